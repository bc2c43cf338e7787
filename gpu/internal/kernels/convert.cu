// convert.cu: bfloat16 conversion on the device, as ep/convert.c does it.
// Compiled after prelude.cuh.
//
// goep_f32_to_bf16 rounds each float32 to the nearest bfloat16, ties to
// even (NaN stays NaN, overflow becomes infinity), by bit operations:
// ep_f32_to_bf16 exactly, NaN payloads included. goep_bf16_to_f32 widens
// exactly. One thread per element, grid-stride.

GOEP_KERNEL goep_f32_to_bf16(u16 *dst, const float *src, i64 n) {
  for (i64 i = GOEP_THREAD; i < n; i += GOEP_THREADS) dst[i] = bf16_round(src[i]);
}

GOEP_KERNEL goep_bf16_to_f32(float *dst, const u16 *src, i64 n) {
  for (i64 i = GOEP_THREAD; i < n; i += GOEP_THREADS) dst[i] = bf16_load(src[i]);
}
