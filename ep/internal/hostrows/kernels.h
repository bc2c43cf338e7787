// C kernels of package ep. Each call does a whole batch; none keeps a
// pointer it was given after it returns. Tables of addresses are uintptr_t:
// they hold window (C) memory, which Go need not check on each call.
#ifndef GOEP_EP_KERNELS_H
#define GOEP_EP_KERNELS_H
#include <stdint.h>
#include <string.h>

#include "dtype.h"  // GOEP_ELEM_F32, GOEP_ELEM_BF16: internal/dtype

// ep_bf16_bits rounds the float32 with bits u to the nearest bfloat16, ties to
// even; NaN stays NaN (quietened), overflow becomes infinity. Branch-free, so
// loops over it vectorise.
static inline uint16_t ep_bf16_bits(uint32_t u) {
  uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  uint32_t quiet = (u >> 16) | 0x40u;
  return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? quiet : rounded);
}

// FP8 e4m3 (the OCP "E4M3FN" format): sign, 4 exponent bits of bias 7, 3
// mantissa bits; no infinities, NaN is S.1111.111; largest finite 448,
// smallest normal 2^-6, subnormals m/8 * 2^-6.
#define EP_FP8_GROUP 128  // elements per scale: a row's groups of consecutive elements
enum ep_scale { EP_SCALE_F32 = 0, EP_SCALE_UE8M0 = 1 };

// ep_e4m3_bits rounds the float32 with bits v to e4m3, to nearest, ties to
// even, saturating at +-448; x is the bits of the input v was scaled from:
// a NaN or infinite x gives NaN (0x7F) with x's sign. Branch-free, so loops
// over it vectorise.
static inline uint8_t ep_e4m3_bits(uint32_t v, uint32_t x) {
  uint32_t a = v & 0x7fffffffu;
  // normal: round the 23-bit mantissa to 3 bits; the exponent moves from
  // bias 127 to bias 7 (120 << 3 in the code's units)
  uint32_t r = a + 0x7ffffu + ((a >> 20) & 1u);
  int32_t normal = (int32_t)(r >> 20) - (120 << 3);
  // subnormal (below 2^-6): the code is round(|v| * 2^9) as an integer,
  // rounded by the float addition of 2^23 (exact: |v| * 2^9 < 8)
  float f, g;
  memcpy(&f, &a, 4);
  g = f * 512.0f + 8388608.0f;
  uint32_t gb;
  memcpy(&gb, &g, 4);
  int32_t sub = (int32_t)(gb - 0x4b000000u);
  int32_t code = a < 0x3c800000u ? sub : normal;
  code = code > 0x7e ? 0x7e : code;
  code = (x & 0x7fffffffu) >= 0x7f800000u ? 0x7f : code;
  return (uint8_t)(((x >> 24) & 0x80u) | (uint32_t)code);
}

// quant.c
void ep_quant_rows(const uintptr_t *dst, const uintptr_t *dst_scales, const char *src, const int64_t *src_off,
                   int64_t n, int64_t hidden, int dtype, int scale_mode, int impl);
void ep_dequant_rows(void *out, int out_dtype, const uint8_t *q, const float *scales, int64_t rows, int64_t hidden);
void ep_reduce_rows_fp8(void *out, int out_dtype, const uintptr_t *codes, const uintptr_t *scales, const float *w,
                        const int32_t *start, int64_t n, int64_t hidden);

// layout.c
int64_t ep_layout(const int32_t *topk, int64_t T, int K, int E, int L, int R,
                  const int32_t *node_of, int nodes,
                  int32_t *per_expert, int32_t *per_rank, int32_t *per_node,
                  int32_t *pair_ord, int32_t *tok_rank_ord, int32_t *tok_node_ord);
void ep_ht_meta(int32_t *tok_out, int32_t *topk_out, float *w_out, const int32_t *rows, int64_t n,
                const int32_t *src_tok, const int32_t *src_topk, const float *src_w, int K, int L, int d,
                int global);
void ep_count_local(const int32_t *topk, int64_t n, int K, int L, int32_t lo, int32_t *counts);

// rows.c
void ep_copy_rows(const uintptr_t *dst, const uintptr_t *src, const int64_t *lens, int64_t n, int64_t row_bytes,
                  int stream);
void ep_move_blocks(const uintptr_t *dst, const uintptr_t *src, const int64_t *lens, int64_t n);
void ep_scatter_rows(const uintptr_t *dst, const char *src, const int64_t *src_off, const int64_t *lens, int64_t n,
                     int64_t row_bytes, int stream);
void ep_reduce_rows(void *out, int out_dtype, const uintptr_t *src, const float *w, const int32_t *start,
                    int64_t n, int64_t hidden, int dtype, int stream);
void ep_sum_values(float *out, const uintptr_t *src, const int32_t *start, int64_t n, int K);

// convert.c
void ep_f32_to_bf16(uint16_t *dst, const float *src, int64_t n);
void ep_bf16_to_f32(float *dst, const uint16_t *src, int64_t n);

// sync.c
long ep_online_cpus(void);
#endif
