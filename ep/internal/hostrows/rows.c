// Row kernels: the byte-moving and arithmetic work of dispatch and combine.
//
// ep_copy_rows copies n rows, row i from src[i] to dst[i] (pointers into the
// caller's tensor, a peer's shared-memory segment or a staging buffer), each
// row_bytes long, or lens[i] bytes when lens is not NULL.
//
// ep_move_blocks moves n blocks, block i of lens[i] bytes from src[i] to
// dst[i], in order, each as memmove does: blocks may overlap their own
// destination (compacting a buffer in place).
//
// ep_scatter_rows copies n rows of row_bytes (or lens[i] bytes when lens is
// not NULL), row i from src + src_off[i] (one buffer of the caller's, passed
// as a base so that no table holds a pointer into it) to dst[i].
//
// With stream set, ep_copy_rows and ep_scatter_rows write rows of 4 KiB or
// more with streaming (non-temporal) stores: the caller says that the whole
// operation, of which this call may be a part, writes more than the caches
// hold and that this core will not read the rows back, so the stores need not
// read the destination's cache lines first (a third of a copy's memory
// traffic).
//
// ep_reduce_rows computes, for each output row i < n,
//   out[i] = sum over j in [start[i], start[i+1]) of w[j] * src[j]
// (w == NULL: every weight is 1) over `hidden` elements, accumulating in
// float32 in the order of j, so the result does not depend on when the rows
// arrived. src rows have element type dtype, out rows out_dtype (GOEP_ELEM_F32 or
// GOEP_ELEM_BF16; bfloat16 results are rounded to nearest even once, at the end). A
// row with no sources is zero; a row with one source of weight 1 is a copy.
// It works in chunks of 512 elements held in L1 across all of a row's
// sources, prefetches each source's next chunk, and writes outputs of 8 MiB
// or more with streaming stores, or every output with stream set (a call
// that is a part of a larger reduction).
//
// The hot loops are built twice, for AVX2 and for the x86-64 baseline, and
// picked at load time (GCC target_clones), so the same binary runs anywhere.
//
// ep_sum_values sets out[i*K+k] = sum over j in [start[i], start[i+1]) of
// src[j][k]: they carry per-slot scalars back with the rows.
#include "kernels.h"
#include <string.h>
#if defined(__x86_64__)
#include <emmintrin.h>
#endif

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define HOT __attribute__((target_clones("avx2", "default")))
#else
#define HOT
#endif

// STREAM_ROW is the least row that copy_row writes with streaming stores.
#define STREAM_ROW 4096

// copy_row copies n bytes from src to dst, with streaming stores when stream
// is set, the row is long and dst is 16-byte aligned; it says whether it
// streamed.
static int copy_row(char *restrict dst, const char *restrict src, size_t n, int stream) {
#if defined(__x86_64__)
  if (stream && n >= STREAM_ROW && ((uintptr_t)dst & 15) == 0) {
    size_t i = 0;
    for (; i + 64 <= n; i += 64) {
      __m128i a = _mm_loadu_si128((const __m128i *)(src + i)), b = _mm_loadu_si128((const __m128i *)(src + i + 16));
      __m128i c = _mm_loadu_si128((const __m128i *)(src + i + 32)), d = _mm_loadu_si128((const __m128i *)(src + i + 48));
      _mm_stream_si128((__m128i *)(dst + i), a);
      _mm_stream_si128((__m128i *)(dst + i + 16), b);
      _mm_stream_si128((__m128i *)(dst + i + 32), c);
      _mm_stream_si128((__m128i *)(dst + i + 48), d);
    }
    for (; i + 16 <= n; i += 16) _mm_stream_si128((__m128i *)(dst + i), _mm_loadu_si128((const __m128i *)(src + i)));
    memcpy(dst + i, src + i, n - i);
    return 1;
  }
#endif
  (void)stream;
  memcpy(dst, src, n);
  return 0;
}

// fence_streams orders streaming stores before any later store (a flag).
static inline void fence_streams(int streamed) {
#if defined(__x86_64__)
  if (streamed) _mm_sfence();
#endif
  (void)streamed;
}

void ep_copy_rows(const uintptr_t *dst, const uintptr_t *src, const int64_t *lens, int64_t n, int64_t row_bytes,
                  int stream) {
  int streamed = 0;
  for (int64_t i = 0; i < n; i++)
    streamed |= copy_row((char *)dst[i], (const char *)src[i], (size_t)(lens ? lens[i] : row_bytes), stream);
  fence_streams(streamed);
}

void ep_move_blocks(const uintptr_t *dst, const uintptr_t *src, const int64_t *lens, int64_t n) {
  for (int64_t i = 0; i < n; i++) memmove((void *)dst[i], (const void *)src[i], (size_t)lens[i]);
}

void ep_scatter_rows(const uintptr_t *dst, const char *src, const int64_t *src_off, const int64_t *lens, int64_t n,
                     int64_t row_bytes, int stream) {
  int streamed = 0;
  for (int64_t i = 0; i < n; i++)
    streamed |= copy_row((char *)dst[i], src + src_off[i], (size_t)(lens ? lens[i] : row_bytes), stream);
  fence_streams(streamed);
}

