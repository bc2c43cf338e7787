// reduce.cu: the weighted combine of ep_reduce_rows (ep/internal/hostrows/rows.c) on the
// device. Compiled after prelude.cuh.
//
// goep_reduce_rows computes, for each output row i < n,
//   out[i] = sum over j in [start[i], start[i+1]) of w[j] * src[j]
// over `hidden` elements (w NULL: every weight is 1), where src[j] is the
// device address of a source row (a CSR list of source rows per output row).
// Source rows have element type dtype, output rows out_dtype (GOEP_ELEM_F32 or
// GOEP_ELEM_BF16). The sum is accumulated in float32 in the order of j, the
// first term assigned rather than added to zero, a weight of exactly 1 on a
// float32 row adding the value itself, and each product and sum rounded
// once (no fused multiply-add): the arithmetic of ep_reduce_rows, so results
// match the CPU bit for bit (NaN payloads aside: the device makes every NaN
// its canonical NaN). bfloat16 results are rounded to nearest even once, at
// the end. A row with no sources is zero. A source address of 0 is skipped
// (ep_reduce_rows has none).
//
// Work items are (row, segment) pairs, a segment being as many elements as
// the block's threads take at once, so that a few long rows still fill the
// device. Each thread reads 16 bytes of each source row at a time (8
// bfloat16 or 4 float32 elements), up to REDUCE_BATCH sources' pieces in
// flight before it adds them in order, when the row's size and every
// address allow it; else one element at a time. The arithmetic per element
// is the same either way.

#define REDUCE_BATCH 4

// REDUCE_PIECE is the body of reduce_piece_bf16 and reduce_piece_f32: it
// reduces the VW elements of output row i from element h on, from 16-byte
// pieces of its sources. VW is a constant, so that every array is indexed
// by constants once the loops are unrolled and stays in registers.
#define REDUCE_PIECE(VW, F32)                                                                        \
  float acc[VW];                                                                                     \
  int first = 1;                                                                                     \
  for (i32 j = j0; j < j1; j += REDUCE_BATCH) {                                                      \
    v16 v[REDUCE_BATCH];                                                                             \
    float wv[REDUCE_BATCH];                                                                          \
    int ok[REDUCE_BATCH];                                                                            \
    GOEP_UNROLL                                                                                      \
    for (int c = 0; c < REDUCE_BATCH; c++) {                                                         \
      u64 p = j + c < j1 ? src[j + c] : 0;                                                           \
      ok[c] = p != 0;                                                                                \
      wv[c] = 1.0f;                                                                                  \
      if (ok[c]) {                                                                                   \
        v[c] = load16((const u8 *)(uptr)p + h * (F32 ? 4 : 2));                                      \
        if (w) wv[c] = w[j + c];                                                                     \
      }                                                                                              \
    }                                                                                                \
    GOEP_UNROLL                                                                                      \
    for (int c = 0; c < REDUCE_BATCH; c++) {                                                         \
      if (!ok[c]) continue;                                                                          \
      u32 word[4] = {v[c].x, v[c].y, v[c].z, v[c].w};                                                \
      GOEP_UNROLL                                                                                    \
      for (int e = 0; e < VW; e++) {                                                                 \
        float term;                                                                                  \
        if (F32) {                                                                                   \
          float x = u2f(word[e]);                                                                    \
          term = wv[c] == 1.0f ? x : fmul(wv[c], x);                                                 \
        } else {                                                                                     \
          term = fmul(wv[c], bf16_load((u16)(word[e / 2] >> (16 * (e % 2)))));                       \
        }                                                                                            \
        acc[e] = first ? term : fadd(acc[e], term);                                                  \
      }                                                                                              \
      first = 0;                                                                                     \
    }                                                                                                \
  }                                                                                                  \
  if (first) {                                                                                       \
    GOEP_UNROLL                                                                                      \
    for (int e = 0; e < VW; e++) acc[e] = 0.0f;                                                      \
  }                                                                                                  \
  if (out_dtype == GOEP_ELEM_F32) {                                                                  \
    float *o = (float *)out + i * hidden + h;                                                        \
    if (VW == 4 && ((uptr)o & 15) == 0) {                                                            \
      v16 r;                                                                                         \
      r.x = f2u(acc[0]), r.y = f2u(acc[1]), r.z = f2u(acc[2]), r.w = f2u(acc[3]);                    \
      store16((u8 *)o, r);                                                                           \
    } else {                                                                                         \
      GOEP_UNROLL                                                                                    \
      for (int e = 0; e < VW; e++) o[e] = acc[e];                                                    \
    }                                                                                                \
  } else {                                                                                           \
    u16 *o = (u16 *)out + i * hidden + h;                                                            \
    if (VW == 8 && ((uptr)o & 15) == 0) {                                                            \
      u32 r2[4];                                                                                     \
      GOEP_UNROLL                                                                                    \
      for (int e = 0; e < 4; e++) r2[e] = (u32)bf16_round(acc[2 * e]) | ((u32)bf16_round(acc[(2 * e + 1) % VW]) << 16); \
      v16 r;                                                                                         \
      r.x = r2[0], r.y = r2[1], r.z = r2[2], r.w = r2[3];                                            \
      store16((u8 *)o, r);                                                                           \
    } else {                                                                                         \
      GOEP_UNROLL                                                                                    \
      for (int e = 0; e < VW; e++) o[e] = bf16_round(acc[e]);                                        \
    }                                                                                                \
  }

