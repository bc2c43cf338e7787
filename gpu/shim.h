// shim.h: package gpu's C side. The CUDA driver, NVRTC and NCCL are opened
// with dlopen at run time (shim.c), so nothing here needs their headers or
// their libraries at build time: the few types and prototypes used are
// declared in shim.c from the libraries' documented ABI.
//
// Every function returns the library's own status code (CUresult,
// nvrtcResult, ncclResult_t; 0 = success). Functions that act in a CUDA
// context take it first and make it current on the calling thread in the
// same call, because Go may run consecutive calls of one goroutine on
// different threads. None keeps a pointer it was given after it returns.
#ifndef GOEP_GPU_SHIM_H
#define GOEP_GPU_SHIM_H
#include <stddef.h>
#include <stdint.h>

// Status codes this shim returns itself.
enum {
  GOEP_CUDA_ERROR_NOT_SUPPORTED = 801,  // CUDA_ERROR_NOT_SUPPORTED: a symbol this driver lacks
  GOEP_NCCL_INVALID_USAGE = 5,          // ncclInvalidUsage: a symbol this NCCL lacks
};

// Loading: 0, or non-zero with a message in err.
int goep_load_cuda(const char *path, char *err, size_t errlen);
int goep_load_nvrtc(const char *path, char *err, size_t errlen);
int goep_load_nccl(const char *path, char *err, size_t errlen);
// goep_dlopen_keep loads a library and keeps it for the life of the
// process, so that a later dlopen of its soname by a library finds it.
int goep_dlopen_keep(const char *path, char *err, size_t errlen);

// CUDA driver.
const char *goep_cu_error_name(int r);
const char *goep_cu_error_string(int r);
int goep_cu_init(void);
int goep_cu_driver_version(int *v);
int goep_cu_device_count(int *n);
int goep_cu_device_get(int ordinal, int *dev);
int goep_cu_device_name(int dev, char *buf, int len);
int goep_cu_device_attribute(int dev, int attr, int *v);
int goep_cu_device_total_mem(int dev, size_t *bytes);
int goep_cu_device_pci_bus_id(int dev, char *buf, int len);
int goep_cu_primary_ctx_retain(int dev, void **ctx);
int goep_cu_ctx_synchronize(void *ctx);
int goep_cu_mem_get_info(void *ctx, size_t *free_bytes, size_t *total_bytes);
int goep_cu_mem_alloc(void *ctx, uint64_t *p, size_t n);
int goep_cu_mem_free(void *ctx, uint64_t p);
int goep_cu_mem_alloc_async(void *ctx, uint64_t *p, size_t n, void *stream);
int goep_cu_mem_free_async(void *ctx, uint64_t p, void *stream);
int goep_cu_pool_keep(int dev, uint64_t bytes);
int goep_cu_mem_host_alloc(void *ctx, void **p, size_t n, unsigned flags);
int goep_cu_mem_free_host(void *ctx, void *p);
int goep_cu_memcpy_htod(void *ctx, uint64_t dst, const void *src, size_t n);
int goep_cu_memcpy_dtoh(void *ctx, void *dst, uint64_t src, size_t n);
int goep_cu_memcpy_dtod(void *ctx, uint64_t dst, uint64_t src, size_t n);
int goep_cu_memset_d8(void *ctx, uint64_t dst, unsigned char v, size_t n);
int goep_cu_memcpy_htod_async(void *ctx, uint64_t dst, const void *src, size_t n, void *stream);
int goep_cu_memcpy_dtoh_async(void *ctx, void *dst, uint64_t src, size_t n, void *stream);
int goep_cu_memcpy_dtod_async(void *ctx, uint64_t dst, uint64_t src, size_t n, void *stream);
int goep_cu_memset_d8_async(void *ctx, uint64_t dst, unsigned char v, size_t n, void *stream);
int goep_cu_stream_create(void *ctx, void **s, unsigned flags);
int goep_cu_stream_destroy(void *ctx, void *s);
int goep_cu_stream_synchronize(void *ctx, void *s);
int goep_cu_stream_query(void *ctx, void *s);
// goep_cu_legacy_synchronize waits for the work of the legacy default
// stream (CU_STREAM_LEGACY): the synchronous copies by address.
int goep_cu_legacy_synchronize(void *ctx);
// CUDA IPC: goep_cu_ipc_export writes the 64-byte handle of the allocation
// holding p (cuMemGetAddressRange, cuIpcGetMemHandle) and the allocation's
// base and size; goep_cu_ipc_open maps another process's allocation
// (cuIpcOpenMemHandle); goep_cu_ipc_close unmaps it.
int goep_cu_ipc_export(void *ctx, uint64_t p, unsigned char *handle, uint64_t *base, size_t *size);
int goep_cu_ipc_open(void *ctx, uint64_t *p, const unsigned char *handle);
int goep_cu_ipc_close(void *ctx, uint64_t p);
int goep_cu_stream_wait_event(void *ctx, void *s, void *e);
int goep_cu_event_create(void *ctx, void **e, unsigned flags);
int goep_cu_event_destroy(void *ctx, void *e);
int goep_cu_event_record(void *ctx, void *e, void *s);
int goep_cu_event_synchronize(void *ctx, void *e);
int goep_cu_event_query(void *ctx, void *e);
int goep_cu_event_elapsed(void *ctx, float *ms, void *start, void *end);
// goep_cu_module_load JIT-compiles a PTX image (NUL-terminated); on failure
// the JIT's error log is in log.
int goep_cu_module_load(void *ctx, void **mod, const char *image, char *log, size_t loglen);
int goep_cu_module_unload(void *ctx, void *mod);
int goep_cu_module_get_function(void *ctx, void **fn, void *mod, const char *name);
// goep_cu_launch launches fn with a 1-D grid; args holds one 8-byte slot per
// kernel parameter (a 4-byte parameter is the slot's low half).
int goep_cu_launch(void *ctx, void *fn, unsigned grid, unsigned block, unsigned shmem, void *stream,
                   const uint64_t *args, int nargs);

