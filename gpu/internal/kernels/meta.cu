// meta.cu: the metadata kernels of a dispatch on the device. Compiled after
// prelude.cuh.
//
// goep_ht_meta is ep_ht_meta (ep/internal/hostrows/layout.c): for n received rows, the
// metadata a rank d keeps with each row i: its source token
// (src_tok[row], or row itself when src_tok is NULL), its top-k ids made
// local to rank d (id - d*L when d owns the expert, that is when the id is in
// [d*L, (d+1)*L), else -1) and its weights (zeroed where the local id is -1),
// where row = rows[i], or i itself when rows is NULL (the device's use: the
// rows arrived in order). One thread per row.
//
// goep_count_local is ep_count_local: counts[l], for l < L, becomes the
// number of entries of topk_local ([n][K], -1 = an expert elsewhere) equal to
// l. The caller zeroes counts first; threads add with atomics, one thread
// per entry.
//
// goep_ll_place places the rows of a low-latency dispatch as they arrived,
// with no host in the loop. Each of R sources sent a block of `cap` staged
// rows and a block of meta_words int32 metadata words:
//   word 0             the call's sequence number (low 32 bits), `op`
//   word 1             flags (unused here)
//   words 2 .. 2+L     counts[l]: rows for this rank's local expert l
//   then cap words     the source token of each staged row
//   then cap words     the weight (float32 bits) of each staged row
// The staged rows are grouped by local expert in order, each group in token
// order, so row p of source s belongs to the expert l whose group holds p,
// as its (p - first row of the group)-th row. The receive buffer is
// expert-major, [L][span] rows, each expert's rows by source rank then token,
// packed: staged row p of source s goes to row
//   l*span + (rows of expert l from sources before s) + (p - first row of l's group)
// For every staged row i = s*cap + p, dst_row[i] becomes that row (-1 for
// p past the source's rows), and tok_out and w_out at that row its token and
// weight. counts_out[s*L+l] becomes counts[l] of source s. *bad (a u64 the
// caller sets to ~0 first) becomes the lowest source whose block is not of
// this call (word 0 != op) or whose counts are negative or overflow cap or
// span; that source's rows are not placed. One thread per staged row, then
// per (source, expert).

GOEP_KERNEL goep_ht_meta(i32 *tok_out, i32 *topk_out, float *w_out, const i32 *rows, i64 n, const i32 *src_tok,
                         const i32 *src_topk, const float *src_w, int K, int L, int d) {
  i32 lo = (i32)d * L, hi = lo + L;
  for (i64 i = GOEP_THREAD; i < n; i += GOEP_THREADS) {
    i64 row = rows ? (i64)rows[i] : i;
    tok_out[i] = src_tok ? src_tok[row] : (i32)row;
    for (int k = 0; k < K; k++) {
      i32 e = src_topk[row * K + k];
      int mine = e >= lo && e < hi;
      topk_out[i * K + k] = mine ? e - lo : -1;
      w_out[i * K + k] = mine ? src_w[row * K + k] : 0.0f;
    }
  }
}

GOEP_KERNEL goep_count_local(const i32 *topk_local, i64 n, int K, int L, i32 *counts) {
  i64 m = n * K;
  for (i64 i = GOEP_THREAD; i < m; i += GOEP_THREADS) {
    i32 l = topk_local[i];
    if (l >= 0 && l < L) atomic_add_i32(&counts[l], 1);
  }
}

// ll_block_ok reports whether source s's block is of call op and its counts
// fit: each non-negative, their sum at most cap, and for every expert the
// rows of sources 0..s at most span (checked by the caller's prefix).
GOEP_FN int ll_block_ok(const i32 *blk, int L, i64 cap, u32 op) {
  if ((u32)blk[0] != op) return 0;
  i64 total = 0;
  for (int l = 0; l < L; l++) {
    if (blk[2 + l] < 0) return 0;
    total += blk[2 + l];
  }
  return total <= cap;
}

GOEP_KERNEL goep_ll_place(const i32 *meta, int R, int L, i64 cap, i64 meta_words, i64 span, int op, i32 *dst_row,
                          i32 *tok_out, float *w_out, i32 *counts_out, u64 *bad) {
  i64 n = (i64)R * cap;
  for (i64 i = GOEP_THREAD; i < n; i += GOEP_THREADS) {
    i64 s = i / cap, p = i % cap;
    const i32 *blk = meta + s * meta_words;
    dst_row[i] = -1;
    if (!ll_block_ok(blk, L, cap, (u32)op)) {
      if (p == 0 && bad) atomic_min_u64(bad, (u64)s);
      continue;
    }
    i64 first = 0;
    int l = 0;
    for (; l < L; l++) {
      if (p < first + blk[2 + l]) break;
      first += blk[2 + l];
    }
    if (l == L) continue;  // past this source's rows
    i64 off = 0;  // rows of expert l from earlier sources
    for (i64 q = 0; q < s; q++) off += meta[q * meta_words + 2 + l];
    i64 j = off + (p - first);
    if (j < 0 || j >= span) {
      if (bad) atomic_min_u64(bad, (u64)s);
      continue;
    }
    i64 row = (i64)l * span + j;
    dst_row[i] = (i32)row;
    tok_out[row] = blk[2 + L + p];
    w_out[row] = u2f((u32)blk[2 + L + cap + p]);
  }
  i64 m = (i64)R * L;
  for (i64 i = GOEP_THREAD; i < m; i += GOEP_THREADS) counts_out[i] = meta[(i / L) * meta_words + 2 + i % L];
}
