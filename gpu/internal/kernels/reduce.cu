// reduce.cu: the weighted combine of ep_reduce_rows (ep/rows.c) on the
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
// One block per output row, its threads striding over the row's elements:
// 16 bytes of each source row at a time (8 bfloat16 or 4 float32 elements)
// when the row's size and every address allow it, else one element; the
// arithmetic per element is the same either way.

// reduce_vec reduces output row i from 16-byte pieces of its sources: VW
// elements per piece (8 bfloat16, 4 float32).
GOEP_FN void reduce_vec(void *out, int out_dtype, const u64 *src, const float *w, i32 j0, i32 j1, i64 i,
                        i64 hidden, int dtype) {
  int vw = dtype == GOEP_ELEM_F32 ? 4 : 8;
  for (i64 h = GOEP_LANE * vw; h < hidden; h += GOEP_LANES * vw) {
    float acc[8];
    int first = 1;
    for (i32 j = j0; j < j1; j++) {
      u64 p = src[j];
      if (p == 0) continue;
      float wj = w ? w[j] : 1.0f;
      v16 v = load16((const u8 *)(uptr)p + h * (dtype == GOEP_ELEM_F32 ? 4 : 2));
      u32 word[4] = {v.x, v.y, v.z, v.w};
      for (int e = 0; e < vw; e++) {
        float term;
        if (dtype == GOEP_ELEM_F32) {
          float x = u2f(word[e]);
          term = wj == 1.0f ? x : fmul(wj, x);
        } else {
          term = fmul(wj, bf16_load((u16)(word[e / 2] >> (16 * (e % 2)))));
        }
        acc[e] = first ? term : fadd(acc[e], term);
      }
      first = 0;
    }
    if (first)
      for (int e = 0; e < vw; e++) acc[e] = 0.0f;
    if (out_dtype == GOEP_ELEM_F32) {
      float *o = (float *)out + i * hidden + h;
      if (vw == 4 && ((uptr)o & 15) == 0) {
        v16 r;
        r.x = f2u(acc[0]), r.y = f2u(acc[1]), r.z = f2u(acc[2]), r.w = f2u(acc[3]);
        store16((u8 *)o, r);
      } else {
        for (int e = 0; e < vw; e++) o[e] = acc[e];
      }
    } else {
      u16 *o = (u16 *)out + i * hidden + h;
      if (vw == 8 && ((uptr)o & 15) == 0) {
        u32 r2[4];
        for (int e = 0; e < 4; e++) r2[e] = (u32)bf16_round(acc[2 * e]) | ((u32)bf16_round(acc[2 * e + 1]) << 16);
        v16 r;
        r.x = r2[0], r.y = r2[1], r.z = r2[2], r.w = r2[3];
        store16((u8 *)o, r);
      } else {
        for (int e = 0; e < vw; e++) o[e] = bf16_round(acc[e]);
      }
    }
  }
}

GOEP_KERNEL goep_reduce_rows(void *out, int out_dtype, const u64 *src, const float *w, const i32 *start, i64 n,
                             i64 hidden, int dtype) {
  for (i64 i = GOEP_BLOCK; i < n; i += GOEP_BLOCKS) {
    i32 j0 = start[i], j1 = start[i + 1];
    int vw = dtype == GOEP_ELEM_F32 ? 4 : 8;
    uptr a = (uptr)(hidden % vw);
    for (i32 j = j0; j < j1; j++) a |= (uptr)src[j];
    if ((a & 15) == 0) {
      reduce_vec(out, out_dtype, src, w, j0, j1, i, hidden, dtype);
      continue;
    }
    for (i64 h = GOEP_LANE; h < hidden; h += GOEP_LANES) {
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
  }
}
