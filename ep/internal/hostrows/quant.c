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
// impl 0 picks the fastest cast this CPU has, 1 the portable one (the
// tests run both: they must agree bit for bit).
//
// ep_dequant_rows sets out[r][c] = e4m3 value of q[r][c] * scales[r][c/128]
// in float32, rounded once to bfloat16 when out_dtype is GOEP_ELEM_BF16.
//
// ep_reduce_rows_fp8 is ep_reduce_rows over rows that travelled as e4m3 (a
// low-precision combine): for each output row i < n,
//   out[i][c] = sum over j in [start[i], start[i+1]) of w[j] * v[j][c],
//   v[j][c]   = e4m3 value of codes[j][c] * scales[j][c/128]  (float32)
// each product rounded to float32 as written (the dequantized value as
// ep_dequant_rows makes it in float32, then times the weight), accumulated
// in float32 in the order of j (the first term is the sum's start, as in
// ep_reduce_rows), rounded once to out_dtype; a row with no sources is
// zero. codes[j] and scales[j] are addresses.
//
// Two casts compute the same thing. The portable one (ep_e4m3_bits per
// element) is built for AVX2 and the x86-64 baseline (picked at load time);
// it vectorises only if float operations may be evaluated unconditionally
// (it computes both the normal and the subnormal code of every element,
// then picks one): no-trapping-math allows it, and changes no result
// (nothing here reads the floating-point exception flags). The AVX2 one
// (x86-64 with AVX2, checked at run time) rounds by adding a power of two
// whose last mantissa bit weighs one e4m3 step at the value's exponent
// (2^(max(e,-6)+20), with the value's sign): the float addition rounds to
// nearest even at exactly the right place, normal or subnormal, and the
// code is read off the sum's bits; it takes the groups of 128 finite
// values, the portable cast the others (a NaN or an infinity in the group,
// a last partial group).
#pragma GCC optimize("no-trapping-math")
#include <float.h>
#include <string.h>

#include "kernels.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define EP_AVX2_CAST 1
#endif

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

#ifdef EP_AVX2_CAST
#define AVX2 __attribute__((target("avx2")))

// cast8 casts 8 scaled values v to their e4m3 codes without the sign, one
// per 32-bit lane (finite v only).
AVX2 static inline __m256i cast8(__m256 v) {
  const __m256i expmask = _mm256_set1_epi32(0x7f800000), minexp = _mm256_set1_epi32(0x3c800000);
  const __m256i m20 = _mm256_set1_epi32(20 << 23), signm = _mm256_set1_epi32((int)0x80000000u);
  const __m256i bias = _mm256_set1_epi32(968), sat = _mm256_set1_epi32(0x7e);
  __m256i vb = _mm256_castps_si256(v);
  // the exponent, at least 2^-6's (below it, e4m3's steps are 2^-9)
  __m256i expc = _mm256_max_epi32(_mm256_and_si256(vb, expmask), minexp);
  // 2^(e+20), with v's sign: its last mantissa bit weighs 2^(e-3)
  __m256i big = _mm256_or_si256(_mm256_add_epi32(expc, m20), _mm256_and_si256(vb, signm));
  __m256i sum = _mm256_castps_si256(_mm256_add_ps(v, _mm256_castsi256_ps(big)));
  // steps of 2^(e-3) in |v| (8..16 when normal), plus 8*(e+6)
  __m256i code = _mm256_add_epi32(_mm256_sub_epi32(sum, big), _mm256_sub_epi32(_mm256_srli_epi32(expc, 20), bias));
  return _mm256_min_epu32(code, sat);
}

// amax_bf16_avx2 is the largest |x| of a group of 128 bfloat16 values, as
// float32 bits, or -1 if one of them is a NaN or an infinity.
AVX2 static int32_t amax_bf16_avx2(const uint16_t *x) {
  const __m256i abs16 = _mm256_set1_epi16(0x7fff);
  __m256i m = _mm256_setzero_si256();
  for (int c = 0; c < EP_FP8_GROUP; c += 16)
    m = _mm256_max_epu16(m, _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(x + c)), abs16));
  __m128i h = _mm_max_epu16(_mm256_castsi256_si128(m), _mm256_extracti128_si256(m, 1));
  h = _mm_max_epu16(h, _mm_srli_si128(h, 8));
  h = _mm_max_epu16(h, _mm_srli_si128(h, 4));
  h = _mm_max_epu16(h, _mm_srli_si128(h, 2));
  int32_t amax = _mm_extract_epi16(h, 0);
  return amax >= 0x7f80 ? -1 : amax << 16;
}

