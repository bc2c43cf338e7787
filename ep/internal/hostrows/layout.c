// Layout kernels.
//
// ep_layout reads the top-k expert ids of T tokens (topk[t*K+k], -1 = no
// expert) for E experts spread over R ranks of L experts each (rank r owns
// experts [r*L, (r+1)*L)), rank r living on node node_of[r] of `nodes`. It
// counts pairs per expert, tokens per rank and tokens per node (a token counts
// once per rank and once per node however many of its experts live there),
// and numbers them: pair_ord[t*K+k] is the place of pair (t,k) among the pairs
// of its expert in token order (-1 when masked), tok_rank_ord[t*R+r] the place
// of token t among the tokens sent to rank r (-1 when not sent), and
// tok_node_ord[t*nodes+n] the same per node. Any output may be NULL. It
// returns -1, or 4*(t*K+k) + kind for the first bad entry t*K+k, kind 1 for
// an id out of [-1, E) and 2 for an expert repeated within a token; the
// outputs are then unspecified.
//
// ep_ht_meta writes, for n received rows, the metadata a rank d keeps with
// each row: its source token (src_tok[row], or row itself when src_tok is
// NULL), its top-k ids as rank d keeps them (where d owns the expert: id -
// d*L, or the global id itself when global is set; else -1) and its weights
// (zeroed where the id is -1).
//
// ep_count_local counts, per local expert l, the rows whose top-k ids name
// it, as id lo + l (lo: 0 for local ids, d*L for global ones).
#include "kernels.h"
#include <string.h>

int64_t ep_layout(const int32_t *topk, int64_t T, int K, int E, int L, int R,
                  const int32_t *node_of, int nodes,
                  int32_t *per_expert, int32_t *per_rank, int32_t *per_node,
                  int32_t *pair_ord, int32_t *tok_rank_ord, int32_t *tok_node_ord) {
  int32_t pe[E > 0 ? E : 1], pr[R > 0 ? R : 1], pn[nodes > 0 ? nodes : 1];
  memset(pe, 0, sizeof(int32_t) * (size_t)E);
  memset(pr, 0, sizeof(int32_t) * (size_t)R);
  memset(pn, 0, sizeof(int32_t) * (size_t)nodes);
  int32_t last_rank[R > 0 ? R : 1], last_node[nodes > 0 ? nodes : 1];  // last token counted, per rank / node
  for (int r = 0; r < R; r++) last_rank[r] = -1;
  for (int n = 0; n < nodes; n++) last_node[n] = -1;
  for (int64_t t = 0; t < T; t++) {
    const int32_t *ids = topk + t * K;
    if (tok_rank_ord)
      for (int r = 0; r < R; r++) tok_rank_ord[t * R + r] = -1;
    if (tok_node_ord)
      for (int n = 0; n < nodes; n++) tok_node_ord[t * nodes + n] = -1;
    for (int k = 0; k < K; k++) {
      int32_t e = ids[k];
      if (e == -1) {
        if (pair_ord) pair_ord[t * K + k] = -1;
        continue;
      }
      if (e < -1 || e >= E) return 4 * (t * K + k) + 1;
      for (int j = 0; j < k; j++)
        if (ids[j] == e) return 4 * (t * K + k) + 2;
      if (pair_ord) pair_ord[t * K + k] = pe[e];
      pe[e]++;
      int r = e / L;
      if (last_rank[r] != (int32_t)t) {
        last_rank[r] = (int32_t)t;
        if (tok_rank_ord) tok_rank_ord[t * R + r] = pr[r];
        pr[r]++;
        int n = node_of[r];
        if (last_node[n] != (int32_t)t) {
          last_node[n] = (int32_t)t;
          if (tok_node_ord) tok_node_ord[t * nodes + n] = pn[n];
          pn[n]++;
        }
      }
    }
  }
  if (per_expert) memcpy(per_expert, pe, sizeof(int32_t) * (size_t)E);
  if (per_rank) memcpy(per_rank, pr, sizeof(int32_t) * (size_t)R);
  if (per_node) memcpy(per_node, pn, sizeof(int32_t) * (size_t)nodes);
  return -1;
}

void ep_ht_meta(int32_t *tok_out, int32_t *topk_out, float *w_out, const int32_t *rows, int64_t n,
                const int32_t *src_tok, const int32_t *src_topk, const float *src_w, int K, int L, int d,
                int global) {
  int32_t lo = (int32_t)d * L, hi = lo + L, shift = global ? 0 : lo;
  for (int64_t i = 0; i < n; i++) {
    int32_t row = rows[i];
    tok_out[i] = src_tok ? src_tok[row] : row;
    for (int k = 0; k < K; k++) {
      int32_t e = src_topk[(int64_t)row * K + k];
      int mine = e >= lo && e < hi;
      topk_out[i * K + k] = mine ? e - shift : -1;
      w_out[i * K + k] = mine ? src_w[(int64_t)row * K + k] : 0.0f;
    }
  }
}

void ep_count_local(const int32_t *topk, int64_t n, int K, int L, int32_t lo, int32_t *counts) {
  memset(counts, 0, sizeof(int32_t) * (size_t)L);
  for (int64_t i = 0; i < n * K; i++) {
    int32_t l = topk[i] - lo;
    if (l >= 0 && l < L) counts[l]++;
  }
}
