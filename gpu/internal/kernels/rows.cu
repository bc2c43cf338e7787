// rows.cu: moving rows between buffers, on the device. Compiled after
// prelude.cuh. A row is row_bytes bytes; buffers are arrays of rows. One
// block per row (grid-stride over the rows), the block's threads sharing the
// row's bytes.
//
// goep_copy_rows copies, for i < n, row s = src_idx[i] of src to row
// d = dst_idx[i] of dst (a NULL index array means the identity: s = i or
// d = i). A negative index skips the row, as does an index past the end of
// its buffer (src_rows, dst_rows rows), so the kernel never reads or writes
// outside the two buffers. With dst_idx it scatters (packs), with src_idx it
// gathers (unpacks); two destinations must not be the same row.
//
// goep_pack_rows writes token rows into grouped buffers from the layout's
// ordinals: for item j = t*W+w of T tokens by W slots (top-k slots, or
// ranks), with o = ord[j] >= 0, it copies row t of src to row
// base[g] + o of dst, where g = group[j] (the item's group: its expert for
// top-k slots) or g = w when group is NULL, and base[g] = 0 when base is
// NULL. Items whose group is outside [0, groups) or whose row is outside
// [0, dst_rows) are skipped.
//   LL, expert-major: ord = pair_ord, group = topk, base[e] = first row of
//     expert e's block.
//   HT, rank-grouped: ord = tok_rank_ord, W = R, group = NULL,
//     base[r] = first row of rank r's block.
//
// goep_row_ptrs sets ptrs[i] = base + idx[i]*row_bytes (idx NULL: i), or 0
// where idx[i] < 0: the source-row pointers of goep_reduce_rows.

GOEP_KERNEL goep_copy_rows(u8 *dst, const i32 *dst_idx, i64 dst_rows, const u8 *src, const i32 *src_idx,
                           i64 src_rows, i64 n, i64 row_bytes) {
  for (i64 i = GOEP_BLOCK; i < n; i += GOEP_BLOCKS) {
    i64 s = src_idx ? (i64)src_idx[i] : i;
    i64 d = dst_idx ? (i64)dst_idx[i] : i;
    if (s < 0 || s >= src_rows || d < 0 || d >= dst_rows) continue;
    copy_row(dst + d * row_bytes, src + s * row_bytes, row_bytes, GOEP_LANE, GOEP_LANES);
  }
}

GOEP_KERNEL goep_pack_rows(u8 *dst, i64 dst_rows, const u8 *src, const i32 *ord, const i32 *group,
                           const i32 *base, int groups, i64 T, int W, i64 row_bytes) {
  i64 n = T * W;
  for (i64 j = GOEP_BLOCK; j < n; j += GOEP_BLOCKS) {
    i32 o = ord[j];
    if (o < 0) continue;
    i64 g = group ? (i64)group[j] : j % W;
    if (g < 0 || g >= groups) continue;
    i64 d = (base ? (i64)base[g] : 0) + o;
    if (d < 0 || d >= dst_rows) continue;
    copy_row(dst + d * row_bytes, src + (j / W) * row_bytes, row_bytes, GOEP_LANE, GOEP_LANES);
  }
}

GOEP_KERNEL goep_row_ptrs(u64 *ptrs, u64 base, const i32 *idx, i64 n, i64 row_bytes) {
  for (i64 i = GOEP_THREAD; i < n; i += GOEP_THREADS) {
    i64 r = idx ? (i64)idx[i] : i;
    ptrs[i] = r < 0 ? 0 : base + (u64)r * (u64)row_bytes;
  }
}
