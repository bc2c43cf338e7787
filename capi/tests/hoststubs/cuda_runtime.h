/*
 * cuda_runtime.h, a host stand-in for the test that compiles NCCL EP-shaped programs on goep
 * (scripts/capi/test-rename.sh puts this directory on their include path, and nothing else's):
 * the few CUDA runtime calls such a program makes for its device memory and streams, on host memory.
 * cudaMalloc is malloc, cudaMemcpy memcpy, a stream a token nobody reads. Not part of goep's API.
 */
#ifndef GOEP_HOSTSTUB_CUDA_RUNTIME_H
#define GOEP_HOSTSTUB_CUDA_RUNTIME_H
#define __DRIVER_TYPES_H__ /* CUDA's guard for cudaError_t, which goep_ep.h's allocator hooks then return */

#include <stdlib.h>
#include <string.h>

typedef enum cudaError { cudaSuccess = 0, cudaErrorMemoryAllocation = 2, cudaErrorInvalidValue = 1 } cudaError_t;
typedef struct CUstream_st* cudaStream_t;
enum cudaMemcpyKind {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3,
    cudaMemcpyDefault = 4
};

static inline cudaError_t cudaMalloc(void** p, size_t n) {
    *p = malloc(n ? n : 1);
    return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}
static inline cudaError_t cudaFree(void* p) {
    free(p);
    return cudaSuccess;
}
static inline cudaError_t cudaMemcpy(void* dst, const void* src, size_t n, enum cudaMemcpyKind kind) {
    (void)kind;
    memmove(dst, src, n);
    return cudaSuccess;
}
static inline cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t n, enum cudaMemcpyKind kind, cudaStream_t s) {
    (void)s;
    return cudaMemcpy(dst, src, n, kind);
}
static inline cudaError_t cudaMemset(void* p, int v, size_t n) {
    memset(p, v, n);
    return cudaSuccess;
}
static inline cudaError_t cudaSetDevice(int d) {
    (void)d;
    return cudaSuccess;
}
/* A stream is a distinct non-NULL token: its calls are already done when they return. */
static inline cudaError_t cudaStreamCreate(cudaStream_t* s) {
    static char token;
    *s = (cudaStream_t)(void*)&token;
    return cudaSuccess;
}
static inline cudaError_t cudaStreamSynchronize(cudaStream_t s) {
    (void)s;
    return cudaSuccess;
}
static inline cudaError_t cudaStreamDestroy(cudaStream_t s) {
    (void)s;
    return cudaSuccess;
}
static inline const char* cudaGetErrorString(cudaError_t e) { return e == cudaSuccess ? "no error" : "host stand-in error"; }
#endif