GOEP_FN void reduce_piece_bf16(void *out, int out_dtype, const u64 *src, const float *w, i32 j0, i32 j1, i64 i,
                               i64 h, i64 hidden) {
  REDUCE_PIECE(8, 0)
}

GOEP_FN void reduce_piece_f32(void *out, int out_dtype, const u64 *src, const float *w, i32 j0, i32 j1, i64 i,
                              i64 h, i64 hidden) {
  REDUCE_PIECE(4, 1)
}

// reduce_scalar reduces element h of output row i.
GOEP_FN void reduce_scalar(void *out, int out_dtype, const u64 *src, const float *w, i32 j0, i32 j1, i64 i, i64 h,
                           i64 hidden, int dtype) {
  float acc = 0.0f;
  int first = 1;
  for (i32 j = j0; j < j1; j++) {
    u64 p = src[j];
    if (p == 0) continue;
    float wj = w ? w[j] : 1.0f;
    float term;
    if (dtype == GOEP_ELEM_F32) {
      float x = ((const float *)(uptr)p)[h];
      term = wj == 1.0f ? x : fmul(wj, x);
    } else {
      term = fmul(wj, bf16_load(((const u16 *)(uptr)p)[h]));
    }
    acc = first ? term : fadd(acc, term);
    first = 0;
  }
  if (out_dtype == GOEP_ELEM_F32) ((float *)out)[i * hidden + h] = acc;
  else ((u16 *)out)[i * hidden + h] = bf16_round(acc);
}

GOEP_KERNEL goep_reduce_rows(void *out, int out_dtype, const u64 *src, const float *w, const i32 *start, i64 n,
                             i64 hidden, int dtype) {
  int vw = dtype == GOEP_ELEM_F32 ? 4 : 8;
  // Segments are sized for the vector path; a row that cannot take it
  // covers the same elements one at a time.
  i64 per = GOEP_LANES * vw, segs = (hidden + per - 1) / per;
  for (i64 it = GOEP_BLOCK; it < n * segs; it += GOEP_BLOCKS) {
    i64 i = it / segs, h0 = (it % segs) * per;
    i32 j0 = start[i], j1 = start[i + 1];
    uptr a = (uptr)(hidden % vw);
    for (i32 j = j0; j < j1; j++) a |= (uptr)src[j];
    if ((a & 15) == 0) {
      i64 h = h0 + GOEP_LANE * vw;
      if (h < hidden && dtype == GOEP_ELEM_F32) reduce_piece_f32(out, out_dtype, src, w, j0, j1, i, h, hidden);
      else if (h < hidden) reduce_piece_bf16(out, out_dtype, src, w, j0, j1, i, h, hidden);
      continue;
    }
    for (i64 h = h0 + GOEP_LANE; h < h0 + per && h < hidden; h += GOEP_LANES)
      reduce_scalar(out, out_dtype, src, w, j0, j1, i, h, hidden, dtype);
  }
}
