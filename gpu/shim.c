// shim.c: the CUDA driver, NVRTC and NCCL through dlopen (see shim.h).
//
// The types below stand for the libraries' own: handles are pointers,
// CUdevice is an int, CUdeviceptr a 64-bit integer, status codes ints, and
// ncclUniqueId a 128-byte struct passed by value. Symbols with a _v2 suffix
// are the ones cuda.h has mapped the plain names to since CUDA 4 to 11.
#define _GNU_SOURCE
#include "shim.h"

#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct { char internal[128]; } nccl_id;
typedef struct { char reserved[64]; } ipc_handle;  // CUipcMemHandle, passed by value

// ---- symbol tables ----------------------------------------------------------

#define CU_SYMBOLS(X, O)                                                                        \
  X(int, cuGetErrorName, (int, const char **), "cuGetErrorName")                               \
  X(int, cuGetErrorString, (int, const char **), "cuGetErrorString")                           \
  X(int, cuInit, (unsigned), "cuInit")                                                         \
  X(int, cuDriverGetVersion, (int *), "cuDriverGetVersion")                                    \
  X(int, cuDeviceGetCount, (int *), "cuDeviceGetCount")                                        \
  X(int, cuDeviceGet, (int *, int), "cuDeviceGet")                                             \
  X(int, cuDeviceGetName, (char *, int, int), "cuDeviceGetName")                               \
  X(int, cuDeviceGetAttribute, (int *, int, int), "cuDeviceGetAttribute")                      \
  X(int, cuDeviceTotalMem, (size_t *, int), "cuDeviceTotalMem_v2")                             \
  X(int, cuDeviceGetPCIBusId, (char *, int, int), "cuDeviceGetPCIBusId")                       \
  X(int, cuDevicePrimaryCtxRetain, (void **, int), "cuDevicePrimaryCtxRetain")                 \
  X(int, cuCtxSetCurrent, (void *), "cuCtxSetCurrent")                                         \
  X(int, cuCtxSynchronize, (void), "cuCtxSynchronize")                                         \
  X(int, cuMemGetInfo, (size_t *, size_t *), "cuMemGetInfo_v2")                                \
  X(int, cuMemAlloc, (uint64_t *, size_t), "cuMemAlloc_v2")                                    \
  X(int, cuMemFree, (uint64_t), "cuMemFree_v2")                                                \
  O(int, cuMemAllocAsync, (uint64_t *, size_t, void *), "cuMemAllocAsync")                     \
  O(int, cuMemGetAddressRange, (uint64_t *, size_t *, uint64_t), "cuMemGetAddressRange_v2")      \
  O(int, cuIpcGetMemHandle, (void *, uint64_t), "cuIpcGetMemHandle")                             \
  O(int, cuIpcOpenMemHandle, (uint64_t *, ipc_handle, unsigned), "cuIpcOpenMemHandle_v2")        \
  O(int, cuIpcCloseMemHandle, (uint64_t), "cuIpcCloseMemHandle")                                \
  O(int, cuMemFreeAsync, (uint64_t, void *), "cuMemFreeAsync")                                 \
  O(int, cuDeviceGetDefaultMemPool, (void **, int), "cuDeviceGetDefaultMemPool")               \
  O(int, cuMemPoolSetAttribute, (void *, int, void *), "cuMemPoolSetAttribute")                 \
  O(int, cuMemPoolGetAttribute, (void *, int, void *), "cuMemPoolGetAttribute")                 \
  X(int, cuMemHostAlloc, (void **, size_t, unsigned), "cuMemHostAlloc")                        \
  X(int, cuMemFreeHost, (void *), "cuMemFreeHost")                                             \
  X(int, cuMemcpyHtoD, (uint64_t, const void *, size_t), "cuMemcpyHtoD_v2")                   \
  X(int, cuMemcpyDtoH, (void *, uint64_t, size_t), "cuMemcpyDtoH_v2")                         \
  X(int, cuMemcpyDtoD, (uint64_t, uint64_t, size_t), "cuMemcpyDtoD_v2")                       \
  X(int, cuMemsetD8, (uint64_t, unsigned char, size_t), "cuMemsetD8_v2")                      \
  X(int, cuMemcpyHtoDAsync, (uint64_t, const void *, size_t, void *), "cuMemcpyHtoDAsync_v2") \
  X(int, cuMemcpyDtoHAsync, (void *, uint64_t, size_t, void *), "cuMemcpyDtoHAsync_v2")       \
  X(int, cuMemcpyDtoDAsync, (uint64_t, uint64_t, size_t, void *), "cuMemcpyDtoDAsync_v2")     \
  X(int, cuMemsetD8Async, (uint64_t, unsigned char, size_t, void *), "cuMemsetD8Async")       \
  X(int, cuStreamCreate, (void **, unsigned), "cuStreamCreate")                                \
  X(int, cuStreamDestroy, (void *), "cuStreamDestroy_v2")                                      \
  X(int, cuStreamSynchronize, (void *), "cuStreamSynchronize")                                 \
  X(int, cuStreamQuery, (void *), "cuStreamQuery")                                             \
  X(int, cuStreamWaitEvent, (void *, void *, unsigned), "cuStreamWaitEvent")                   \
  X(int, cuEventCreate, (void **, unsigned), "cuEventCreate")                                  \
  X(int, cuEventDestroy, (void *), "cuEventDestroy_v2")                                        \
  X(int, cuEventRecord, (void *, void *), "cuEventRecord")                                     \
  X(int, cuEventSynchronize, (void *), "cuEventSynchronize")                                   \
  X(int, cuEventQuery, (void *), "cuEventQuery")                                               \
  X(int, cuModuleLoadDataEx, (void **, const void *, unsigned, int *, void **), "cuModuleLoadDataEx") \
  X(int, cuModuleUnload, (void *), "cuModuleUnload")                                           \
  X(int, cuModuleGetFunction, (void **, void *, const char *), "cuModuleGetFunction")          \
  X(int, cuLaunchKernel,                                                                       \
    (void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void *, void **, void **), \
    "cuLaunchKernel")

