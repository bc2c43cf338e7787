/*
 * ep_reference.h: the inputs of the C example, tests and benchmark, and what a
 * dispatch and combine must give for them, computed here from the definition
 * (no goep code), so that every rank can check its own results.
 *
 * Token t of rank r (num_tokens_of(r) of them) has hidden values
 * value(r, t, h): r in column 0, t mod 16 in column 1 and small integers
 * elsewhere, at most 4 significant bits each. Its top-k experts are spread over the ranks, some slots
 * are -1 (no expert), and its gate weights are 1, 1/2, 1/4 or 1/8, so that
 * every product and sum the experts and the combine make has at most 8
 * significant bits: exact in float32 and in bfloat16, whatever the order of
 * the sums. The reference is bit for bit.
 */
#ifndef GOEP_EP_REFERENCE_H
#define GOEP_EP_REFERENCE_H

#include <stdint.h>
#include <string.h>

typedef struct {
    int nranks, num_experts, local_experts, topk, hidden, max_tokens;
} ref_shape_t;

/* Uneven token counts: every rank a little fewer than the maximum. */
static inline int num_tokens_of(const ref_shape_t* s, int rank) {
    int t = s->max_tokens - (rank % 3);
    return t < 0 ? 0 : t;
}

static inline float ref_value(int rank, int t, int h) {
    if (h == 0) return (float)rank;
    if (h == 1) return (float)(t % 16);
    return (float)(((rank * 7 + t * 3 + h) % 17) - 8);
}

/* The expert of slot k of token t on rank r, or -1. Distinct within a token. */
static inline int ref_expert(const ref_shape_t* s, int rank, int t, int k) {
    if ((rank + 2 * t + k) % 5 == 4) return -1;
    int stride = s->num_experts / s->topk;
    if (stride < 1) stride = 1;
    return (rank * 5 + t * 3 + k * stride) % s->num_experts;
}

static inline float ref_weight(int t, int k) {
    static const float w[4] = {1.0f, 0.5f, 0.25f, 0.125f};
    return w[(t + k) % 4];
}

static inline int ref_owner(const ref_shape_t* s, int expert) { return expert / s->local_experts; }

static inline uint16_t bf16_of(float f) { /* round to nearest even; the values here are exact */
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline float float_of_bf16(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* out[t][h] of a combine with identity experts: x[t][h] times the sum of the weights of the token's
 * slots whose expert is not on a rank in masked[] (masked may be NULL), accumulated in slot order. */
static inline float ref_combined(const ref_shape_t* s, const int* masked, int rank, int t, int h) {
    float acc = 0;
    for (int k = 0; k < s->topk; k++) {
        int e = ref_expert(s, rank, t, k);
        if (e < 0 || (masked && masked[ref_owner(s, e)])) continue;
        acc += ref_weight(t, k) * ref_value(rank, t, h);
    }
    return acc;
}

#endif