// NVRTC.
const char *goep_nvrtc_error_string(int r);
int goep_nvrtc_version(int *major, int *minor);
// goep_nvrtc_supported_archs writes up to cap architectures (80 = sm_80)
// and their number; -1 when this NVRTC cannot list them (before 11.2).
int goep_nvrtc_supported_archs(int *archs, int cap, int *n);
// goep_nvrtc_compile compiles src; options are separated by '\n'. *stage
// names the call that failed (0 create, 1 compile, 2 get PTX). The PTX and
// the log are malloc'd (the caller frees them), each NUL-terminated.
int goep_nvrtc_compile(const char *src, const char *name, const char *options, int *stage, char **ptx,
                       size_t *ptxlen, char **log, size_t *loglen);

// NCCL.
const char *goep_nccl_error_string(int r);
const char *goep_nccl_last_error(void *comm);
int goep_nccl_version(int *v);
int goep_nccl_get_unique_id(unsigned char *id);
int goep_nccl_comm_init_rank(void *ctx, void **comm, int nranks, const unsigned char *id, int rank);
// goep_nccl_comm_init_rank_config is ncclCommInitRankConfig with a config
// whose only setting is blocking (0: a non-blocking communicator, whose
// calls may return ncclInProgress and finish in the background).
int goep_nccl_comm_init_rank_config(void *ctx, void **comm, int nranks, const unsigned char *id, int rank,
                                    int blocking);
int goep_nccl_comm_finalize(void *ctx, void *comm);
int goep_nccl_comm_destroy(void *ctx, void *comm);
int goep_nccl_comm_abort(void *ctx, void *comm);
// goep_nccl_comm_get_async_error stores the communicator's asynchronous
// state (ncclSuccess, ncclInProgress, or the error of an operation that
// failed) in *result; it needs no context and may be called from any thread.
int goep_nccl_comm_get_async_error(void *comm, int *result);
// goep_nccl_send_recv posts n point-to-point operations in one NCCL group:
// op i sends (recv[i] == 0) or receives (recv[i] != 0) bytes[i] bytes at
// device address ptr[i] to or from rank peer[i].
int goep_nccl_send_recv(void *ctx, void *comm, void *stream, int n, const int *recv, const int *peer,
                        const uint64_t *ptr, const uint64_t *bytes);
#endif
