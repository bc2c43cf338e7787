// emulate.c: the kernels compiled as C and run on the CPU.
//
// goep_emulate runs one launch of `grid` blocks of `block` threads, one
// (block, thread) at a time in an order shuffled by `seed`: a kernel whose
// result depends on the order its threads run in gives different results
// for different seeds. Arguments come as 8-byte slots, as cuLaunchKernel is
// given them (an int parameter is the low half of its slot). Not thread
// safe: the caller serialises calls (threadIdx and the others are globals).
#include "prelude.cuh"
#include "layout.cu"
#include "rows.cu"
#include "reduce.cu"
#include "convert.cu"
#include "meta.cu"

#include <stdlib.h>
#include "emulate.h"
#include "emulate_table.h"

#define P(i) ((void *)(uptr)a[i])
#define L(i) ((i64)a[i])
#define I(i) ((int)(i32)(u32)a[i])

static void run_one(int kernel, const uint64_t *a) {
  switch (kernel) { GOEP_EMULATE_CASES }
}

int goep_emulate(int kernel, unsigned grid, unsigned block, const uint64_t *args, uint64_t seed) {
  if (kernel < 0 || kernel >= GOEP_KERNEL_COUNT) return 1;
  uint64_t n = (uint64_t)grid * block;
  if (n == 0) return 0;
  if (n > (1u << 24)) return 2;
  uint32_t *order = malloc(sizeof(uint32_t) * n);
  if (!order) return 3;
  for (uint64_t i = 0; i < n; i++) order[i] = (uint32_t)i;
  uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
  for (uint64_t i = n - 1; i > 0; i--) {  // Fisher-Yates, xorshift64*
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    uint64_t j = (x * 0x2545f4914f6cdd1dull) % (i + 1);
    uint32_t t = order[i];
    order[i] = order[j];
    order[j] = t;
  }
  gridDim.x = grid;
  blockDim.x = block;
  gridDim.y = gridDim.z = blockDim.y = blockDim.z = 1;
  blockIdx.y = blockIdx.z = threadIdx.y = threadIdx.z = 0;
  for (uint64_t i = 0; i < n; i++) {
    blockIdx.x = order[i] / block;
    threadIdx.x = order[i] % block;
    run_one(kernel, args);
  }
  free(order);
  return 0;
}
