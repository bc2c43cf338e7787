// Row kernels: the byte-moving and arithmetic work of dispatch and combine.
//
// ep_copy_rows copies n rows, row i from src[i] to dst[i] (pointers into the
// caller's tensor, a peer's shared-memory segment or a staging buffer), each
// row_bytes long, or lens[i] bytes when lens is not NULL.
//
// ep_reduce_rows computes, for each output row i < n,
//   out[i] = sum over j in [start[i], start[i+1]) of w[j] * src[j]
// (w == NULL: every weight is 1) over `hidden` elements, accumulating in
// float32 in the order of j, so the result does not depend on when the rows
// arrived. src rows have element type dtype, out rows out_dtype (EP_F32 or
// EP_BF16; bfloat16 results are rounded to nearest even once, at the end). A
// row with no sources is zero. acc is scratch for `hidden` floats.
//
// ep_gather_values sets out[i] = *src[i] (0 where src[i] is NULL), and
// ep_sum_values sets out[i*K+k] = sum over j in [start[i], start[i+1]) of
// src[j][k]: they carry per-slot scalars back with the rows.
#include "kernels.h"
#include <string.h>

void ep_copy_rows(void *const *dst, const void *const *src, const int64_t *lens, int64_t n, int64_t row_bytes) {
  for (int64_t i = 0; i < n; i++) memcpy(dst[i], src[i], (size_t)(lens ? lens[i] : row_bytes));
}

static inline float bf16_load(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static inline uint16_t bf16_round(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);  // NaN stays NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

static void axpy_f32(float *restrict acc, const float *restrict x, float w, int64_t h, int first) {
  if (first) {
    if (w == 1.0f) memcpy(acc, x, sizeof(float) * (size_t)h);
    else for (int64_t i = 0; i < h; i++) acc[i] = w * x[i];
  } else if (w == 1.0f) {
    for (int64_t i = 0; i < h; i++) acc[i] += x[i];
  } else {
    for (int64_t i = 0; i < h; i++) acc[i] += w * x[i];
  }
}

static void axpy_bf16(float *restrict acc, const uint16_t *restrict x, float w, int64_t h, int first) {
  if (first) {
    for (int64_t i = 0; i < h; i++) acc[i] = w * bf16_load(x[i]);
  } else {
    for (int64_t i = 0; i < h; i++) acc[i] += w * bf16_load(x[i]);
  }
}

void ep_reduce_rows(void *out, int out_dtype, const void *const *src, const float *w, const int32_t *start,
                    int64_t n, int64_t hidden, int dtype, float *acc) {
  for (int64_t i = 0; i < n; i++) {
    float *a = out_dtype == EP_F32 ? (float *)out + i * hidden : acc;
    int32_t j0 = start[i], j1 = start[i + 1];
    if (j0 == j1) {
      memset(a, 0, sizeof(float) * (size_t)hidden);
    }
    for (int32_t j = j0; j < j1; j++) {
      float wj = w ? w[j] : 1.0f;
      if (dtype == EP_F32) axpy_f32(a, (const float *)src[j], wj, hidden, j == j0);
      else axpy_bf16(a, (const uint16_t *)src[j], wj, hidden, j == j0);
    }
    if (out_dtype == EP_BF16) {
      uint16_t *o = (uint16_t *)out + i * hidden;
      for (int64_t k = 0; k < hidden; k++) o[k] = bf16_round(a[k]);
    }
  }
}

void ep_gather_values(float *out, const float *const *src, int64_t n) {
  for (int64_t i = 0; i < n; i++) out[i] = src[i] ? *src[i] : 0.0f;
}

void ep_sum_values(float *out, const float *const *src, const int32_t *start, int64_t n, int K) {
  for (int64_t i = 0; i < n; i++) {
    for (int k = 0; k < K; k++) {
      float s = 0.0f;
      for (int32_t j = start[i]; j < start[i + 1]; j++) s += src[j][k];
      out[i * K + k] = s;
    }
  }
}