#define NVRTC_SYMBOLS(X, O)                                                                     \
  X(const char *, nvrtcGetErrorString, (int), "nvrtcGetErrorString")                            \
  X(int, nvrtcVersion, (int *, int *), "nvrtcVersion")                                          \
  O(int, nvrtcGetNumSupportedArchs, (int *), "nvrtcGetNumSupportedArchs")                       \
  O(int, nvrtcGetSupportedArchs, (int *), "nvrtcGetSupportedArchs")                             \
  X(int, nvrtcCreateProgram,                                                                    \
    (void **, const char *, const char *, int, const char *const *, const char *const *),       \
    "nvrtcCreateProgram")                                                                       \
  X(int, nvrtcCompileProgram, (void *, int, const char *const *), "nvrtcCompileProgram")        \
  X(int, nvrtcGetPTXSize, (void *, size_t *), "nvrtcGetPTXSize")                                \
  X(int, nvrtcGetPTX, (void *, char *), "nvrtcGetPTX")                                          \
  X(int, nvrtcGetProgramLogSize, (void *, size_t *), "nvrtcGetProgramLogSize")                  \
  X(int, nvrtcGetProgramLog, (void *, char *), "nvrtcGetProgramLog")                            \
  X(int, nvrtcDestroyProgram, (void **), "nvrtcDestroyProgram")

#define NCCL_SYMBOLS(X, O)                                                                      \
  X(const char *, ncclGetErrorString, (int), "ncclGetErrorString")                              \
  O(const char *, ncclGetLastError, (void *), "ncclGetLastError")                               \
  X(int, ncclGetVersion, (int *), "ncclGetVersion")                                             \
  X(int, ncclGetUniqueId, (nccl_id *), "ncclGetUniqueId")                                       \
  X(int, ncclCommInitRank, (void **, int, nccl_id, int), "ncclCommInitRank")                    \
  X(int, ncclCommInitRankConfig, (void **, int, nccl_id, int, void *), "ncclCommInitRankConfig") \
  X(int, ncclCommFinalize, (void *), "ncclCommFinalize")                                        \
  X(int, ncclCommDestroy, (void *), "ncclCommDestroy")                                          \
  X(int, ncclCommAbort, (void *), "ncclCommAbort")                                              \
  X(int, ncclCommGetAsyncError, (void *, int *), "ncclCommGetAsyncError")                       \
  X(int, ncclGroupStart, (void), "ncclGroupStart")                                              \
  X(int, ncclGroupEnd, (void), "ncclGroupEnd")                                                  \
  X(int, ncclSend, (const void *, size_t, int, int, void *, void *), "ncclSend")                \
  X(int, ncclRecv, (void *, size_t, int, int, void *, void *), "ncclRecv")

