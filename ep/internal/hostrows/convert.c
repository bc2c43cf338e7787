// bfloat16 conversion. ep_f32_to_bf16 rounds each float32 to the nearest
// bfloat16, ties to even (NaN stays NaN, overflow becomes infinity);
// ep_bf16_to_f32 widens exactly. Both are branch-free so that they vectorise,
// and built for AVX2 and the x86-64 baseline (picked at load time).
#include "kernels.h"
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define HOT __attribute__((target_clones("avx2", "default")))
#else
#define HOT
#endif

HOT void ep_f32_to_bf16(uint16_t *restrict dst, const float *restrict src, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    uint32_t u;
    memcpy(&u, &src[i], 4);
    dst[i] = ep_bf16_bits(u);
  }
}

HOT void ep_bf16_to_f32(float *restrict dst, const uint16_t *restrict src, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    uint32_t u = (uint32_t)src[i] << 16;
    memcpy(&dst[i], &u, 4);
  }
}
