// bfloat16 conversion. ep_f32_to_bf16 rounds each float32 to the nearest
// bfloat16, ties to even (NaN stays NaN, overflow becomes infinity);
// ep_bf16_to_f32 widens exactly.
#include "kernels.h"
#include <string.h>

void ep_f32_to_bf16(uint16_t *dst, const float *src, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    uint32_t u;
    memcpy(&u, &src[i], 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
      dst[i] = (uint16_t)((u >> 16) | 0x40);
      continue;
    }
    u += 0x7fffu + ((u >> 16) & 1u);
    dst[i] = (uint16_t)(u >> 16);
  }
}

void ep_bf16_to_f32(float *dst, const uint16_t *src, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    uint32_t u = (uint32_t)src[i] << 16;
    memcpy(&dst[i], &u, 4);
  }
}
