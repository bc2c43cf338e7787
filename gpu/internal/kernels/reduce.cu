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
// One block per output row, its threads striding over the row's elements.

GOEP_KERNEL goep_reduce_rows(void *out, int out_dtype, const u64 *src, const float *w, const i32 *start, i64 n,
                             i64 hidden, int dtype) {
  for (i64 i = GOEP_BLOCK; i < n; i += GOEP_BLOCKS) {
    i32 j0 = start[i], j1 = start[i + 1];
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
