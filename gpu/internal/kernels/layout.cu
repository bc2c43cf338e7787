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
// threads but the atomic minimum on *bad. The tokens are cut into C =
// ceil(T/chunk) chunks; the columns are W = E+R+nodes (experts, then ranks,
// then nodes); counts[C][W] is scratch.
//   1. goep_layout_count: thread (c, w) counts, in a register, the tokens of
//      chunk c that column w receives (expert w: the token holds id w; rank
//      or node: a valid id of the token lives there) into counts[c][w];
//      and reports the first bad entry of the chunk's tokens it checks;
//   2. goep_layout_scan: thread w turns column w into exclusive prefix sums
//      over the chunks, LAYOUT_BATCH loads in flight at a time, and writes
//      the column's total (per_expert[w], or per_rank[w-E], or
//      per_node[w-E-R]);
//   3. goep_layout_assign: thread (c, w) walks chunk c again and numbers
//      what column w receives from counts[c][w] on: pair_ord for expert
//      columns, every tok_rank_ord / tok_node_ord entry of its column (-1
//      when not sent); and -1 to pair_ord for the masked, bad and repeated
//      entries of the tokens it checks. Every output has one writer.
// The tokens of chunk c are checked (bad entries, -1 in pair_ord) by its
// W threads in turn: token c*chunk+j by thread (c, j mod W), so no thread
// walks a whole chunk's K*K comparisons. A thread reads only its chunk's
// ids, and none reads what another thread of the same launch writes.

// layout_valid reports whether expert id e is usable: in [0, E). A repeated
// id is in range; the first of its copies is used, the repeats are reported.
GOEP_FN int layout_valid(i32 e, int E) { return e >= 0 && e < E; }

// repeated reports whether ids[k] equals an earlier id of the token.
GOEP_FN int repeated(const i32 *ids, int k) {
  for (int j = 0; j < k; j++)
    if (ids[j] == ids[k]) return 1;
  return 0;
}

// column_hit returns the first entry k of a token's ids that column w
// receives (see above), or -1 when it receives none of them. A repeated id
// sits in the same expert, rank and node as its first copy, so the first
// valid entry that matches is the one ep_layout counts.
GOEP_FN int column_hit(const i32 *ids, int K, int E, int L, int R, const i32 *node_of, int nodes, i64 w) {
  for (int k = 0; k < K; k++) {
    i32 e = ids[k];
    if (!layout_valid(e, E)) continue;
    if (w < E) {
      if (e == w) return k;
    } else if (w < (i64)E + R) {
      if (e / L == w - E) return k;
    } else {
      int n = node_of[e / L];
      if (n >= 0 && n < nodes && n == w - E - R) return k;
    }
  }
  return -1;
}

GOEP_KERNEL goep_layout_count(const i32 *topk, i64 T, int K, int E, int L, int R, const i32 *node_of,
                              int nodes, i64 chunk, i32 *counts, u64 *bad) {
  i64 C = (T + chunk - 1) / chunk;
  i64 W = (i64)E + R + nodes;
  for (i64 i = GOEP_THREAD; i < C * W; i += GOEP_THREADS) {
    i64 c = i / W, w = i % W;
    i64 t1 = (c + 1) * chunk < T ? (c + 1) * chunk : T;
    i32 n = 0;
    for (i64 t = c * chunk; t < t1; t++) n += column_hit(topk + t * K, K, E, L, R, node_of, nodes, w) >= 0;
    counts[i] = n;
    if (!bad) continue;
    // The first bad entry of the tokens this thread checks: ids are read
    // in order, so the first found is the lowest index.
    i64 first = -1;
    u64 kind = 0;
    for (i64 t = c * chunk + w; t < t1 && first < 0; t += W) {
      const i32 *ids = topk + t * K;
      for (int k = 0; k < K && first < 0; k++) {
        if (ids[k] == -1) continue;
        kind = !layout_valid(ids[k], E) ? 1u : repeated(ids, k) ? 2u : 0u;
        if (kind) first = t * K + k;
      }
    }
    if (first >= 0) atomic_min_u64(bad, ((u64)first << 2) | kind);
  }
}

#define LAYOUT_BATCH 32

GOEP_KERNEL goep_layout_scan(i32 *counts, i64 C, int E, int R, int nodes, i32 *per_expert, i32 *per_rank,
                             i32 *per_node) {
  i64 W = (i64)E + R + nodes;
  for (i64 w = GOEP_THREAD; w < W; w += GOEP_THREADS) {
    i32 s = 0;
    for (i64 c0 = 0; c0 < C; c0 += LAYOUT_BATCH) {
      i32 v[LAYOUT_BATCH];
      i64 m = C - c0 < LAYOUT_BATCH ? C - c0 : LAYOUT_BATCH;
      GOEP_UNROLL
      for (int j = 0; j < LAYOUT_BATCH; j++)
        if (j < m) v[j] = counts[(c0 + j) * W + w];
      GOEP_UNROLL
      for (int j = 0; j < LAYOUT_BATCH; j++)
        if (j < m) {
          counts[(c0 + j) * W + w] = s;
          s += v[j];
        }
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
  for (i64 i = GOEP_THREAD; i < C * W; i += GOEP_THREADS) {
    i64 c = i / W, w = i % W;
    i64 t1 = (c + 1) * chunk < T ? (c + 1) * chunk : T;
    if (pair_ord)
      for (i64 t = c * chunk + w; t < t1; t += W)
        for (int k = 0; k < K; k++)
          if (!layout_valid(topk[t * K + k], E) || repeated(topk + t * K, k)) pair_ord[t * K + k] = -1;
    i32 next = counts[i];  // this chunk's first place in column w
    for (i64 t = c * chunk; t < t1; t++) {
      const i32 *ids = topk + t * K;
      int k = column_hit(ids, K, E, L, R, node_of, nodes, w);
      if (w < E) {
        if (k >= 0 && pair_ord) pair_ord[t * K + k] = next;
      } else if (w < (i64)E + R) {
        if (tok_rank_ord) tok_rank_ord[t * R + (w - E)] = k >= 0 ? next : -1;
      } else {
        if (tok_node_ord) tok_node_ord[t * nodes + (w - E - R)] = k >= 0 ? next : -1;
      }
      next += k >= 0;
    }
  }
}