#define DECLARE(ret, name, args, sym) static ret(*p_##name) args;
CU_SYMBOLS(DECLARE, DECLARE)
NVRTC_SYMBOLS(DECLARE, DECLARE)
NCCL_SYMBOLS(DECLARE, DECLARE)
// cuEventElapsedTime: the _v2 name since CUDA 12.8 (the only one some
// drivers keep), the plain name before.
static int (*p_cuEventElapsedTime)(float *, void *, void *);

// Loading one library: all required symbols or nothing. The handle is never
// closed once loaded.
#define LOOKUP_REQUIRED(ret, name, args, sym)                                   \
  ret(*name) args = (ret(*) args)dlsym(h, sym);                                 \
  if (!name) {                                                                  \
    snprintf(err, errlen, "%s has no symbol %s (too old a version?)", path, sym); \
    dlclose(h);                                                                 \
    return 1;                                                                   \
  }
#define LOOKUP_OPTIONAL(ret, name, args, sym) ret(*name) args = (ret(*) args)dlsym(h, sym);
#define PUBLISH(ret, name, args, sym) p_##name = name;

static void *open_lib(const char *path, char *err, size_t errlen) {
  dlerror();
  void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char *e = dlerror();
    snprintf(err, errlen, "%s", e ? e : "dlopen failed");
  }
  return h;
}

int goep_load_cuda(const char *path, char *err, size_t errlen) {
  void *h = open_lib(path, err, errlen);
  if (!h) return 1;
  CU_SYMBOLS(LOOKUP_REQUIRED, LOOKUP_OPTIONAL)
  int (*elapsed)(float *, void *, void *) = (int (*)(float *, void *, void *))dlsym(h, "cuEventElapsedTime_v2");
  if (!elapsed) elapsed = (int (*)(float *, void *, void *))dlsym(h, "cuEventElapsedTime");
  if (!elapsed) {
    snprintf(err, errlen, "%s has no symbol cuEventElapsedTime(_v2)", path);
    dlclose(h);
    return 1;
  }
  CU_SYMBOLS(PUBLISH, PUBLISH)
  p_cuEventElapsedTime = elapsed;
  return 0;
}

int goep_dlopen_keep(const char *path, char *err, size_t errlen) {
  return open_lib(path, err, errlen) ? 0 : 1;  // never closed
}

int goep_load_nvrtc(const char *path, char *err, size_t errlen) {
  void *h = open_lib(path, err, errlen);
  if (!h) return 1;
  NVRTC_SYMBOLS(LOOKUP_REQUIRED, LOOKUP_OPTIONAL)
  NVRTC_SYMBOLS(PUBLISH, PUBLISH)
  return 0;
}

int goep_load_nccl(const char *path, char *err, size_t errlen) {
  void *h = open_lib(path, err, errlen);
  if (!h) return 1;
  NCCL_SYMBOLS(LOOKUP_REQUIRED, LOOKUP_OPTIONAL)
  NCCL_SYMBOLS(PUBLISH, PUBLISH)
  return 0;
}

// ---- CUDA driver ---------------------------------------------------------------

const char *goep_cu_error_name(int r) {
  const char *s = NULL;
  if (!p_cuGetErrorName || p_cuGetErrorName(r, &s) != 0) return NULL;
  return s;
}

const char *goep_cu_error_string(int r) {
  const char *s = NULL;
  if (!p_cuGetErrorString || p_cuGetErrorString(r, &s) != 0) return NULL;
  return s;
}

