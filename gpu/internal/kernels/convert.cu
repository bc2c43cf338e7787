// convert.cu: bfloat16 conversion on the device, as ep/internal/hostrows/convert.c does it.
// Compiled after prelude.cuh.
//
// goep_f32_to_bf16 rounds each float32 to the nearest bfloat16, ties to
// even (NaN stays NaN, overflow becomes infinity), by bit operations:
// ep_f32_to_bf16 exactly, NaN payloads included. goep_bf16_to_f32 widens
// exactly. Grid-stride over pieces of 8 elements (16 bytes of bfloat16,
// 32 of float32) when both arrays are 16-byte aligned, the last n % 8
// elements one per thread; one element per thread otherwise.

GOEP_FN u32 bf16_pair(u32 lo, u32 hi) { return (u32)bf16_round(u2f(lo)) | ((u32)bf16_round(u2f(hi)) << 16); }

GOEP_KERNEL goep_f32_to_bf16(u16 *dst, const float *src, i64 n) {
  i64 done = 0;
  if ((((uptr)dst | (uptr)src) & 15) == 0) {
    i64 m = n / 8;
    for (i64 c = GOEP_THREAD; c < m; c += GOEP_THREADS) {
      v16 a = load16((const u8 *)(src + 8 * c)), b = load16((const u8 *)(src + 8 * c + 4)), r;
      r.x = bf16_pair(a.x, a.y), r.y = bf16_pair(a.z, a.w), r.z = bf16_pair(b.x, b.y), r.w = bf16_pair(b.z, b.w);
      store16((u8 *)(dst + 8 * c), r);
    }
    done = 8 * m;
  }
  for (i64 i = done + GOEP_THREAD; i < n; i += GOEP_THREADS) dst[i] = bf16_round(src[i]);
}

GOEP_FN u32 bf16_lo(u32 w) { return f2u(bf16_load((u16)(w & 0xffffu))); }
GOEP_FN u32 bf16_hi(u32 w) { return f2u(bf16_load((u16)(w >> 16))); }

GOEP_KERNEL goep_bf16_to_f32(float *dst, const u16 *src, i64 n) {
  i64 done = 0;
  if ((((uptr)dst | (uptr)src) & 15) == 0) {
    i64 m = n / 8;
    for (i64 c = GOEP_THREAD; c < m; c += GOEP_THREADS) {
      v16 a = load16((const u8 *)(src + 8 * c)), lo, hi;
      lo.x = bf16_lo(a.x), lo.y = bf16_hi(a.x), lo.z = bf16_lo(a.y), lo.w = bf16_hi(a.y);
      hi.x = bf16_lo(a.z), hi.y = bf16_hi(a.z), hi.z = bf16_lo(a.w), hi.w = bf16_hi(a.w);
      store16((u8 *)(dst + 8 * c), lo);
      store16((u8 *)(dst + 8 * c + 4), hi);
    }
    done = 8 * m;
  }
  for (i64 i = done + GOEP_THREAD; i < n; i += GOEP_THREADS) dst[i] = bf16_load(src[i]);
}
