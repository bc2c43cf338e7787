// FP8 kernels: the cast of dispatched rows to e4m3 with per-group scales,
// fused into the copy that places them, and its inverse.
//
// ep_quant_rows writes n rows: row i is the source row at src + src_off[i]
// (hidden elements of dtype, GOEP_ELEM_F32 or GOEP_ELEM_BF16) cast to e4m3
// at dst[i] (hidden bytes), with one float32 scale per group of
// EP_FP8_GROUP consecutive elements at dst_scales[i] (ceil(hidden/128)
// floats; the last group is shorter when hidden is not a multiple of 128).
// Per group:
//   amax  = the largest |x| over the group's finite elements (0 if none)
//   s     = max(amax / 448, 2^-126)                 (float32 division)
//   s     = 2^ceil(log2 s)                           (EP_SCALE_UE8M0 only)
//   q[c]  = e4m3(x[c] * (1/s))                       (ep_e4m3_bits)
// so an all-zero group has scale 2^-126 and codes 0, and dequantizing gives
// exact zeros. A row whose source is the previous row's (the same token
// going to several places) is copied from the previous destination instead
// of cast again: the cast runs once per token, its result stays in cache.
// Destinations are addresses (a peer's shared segment, an outbox, pinned Go
// memory); scales are stored with memcpy, so they may be unaligned.
//
// ep_dequant_rows sets out[r][c] = e4m3 value of q[r][c] * scales[r][c/128]
// in float32, rounded once to bfloat16 when out_dtype is GOEP_ELEM_BF16.
//
// The loops are built for AVX2 and the x86-64 baseline (picked at load time).
// They vectorise only if float operations may be evaluated unconditionally
// (the cast computes both the normal and the subnormal code of every
// element, then picks one): no-trapping-math allows it, and changes no
// result (nothing here reads the floating-point exception flags).
#pragma GCC optimize("no-trapping-math")
#include <float.h>

#include "kernels.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define HOT __attribute__((target_clones("avx2", "default")))
#else
#define HOT
#endif

static inline float f32_of(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static inline uint32_t bits_of(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}

// finite_abs is |x|'s bits, or 0 for a NaN or an infinity (signed, so that
// the max over a group vectorises without SSE4.1's unsigned max).
static inline int32_t finite_abs(uint32_t u) {
  int32_t a = (int32_t)(u & 0x7fffffffu);
  return a < 0x7f800000 ? a : 0;
}

// group_scale is the scale of a group whose largest finite |x| has bits m.
static inline float group_scale(int32_t m, int scale_mode) {
  float s = f32_of((uint32_t)m) / 448.0f;
  if (!(s >= FLT_MIN)) s = FLT_MIN;  // all-zero and tiny groups: 1/s stays finite
  if (scale_mode == EP_SCALE_UE8M0) s = f32_of((bits_of(s) + 0x7fffffu) & 0xff800000u);
  return s;
}

static inline __attribute__((always_inline)) void quant_f32(uint8_t *restrict q, float *restrict scale,
                                                            const float *restrict x, int64_t m, int scale_mode) {
  int32_t amax = 0;
  for (int64_t c = 0; c < m; c++) {
    int32_t a = finite_abs(bits_of(x[c]));
    amax = a > amax ? a : amax;
  }
  float s = group_scale(amax, scale_mode), inv = 1.0f / s;
  for (int64_t c = 0; c < m; c++) q[c] = ep_e4m3_bits(bits_of(x[c] * inv), bits_of(x[c]));
  memcpy(scale, &s, 4);
}

static inline __attribute__((always_inline)) void quant_bf16(uint8_t *restrict q, float *restrict scale,
                                                             const uint16_t *restrict x, int64_t m, int scale_mode) {
  int32_t amax = 0;
  for (int64_t c = 0; c < m; c++) {
    int32_t a = finite_abs((uint32_t)x[c] << 16);
    amax = a > amax ? a : amax;
  }
  float s = group_scale(amax, scale_mode), inv = 1.0f / s;
  for (int64_t c = 0; c < m; c++) {
    uint32_t u = (uint32_t)x[c] << 16;
    q[c] = ep_e4m3_bits(bits_of(f32_of(u) * inv), u);
  }
  memcpy(scale, &s, 4);
}

HOT void ep_quant_rows(const uintptr_t *dst, const uintptr_t *dst_scales, const char *src, const int64_t *src_off,
                       int64_t n, int64_t hidden, int dtype, int scale_mode) {
  int64_t groups = (hidden + EP_FP8_GROUP - 1) / EP_FP8_GROUP;
  for (int64_t i = 0; i < n; i++) {
    uint8_t *q = (uint8_t *)dst[i];
    char *sc = (char *)dst_scales[i];
    if (i > 0 && src_off[i] == src_off[i - 1]) {
      memcpy(q, (const void *)dst[i - 1], (size_t)hidden);
      memcpy(sc, (const void *)dst_scales[i - 1], 4 * (size_t)groups);
      continue;
    }
    const char *row = src + src_off[i];
    for (int64_t g = 0; g < groups; g++) {
      int64_t c0 = g * EP_FP8_GROUP, m = hidden - c0 < EP_FP8_GROUP ? hidden - c0 : EP_FP8_GROUP;
      float s;
      if (dtype == GOEP_ELEM_F32) quant_f32(q + c0, &s, (const float *)row + c0, m, scale_mode);
      else quant_bf16(q + c0, &s, (const uint16_t *)row + c0, m, scale_mode);
      memcpy(sc + 4 * g, &s, 4);
    }
  }
}

// e4m3_value is the e4m3 code q as a float32, exactly.
static inline float e4m3_value(uint8_t q) {
  uint32_t a = q & 0x7fu;
  float sub = (float)(a & 7u) * (1.0f / 512.0f);  // m/8 * 2^-6
  uint32_t normal = (a << 20) + (120u << 23);     // exponent from bias 7 to 127
  uint32_t u = a < 8 ? bits_of(sub) : normal;
  u = a == 0x7fu ? 0x7fc00000u : u;
  return f32_of(u | ((uint32_t)(q & 0x80u) << 24));
}

HOT void ep_dequant_rows(void *out, int out_dtype, const uint8_t *q, const float *scales, int64_t rows, int64_t hidden) {
  int64_t groups = (hidden + EP_FP8_GROUP - 1) / EP_FP8_GROUP;
  for (int64_t r = 0; r < rows; r++) {
    for (int64_t g = 0; g < groups; g++) {
      int64_t c0 = g * EP_FP8_GROUP, m = hidden - c0 < EP_FP8_GROUP ? hidden - c0 : EP_FP8_GROUP;
      float s = scales[r * groups + g];
      const uint8_t *qq = q + r * hidden + c0;
      if (out_dtype == GOEP_ELEM_F32) {
        float *o = (float *)out + r * hidden + c0;
        for (int64_t c = 0; c < m; c++) o[c] = e4m3_value(qq[c]) * s;
      } else {
        uint16_t *o = (uint16_t *)out + r * hidden + c0;
        for (int64_t c = 0; c < m; c++) o[c] = ep_bf16_bits(bits_of(e4m3_value(qq[c]) * s));
      }
    }
  }
}