int goep_cu_init(void) { return p_cuInit(0); }
int goep_cu_driver_version(int *v) { return p_cuDriverGetVersion(v); }
int goep_cu_device_count(int *n) { return p_cuDeviceGetCount(n); }
int goep_cu_device_get(int ordinal, int *dev) { return p_cuDeviceGet(dev, ordinal); }
int goep_cu_device_name(int dev, char *buf, int len) { return p_cuDeviceGetName(buf, len, dev); }
int goep_cu_device_attribute(int dev, int attr, int *v) { return p_cuDeviceGetAttribute(v, attr, dev); }
int goep_cu_device_total_mem(int dev, size_t *bytes) { return p_cuDeviceTotalMem(bytes, dev); }
int goep_cu_device_pci_bus_id(int dev, char *buf, int len) { return p_cuDeviceGetPCIBusId(buf, len, dev); }
int goep_cu_primary_ctx_retain(int dev, void **ctx) { return p_cuDevicePrimaryCtxRetain(ctx, dev); }

// IN_CTX makes ctx current on this thread, or returns the error.
#define IN_CTX(ctx)                        \
  do {                                     \
    int r_ = p_cuCtxSetCurrent(ctx);       \
    if (r_ != 0) return r_;                \
  } while (0)

int goep_cu_ctx_synchronize(void *ctx) {
  IN_CTX(ctx);
  return p_cuCtxSynchronize();
}

int goep_cu_mem_get_info(void *ctx, size_t *free_bytes, size_t *total_bytes) {
  IN_CTX(ctx);
  return p_cuMemGetInfo(free_bytes, total_bytes);
}

int goep_cu_mem_alloc(void *ctx, uint64_t *p, size_t n) {
  IN_CTX(ctx);
  return p_cuMemAlloc(p, n);
}

int goep_cu_mem_free(void *ctx, uint64_t p) {
  IN_CTX(ctx);
  return p_cuMemFree(p);
}

int goep_cu_mem_alloc_async(void *ctx, uint64_t *p, size_t n, void *stream) {
  if (!p_cuMemAllocAsync) return GOEP_CUDA_ERROR_NOT_SUPPORTED;
  IN_CTX(ctx);
  return p_cuMemAllocAsync(p, n, stream);
}

// goep_cu_pool_keep raises the release threshold of device dev's default
// memory pool (CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, 4) to `bytes` where it is
// lower (a threshold the program set higher stays): the pool then keeps up
// to that much memory across synchronizations instead of returning it to
// the system at each one, so that a stream-ordered allocation after a
// synchronization reuses memory rather than mapping it.
int goep_cu_pool_keep(int dev, uint64_t bytes) {
  if (!p_cuDeviceGetDefaultMemPool || !p_cuMemPoolSetAttribute) return GOEP_CUDA_ERROR_NOT_SUPPORTED;
  void *pool = NULL;
  int r = p_cuDeviceGetDefaultMemPool(&pool, dev);
  if (r) return r;
  uint64_t now = 0;
  if (p_cuMemPoolGetAttribute && p_cuMemPoolGetAttribute(pool, 4, &now) == 0 && now >= bytes) return 0;
  return p_cuMemPoolSetAttribute(pool, 4, &bytes);
}

int goep_cu_mem_free_async(void *ctx, uint64_t p, void *stream) {
  if (!p_cuMemFreeAsync) return GOEP_CUDA_ERROR_NOT_SUPPORTED;
  IN_CTX(ctx);
  return p_cuMemFreeAsync(p, stream);
}

int goep_cu_mem_host_alloc(void *ctx, void **p, size_t n, unsigned flags) {
  IN_CTX(ctx);
  return p_cuMemHostAlloc(p, n, flags);
}

int goep_cu_mem_free_host(void *ctx, void *p) {
  IN_CTX(ctx);
  return p_cuMemFreeHost(p);
}

int goep_cu_memcpy_htod(void *ctx, uint64_t dst, const void *src, size_t n) {
  IN_CTX(ctx);
  return p_cuMemcpyHtoD(dst, src, n);
}

int goep_cu_memcpy_dtoh(void *ctx, void *dst, uint64_t src, size_t n) {
  IN_CTX(ctx);
  return p_cuMemcpyDtoH(dst, src, n);
}