// amax_f32_avx2 is amax_bf16_avx2 for float32 values.
AVX2 static int32_t amax_f32_avx2(const float *x) {
  const __m256i abs32 = _mm256_set1_epi32(0x7fffffff);
  __m256i m = _mm256_setzero_si256();
  for (int c = 0; c < EP_FP8_GROUP; c += 8)
    m = _mm256_max_epi32(m, _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(x + c)), abs32));
  __m128i h = _mm_max_epi32(_mm256_castsi256_si128(m), _mm256_extracti128_si256(m, 1));
  h = _mm_max_epi32(h, _mm_srli_si128(h, 8));
  h = _mm_max_epi32(h, _mm_srli_si128(h, 4));
  int32_t amax = _mm_cvtsi128_si32(h);
  return amax >= 0x7f800000 ? -1 : amax;
}

// cast_bf16_avx2 casts a group of 128 finite bfloat16 values with scale
// 1/inv.
AVX2 static void cast_bf16_avx2(uint8_t *q, const uint16_t *x, __m256 inv) {
  const __m256i sign16 = _mm256_set1_epi16((short)0x8000), zero = _mm256_setzero_si256();
  for (int c = 0; c < EP_FP8_GROUP; c += 32) {
    __m256i codes[2];
    for (int k = 0; k < 2; k++) {
      __m256i X = _mm256_loadu_si256((const __m256i *)(x + c + 16 * k));
      // bfloat16 -> float32 by placing each word in a lane's high half:
      // elements 0-3 and 8-11, then 4-7 and 12-15, which the pack puts back
      // in order
      __m256i lo = cast8(_mm256_mul_ps(_mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, X)), inv));
      __m256i hi = cast8(_mm256_mul_ps(_mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, X)), inv));
      codes[k] = _mm256_or_si256(_mm256_packs_epi32(lo, hi), _mm256_srli_epi16(_mm256_and_si256(X, sign16), 8));
    }
    __m256i bytes = _mm256_permute4x64_epi64(_mm256_packus_epi16(codes[0], codes[1]), 0xd8);
    _mm256_storeu_si256((__m256i *)(q + c), bytes);
  }
}

// cast_f32_avx2 is cast_bf16_avx2 for float32 values.
AVX2 static void cast_f32_avx2(uint8_t *q, const float *x, __m256 inv) {
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7), signbit = _mm256_set1_epi32(0x80);
  for (int c = 0; c < EP_FP8_GROUP; c += 32) {
    __m256i codes[4];
    for (int k = 0; k < 4; k++) {
      __m256 X = _mm256_loadu_ps(x + c + 8 * k);
      __m256i sign = _mm256_and_si256(_mm256_srli_epi32(_mm256_castps_si256(X), 24), signbit);
      codes[k] = _mm256_or_si256(cast8(_mm256_mul_ps(X, inv)), sign);
    }
    __m256i bytes = _mm256_packus_epi16(_mm256_packs_epi32(codes[0], codes[1]), _mm256_packs_epi32(codes[2], codes[3]));
    _mm256_storeu_si256((__m256i *)(q + c), _mm256_permutevar8x32_epi32(bytes, order));
  }
}

// quant_groups_avx2 casts n whole groups (n <= 64) of a row: first every
// group's amax and scale (so that the divisions overlap), then the casts.
// It returns, as bits, the groups it left to the portable cast (a NaN or
// an infinity in them).
AVX2 static uint64_t quant_groups_avx2(uint8_t *q, char *sc, const char *row, int n, int dtype, int scale_mode) {
  int32_t amax[64];
  float inv[64];
  uint64_t left = 0;
  for (int g = 0; g < n; g++)
    amax[g] = dtype == GOEP_ELEM_F32 ? amax_f32_avx2((const float *)row + g * EP_FP8_GROUP)
                                     : amax_bf16_avx2((const uint16_t *)row + g * EP_FP8_GROUP);
  for (int g = 0; g < n; g++) {
    if (amax[g] < 0) {
      left |= (uint64_t)1 << g;
      continue;
    }
    float s = group_scale(amax[g], scale_mode);
    inv[g] = 1.0f / s;
    memcpy(sc + 4 * g, &s, 4);
  }
  for (int g = 0; g < n; g++) {
    if (left >> g & 1) continue;
    if (dtype == GOEP_ELEM_F32) cast_f32_avx2(q + g * EP_FP8_GROUP, (const float *)row + g * EP_FP8_GROUP, _mm256_set1_ps(inv[g]));
    else cast_bf16_avx2(q + g * EP_FP8_GROUP, (const uint16_t *)row + g * EP_FP8_GROUP, _mm256_set1_ps(inv[g]));
  }
  return left;
}

static int have_avx2(void) {
  static int have = -1;
  if (have < 0) have = __builtin_cpu_supports("avx2") ? 1 : 0;
  return have;
}
#endif

