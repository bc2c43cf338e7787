/*
 * ep_features.c: the engine's optional features through the C interface, each received value checked
 * against capi/examples/ep_reference.h (computed from the definition, not by goep):
 *
 *   - LL RANK_MAJOR: rank r's tokens with an expert here at [r][0:src_rank_counters[r]], in token order,
 *     with their local top-k ids (-1 elsewhere) and weights (0 elsewhere); combine sums the experts' rows;
 *   - HT EXPERT_MAJOR with zones padded to 4 rows: each zone's rows by source then token, zero padding,
 *     one weight per row, expert_offsets, padded expert_counters and recv_total_counter;
 *   - FP8 dispatch (DS_FP8E3M4, with and without round_scales): every scale is amax/448 of its 128
 *     elements (or the next power of two), and every code times its scale is the token's value within
 *     e4m3's rounding;
 *   - forwarded FP8 rows (FWD): the caller's codes and scales arrive byte for byte;
 *   - forwarded NVFP4 rows (FWD_NVFP4, LL and HT): the caller's float4x2 codes and e4m3 scale bytes arrive
 *     byte for byte at their (source, token) places; bad payloads are refused on every rank, naming them,
 *     and the group goes on;
 *   - the NVFP4 combine: every combined value is the definition's (docs/ep.md, "An NVFP4 combine"),
 *     computed here from the e2m1 and e4m3 grids, bit for bit, with NCCL EP's global scales given or not;
 *     a scale other than 2688 / amax of its row is refused on every rank, naming the row, and the
 *     combine then goes on.
 *
 *   mpirun -np 4 bin/capi/ep_features
 */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../examples/ep_reference.h"
#include "check.h"
#include "goep_ep.h"

static int my_rank, n_ranks, failures, checks;