int goep_cu_memcpy_dtod(void *ctx, uint64_t dst, uint64_t src, size_t n) {
  IN_CTX(ctx);
  return p_cuMemcpyDtoD(dst, src, n);
}

int goep_cu_memset_d8(void *ctx, uint64_t dst, unsigned char v, size_t n) {
  IN_CTX(ctx);
  return p_cuMemsetD8(dst, v, n);
}

int goep_cu_memcpy_htod_async(void *ctx, uint64_t dst, const void *src, size_t n, void *stream) {
  IN_CTX(ctx);
  return p_cuMemcpyHtoDAsync(dst, src, n, stream);
}

int goep_cu_memcpy_dtoh_async(void *ctx, void *dst, uint64_t src, size_t n, void *stream) {
  IN_CTX(ctx);
  return p_cuMemcpyDtoHAsync(dst, src, n, stream);
}

int goep_cu_memcpy_dtod_async(void *ctx, uint64_t dst, uint64_t src, size_t n, void *stream) {
  IN_CTX(ctx);
  return p_cuMemcpyDtoDAsync(dst, src, n, stream);
}

int goep_cu_memset_d8_async(void *ctx, uint64_t dst, unsigned char v, size_t n, void *stream) {
  IN_CTX(ctx);
  return p_cuMemsetD8Async(dst, v, n, stream);
}

int goep_cu_stream_create(void *ctx, void **s, unsigned flags) {
  IN_CTX(ctx);
  return p_cuStreamCreate(s, flags);
}

int goep_cu_stream_destroy(void *ctx, void *s) {
  IN_CTX(ctx);
  return p_cuStreamDestroy(s);
}

int goep_cu_stream_synchronize(void *ctx, void *s) {
  IN_CTX(ctx);
  return p_cuStreamSynchronize(s);
}

int goep_cu_ipc_export(void *ctx, uint64_t p, unsigned char *handle, uint64_t *base, size_t *size) {
  if (!p_cuIpcGetMemHandle || !p_cuMemGetAddressRange) return GOEP_CUDA_ERROR_NOT_SUPPORTED;
  IN_CTX(ctx);
  int r = p_cuMemGetAddressRange(base, size, p);
  if (r != 0) return r;
  ipc_handle h;
  r = p_cuIpcGetMemHandle(&h, *base);
  if (r == 0) memcpy(handle, h.reserved, sizeof h.reserved);
  return r;
}

int goep_cu_ipc_open(void *ctx, uint64_t *p, const unsigned char *handle) {
  if (!p_cuIpcOpenMemHandle) return GOEP_CUDA_ERROR_NOT_SUPPORTED;
  IN_CTX(ctx);
  ipc_handle h;
  memcpy(h.reserved, handle, sizeof h.reserved);
  return p_cuIpcOpenMemHandle(p, h, 1);  // CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS
}

int goep_cu_ipc_close(void *ctx, uint64_t p) {
  if (!p_cuIpcCloseMemHandle) return GOEP_CUDA_ERROR_NOT_SUPPORTED;
  IN_CTX(ctx);
  return p_cuIpcCloseMemHandle(p);
}

int goep_cu_legacy_synchronize(void *ctx) {
  IN_CTX(ctx);
  return p_cuStreamSynchronize((void *)(uintptr_t)1);  // CU_STREAM_LEGACY
}

int goep_cu_stream_query(void *ctx, void *s) {
  IN_CTX(ctx);
  return p_cuStreamQuery(s);
}

int goep_cu_stream_wait_event(void *ctx, void *s, void *e) {
  IN_CTX(ctx);
  return p_cuStreamWaitEvent(s, e, 0);
}

int goep_cu_event_create(void *ctx, void **e, unsigned flags) {
  IN_CTX(ctx);
  return p_cuEventCreate(e, flags);
}

int goep_cu_event_destroy(void *ctx, void *e) {
  IN_CTX(ctx);
  return p_cuEventDestroy(e);
}

int goep_cu_event_record(void *ctx, void *e, void *s) {
  IN_CTX(ctx);
  return p_cuEventRecord(e, s);
}

