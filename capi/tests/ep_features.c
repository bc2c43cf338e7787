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
 *   - forwarded FP8 rows (FWD): the caller's codes and scales arrive byte for byte.
 *
 *   mpirun -np 4 bin/capi/ep_features
 */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../examples/ep_reference.h"
#include "goep_ep.h"

static int my_rank, n_ranks, failures, checks;

#define FAIL(...)                                                         \
    do {                                                                  \
        failures++;                                                       \
        fprintf(stderr, "rank %d: %s:%d: ", my_rank, __FILE__, __LINE__); \
        fprintf(stderr, __VA_ARGS__);                                     \
        fprintf(stderr, "\n");                                            \
    } while (0)
#define OK(call)                                                                                   \
    do {                                                                                           \
        checks++;                                                                                  \
        goepEpResult_t rc_ = (call);                                                               \
        if (rc_ != goepEpSuccess) {                                                                \
            FAIL("%s: %s (%s)", #call, goepEpGetErrorString(rc_), goepEpGetLastError());           \
            MPI_Abort(MPI_COMM_WORLD, 1); /* the ranks' calls no longer match: nothing more to learn */ \
        }                                                                                          \
    } while (0)
#define EXPECT(cond, ...)               \
    do {                                \
        checks++;                       \
        if (!(cond)) FAIL(__VA_ARGS__); \
    } while (0)

enum { E_PER_RANK = 3, K = 3, MAXT = 8 };

static ref_shape_t shape(int hidden) { return (ref_shape_t){n_ranks, E_PER_RANK * n_ranks, E_PER_RANK, K, hidden, MAXT}; }

static goepEpTensor_t tensor(goepEpDataType_t d, void* data, unsigned ndim, size_t* dims) {
    goepEpTensor_t t = GOEP_EP_TENSOR_INIT;
    t.ndim = ndim, t.datatype = d, t.data = data, t.sizes = dims;
    return t;
}

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
    int bad = failures > 0, any;
    MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (my_rank == 0) printf("ep_features: %d checks on %d ranks: %s\n", checks, n_ranks, any ? "FAILED" : "ok");
    MPI_Finalize();
    return any ? 1 : 0;
}