#define OK(call)                                                                                   \
    do {                                                                                           \
        checks++;                                                                                  \
        goepEpResult_t rc_ = (call);                                                               \
        if (rc_ != goepEpSuccess) {                                                                \
            FAIL("%s: %s (%s)", #call, goepEpGetErrorString(rc_), goepEpGetLastError());           \
            MPI_Abort(MPI_COMM_WORLD, 1); /* the ranks' calls no longer match: nothing more to learn */ \
        }                                                                                          \
    } while (0)

/* A collective call that rank bad refuses: there it returns want with a message saying text, and on the
 * other ranks goepEpRemoteError naming that rank and the same text. */
#define EXPECT_REFUSED(call, bad, want, text)                                                                    \
    do {                                                                                                         \
        checks++;                                                                                                \
        goepEpResult_t rc_ = (call);                                                                             \
        const char* msg_ = goepEpGetLastError();                                                                 \
        char by_[64];                                                                                            \
        snprintf(by_, sizeof by_, "rank %d refused the call", (bad));                                            \
        goepEpResult_t want_ = my_rank == (bad) ? (want) : goepEpRemoteError;                                     \
        if (rc_ != want_ || !strstr(msg_, (text)) || (my_rank != (bad) && !strstr(msg_, by_)))                  \
            FAIL("%s: %s (%s), want %s saying \"%s\"", #call, goepEpGetErrorString(rc_), msg_,                   \
                 goepEpGetErrorString(want_), (text));                                                          \
    } while (0)

enum { E_PER_RANK = 3, K = 3, MAXT = 8 };

static ref_shape_t shape(int hidden) { return (ref_shape_t){n_ranks, E_PER_RANK * n_ranks, E_PER_RANK, K, hidden, MAXT}; }

static goepEpGroup_t group(goepEpAlgorithm_t algo, int hidden, const goepEpGroupOptions_t* o, int elem_bytes) {
    goepEpGroupConfig_t c = GOEP_EP_GROUP_CONFIG_INIT;
    c.algorithm = algo, c.num_experts = E_PER_RANK * n_ranks, c.max_dispatch_tokens_per_rank = MAXT;
    c.max_token_bytes = (unsigned)(hidden * elem_bytes), c.num_topk = K, c.timeout_ns = 30ull * 1000 * 1000 * 1000;
    goepEpGroup_t g;
    OK(goepEpCreateGroupWithOptions(&g, MPI_COMM_WORLD, &c, o));
    return g;
}

/* This rank's tokens (bfloat16), routing and weights. */
typedef struct {
    int T, H;
    uint16_t* x;
    int32_t topk[MAXT * K];
    float w[MAXT * K];
    size_t x_dims[2], k_dims[2];
    goepEpTensor_t x_t, topk_t, w_t;
} inputs_t;

static void make_inputs(inputs_t* in, const ref_shape_t* s) {
    in->T = num_tokens_of(s, my_rank), in->H = s->hidden;
    in->x = calloc((size_t)MAXT * s->hidden, 2);
    for (int t = 0; t < in->T; t++) {
        for (int h = 0; h < s->hidden; h++) in->x[t * s->hidden + h] = bf16_of(ref_value(my_rank, t, h));
        for (int k = 0; k < K; k++) in->topk[t * K + k] = ref_expert(s, my_rank, t, k), in->w[t * K + k] = ref_weight(t, k);
    }
    in->x_dims[0] = in->k_dims[0] = (size_t)in->T, in->x_dims[1] = (size_t)s->hidden, in->k_dims[1] = K;
    in->x_t = tensor(goepEpBfloat16, in->x, 2, in->x_dims);
    in->topk_t = tensor(goepEpInt32, in->topk, 2, in->k_dims);
    in->w_t = tensor(goepEpFloat32, in->w, 2, in->k_dims);
}

/* Whether token t of src has an expert on rank me; the sum of the weights of its slots there. */
static float weight_here(const ref_shape_t* s, int src, int t, int me, int* any) {
    float w = 0;
    *any = 0;
    for (int k = 0; k < K; k++) {
        int e = ref_expert(s, src, t, k);
        if (e >= 0 && ref_owner(s, e) == me) w += ref_weight(t, k), *any = 1;
    }
    return w;
}

static void check_combined(const ref_shape_t* s, const inputs_t* in, const uint16_t* out, const char* what) {
    int bad = 0;
    for (int t = 0; t < in->T && !bad; t++)
        for (int h = 0; h < s->hidden && !bad; h++)
            if (float_of_bf16(out[t * s->hidden + h]) != ref_combined(s, NULL, my_rank, t, h)) {
                FAIL("%s: out[%d][%d] = %g, want %g", what, t, h, float_of_bf16(out[t * s->hidden + h]),
                     ref_combined(s, NULL, my_rank, t, h));
                bad = 1;
            }
    checks++;
}

static void test_ll_rank_major(void) {
    ref_shape_t s = shape(40);
    const int H = s.hidden, R = n_ranks, L = E_PER_RANK;
    inputs_t in;
    make_inputs(&in, &s);
    goepEpGroup_t g = group(GOEP_EP_ALGO_LOW_LATENCY, H, NULL, 2);
    goepEpHandle_t h;
    OK(goepEpCreateHandle(&h, g, GOEP_EP_LAYOUT_RANK_MAJOR, &in.topk_t, NULL, NULL, NULL));
    uint16_t* recv = calloc((size_t)R * MAXT * H, 2);
    float* rw = calloc((size_t)R * MAXT * K, 4);
    int32_t* ridx = calloc((size_t)R * MAXT * K, 4);
    int32_t* src_counts = calloc((size_t)R, 4);
    int64_t total = -1;
    size_t rdims[3] = {(size_t)R, MAXT, (size_t)H}, kdims[3] = {(size_t)R, MAXT, K}, cdims[1] = {(size_t)R}, one[1] = {1};
    goepEpTensor_t recv_t = tensor(goepEpBfloat16, recv, 3, rdims), rw_t = tensor(goepEpFloat32, rw, 3, kdims),
                   ridx_t = tensor(goepEpInt32, ridx, 3, kdims), src_t = tensor(goepEpInt32, src_counts, 1, cdims),
                   total_t = tensor(goepEpInt64, &total, 1, one);
    goepEpDispatchInputs_t din = GOEP_EP_DISPATCH_INPUTS_INIT;
    din.tokens = &in.x_t, din.topk_weights = &in.w_t;
    goepEpDispatchOutputs_t dout = GOEP_EP_DISPATCH_OUTPUTS_INIT;
    dout.tokens = &recv_t, dout.topk_weights = &rw_t, dout.topk_idx = &ridx_t;
    goepEpLayoutInfo_t li = GOEP_EP_LAYOUT_INFO_INIT;
    li.src_rank_counters = &src_t, li.recv_total_counter = &total_t;
    OK(goepEpDispatch(h, &din, &dout, &li, NULL, NULL));
    int sum = 0;
    uint16_t* y = calloc((size_t)R * MAXT * H, 2);
    for (int src = 0; src < R; src++) {
        int j = 0;
        for (int t = 0; t < num_tokens_of(&s, src); t++) {
            int any;
            float wsum = weight_here(&s, src, t, my_rank, &any);
            if (!any) continue;
            size_t row = (size_t)src * MAXT + (size_t)j;
            for (int hh = 0; hh < H; hh++) {
                EXPECT(float_of_bf16(recv[row * H + hh]) == ref_value(src, t, hh), "RM row [%d][%d] (token %d) h %d", src, j, t, hh);
                y[row * H + hh] = bf16_of(float_of_bf16(recv[row * H + hh]) * wsum);
            }
            for (int k = 0; k < K; k++) {
                int e = ref_expert(&s, src, t, k);
                int here = e >= 0 && ref_owner(&s, e) == my_rank;
                EXPECT(ridx[row * K + k] == (here ? e - my_rank * L : -1), "RM ids [%d][%d][%d] = %d", src, j, k, ridx[row * K + k]);
                EXPECT(rw[row * K + k] == (here ? ref_weight(t, k) : 0.0f), "RM weights [%d][%d][%d]", src, j, k);
            }
            j++;
        }
        EXPECT(src_counts[src] == j, "src_rank_counters[%d] = %d, want %d", src, src_counts[src], j);
        sum += j;
    }
    EXPECT(total == sum, "recv_total_counter = %lld, want %d", (long long)total, sum);
    uint16_t* out = calloc((size_t)MAXT * H, 2);
    goepEpTensor_t y_t = tensor(goepEpBfloat16, y, 3, rdims), out_t = tensor(goepEpBfloat16, out, 2, in.x_dims);
    goepEpCombineInputs_t cin = GOEP_EP_COMBINE_INPUTS_INIT;
    cin.tokens = &y_t;
    goepEpCombineOutputs_t cout = GOEP_EP_COMBINE_OUTPUTS_INIT;
    cout.tokens = &out_t;
    OK(goepEpCombine(h, &cin, &cout, NULL, NULL));
    check_combined(&s, &in, out, "LL RANK_MAJOR");
    OK(goepEpHandleDestroy(h));
    OK(goepEpGroupDestroy(g));
    free(recv), free(rw), free(ridx), free(src_counts), free(y), free(out), free(in.x);
}

static void test_ht_expert_major(void) {
    enum { ALIGN = 4 };
    ref_shape_t s = shape(40);
    const int H = s.hidden, R = n_ranks, L = E_PER_RANK;
    inputs_t in;
    make_inputs(&in, &s);
    goepEpGroup_t g = group(GOEP_EP_ALGO_HIGH_THROUGHPUT, H, NULL, 2);
    goepEpHandleConfig_t hc = GOEP_EP_HANDLE_CONFIG_INIT;
    hc.dispatch_output_per_expert_alignment = ALIGN;
    goepEpHandle_t h;
    OK(goepEpCreateHandle(&h, g, GOEP_EP_LAYOUT_EXPERT_MAJOR, &in.topk_t, NULL, &hc, NULL));
    size_t slots = (size_t)R * MAXT * K + (size_t)L * (ALIGN - 1);
    uint16_t* recv = malloc(slots * H * 2);
    memset(recv, 0xff, slots * H * 2);
    float* rw = malloc(slots * 4);
    memset(rw, 0xff, slots * 4);
    int64_t counts[E_PER_RANK], offsets[E_PER_RANK], total = -1;
    size_t rdims[2] = {slots, (size_t)H}, wdims[1] = {slots}, ldims[1] = {L}, one[1] = {1};
    goepEpTensor_t recv_t = tensor(goepEpBfloat16, recv, 2, rdims), rw_t = tensor(goepEpFloat32, rw, 1, wdims),
                   counts_t = tensor(goepEpInt64, counts, 1, ldims), off_t = tensor(goepEpInt64, offsets, 1, ldims),
                   total_t = tensor(goepEpInt64, &total, 1, one);
    goepEpDispatchInputs_t din = GOEP_EP_DISPATCH_INPUTS_INIT;
    din.tokens = &in.x_t, din.topk_weights = &in.w_t;
    goepEpDispatchOutputs_t dout = GOEP_EP_DISPATCH_OUTPUTS_INIT;
    dout.tokens = &recv_t, dout.topk_weights = &rw_t;
    goepEpLayoutInfo_t li = GOEP_EP_LAYOUT_INFO_INIT;
    li.expert_counters = &counts_t, li.expert_offsets = &off_t, li.recv_total_counter = &total_t;
    OK(goepEpDispatch(h, &din, &dout, &li, NULL, NULL));
    uint16_t* y = calloc(slots * H, 2);
    int64_t start = 0;
    for (int l = 0; l < L; l++) {
        int j = 0, expert = my_rank * L + l;
        for (int src = 0; src < R; src++)
            for (int t = 0; t < num_tokens_of(&s, src); t++)
                for (int k = 0; k < K; k++) {
                    if (ref_expert(&s, src, t, k) != expert) continue;
                    size_t row = (size_t)(start + j);
                    for (int hh = 0; hh < H; hh++) {
                        EXPECT(float_of_bf16(recv[row * H + hh]) == ref_value(src, t, hh), "EM zone %d row %d h %d", l, j, hh);
                        y[row * H + hh] = bf16_of(float_of_bf16(recv[row * H + hh]) * ref_weight(t, k));
                    }
                    EXPECT(rw[row] == ref_weight(t, k), "EM zone %d row %d weight %g", l, j, rw[row]);
                    j++;
                }
        int64_t padded = (j + ALIGN - 1) / ALIGN * ALIGN;
        EXPECT(offsets[l] == start && counts[l] == padded, "zone %d: offset %lld count %lld, want %lld %lld", l,
               (long long)offsets[l], (long long)counts[l], (long long)start, (long long)padded);
        for (int64_t r = start + j; r < start + padded; r++) {
            EXPECT(rw[r] == 0, "zone %d padding row %lld weight %g", l, (long long)r, rw[r]);
            for (int hh = 0; hh < H; hh++) EXPECT(recv[r * H + hh] == 0, "zone %d padding row %lld not zero", l, (long long)r);
        }
        start += padded;
    }
    EXPECT(total == start, "recv_total_counter = %lld, want %lld", (long long)total, (long long)start);
    uint16_t* out = calloc((size_t)MAXT * H, 2);
    goepEpTensor_t y_t = tensor(goepEpBfloat16, y, 2, rdims), out_t = tensor(goepEpBfloat16, out, 2, in.x_dims);
    goepEpCombineInputs_t cin = GOEP_EP_COMBINE_INPUTS_INIT;
    cin.tokens = &y_t;
    goepEpCombineOutputs_t cout = GOEP_EP_COMBINE_OUTPUTS_INIT;
    cout.tokens = &out_t;
    OK(goepEpCombine(h, &cin, &cout, NULL, NULL));
    check_combined(&s, &in, out, "HT EXPERT_MAJOR");
    OK(goepEpHandleDestroy(h));
    OK(goepEpGroupDestroy(g));
    free(recv), free(rw), free(y), free(out), free(in.x);
}

/* The value of an e4m3 code. */
static float e4m3_value(uint8_t q) {
    int e = (q >> 3) & 15, m = q & 7;
    float v = e == 0 ? m / 512.0f : ldexpf(1 + m / 8.0f, e - 7);
    return q & 0x80 ? -v : v;
}

/* The FP8 rows of an LL EXPERT_MAJOR dispatch: for each valid row, check (or, with fwd, compare byte for
 * byte with the caller's) codes and scales. */
static void test_fp8(int fwd, int round_scales) {
    ref_shape_t s = shape(200); /* two scale groups, the second of 72 elements */
    const int H = s.hidden, R = n_ranks, L = E_PER_RANK, G = (H + 127) / 128;
    inputs_t in;
    make_inputs(&in, &s);
    goepEpGroupOptions_t o = GOEP_EP_GROUP_OPTIONS_INIT;
    o.dispatch_quant = fwd ? GOEP_EP_DISP_QUANT_FWD : GOEP_EP_DISP_QUANT_DS_FP8E3M4, o.dispatch_round_scales = (unsigned)round_scales;
    goepEpGroup_t g = group(GOEP_EP_ALGO_LOW_LATENCY, H, &o, 2);
    goepEpHandle_t h;
    OK(goepEpCreateHandle(&h, g, GOEP_EP_LAYOUT_EXPERT_MAJOR, &in.topk_t, NULL, NULL, NULL));
    /* Forwarded rows: codes and scales of the caller's own, not what a cast would make. */
    uint8_t mine[MAXT * 200];
    float my_scales[MAXT * 2];
    for (int t = 0; t < in.T; t++) {
        for (int hh = 0; hh < H; hh++) mine[t * H + hh] = (uint8_t)((my_rank * 31 + t * 7 + hh) % 0x7e | ((hh & 1) << 7));
        for (int gi = 0; gi < G; gi++) my_scales[t * G + gi] = (float)(my_rank + 1) * 0.25f + (float)(t * G + gi);
    }
    size_t code_dims[2] = {(size_t)in.T, (size_t)H}, sc_dims[2] = {(size_t)in.T, (size_t)G};
    goepEpTensor_t codes_in = tensor(goepEpFloat8e4m3, mine, 2, code_dims), scales_in = tensor(goepEpFloat32, my_scales, 2, sc_dims);
    size_t rows = (size_t)R * MAXT;
    uint8_t* codes = calloc(L * rows * H, 1);
    float* scales = calloc(L * rows * G, 4);
    int32_t counts[E_PER_RANK];
    size_t cdims[3] = {L, rows, (size_t)H}, sdims[3] = {L, rows, (size_t)G}, ldims[1] = {L};
    goepEpTensor_t codes_t = tensor(goepEpFloat8e4m3, codes, 3, cdims), scales_t = tensor(goepEpFloat32, scales, 3, sdims),
                   counts_t = tensor(goepEpInt32, counts, 1, ldims);
    goepEpDispatchInputs_t din = GOEP_EP_DISPATCH_INPUTS_INIT;
    din.tokens = fwd ? &codes_in : &in.x_t, din.topk_weights = &in.w_t, din.scales = fwd ? &scales_in : NULL;
    goepEpDispatchOutputs_t dout = GOEP_EP_DISPATCH_OUTPUTS_INIT;
    dout.tokens = &codes_t, dout.scales = &scales_t;
    goepEpLayoutInfo_t li = GOEP_EP_LAYOUT_INFO_INIT;
    li.expert_counters = &counts_t;
    goepEpDispatchConfig_t dc = GOEP_EP_DISPATCH_CONFIG_INIT; /* NCCL EP's way to ask: the group's own recipe */
    dc.quant_recipe = o.dispatch_quant, dc.round_scales = (unsigned)round_scales;
    OK(goepEpDispatch(h, &din, &dout, &li, &dc, NULL));
    for (int l = 0; l < L; l++) {
        int j = 0, expert = my_rank * L + l;
        for (int src = 0; src < R; src++)
            for (int t = 0; t < num_tokens_of(&s, src); t++) {
                int here = 0;
                for (int k = 0; k < K; k++) here |= ref_expert(&s, src, t, k) == expert;
                if (!here) continue;
                size_t row = (size_t)l * rows + (size_t)j;
                for (int gi = 0; gi < G; gi++) {
                    float sc = scales[row * G + gi];
                    if (fwd) {
                        EXPECT(sc == (float)(src + 1) * 0.25f + (float)(t * G + gi), "forwarded scale [%d][%d][%d] = %g", l, j, gi, sc);
                        continue;
                    }
                    float amax = 0;
                    for (int hh = gi * 128; hh < H && hh < (gi + 1) * 128; hh++) amax = fmaxf(amax, fabsf(ref_value(src, t, hh)));
                    float want = fmaxf(amax / 448.0f, 0x1p-126f);
                    if (round_scales) {
                        int e;
                        float m = frexpf(want, &e);
                        want = m == 0.5f ? want : ldexpf(1.0f, e);
                    }
                    EXPECT(sc == want, "scale [%d][%d][%d] = %g, want %g (amax %g)", l, j, gi, sc, want, amax);
                }
                for (int hh = 0; hh < H; hh++) {
                    uint8_t q = codes[row * H + hh];
                    if (fwd) {
                        uint8_t want = (uint8_t)((src * 31 + t * 7 + hh) % 0x7e | ((hh & 1) << 7));
                        EXPECT(q == want, "forwarded code [%d][%d][%d] = %#x, want %#x", l, j, hh, q, want);
                        continue;
                    }
                    float x = ref_value(src, t, hh), sc = scales[row * G + hh / 128];
                    float got = e4m3_value(q) * sc;
                    /* e4m3 keeps 3 mantissa bits: half a step is 2^-4 of the value, or 2^-10 * scale below 2^-6. */
                    EXPECT((q & 0x7f) != 0x7f && fabsf(got - x) <= fabsf(x) * 0x1p-4f + sc * 0x1p-10f,
                           "code [%d][%d][%d] = %#x: %g, want %g", l, j, hh, q, got, x);
                }
                j++;
            }
        EXPECT(counts[l] == j, "expert_counters[%d] = %d, want %d", l, counts[l], j);
    }
    OK(goepEpHandleDestroy(h));
    OK(goepEpGroupDestroy(g));
    free(codes), free(scales), free(in.x);
}

enum { H4 = 64 }; /* NVFP4 rows: hidden a multiple of 32 */

/* The caller's NVFP4 rows of rank r: float4x2 code bytes (any byte is two e2m1 codes) and e4m3 scale
 * bytes, as a quantising kernel of its own would have made them. */
static uint8_t fp4_code(int rank, int t, int b) { return (uint8_t)(rank * 37 + t * 11 + b * 3 + 1); }
static uint8_t fp4_scale(int rank, int t, int i) { return (uint8_t)(rank * 29 + t * 7 + i * 5 + 2); }

/* The rows of (source, token) this rank receives, in the layout's order: LL EXPERT_MAJOR per local expert
 * (row l * R * MAXT + j), HT FLAT each token once (row j). Returns how many; fills src[], tok[], row[]. */
static int received(const ref_shape_t* s, int ht, int* src, int* tok, size_t* row, int* counts) {
    int n = 0;
    if (ht) {
        for (int r = 0; r < s->nranks; r++)
            for (int t = 0; t < num_tokens_of(s, r); t++) {
                int any;
                weight_here(s, r, t, my_rank, &any);
                if (any) src[n] = r, tok[n] = t, row[n] = (size_t)n, n++;
            }
        return n;
    }
    for (int l = 0; l < E_PER_RANK; l++) {
        int j = 0, expert = my_rank * E_PER_RANK + l;
        for (int r = 0; r < s->nranks; r++)
            for (int t = 0; t < num_tokens_of(s, r); t++) {
                int here = 0;
                for (int k = 0; k < K; k++) here |= ref_expert(s, r, t, k) == expert;
                if (here) src[n] = r, tok[n] = t, row[n] = (size_t)l * s->nranks * MAXT + (size_t)j++, n++;
            }
        counts[l] = j;
    }
    return n;
}

/* Forwarded NVFP4 rows (GOEP_EP_DISP_QUANT_FWD_NVFP4, dispatched with NCCL EP's GOEP_EP_DISP_QUANT_FWD): the
 * caller's codes and scale bytes arrive as they are, at their (source, token) places; bad payloads from one
 * rank are refused there by name and on the others as remote errors, writing nothing; the group goes on. */
static void test_nvfp4_forward(int ht) {
    ref_shape_t s = shape(H4);
    const int H = H4, R = n_ranks, L = E_PER_RANK, P = H / 2, S = H / 16, bad = n_ranks - 1;
    inputs_t in;
    make_inputs(&in, &s);
    goepEpGroupOptions_t o = GOEP_EP_GROUP_OPTIONS_INIT;
    o.dispatch_quant = GOEP_EP_DISP_QUANT_FWD_NVFP4;
    goepEpGroup_t g = group(ht ? GOEP_EP_ALGO_HIGH_THROUGHPUT : GOEP_EP_ALGO_LOW_LATENCY, H, &o, 2);
    goepEpHandle_t h;
    OK(goepEpCreateHandle(&h, g, ht ? GOEP_EP_LAYOUT_FLAT : GOEP_EP_LAYOUT_EXPERT_MAJOR, &in.topk_t, NULL, NULL, NULL));
    /* NCCL EP takes the scale bytes as uint8 or as an FP8 type: both, one per mode. */
    goepEpDataType_t st = ht ? goepEpFloat8e4m3 : goepEpUint8, other_st = ht ? goepEpUint8 : goepEpFloat8e4m3;
    uint8_t mine[MAXT * H4 / 2], my_scales[MAXT * H4 / 16];
    for (int t = 0; t < in.T; t++) {
        for (int b = 0; b < P; b++) mine[t * P + b] = fp4_code(my_rank, t, b);
        for (int i = 0; i < S; i++) my_scales[t * S + i] = fp4_scale(my_rank, t, i);
    }
    size_t cin_dims[2] = {(size_t)in.T, (size_t)P}, sin_dims[2] = {(size_t)in.T, (size_t)S};
    goepEpTensor_t codes_in = tensor(goepEpFloat4x2, mine, 2, cin_dims), scales_in = tensor(st, my_scales, 2, sin_dims);
    size_t slots = ht ? (size_t)R * MAXT : (size_t)L * R * MAXT;
    uint8_t* codes = malloc(slots * P);
    uint8_t* scales = malloc(slots * S);
    memset(codes, 0xee, slots * P), memset(scales, 0xee, slots * S);
    int32_t counts[E_PER_RANK];
    int64_t total = -1;
    unsigned nd = ht ? 2 : 3;
    size_t cdims[3] = {(size_t)L, (size_t)R * MAXT, (size_t)P}, sdims[3] = {(size_t)L, (size_t)R * MAXT, (size_t)S};
    size_t* cd = cdims + (ht ? 1 : 0);
    size_t* sd = sdims + (ht ? 1 : 0);
    size_t ldims[1] = {L}, one[1] = {1};
    goepEpTensor_t codes_t = tensor(goepEpFloat4x2, codes, nd, cd), scales_t = tensor(st, scales, nd, sd),
                   counts_t = tensor(goepEpInt32, counts, 1, ldims), total_t = tensor(goepEpInt64, &total, 1, one);
    goepEpDispatchInputs_t din = GOEP_EP_DISPATCH_INPUTS_INIT;
    din.tokens = &codes_in, din.topk_weights = &in.w_t, din.scales = &scales_in;
    goepEpDispatchOutputs_t dout = GOEP_EP_DISPATCH_OUTPUTS_INIT;
    dout.tokens = &codes_t, dout.scales = &scales_t;
    goepEpLayoutInfo_t li = GOEP_EP_LAYOUT_INFO_INIT;
    li.expert_counters = ht ? NULL : &counts_t, li.recv_total_counter = &total_t;
    goepEpDispatchConfig_t dc = GOEP_EP_DISPATCH_CONFIG_INIT; /* NCCL EP's recipe, its tokens float4x2 */
    dc.quant_recipe = GOEP_EP_DISP_QUANT_FWD;

    /* One rank's bad payloads: NCCL EP accepts some (e4m3 rows, float32 scales, other scale counts) and
     * forwards them; goep's NVFP4 group refuses them, and a shape that reads H for H/2. */
    size_t logical[2] = {(size_t)in.T, (size_t)H}, fewer[2] = {(size_t)in.T, (size_t)S / 2};
    float f32_scales[MAXT * H4 / 16] = {0};
    goepEpTensor_t e4m3_rows = tensor(goepEpFloat8e4m3, in.x, 2, logical), fp4_logical = tensor(goepEpFloat4x2, in.x, 2, logical),
                   f32_t = tensor(goepEpFloat32, f32_scales, 2, sin_dims), fewer_t = tensor(st, my_scales, 2, fewer),
                   other_out = tensor(other_st, scales, nd, sd);
    struct {
        goepEpTensor_t *tokens, *scales, *out_scales;
        goepEpResult_t rc;
        const char* says;
    } bads[] = {
        {&e4m3_rows, &scales_in, &scales_t, goepEpInvalidUsage, "this group forwards NVFP4 rows (GOEP_EP_DISP_QUANT_FWD_NVFP4)"},
        {&fp4_logical, &scales_in, &scales_t, goepEpInvalidArgument, "a float4x2 element holds two values"},
        {&codes_in, &f32_t, &scales_t, goepEpInvalidUsage, "inputs->scales has datatype float32"},
        {&codes_in, &fewer_t, &scales_t, goepEpInvalidUsage, "scales a row"},
        {&codes_in, &scales_in, &other_out, goepEpInvalidArgument, "forwarded scale bytes arrive in the type they were given"},
    };
    for (size_t i = 0; i < sizeof bads / sizeof bads[0]; i++) {
        if (my_rank == bad) din.tokens = bads[i].tokens, din.scales = bads[i].scales, dout.scales = bads[i].out_scales;
        EXPECT_REFUSED(goepEpDispatch(h, &din, &dout, &li, &dc, NULL), bad, bads[i].rc, bads[i].says);
        din.tokens = &codes_in, din.scales = &scales_in, dout.scales = &scales_t;
    }
    int untouched = 1;
    for (size_t i = 0; i < slots * P; i++) untouched &= codes[i] == 0xee;
    for (size_t i = 0; i < slots * S; i++) untouched &= scales[i] == 0xee;
    EXPECT(untouched, "a refused NVFP4 dispatch wrote into its outputs");

    OK(goepEpDispatch(h, &din, &dout, &li, &dc, NULL));
    int src[E_PER_RANK * 4 * MAXT * 8], tok[E_PER_RANK * 4 * MAXT * 8], want_counts[E_PER_RANK];
    size_t row[E_PER_RANK * 4 * MAXT * 8];
    int n = received(&s, ht, src, tok, row, want_counts);
    EXPECT(total == n, "recv_total_counter = %lld, want %d", (long long)total, n);
    for (int l = 0; !ht && l < L; l++) EXPECT(counts[l] == want_counts[l], "expert_counters[%d] = %d, want %d", l, counts[l], want_counts[l]);
    uint16_t* y = calloc(slots * H, 2);
    for (int i = 0; i < n; i++) {
        int bad_bytes = 0;
        for (int b = 0; b < P; b++) bad_bytes += codes[row[i] * P + b] != fp4_code(src[i], tok[i], b);
        for (int c = 0; c < S; c++) bad_bytes += scales[row[i] * S + c] != fp4_scale(src[i], tok[i], c);
        EXPECT(bad_bytes == 0, "NVFP4 row %zu (rank %d token %d): %d bytes differ from the caller's", row[i], src[i], tok[i], bad_bytes);
        /* The experts' outputs, in the token type: LL applies the weights in the combine, HT's experts do. */
        int any;
        float w = ht ? weight_here(&s, src[i], tok[i], my_rank, &any) : 1.0f;
        for (int hh = 0; hh < H; hh++) y[row[i] * H + hh] = bf16_of(ref_value(src[i], tok[i], hh) * w);
    }
    goepEpTensor_t v = GOEP_EP_TENSOR_INIT;
    size_t vd[3];
    v.sizes = vd;
    if (!ht) {
        checks++;
        goepEpResult_t rc = goepEpHandleRecvTokens(h, &v);
        if (rc != goepEpInvalidUsage || !strstr(goepEpGetLastError(), "float4x2 codes with their scales"))
            FAIL("goepEpHandleRecvTokens in an NVFP4 group: %s (%s)", goepEpGetErrorString(rc), goepEpGetLastError());
    }
    uint16_t* out = calloc((size_t)MAXT * H, 2);
    size_t ydims[3] = {(size_t)L, (size_t)R * MAXT, (size_t)H};
    goepEpTensor_t y_t = tensor(goepEpBfloat16, y, nd, ydims + (ht ? 1 : 0)), out_t = tensor(goepEpBfloat16, out, 2, in.x_dims);
    goepEpCombineInputs_t cin = GOEP_EP_COMBINE_INPUTS_INIT;
    cin.tokens = &y_t;
    goepEpCombineOutputs_t cout = GOEP_EP_COMBINE_OUTPUTS_INIT;
    cout.tokens = &out_t;
    OK(goepEpCombine(h, &cin, &cout, NULL, NULL));
    check_combined(&s, &in, out, ht ? "HT NVFP4-forward group's combine" : "LL NVFP4-forward group's combine");
    OK(goepEpHandleDestroy(h));
    OK(goepEpGroupDestroy(g));

    /* A group forwarding FP8 rows names the option that forwards float4x2 ones. */
    o.dispatch_quant = GOEP_EP_DISP_QUANT_FWD;
    g = group(ht ? GOEP_EP_ALGO_HIGH_THROUGHPUT : GOEP_EP_ALGO_LOW_LATENCY, H, &o, 2);
    OK(goepEpCreateHandle(&h, g, ht ? GOEP_EP_LAYOUT_FLAT : GOEP_EP_LAYOUT_EXPERT_MAJOR, &in.topk_t, NULL, NULL, NULL));
    checks++;
    goepEpResult_t rc = goepEpDispatch(h, &din, &dout, &li, &dc, NULL);
    if (rc != goepEpInvalidUsage || !strstr(goepEpGetLastError(), "options.dispatch_quant = GOEP_EP_DISP_QUANT_FWD_NVFP4"))
        FAIL("float4x2 rows in an FP8-forwarding group: %s (%s)", goepEpGetErrorString(rc), goepEpGetLastError());
    OK(goepEpHandleDestroy(h));
    OK(goepEpGroupDestroy(g));
    free(codes), free(scales), free(y), free(out), free(in.x);
}

/* NVFP4 from its definition (docs/ep.md, "An NVFP4 combine"), on the grids of its two formats. */
static const float e2m1_grid[8] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};

