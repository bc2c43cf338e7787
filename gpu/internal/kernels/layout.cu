// layout.cu: the dispatch layout of ep_layout (ep/internal/hostrows/layout.c) on the device.
// Compiled after prelude.cuh.
//
// Input: topk[t*K+k], the top-k expert ids of T tokens (-1 = none), for E
// experts spread over R ranks of L experts each (rank r owns experts
// [r*L, (r+1)*L)), rank r living on node node_of[r] of `nodes`.
// Output, exactly as ep_layout computes it: per_expert[E], per_rank[R] and
// per_node[nodes] (a token counts once per rank and once per node however
// many of its experts live there); pair_ord[t*K+k], the place of pair (t,k)
// among the pairs of its expert in token order (-1 when masked);
// tok_rank_ord[t*R+r] and tok_node_ord[t*nodes+n], the place of token t
// among the tokens sent to rank r / node n (-1 when not sent). Any output
// may be NULL.
//
// Bad input: *bad (when not NULL; the caller sets it to ~0 first) becomes
// (i << 2) | kind for the first bad entry i = t*K+k, kind 1 = id out of
// [-1, E), kind 2 = an expert repeated within a token: the entry ep_layout
// reports. The other outputs are then unspecified, as in ep_layout. The
// caller guarantees E <= R*L; a node_of entry outside [0, nodes) is not
// counted (ep_layout does not check it).
//
// Three launches, each with one thread per item and nothing shared between
// threads but the atomic minimum on *bad:
//   1. goep_layout_count: thread c counts the pairs, rank hits and node hits
//      of its chunk of `chunk` tokens into row c of counts[C][W], where
//      C = ceil(T/chunk), W = E+R+nodes (experts, then ranks, then nodes);
//   2. goep_layout_scan: thread w turns column w into exclusive prefix sums
//      over the chunks and writes the column's total (per_expert[w], or
//      per_rank[w-E], or per_node[w-E-R]);
//   3. goep_layout_assign: thread c walks its chunk again, numbering pairs
//      and tokens from row c's offsets.

// layout_valid reports whether expert id e is usable: in [0, E). A repeated
// id is in range; the first of its copies is used, the repeats are reported.
GOEP_FN int layout_valid(i32 e, int E) { return e >= 0 && e < E; }

// first_rank reports whether entry k is the first of its token (among valid
// entries) to reach rank r; first_node the same for node n.
GOEP_FN int first_rank(const i32 *ids, int k, int E, int L, int r) {
  for (int j = 0; j < k; j++)
    if (layout_valid(ids[j], E) && ids[j] / L == r) return 0;
  return 1;
}

GOEP_FN int first_node(const i32 *ids, int k, int E, int L, const i32 *node_of, int n) {
  for (int j = 0; j < k; j++)
    if (layout_valid(ids[j], E) && node_of[ids[j] / L] == n) return 0;
  return 1;
}

// repeated reports whether ids[k] equals an earlier id of the token.
GOEP_FN int repeated(const i32 *ids, int k) {
  for (int j = 0; j < k; j++)
    if (ids[j] == ids[k]) return 1;
  return 0;
}

GOEP_KERNEL goep_layout_count(const i32 *topk, i64 T, int K, int E, int L, int R, const i32 *node_of,
                              int nodes, i64 chunk, i32 *counts, u64 *bad) {
  i64 C = (T + chunk - 1) / chunk;
  i64 W = (i64)E + R + nodes;
  for (i64 c = GOEP_THREAD; c < C; c += GOEP_THREADS) {
    i32 *row = counts + c * W;
    for (i64 w = 0; w < W; w++) row[w] = 0;
    i64 t1 = (c + 1) * chunk < T ? (c + 1) * chunk : T;
    for (i64 t = c * chunk; t < t1; t++) {
      const i32 *ids = topk + t * K;
      for (int k = 0; k < K; k++) {
        i32 e = ids[k];
        if (e == -1) continue;
        if (!layout_valid(e, E)) {
          if (bad) atomic_min_u64(bad, ((u64)(t * K + k) << 2) | 1u);
          continue;
        }
        if (repeated(ids, k)) {
          if (bad) atomic_min_u64(bad, ((u64)(t * K + k) << 2) | 2u);
          continue;
        }
        row[e]++;
        int r = e / L;
        if (first_rank(ids, k, E, L, r)) {
          row[E + r]++;
          int n = node_of[r];
          if (n >= 0 && n < nodes && first_node(ids, k, E, L, node_of, n)) row[E + R + n]++;
        }
      }
    }
  }
}

GOEP_KERNEL goep_layout_scan(i32 *counts, i64 C, int E, int R, int nodes, i32 *per_expert, i32 *per_rank,
                             i32 *per_node) {
  i64 W = (i64)E + R + nodes;
  for (i64 w = GOEP_THREAD; w < W; w += GOEP_THREADS) {
    i32 s = 0;
    for (i64 c = 0; c < C; c++) {
      i32 v = counts[c * W + w];
      counts[c * W + w] = s;
      s += v;
    }
    if (w < E) {
      if (per_expert) per_expert[w] = s;
    } else if (w < (i64)E + R) {
      if (per_rank) per_rank[w - E] = s;
    } else {
      if (per_node) per_node[w - E - R] = s;
    }
  }
}

GOEP_KERNEL goep_layout_assign(const i32 *topk, i64 T, int K, int E, int L, int R, const i32 *node_of,
                               int nodes, i64 chunk, i32 *counts, i32 *pair_ord, i32 *tok_rank_ord,
                               i32 *tok_node_ord) {
  i64 C = (T + chunk - 1) / chunk;
  i64 W = (i64)E + R + nodes;
  for (i64 c = GOEP_THREAD; c < C; c += GOEP_THREADS) {
    i32 *next = counts + c * W;  // this chunk's running offsets
    i64 t1 = (c + 1) * chunk < T ? (c + 1) * chunk : T;
    for (i64 t = c * chunk; t < t1; t++) {
      const i32 *ids = topk + t * K;
      if (tok_rank_ord)
        for (int r = 0; r < R; r++) tok_rank_ord[t * R + r] = -1;
      if (tok_node_ord)
        for (int n = 0; n < nodes; n++) tok_node_ord[t * nodes + n] = -1;
      for (int k = 0; k < K; k++) {
        i32 e = ids[k];
        if (!layout_valid(e, E) || repeated(ids, k)) {
          if (pair_ord) pair_ord[t * K + k] = -1;
          continue;
        }
        if (pair_ord) pair_ord[t * K + k] = next[e];
        next[e]++;
        int r = e / L;
        if (first_rank(ids, k, E, L, r)) {
          if (tok_rank_ord) tok_rank_ord[t * R + r] = next[E + r];
          next[E + r]++;
          int n = node_of[r];
          if (n >= 0 && n < nodes && first_node(ids, k, E, L, node_of, n)) {
            if (tok_node_ord) tok_node_ord[t * nodes + n] = next[E + R + n];
            next[E + R + n]++;
          }
        }
      }
    }
  }
}