int goep_cu_event_synchronize(void *ctx, void *e) {
  IN_CTX(ctx);
  return p_cuEventSynchronize(e);
}

int goep_cu_event_query(void *ctx, void *e) {
  IN_CTX(ctx);
  return p_cuEventQuery(e);
}

int goep_cu_event_elapsed(void *ctx, float *ms, void *start, void *end) {
  IN_CTX(ctx);
  return p_cuEventElapsedTime(ms, start, end);
}

enum { CU_JIT_ERROR_LOG_BUFFER = 5, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES = 6 };

int goep_cu_module_load(void *ctx, void **mod, const char *image, char *log, size_t loglen) {
  IN_CTX(ctx);
  int opts[2] = {CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES};
  void *vals[2] = {log, (void *)(uintptr_t)loglen};
  if (loglen > 0) log[0] = 0;
  return p_cuModuleLoadDataEx(mod, image, loglen > 0 ? 2 : 0, opts, vals);
}

int goep_cu_module_unload(void *ctx, void *mod) {
  IN_CTX(ctx);
  return p_cuModuleUnload(mod);
}

int goep_cu_module_get_function(void *ctx, void **fn, void *mod, const char *name) {
  IN_CTX(ctx);
  return p_cuModuleGetFunction(fn, mod, name);
}

int goep_cu_launch(void *ctx, void *fn, unsigned grid, unsigned block, unsigned shmem, void *stream,
                   const uint64_t *args, int nargs) {
  void *params[64];
  if (nargs < 0 || nargs > 64) return 1;  // CUDA_ERROR_INVALID_VALUE
  for (int i = 0; i < nargs; i++) params[i] = (void *)&args[i];
  IN_CTX(ctx);
  return p_cuLaunchKernel(fn, grid, 1, 1, block, 1, 1, shmem, stream, params, NULL);
}

// ---- NVRTC ---------------------------------------------------------------------

const char *goep_nvrtc_error_string(int r) { return p_nvrtcGetErrorString ? p_nvrtcGetErrorString(r) : NULL; }
int goep_nvrtc_version(int *major, int *minor) { return p_nvrtcVersion(major, minor); }

int goep_nvrtc_supported_archs(int *archs, int cap, int *n) {
  if (!p_nvrtcGetNumSupportedArchs || !p_nvrtcGetSupportedArchs) return -1;
  int r = p_nvrtcGetNumSupportedArchs(n);
  if (r != 0) return r;
  if (*n > cap) return -1;
  return p_nvrtcGetSupportedArchs(archs);
}

int goep_nvrtc_compile(const char *src, const char *name, const char *options, int *stage, char **ptx,
                       size_t *ptxlen, char **log, size_t *loglen) {
  *ptx = NULL;
  *log = NULL;
  *ptxlen = *loglen = 0;
  *stage = 0;
  void *prog = NULL;
  int r = p_nvrtcCreateProgram(&prog, src, name, 0, NULL, NULL);
  if (r != 0) return r;

  // Split the options at newlines into a NULL-terminated array.
  char *opts = strdup(options ? options : "");
  int nopt = 0;
  const char *argv[64];
  for (char *p = opts; *p && nopt < 64;) {
    argv[nopt++] = p;
    char *nl = strchr(p, '\n');
    if (!nl) break;
    *nl = 0;
    p = nl + 1;
  }
  *stage = 1;
  r = p_nvrtcCompileProgram(prog, nopt, argv);
  free(opts);

  size_t n = 0;
  if (p_nvrtcGetProgramLogSize(prog, &n) == 0 && n > 0) {
    *log = malloc(n + 1);
    if (*log && p_nvrtcGetProgramLog(prog, *log) == 0) {
      (*log)[n] = 0;
      *loglen = strlen(*log);
    }
  }
  if (r == 0) {
    *stage = 2;
    r = p_nvrtcGetPTXSize(prog, &n);
    if (r == 0) {
      *ptx = malloc(n + 1);
      r = *ptx ? p_nvrtcGetPTX(prog, *ptx) : 6;  // NVRTC_ERROR_INTERNAL_ERROR-ish: out of memory
      if (r == 0) {
        (*ptx)[n] = 0;
        *ptxlen = strlen(*ptx);
      }
    }
  }
  p_nvrtcDestroyProgram(&prog);
  return r;
}