/* The e4m3 value nearest to x >= 0, ties to the even code, saturating at 448 (the largest). */
static float e4m3_nearest(float x) {
    int best = 0;
    for (int c = 1; c <= 126; c++) {
        double d = fabs((double)e4m3_value((uint8_t)c) - x), bd = fabs((double)e4m3_value((uint8_t)best) - x);
        if (d < bd || (d == bd && c % 2 == 0)) best = c;
    }
    return e4m3_value((uint8_t)best);
}

/* The e2m1 magnitude nearest to a >= 0, ties to the even code, saturating at 6. */
static float e2m1_nearest(float a) {
    int best = 0;
    for (int c = 1; c < 8; c++) {
        double d = fabs((double)e2m1_grid[c] - a), bd = fabs((double)e2m1_grid[best] - a);
        if (d < bd || (d == bd && c % 2 == 0)) best = c;
    }
    return e2m1_grid[best];
}

/* v: the values of row x after the NVFP4 cast, in float32: g = amax / 2688; per 16 elements es =
 * e4m3(amax_b / 6 / g) * g; each element the nearest e2m1 of x / es, times es (0 where es is 0). */
static void nvfp4_values(const float* x, int n, float* v) {
    float amax = 0;
    for (int i = 0; i < n; i++) amax = fmaxf(amax, fabsf(x[i]));
    float g = amax / 2688.0f;
    for (int b = 0; b < n; b += 16) {
        float bmax = 0;
        for (int i = b; i < b + 16; i++) bmax = fmaxf(bmax, fabsf(x[i]));
        float es = 0;
        if (g > 0) {
            float sc = bmax / 6.0f / g;
            es = e4m3_nearest(sc) * g;
        }
        for (int i = b; i < b + 16; i++) {
            float m = es == 0 ? 0 : e2m1_nearest(fabsf(x[i] / es)) * es;
            v[i] = x[i] < 0 ? -m : m;
        }
    }
}