static inline float bf16_load(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

enum { CHUNK = 512 };  // floats accumulated at a time: 2 KiB, stays in L1

// Streaming (non-temporal) stores skip reading the output's cache lines
// before writing them; worth it only for outputs larger than the caches.
#define STREAM_BYTES ((int64_t)8 << 20)

static void store_row(char *restrict dst, const void *restrict src, size_t n, int stream) {
#if defined(__x86_64__)
  if (stream && ((uintptr_t)dst & 15) == 0 && ((uintptr_t)src & 15) == 0 && (n & 15) == 0) {
    for (size_t i = 0; i < n; i += 16)
      _mm_stream_si128((__m128i *)(dst + i), _mm_load_si128((const __m128i *)((const char *)src + i)));
    return;
  }
#endif
  (void)stream;
  memcpy(dst, src, n);
}

static inline __attribute__((always_inline)) void add_f32(float *restrict a, const float *restrict x, float w, int64_t m, int first) {
  if (first)
    for (int64_t i = 0; i < m; i++) a[i] = w * x[i];
  else
    for (int64_t i = 0; i < m; i++) a[i] += w * x[i];
}

static inline __attribute__((always_inline)) void add_bf16(float *restrict a, const uint16_t *restrict x, float w, int64_t m, int first) {
  if (first)
    for (int64_t i = 0; i < m; i++) a[i] = w * bf16_load(x[i]);
  else
    for (int64_t i = 0; i < m; i++) a[i] += w * bf16_load(x[i]);
}

// round_bf16 rounds m floats to bfloat16 (ep_bf16_bits).
static inline __attribute__((always_inline)) void round_bf16(uint16_t *restrict o, const float *restrict a, int64_t m) {
  for (int64_t k = 0; k < m; k++) {
    uint32_t u;
    memcpy(&u, &a[k], 4);
    o[k] = ep_bf16_bits(u);
  }
}

HOT void ep_reduce_rows(void *out, int out_dtype, const uintptr_t *src, const float *w, const int32_t *start,
                        int64_t n, int64_t hidden, int dtype, int stream) {
  size_t es = dtype == GOEP_ELEM_F32 ? 4 : 2, oes = out_dtype == GOEP_ELEM_F32 ? 4 : 2;
  stream = stream || n * hidden * (int64_t)oes >= STREAM_BYTES;
  float a[CHUNK] __attribute__((aligned(64)));
  uint16_t b[CHUNK] __attribute__((aligned(64)));
  for (int64_t i = 0; i < n; i++) {
    int32_t j0 = start[i], j1 = start[i + 1];
    char *orow = (char *)out + (size_t)i * (size_t)hidden * oes;
    if (j1 == j0 + 1 && (w == NULL || w[j0] == 1.0f) && dtype == out_dtype) {
      // one source, weight 1: the sum is the row itself, bit for bit
      store_row(orow, (const void *)src[j0], (size_t)hidden * oes, stream);
      continue;
    }
    for (int64_t c = 0; c < hidden; c += CHUNK) {
      int64_t m = hidden - c < CHUNK ? hidden - c : CHUNK;
      if (j0 == j1) memset(a, 0, sizeof(float) * (size_t)m);
      for (int32_t j = j0; j < j1; j++) {
        const char *x = (const char *)src[j] + (size_t)c * es;  // src[j]: an address
        // Ask early for this source's next chunk, or the next row's first
        // (only its bytes: a short row is not a whole chunk).
        const char *next = NULL;
        int64_t ahead = 0;
        if (c + CHUNK < hidden) next = x + CHUNK * es, ahead = hidden - c - CHUNK;
        else if (i + 1 < n && j - j0 < start[i + 2] - start[i + 1]) next = (const char *)src[start[i + 1] + (j - j0)], ahead = hidden;
        if (next)
          for (size_t p = 0; p < (size_t)(ahead < CHUNK ? ahead : CHUNK) * es; p += 64) __builtin_prefetch(next + p);
        float wj = w ? w[j] : 1.0f;
        if (dtype == GOEP_ELEM_F32) add_f32(a, (const float *)x, wj, m, j == j0);
        else add_bf16(a, (const uint16_t *)x, wj, m, j == j0);
      }
      if (out_dtype == GOEP_ELEM_F32) {
        store_row(orow + (size_t)c * 4, a, (size_t)m * 4, stream);
      } else {
        round_bf16(b, a, m);
        store_row(orow + (size_t)c * 2, b, (size_t)m * 2, stream);
      }
    }
  }
#if defined(__x86_64__)
  if (stream) _mm_sfence();  // streaming stores are weakly ordered: finish them before any flag
#endif
}

void ep_sum_values(float *out, const uintptr_t *src, const int32_t *start, int64_t n, int K) {
  for (int64_t i = 0; i < n; i++) {
    for (int k = 0; k < K; k++) {
      float s = 0.0f;
      for (int32_t j = start[i]; j < start[i + 1]; j++) s += ((const float *)src[j])[k];
      out[i * K + k] = s;
    }
  }
}