// ---- NCCL ----------------------------------------------------------------------

const char *goep_nccl_error_string(int r) { return p_ncclGetErrorString ? p_ncclGetErrorString(r) : NULL; }

const char *goep_nccl_last_error(void *comm) { return p_ncclGetLastError ? p_ncclGetLastError(comm) : NULL; }

int goep_nccl_version(int *v) { return p_ncclGetVersion(v); }

int goep_nccl_get_unique_id(unsigned char *id) {
  nccl_id u;
  int r = p_ncclGetUniqueId(&u);
  if (r == 0) memcpy(id, u.internal, sizeof u.internal);
  return r;
}

int goep_nccl_comm_init_rank(void *ctx, void **comm, int nranks, const unsigned char *id, int rank) {
  nccl_id u;
  memcpy(u.internal, id, sizeof u.internal);
  int r = p_cuCtxSetCurrent(ctx);
  if (r != 0) return 1;  // ncclUnhandledCudaError
  return p_ncclCommInitRank(comm, nranks, u, rank);
}

// ncclConfig_t as NCCL 2.17 laid it out. NCCL reads a config by its size
// and version and gives the fields a newer version added their defaults,
// so this prefix is a valid config for every NCCL since.
typedef struct {
  size_t size;
  unsigned int magic;
  unsigned int version;
  int blocking;
  int cga_cluster_size;
  int min_ctas;
  int max_ctas;
  const char *net_name;
} nccl_config_2_17;

#define NCCL_API_MAGIC 0xcafebeefu
#define NCCL_CONFIG_VERSION 21700u  // NCCL_VERSION(2, 17, 0)
#define NCCL_CONFIG_UNDEF_INT INT_MIN

int goep_nccl_comm_init_rank_config(void *ctx, void **comm, int nranks, const unsigned char *id, int rank,
                                    int blocking) {
  nccl_id u;
  memcpy(u.internal, id, sizeof u.internal);
  nccl_config_2_17 cfg = {sizeof cfg, NCCL_API_MAGIC, NCCL_CONFIG_VERSION, blocking,
                          NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT, NULL};
  int r = p_cuCtxSetCurrent(ctx);
  if (r != 0) return 1;  // ncclUnhandledCudaError
  return p_ncclCommInitRankConfig(comm, nranks, u, rank, &cfg);
}

int goep_nccl_comm_finalize(void *ctx, void *comm) {
  if (p_cuCtxSetCurrent(ctx) != 0) return 1;
  return p_ncclCommFinalize(comm);
}

int goep_nccl_comm_destroy(void *ctx, void *comm) {
  if (p_cuCtxSetCurrent(ctx) != 0) return 1;
  return p_ncclCommDestroy(comm);
}

int goep_nccl_comm_abort(void *ctx, void *comm) {
  if (p_cuCtxSetCurrent(ctx) != 0) return 1;
  return p_ncclCommAbort(comm);
}

int goep_nccl_comm_get_async_error(void *comm, int *result) { return p_ncclCommGetAsyncError(comm, result); }

enum { NCCL_INT8 = 0 };

int goep_nccl_send_recv(void *ctx, void *comm, void *stream, int n, const int *recv, const int *peer,
                        const uint64_t *ptr, const uint64_t *bytes) {
  if (p_cuCtxSetCurrent(ctx) != 0) return 1;
  int r = p_ncclGroupStart();
  if (r != 0) return r;
  int first = 0;
  for (int i = 0; i < n && first == 0; i++) {
    if (recv[i])
      first = p_ncclRecv((void *)(uintptr_t)ptr[i], (size_t)bytes[i], NCCL_INT8, peer[i], comm, stream);
    else
      first = p_ncclSend((const void *)(uintptr_t)ptr[i], (size_t)bytes[i], NCCL_INT8, peer[i], comm, stream);
  }
  r = p_ncclGroupEnd();  // always close the group, even after a failed post
  return first != 0 ? first : r;
}