/* Expert e's output for token t of rank src, element h: a spread of magnitudes (a block 64 times smaller
 * than the others, fractions below the integers), so that the scales and the codes' rounding matter.
 * bfloat16-exact. The expert's rank and the token's compute it alike. */
static float expert_out(int e, int src, int t, int h) {
    float v = ref_value(src, t, h) * (1.0f + (float)e / 7.0f) + (float)((h * 13 + t) % 11) * 0.0625f;
    if ((h / 16) % 3 == 1) v *= 1.0f / 64.0f;
    return float_of_bf16(bf16_of(v));
}

/* The NVFP4 combine (LL): each combined value is the float32 sum, in top-k order, of weight times the
 * NVFP4 values of its expert outputs, rounded once to bfloat16, bit for bit. NCCL EP's global scales
 * (2688 / amax per row) may be given, or not; one from one rank that is two float32 steps off its row's
 * is refused there naming the row and on the others as a remote error, as is a scales tensor of the
 * wrong shape, and the combine then goes on. */
static void test_nvfp4_combine(void) {
    ref_shape_t s = shape(H4);
    const int H = H4, R = n_ranks, L = E_PER_RANK, bad = n_ranks - 1;
    inputs_t in;
    make_inputs(&in, &s);
    goepEpGroupOptions_t o = GOEP_EP_GROUP_OPTIONS_INIT;
    o.combine_quant = GOEP_EP_COMB_QUANT_NVFP4;
    goepEpGroup_t g = group(GOEP_EP_ALGO_LOW_LATENCY, H, &o, 2);
    goepEpHandle_t h;
    OK(goepEpCreateHandle(&h, g, GOEP_EP_LAYOUT_EXPERT_MAJOR, &in.topk_t, NULL, NULL, NULL));
    size_t rows = (size_t)L * R * MAXT;
    uint16_t* recv = calloc(rows * H, 2);
    int32_t counts[E_PER_RANK];
    size_t rdims[3] = {L, (size_t)R * MAXT, (size_t)H}, ldims[1] = {L};
    goepEpTensor_t recv_t = tensor(goepEpBfloat16, recv, 3, rdims), counts_t = tensor(goepEpInt32, counts, 1, ldims);
    goepEpDispatchInputs_t din = GOEP_EP_DISPATCH_INPUTS_INIT;
    din.tokens = &in.x_t, din.topk_weights = &in.w_t;
    goepEpDispatchOutputs_t dout = GOEP_EP_DISPATCH_OUTPUTS_INIT;
    dout.tokens = &recv_t;
    goepEpLayoutInfo_t li = GOEP_EP_LAYOUT_INFO_INIT;
    li.expert_counters = &counts_t;
    OK(goepEpDispatch(h, &din, &dout, &li, NULL, NULL));
    int src[E_PER_RANK * 4 * MAXT * 8], tok[E_PER_RANK * 4 * MAXT * 8], want_counts[E_PER_RANK];
    size_t row[E_PER_RANK * 4 * MAXT * 8];
    int n = received(&s, 0, src, tok, row, want_counts);
    uint16_t* y = calloc(rows * H, 2);
    float* scales = malloc(rows * 4);
    for (size_t r = 0; r < rows; r++) scales[r] = -1; /* rows past expert_counters: not read */
    for (int i = 0; i < n; i++) {
        int l = (int)(row[i] / ((size_t)R * MAXT));
        float amax = 0;
        for (int hh = 0; hh < H; hh++) {
            float v = expert_out(my_rank * L + l, src[i], tok[i], hh);
            y[row[i] * H + hh] = bf16_of(v);
            amax = fmaxf(amax, fabsf(v));
        }
        scales[row[i]] = amax == 0 ? 0 : 2688.0f / amax; /* NCCL EP's contract */
    }
    /* A neighbour of a row's scale (another division's last bit) is accepted. */
    if (n > 0) scales[row[0]] = nextafterf(scales[row[0]], INFINITY);
    size_t sdims[3] = {L, (size_t)R * MAXT, 1}, flat[2] = {L, (size_t)R * MAXT};
    goepEpTensor_t y_t = tensor(goepEpBfloat16, y, 3, rdims), sc_t = tensor(goepEpFloat32, scales, 3, sdims),
                   sc_flat = tensor(goepEpFloat32, scales, 2, flat);
    uint16_t* out = calloc((size_t)MAXT * H, 2);
    goepEpTensor_t out_t = tensor(goepEpBfloat16, out, 2, in.x_dims);
    goepEpCombineInputs_t cin = GOEP_EP_COMBINE_INPUTS_INIT;
    cin.tokens = &y_t, cin.scales = &sc_t;
    goepEpCombineOutputs_t cout = GOEP_EP_COMBINE_OUTPUTS_INIT;
    cout.tokens = &out_t;
    goepEpCombineConfig_t cc = GOEP_EP_COMBINE_CONFIG_INIT;
    cc.quant_recipe = GOEP_EP_COMB_QUANT_NVFP4;

    /* The refusals, from rank bad: its first row's scale two float32 steps off, then a 2-D scales tensor. */
    int l0 = -1; /* the first local expert of rank bad with a row: where its first row is */
    for (int l = 0; l < L && l0 < 0; l++)
        for (int r = 0; r < R && l0 < 0; r++)
            for (int t = 0; t < num_tokens_of(&s, r) && l0 < 0; t++)
                for (int k = 0; k < K; k++)
                    if (ref_expert(&s, r, t, k) == bad * L + l) l0 = l;
    char says[64];
    snprintf(says, sizeof says, "inputs->scales[%d][0][0] = ", l0);
    float kept = n > 0 ? scales[row[0]] : 0;
    if (my_rank == bad && n > 0) scales[row[0]] = nextafterf(nextafterf(nextafterf(kept, 0), 0), 0);
    if (l0 >= 0) EXPECT_REFUSED(goepEpCombine(h, &cin, &cout, &cc, NULL), bad, goepEpInvalidArgument, says);
    if (n > 0) scales[row[0]] = kept;
    if (my_rank == bad) cin.scales = &sc_flat;
    EXPECT_REFUSED(goepEpCombine(h, &cin, &cout, &cc, NULL), bad, goepEpInvalidArgument, "inputs->scales has shape");
    cin.scales = &sc_t;
    cc.quant_recipe = GOEP_EP_COMB_QUANT_FP8;
    checks++;
    goepEpResult_t rc = goepEpCombine(h, &cin, &cout, &cc, NULL);
    if (rc != goepEpInvalidUsage || !strstr(goepEpGetLastError(), "GOEP_EP_COMB_QUANT_NVFP4, goepEpGroupOptions_t.combine_quant"))
        FAIL("an FP8 combine in an NVFP4 group: %s (%s)", goepEpGetErrorString(rc), goepEpGetLastError());
    cc.quant_recipe = GOEP_EP_COMB_QUANT_NVFP4;

    /* The combine, with the scales and (after a cached dispatch) without them. */
    float x[H4], v[H4], acc[H4];
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1) {
            OK(goepEpDispatch(h, &din, &dout, &li, NULL, NULL));
            cin.scales = NULL;
        }
        memset(out, 0xff, (size_t)MAXT * H * 2);
        OK(goepEpCombine(h, &cin, &cout, &cc, NULL));
        int wrong = 0;
        for (int t = 0; t < in.T && !wrong; t++) {
            int first = 1;
            memset(acc, 0, sizeof acc);
            for (int k = 0; k < K; k++) {
                int e = ref_expert(&s, my_rank, t, k);
                if (e < 0) continue;
                for (int hh = 0; hh < H; hh++) x[hh] = expert_out(e, my_rank, t, hh);
                nvfp4_values(x, H, v);
                float w = ref_weight(t, k);
                for (int hh = 0; hh < H; hh++) {
                    float p = w * v[hh];
                    acc[hh] = first ? p : acc[hh] + p;
                }
                first = 0;
            }
            for (int hh = 0; hh < H && !wrong; hh++)
                if (out[t * H + hh] != bf16_of(acc[hh]) && !(acc[hh] == 0 && float_of_bf16(out[t * H + hh]) == 0)) {
                    FAIL("NVFP4 combine (%s scales): out[%d][%d] = %g, want %g by the definition", pass ? "without" : "with", t, hh,
                         float_of_bf16(out[t * H + hh]), acc[hh]);
                    wrong = 1;
                }
        }
        checks++;
    }
    OK(goepEpHandleDestroy(h));
    OK(goepEpGroupDestroy(g));
    free(recv), free(y), free(scales), free(out), free(in.x);
}

int main(int argc, char** argv) {
    int provided;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &my_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &n_ranks);
    test_ll_rank_major();
    test_ht_expert_major();
    test_fp8(0, 0);
    test_fp8(0, 1);
    test_fp8(1, 0);
    test_nvfp4_forward(0);
    test_nvfp4_forward(1);
    test_nvfp4_combine();
    int bad = failures > 0, any;
    MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (my_rank == 0) printf("ep_features: %d checks on %d ranks: %s\n", checks, n_ranks, any ? "FAILED" : "ok");
    MPI_Finalize();
    return any ? 1 : 0;
}
