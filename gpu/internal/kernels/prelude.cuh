// prelude.cuh: what every goep kernel source sees first.
//
// The kernels are written in the common subset of CUDA C++ and C11 so that
// the same text compiles two ways:
//
//   - by NVRTC, as CUDA (__CUDACC__ is defined): no system headers exist
//     there, so the fixed-width types are declared here; nothing newer than
//     CUDA 11.8 is used (no cuda_bf16.h: bfloat16 is bit operations on u16);
//   - by the host C compiler, through cgo in package kernels, where each
//     kernel runs on the CPU one (block, thread) at a time in a shuffled order
//     (see emulate.c). That is how the kernels are tested on machines with no
//     GPU.
//
// Rules that keep both true: every kernel is a grid-stride loop in which no
// thread reads what another thread of the same launch writes (only atomics
// may touch a shared word), so that any execution order gives the same
// result; no __syncthreads and no __shared__; arithmetic whose result must
// match the CPU reference bit for bit goes through fmul/fadd (never fused).
#ifndef GOEP_PRELUDE_CUH
#define GOEP_PRELUDE_CUH

#ifdef __CUDACC__
typedef signed char i8;
typedef unsigned char u8;
typedef unsigned short u16;
typedef int i32;
typedef unsigned int u32;
typedef long long i64;
typedef unsigned long long u64;
typedef unsigned long long uptr;

#define GOEP_KERNEL extern "C" __global__ void
#define GOEP_FN static __device__ __forceinline__
#define GOEP_UNROLL _Pragma("unroll")

GOEP_FN u32 f2u(float f) { return __float_as_uint(f); }
GOEP_FN float u2f(u32 u) { return __uint_as_float(u); }
// Round-to-nearest multiply and add, never contracted into an FMA, so that
// the device computes what the C reference computes.
GOEP_FN float fmul(float a, float b) { return __fmul_rn(a, b); }
GOEP_FN float fadd(float a, float b) { return __fadd_rn(a, b); }
GOEP_FN void atomic_min_u64(u64 *p, u64 v) { atomicMin((unsigned long long *)p, (unsigned long long)v); }
GOEP_FN void atomic_add_i32(i32 *p, i32 v) { atomicAdd((int *)p, (int)v); }
GOEP_FN void copy16(u8 *d, const u8 *s) { *(uint4 *)d = *(const uint4 *)s; }
GOEP_FN void copy4(u8 *d, const u8 *s) { *(u32 *)d = *(const u32 *)s; }
// v16 is 16 bytes in registers: one 128-bit load or store.
typedef uint4 v16;
GOEP_FN v16 load16(const u8 *s) { return *(const v16 *)s; }
GOEP_FN void store16(u8 *d, v16 v) { *(v16 *)d = v; }

#else  // host C: the emulator

#include <stdint.h>
#include <string.h>
typedef int8_t i8;
typedef uint8_t u8;
typedef uint16_t u16;
typedef int32_t i32;
typedef uint32_t u32;
typedef int64_t i64;
typedef uint64_t u64;
typedef uintptr_t uptr;

typedef struct { unsigned x, y, z; } goep_dim3;
// Set by the emulator before each (block, thread) runs.
static goep_dim3 threadIdx, blockIdx, blockDim, gridDim;

#define GOEP_KERNEL static void
#define GOEP_FN static inline
#define GOEP_UNROLL

GOEP_FN u32 f2u(float f) { u32 u; memcpy(&u, &f, 4); return u; }
GOEP_FN float u2f(u32 u) { float f; memcpy(&f, &u, 4); return f; }
GOEP_FN float fmul(float a, float b) { volatile float r = a * b; return r; }
GOEP_FN float fadd(float a, float b) { volatile float r = a + b; return r; }
GOEP_FN void atomic_min_u64(u64 *p, u64 v) { if (v < *p) *p = v; }
GOEP_FN void atomic_add_i32(i32 *p, i32 v) { *p += v; }
GOEP_FN void copy16(u8 *d, const u8 *s) { memcpy(d, s, 16); }
GOEP_FN void copy4(u8 *d, const u8 *s) { memcpy(d, s, 4); }
typedef struct { u32 x, y, z, w; } v16;
GOEP_FN v16 load16(const u8 *s) { v16 v; memcpy(&v, s, 16); return v; }
GOEP_FN void store16(u8 *d, v16 v) { memcpy(d, &v, 16); }
#endif

// Element types of the row kernels: GOEP_ELEM_F32 and GOEP_ELEM_BF16, the
// one definition package ep's C kernels read too (internal/dtype). NVRTC
// has no include path: Source() puts the header's text in place of this line.
#include "dtype.h"

// Grid-stride loops: over all threads of the launch, and over the blocks
// (with the threads of a block striding inside one item).
#define GOEP_THREAD ((i64)blockIdx.x * (i64)blockDim.x + (i64)threadIdx.x)
#define GOEP_THREADS ((i64)gridDim.x * (i64)blockDim.x)
#define GOEP_BLOCK ((i64)blockIdx.x)
#define GOEP_BLOCKS ((i64)gridDim.x)
#define GOEP_LANE ((i64)threadIdx.x)
#define GOEP_LANES ((i64)blockDim.x)

// bfloat16: the top half of a float32. Rounding is to nearest, ties to
// even; a NaN stays a NaN (quiet bit set), overflow becomes infinity.
GOEP_FN u16 bf16_round(float f) {
  u32 u = f2u(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (u16)((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (u16)(u >> 16);
}

GOEP_FN float bf16_load(u16 h) { return u2f((u32)h << 16); }

// copy_row copies n bytes from s to d (two rows that do not overlap), this
// lane's share of them: 16 bytes at a time when both addresses and n allow
// it, four loads in flight before their stores; else 4 bytes, else 1.
GOEP_FN void copy_row(u8 *d, const u8 *s, i64 n, i64 lane, i64 lanes) {
  uptr a = (uptr)d | (uptr)s | (uptr)n;
  if ((a & 15) == 0) {
    i64 step = lanes * 16, i = lane * 16;
    for (; i + 3 * step < n; i += 4 * step) {
      v16 v0 = load16(s + i), v1 = load16(s + i + step), v2 = load16(s + i + 2 * step), v3 = load16(s + i + 3 * step);
      store16(d + i, v0);
      store16(d + i + step, v1);
      store16(d + i + 2 * step, v2);
      store16(d + i + 3 * step, v3);
    }
    for (; i < n; i += step) copy16(d + i, s + i);
  } else if ((a & 3) == 0) {
    for (i64 i = lane * 4; i < n; i += lanes * 4) copy4(d + i, s + i);
  } else {
    for (i64 i = lane; i < n; i += lanes) d[i] = s[i];
  }
}

#endif