// quant_group casts group g of a row with the portable cast.
HOT static void quant_group(uint8_t *q, char *sc, const char *row, int64_t hidden, int64_t g, int dtype, int scale_mode) {
  int64_t c0 = g * EP_FP8_GROUP, m = hidden - c0 < EP_FP8_GROUP ? hidden - c0 : EP_FP8_GROUP;
  float s;
  if (dtype == GOEP_ELEM_F32) quant_f32(q + c0, &s, (const float *)row + c0, m, scale_mode);
  else quant_bf16(q + c0, &s, (const uint16_t *)row + c0, m, scale_mode);
  memcpy(sc + 4 * g, &s, 4);
}

// quant_row casts one row: its whole groups with the AVX2 cast when fast
// (64 at a time), the rest with the portable one.
static void quant_row(uint8_t *q, char *sc, const char *row, int64_t hidden, int dtype, int scale_mode, int fast) {
  int64_t groups = (hidden + EP_FP8_GROUP - 1) / EP_FP8_GROUP, g = 0;
#ifdef EP_AVX2_CAST
  if (fast) {
    size_t es = dtype == GOEP_ELEM_F32 ? 4 : 2;
    for (int64_t whole = hidden / EP_FP8_GROUP; g < whole;) {
      int n = whole - g < 64 ? (int)(whole - g) : 64;
      uint64_t left = quant_groups_avx2(q + g * EP_FP8_GROUP, sc + 4 * g, row + (size_t)g * EP_FP8_GROUP * es, n, dtype,
                                        scale_mode);
      for (int k = 0; k < n; k++)
        if (left >> k & 1) quant_group(q, sc, row, hidden, g + k, dtype, scale_mode);
      g += n;
    }
  }
#else
  (void)fast;
#endif
  for (; g < groups; g++) quant_group(q, sc, row, hidden, g, dtype, scale_mode);
}

void ep_quant_rows(const uintptr_t *dst, const uintptr_t *dst_scales, const char *src, const int64_t *src_off,
                   int64_t n, int64_t hidden, int dtype, int scale_mode, int impl) {
  int fast = 0;
#ifdef EP_AVX2_CAST
  fast = impl == 0 && have_avx2();
#else
  (void)impl;
#endif
  int64_t groups = (hidden + EP_FP8_GROUP - 1) / EP_FP8_GROUP;
  for (int64_t i = 0; i < n; i++) {
    uint8_t *q = (uint8_t *)dst[i];
    char *sc = (char *)dst_scales[i];
    if (i > 0 && src_off[i] == src_off[i - 1]) {
      memcpy(q, (const void *)dst[i - 1], (size_t)hidden);
      memcpy(sc, (const void *)dst_scales[i - 1], 4 * (size_t)groups);
      continue;
    }
    quant_row(q, sc, src + src_off[i], hidden, dtype, scale_mode, fast);
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

HOT void ep_reduce_rows_fp8(void *out, int out_dtype, const uintptr_t *codes, const uintptr_t *scales, const float *w,
                            const int32_t *start, int64_t n, int64_t hidden) {
  enum { CH = 512 };  // a multiple of EP_FP8_GROUP: a chunk's groups are whole
  float a[CH] __attribute__((aligned(64)));
  size_t oes = out_dtype == GOEP_ELEM_F32 ? 4 : 2;
  for (int64_t i = 0; i < n; i++) {
    int32_t j0 = start[i], j1 = start[i + 1];
    char *orow = (char *)out + (size_t)i * (size_t)hidden * oes;
    for (int64_t c0 = 0; c0 < hidden; c0 += CH) {
      int64_t m = hidden - c0 < CH ? hidden - c0 : CH;
      if (j0 == j1)
        for (int64_t c = 0; c < m; c++) a[c] = 0.0f;
      for (int32_t j = j0; j < j1; j++) {
        const uint8_t *q = (const uint8_t *)codes[j] + c0;
        const float *sc = (const float *)scales[j] + c0 / EP_FP8_GROUP;
        float wj = w ? w[j] : 1.0f;
        for (int64_t g0 = 0; g0 < m; g0 += EP_FP8_GROUP) {
          int64_t gm = m - g0 < EP_FP8_GROUP ? m - g0 : EP_FP8_GROUP;
          float s = sc[g0 / EP_FP8_GROUP];
          if (j == j0)
            for (int64_t c = g0; c < g0 + gm; c++) {
              float v = e4m3_value(q[c]) * s;
              a[c] = wj * v;
            }
          else
            for (int64_t c = g0; c < g0 + gm; c++) {
              float v = e4m3_value(q[c]) * s;
              a[c] += wj * v;
            }
        }
      }
      if (out_dtype == GOEP_ELEM_F32) {
        memcpy(orow + (size_t)c0 * 4, a, (size_t)m * 4);
      } else {
        uint16_t *o = (uint16_t *)(orow + (size_t)c0 * 2);
        for (int64_t c = 0; c < m; c++) o[c] = ep_bf16_bits(bits_of(a[c]));
      }
    }
  }
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
