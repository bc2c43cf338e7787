/*
 * ep_test.c: a full dispatch / expert / combine round through goep's C interface, checked against
 * a reference this program computes itself (ep_reference.h), written the way NCCL EP's ep_test.cu
 * uses its API: a group from the program's MPI communicator, a handle per step's routing, dispatch
 * into the caller's buffers, the experts, combine, and the send-only halves with goepEpComplete.
 *
 *   mpirun -np 4 bin/capi/ep_test [-a ll,ht] [-s none,dispatch,combine,both] [-c] [-z] [-t tokens]
 *                                 [-d hidden] [-k topk] [-e experts_per_rank] [-f bf16|f32]
 *                                 [-b backend] [-D max_recv] [-Q]
 *
 * -a and -s take lists (default: every algorithm, send-only none and both); -c repeats each round
 * with the same handle (a cached dispatch and combine) and checks it gives the same; -z runs each
 * round a second time without copies (goep's extension: the rows read and overwritten in place in
 * the group's buffer, goepEpHandleRecvTokens). goep's options (goepEpCreateGroupWithOptions): -f the
 * token type, -b the backend by name, -Q the FP8 combine (checked within its error bound, docs/ep.md).
 * -D gives HT groups max_recv_tokens_per_rank = max_recv and GOEP_EP_OVERFLOW_DROP: each rank keeps
 * its first max_recv rows, and a dropped row contributes nothing to the combine. Prints one line per
 * round on rank 0 and exits non-zero on any rank's mismatch.
 */
#define _POSIX_C_SOURCE 200809L
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ep_reference.h"
#include "goep_ep.h"

static int my_rank, n_ranks;

#define CHECK(call)                                                                                     \
    do {                                                                                                \
        goepEpResult_t rc_ = (call);                                                                    \
        if (rc_ != goepEpSuccess) {                                                                     \
            fprintf(stderr, "rank %d: %s:%d: %s failed: %s\n  %s\n", my_rank, __FILE__, __LINE__, #call, \
                    goepEpGetErrorString(rc_), goepEpGetLastError());                                   \
            MPI_Abort(MPI_COMM_WORLD, 2);                                                               \
        }                                                                                               \
    } while (0)

/* A host tensor: its memory, its descriptor and its extents, owned here. */
typedef struct {
    size_t dims[3];
    goepEpTensor_t t;
    size_t bytes;
} host_tensor_t;

static size_t dtype_size(goepEpDataType_t d) {
    switch (d) {
        case goepEpBfloat16: return 2;
        case goepEpInt64: return 8;
        default: return 4;
    }
}

static void make_tensor(host_tensor_t* h, goepEpDataType_t dtype, unsigned ndim, size_t d0, size_t d1, size_t d2) {
    h->dims[0] = d0, h->dims[1] = d1, h->dims[2] = d2;
    h->t = GOEP_EP_TENSOR_INIT;
    h->t.ndim = ndim;
    h->t.datatype = dtype;
    h->t.sizes = h->dims;
    h->bytes = dtype_size(dtype);
    for (unsigned i = 0; i < ndim; i++) h->bytes *= h->dims[i];
    h->t.data = calloc(1, h->bytes ? h->bytes : 1);
}

static void free_tensor(host_tensor_t* h) { free(h->t.data); }

/* Element i of a token tensor as a float, and the reverse. */
static float get_tok(const host_tensor_t* h, size_t i) {
    if (h->t.datatype == goepEpBfloat16) return float_of_bf16(((uint16_t*)h->t.data)[i]);
    return ((float*)h->t.data)[i];
}
static void set_tok(host_tensor_t* h, size_t i, float v) {
    if (h->t.datatype == goepEpBfloat16)
        ((uint16_t*)h->t.data)[i] = bf16_of(v);
    else
        ((float*)h->t.data)[i] = v;
}

typedef struct {
    goepEpAlgorithm_t algo;
    int send_dispatch, send_combine, cached, zero_copy;
    goepEpDataType_t dtype;
    int max_recv; /* HT with GOEP_EP_OVERFLOW_DROP: the rows a rank keeps; 0: no drop */
    int fp8_combine;
} round_opts_t;

/* Whether rank dst keeps the HT row of token t of rank src under GOEP_EP_OVERFLOW_DROP with max_recv
 * (0: every row): dst keeps its rows source rank by source rank, each source's in token order, until
 * max_recv. */
static int ht_kept(const ref_shape_t* s, int max_recv, int dst, int src, int t) {
    if (max_recv <= 0) return 1;
    int row = 0;
    for (int r = 0; r <= src; r++)
        for (int u = 0; u < num_tokens_of(s, r) && (r < src || u <= t); u++) {
            int hit = 0;
            for (int k = 0; k < s->topk; k++) {
                int e = ref_expert(s, r, u, k);
                hit |= e >= 0 && ref_owner(s, e) == dst;
            }
            if (!hit) continue;
            if (r == src && u == t) return row < max_recv;
            row++;
        }
    return 0;
}

static int failures;

#define EXPECT(cond, ...)                                                    \
    do {                                                                     \
        if (!(cond)) {                                                       \
            if (failures++ < 10) {                                           \
                fprintf(stderr, "rank %d: %s: ", my_rank, round_name);       \
                fprintf(stderr, __VA_ARGS__);                                \
                fprintf(stderr, "\n");                                       \
            }                                                                \
        }                                                                    \
    } while (0)

static char round_name[128];

/* check_dispatch compares what this rank received with the reference: per local expert (LL) or
 * per row (HT), the source rank and token of each row, in order, its values, ids and weights. */
static void check_dispatch(const ref_shape_t* s, const round_opts_t* o, const host_tensor_t* recv,
                           const host_tensor_t* counts, const host_tensor_t* recv_w, const host_tensor_t* recv_idx,
                           const host_tensor_t* total) {
    int L = s->local_experts, H = s->hidden, K = s->topk;
    const int32_t* cnt = counts->t.data;
    if (o->algo == GOEP_EP_ALGO_LOW_LATENCY) {
        size_t span = (size_t)n_ranks * s->max_tokens;
        long sum = 0;
        for (int l = 0; l < L; l++) {
            int e = my_rank * L + l, row = 0;
            for (int src = 0; src < n_ranks; src++)
                for (int t = 0; t < num_tokens_of(s, src); t++) {
                    int hit = 0;
                    for (int k = 0; k < K; k++) hit |= ref_expert(s, src, t, k) == e;
                    if (!hit) continue;
                    if (row < cnt[l])
                        for (int h = 0; h < H; h++) {
                            float got = get_tok(recv, ((size_t)l * span + row) * H + h);
                            EXPECT(got == ref_value(src, t, h), "expert %d row %d (rank %d token %d) [%d] = %g, want %g",
                                   l, row, src, t, h, got, ref_value(src, t, h));
                        }
                    row++;
                }
            EXPECT(cnt[l] == row, "expert_counters[%d] = %d, want %d", l, cnt[l], row);
            sum += row;
        }
        EXPECT(((int32_t*)total->t.data)[0] == sum, "recv_total_counter = %d, want %ld", ((int32_t*)total->t.data)[0], sum);
        return;
    }
    int row = 0;
    int32_t want_cnt[256] = {0};
    const float* w = recv_w->t.data;
    const int64_t* idx = recv_idx->t.data;
    for (int src = 0; src < n_ranks; src++)
        for (int t = 0; t < num_tokens_of(s, src); t++) {
            int hit = 0;
            for (int k = 0; k < K; k++) {
                int e = ref_expert(s, src, t, k);
                hit |= e >= 0 && ref_owner(s, e) == my_rank;
            }
            if (!hit || (o->max_recv > 0 && row >= o->max_recv)) continue; /* dropped: after the kept rows */
            if (row < ((int32_t*)total->t.data)[0]) {
                for (int h = 0; h < H; h++) {
                    float got = get_tok(recv, (size_t)row * H + h);
                    EXPECT(got == ref_value(src, t, h), "row %d (rank %d token %d) [%d] = %g, want %g", row, src, t, h,
                           got, ref_value(src, t, h));
                }
                for (int k = 0; k < K; k++) {
                    int e = ref_expert(s, src, t, k);
                    int mine = e >= 0 && ref_owner(s, e) == my_rank;
                    int64_t want_id = mine ? e - my_rank * L : -1;
                    float want_w = mine ? ref_weight(t, k) : 0.0f;
                    if (mine) want_cnt[want_id]++;
                    EXPECT(idx[row * K + k] == want_id, "topk_idx[%d][%d] = %lld, want %lld", row, k,
                           (long long)idx[row * K + k], (long long)want_id);
                    EXPECT(w[row * K + k] == want_w, "topk_weights[%d][%d] = %g, want %g", row, k, w[row * K + k], want_w);
                }
            }
            row++;
        }
    EXPECT(((int32_t*)total->t.data)[0] == row, "recv_total_counter = %d, want %d", ((int32_t*)total->t.data)[0], row);
    for (int l = 0; l < L; l++) EXPECT(cnt[l] == want_cnt[l], "expert_counters[%d] = %d, want %d", l, cnt[l], want_cnt[l]);
}

/* The combine's output against the reference: bit for bit, or with the FP8 combine within its bound
 * (per slot, its weight times 2^-4 of the row's value: half an e4m3 step, three times that in HT; then
 * the rounding to the token type, 2^-8 of the result in bfloat16). */
static void check_combine(const ref_shape_t* s, const round_opts_t* o, const host_tensor_t* out) {
    int T = num_tokens_of(s, my_rank), inexact = 0;
    for (int t = 0; t < T; t++)
        for (int h = 0; h < s->hidden; h++) {
            float got = get_tok(out, (size_t)t * s->hidden + h), want = 0, wsum = 0;
            for (int k = 0; k < s->topk; k++) {
                int e = ref_expert(s, my_rank, t, k);
                if (e < 0 || !ht_kept(s, o->algo == GOEP_EP_ALGO_HIGH_THROUGHPUT ? o->max_recv : 0, ref_owner(s, e), my_rank, t))
                    continue;
                want += ref_weight(t, k) * ref_value(my_rank, t, h);
                wsum += ref_weight(t, k);
            }
            if (!o->fp8_combine) {
                EXPECT(got == want, "combined token %d [%d] = %g, want %g", t, h, got, want);
                continue;
            }
            /* HT quantizes each rank's partial and, across nodes, the node's sum again: 3/16 per slot. */
            float rel = o->algo == GOEP_EP_ALGO_HIGH_THROUGHPUT ? 3.0f / 16 : 1.0f / 16;
            float v = ref_value(my_rank, t, h), bound = wsum * (v < 0 ? -v : v) * rel + (want < 0 ? -want : want) / 128;
            float d = got - want;
            EXPECT(d <= bound && -d <= bound, "FP8 combine: token %d [%d] = %g, want %g within %g", t, h, got, want, bound);
            inexact += d != 0;
        }
    /* Most of these values are not e4m3 steps of their row's scale: some must come back inexact. */
    EXPECT(!o->fp8_combine || T == 0 || inexact > 0, "FP8 combine: every value exact, as if the outputs had not been quantised");
}

/* The HT experts: each received row times the sum of its local slots' weights (the expert side applies
 * them in HT), from src into dst (which may be src: in place). */
static void ht_expert(host_tensor_t* dst, const host_tensor_t* src, const host_tensor_t* recv_w, int n, int K, int H) {
    for (int r = 0; r < n; r++) {
        float wsum = 0;
        for (int k = 0; k < K; k++) wsum += ((const float*)recv_w->t.data)[r * K + k];
        for (int h = 0; h < H; h++) set_tok(dst, (size_t)r * H + h, wsum * get_tok(src, (size_t)r * H + h));
    }
}

static void run_round(goepEpGroup_t group, const ref_shape_t* s, const round_opts_t* o) {
    int T = num_tokens_of(s, my_rank), H = s->hidden, K = s->topk, L = s->local_experts, R = n_ranks;
    int ll = o->algo == GOEP_EP_ALGO_LOW_LATENCY;
    size_t slots = (size_t)R * s->max_tokens; /* HT: max_recv_tokens_per_rank AUTO */

    /* Inputs: tokens, their top-k expert ids (int64, as NCCL EP's test) and gate weights. */
    host_tensor_t x, topk_idx, topk_w;
    make_tensor(&x, o->dtype, 2, T, H, 0);
    make_tensor(&topk_idx, goepEpInt64, 2, T, K, 0);
    make_tensor(&topk_w, goepEpFloat32, 2, T, K, 0);
    for (int t = 0; t < T; t++) {
        for (int h = 0; h < H; h++) set_tok(&x, (size_t)t * H + h, ref_value(my_rank, t, h));
        for (int k = 0; k < K; k++) {
            ((int64_t*)topk_idx.t.data)[t * K + k] = ref_expert(s, my_rank, t, k);
            ((float*)topk_w.t.data)[t * K + k] = ref_weight(t, k);
        }
    }
    goepEpHandle_t handle;
    CHECK(goepEpCreateHandle(&handle, group, ll ? GOEP_EP_LAYOUT_EXPERT_MAJOR : GOEP_EP_LAYOUT_FLAT, &topk_idx.t, NULL, NULL, NULL));

    /* Outputs, sized by the layout. */
    host_tensor_t recv, counts, total, recv_w, recv_idx;
    if (ll)
        make_tensor(&recv, o->dtype, 3, L, (size_t)R * s->max_tokens, H);
    else
        make_tensor(&recv, o->dtype, 2, slots, H, 0);
    make_tensor(&counts, goepEpInt32, 1, L, 0, 0);
    make_tensor(&total, goepEpInt32, 1, 1, 0, 0);
    make_tensor(&recv_w, goepEpFloat32, 2, ll ? 0 : slots, K, 0);
    make_tensor(&recv_idx, goepEpInt64, 2, ll ? 0 : slots, K, 0);

    goepEpDispatchInputs_t din = GOEP_EP_DISPATCH_INPUTS_INIT;
    din.tokens = &x.t;
    din.topk_weights = &topk_w.t;
    goepEpDispatchOutputs_t dout = GOEP_EP_DISPATCH_OUTPUTS_INIT;
    dout.tokens = o->zero_copy ? NULL : &recv.t; /* NULL: the rows stay in the group's buffer */
    if (!ll) {
        dout.topk_weights = &recv_w.t;
        dout.topk_idx = &recv_idx.t;
    }
    goepEpLayoutInfo_t info = GOEP_EP_LAYOUT_INFO_INIT;
    info.expert_counters = &counts.t;
    info.recv_total_counter = &total.t;
    goepEpDispatchConfig_t dcfg = GOEP_EP_DISPATCH_CONFIG_INIT;
    dcfg.send_only = o->send_dispatch;
    CHECK(goepEpDispatch(handle, &din, &dout, &info, &dcfg, NULL));
    CHECK(goepEpComplete(handle, NULL, NULL)); /* as NCCL EP's test: a no-op after a call that was not send-only */
    host_tensor_t view; /* zero-copy: the rows where they are, in the group's buffer */
    if (o->zero_copy) {
        view.t = (goepEpTensor_t)GOEP_EP_TENSOR_INIT;
        view.t.sizes = view.dims;
        CHECK(goepEpHandleRecvTokens(handle, &view.t));
        EXPECT(view.t.ndim == recv.t.ndim && view.t.datatype == o->dtype && view.dims[0] == (ll ? (size_t)L : (size_t)((int32_t*)total.t.data)[0]),
               "goepEpHandleRecvTokens: ndim %u, datatype %d, sizes[0] %zu", view.t.ndim, (int)view.t.datatype, view.dims[0]);
    }
    host_tensor_t* rows = o->zero_copy ? &view : &recv;
    check_dispatch(s, o, rows, &counts, &recv_w, &recv_idx, &total);
    if (o->zero_copy) { /* a copy of the first dispatch's rows, for the cached round to compare with */
        size_t n = view.dims[0] * view.dims[1] * (view.t.ndim == 3 ? view.dims[2] : 1);
        memcpy(recv.t.data, view.t.data, n * dtype_size(o->dtype));
    }

    /* The experts: LL, the identity on the received rows in place; HT, each row times the sum of its
     * local slots' weights (the expert side applies them in HT), written in place when zero-copy. */
    host_tensor_t* y = rows;
    host_tensor_t y_ht;
    if (!ll && !o->zero_copy) {
        make_tensor(&y_ht, o->dtype, 2, slots, H, 0);
        y = &y_ht;
    }
    if (!ll) ht_expert(y, rows, &recv_w, ((int32_t*)total.t.data)[0], K, H);
    host_tensor_t out;
    make_tensor(&out, o->dtype, 2, T, H, 0);
    goepEpCombineInputs_t cin = GOEP_EP_COMBINE_INPUTS_INIT;
    cin.tokens = &y->t;
    goepEpCombineOutputs_t cout = GOEP_EP_COMBINE_OUTPUTS_INIT;
    cout.tokens = &out.t;
    if (ll) cout.topk_weights = &topk_w.t; /* LL applies the gate weights as it combines */
    goepEpCombineConfig_t ccfg = GOEP_EP_COMBINE_CONFIG_INIT;
    ccfg.send_only = o->send_combine;
    CHECK(goepEpCombine(handle, &cin, &cout, &ccfg, NULL));
    CHECK(goepEpComplete(handle, NULL, NULL));
    check_combine(s, o, &out);

    if (o->cached) {
        /* The same handle again: a cached dispatch (tokens only: the routing and weights are the
         * handle's) and combine must give the same bytes. */
        host_tensor_t recv2, out2;
        make_tensor(&recv2, o->dtype, recv.t.ndim, recv.dims[0], recv.dims[1], recv.dims[2]);
        make_tensor(&out2, o->dtype, 2, T, H, 0);
        goepEpDispatchInputs_t din2 = GOEP_EP_DISPATCH_INPUTS_INIT;
        din2.tokens = &x.t;
        goepEpDispatchOutputs_t dout2 = GOEP_EP_DISPATCH_OUTPUTS_INIT;
        dout2.tokens = &recv2.t;
        CHECK(goepEpDispatch(handle, &din2, &dout2, ll ? &info : NULL, &dcfg, NULL));
        CHECK(goepEpComplete(handle, NULL, NULL));
        int n = ll ? 0 : ((int32_t*)total.t.data)[0];
        if (ll) {
            size_t span = (size_t)R * s->max_tokens * H;
            for (int l = 0; l < L; l++)
                EXPECT(!memcmp((char*)recv2.t.data + l * span * dtype_size(o->dtype),
                               (char*)recv.t.data + l * span * dtype_size(o->dtype),
                               (size_t)((int32_t*)counts.t.data)[l] * H * dtype_size(o->dtype)),
                       "cached dispatch: expert %d's rows differ from the first dispatch's", l);
        } else {
            EXPECT(!memcmp(recv2.t.data, recv.t.data, (size_t)n * H * dtype_size(o->dtype)),
                   "cached dispatch: the rows differ from the first dispatch's");
        }
        goepEpCombineOutputs_t cout2 = GOEP_EP_COMBINE_OUTPUTS_INIT;
        cout2.tokens = &out2.t;
        if (ll) cin.tokens = &recv2.t;
        if (!ll && o->zero_copy) ht_expert(&view, &view, &recv_w, n, K, H); /* the second dispatch refilled it */
        CHECK(goepEpCombine(handle, &cin, &cout2, &ccfg, NULL));
        CHECK(goepEpComplete(handle, NULL, NULL));
        EXPECT(!memcmp(out2.t.data, out.t.data, out.bytes), "cached combine: the output differs from the first combine's");
        free_tensor(&recv2);
        free_tensor(&out2);
    }
    CHECK(goepEpHandleDestroy(handle));
    if (!ll && !o->zero_copy) free_tensor(&y_ht);
    host_tensor_t* all[] = {&x, &topk_idx, &topk_w, &recv, &counts, &total, &recv_w, &recv_idx, &out};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) free_tensor(all[i]);
}

static int has(const char* list, const char* item) {
    char buf[256];
    snprintf(buf, sizeof buf, "%s", list);
    for (char* tok = strtok(buf, ","); tok; tok = strtok(NULL, ","))
        if (!strcmp(tok, item)) return 1;
    return 0;
}

int main(int argc, char** argv) {
    int provided;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &my_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &n_ranks);

    const char *algos = "ll,ht", *sends = "none,both", *dtype_name = "bf16";
    const char* backend = NULL;
    int cached = 0, zero_copy = 0, tokens = 24, hidden = 64, topk = 4, experts_per_rank = 8, max_recv = 0, fp8 = 0, opt;
    while ((opt = getopt(argc, argv, "a:s:czt:d:k:e:f:b:D:Q")) != -1) {
        switch (opt) {
            case 'a': algos = optarg; break;
            case 's': sends = optarg; break;
            case 'c': cached = 1; break;
            case 'z': zero_copy = 1; break;
            case 't': tokens = atoi(optarg); break;
            case 'd': hidden = atoi(optarg); break;
            case 'k': topk = atoi(optarg); break;
            case 'e': experts_per_rank = atoi(optarg); break;
            case 'f': dtype_name = optarg; break;
            case 'b': backend = optarg; break;
            case 'D': max_recv = atoi(optarg); break;
            case 'Q': fp8 = 1; break;
            default:
                if (my_rank == 0) fprintf(stderr, "usage: see the comment at the top of ep_test.c\n");
                MPI_Finalize();
                return 2;
        }
    }
    goepEpDataType_t dtype = strcmp(dtype_name, "f32") ? goepEpBfloat16 : goepEpFloat32;
    ref_shape_t s = {n_ranks, experts_per_rank * n_ranks, experts_per_rank, topk, hidden, tokens};
    if (s.local_experts > 256) {
        if (my_rank == 0) fprintf(stderr, "ep_test: at most 256 experts per rank\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    static const char* send_names[] = {"none", "dispatch", "combine", "both"};
    static const char* algo_names[] = {"ll", "ht"};
    for (int a = 0; a < 2; a++) {
        if (!has(algos, algo_names[a])) continue;
        goepEpGroupConfig_t cfg = GOEP_EP_GROUP_CONFIG_INIT;
        cfg.algorithm = a == 0 ? GOEP_EP_ALGO_LOW_LATENCY : GOEP_EP_ALGO_HIGH_THROUGHPUT;
        cfg.num_experts = s.num_experts;
        cfg.max_dispatch_tokens_per_rank = tokens;
        cfg.max_token_bytes = hidden * (unsigned)dtype_size(dtype);
        cfg.num_topk = topk;
        cfg.timeout_ns = 30ull * 1000 * 1000 * 1000;
        if (a == 1 && max_recv > 0) {
            cfg.max_recv_tokens_per_rank = max_recv;
            cfg.overflow_policy = GOEP_EP_OVERFLOW_DROP;
        }
        goepEpGroupOptions_t opts = GOEP_EP_GROUP_OPTIONS_INIT; /* goep's: the token type, the backend */
        opts.token_datatype = dtype;
        opts.backend = backend;
        if (fp8) opts.combine_quant = GOEP_EP_COMB_QUANT_FP8;
        goepEpGroup_t group;
        CHECK(goepEpCreateGroupWithOptions(&group, MPI_COMM_WORLD, &cfg, &opts));
        for (int rnd = 0; rnd < 8; rnd++) {
            int sm = rnd % 4, zc = rnd / 4;
            if (!has(sends, send_names[sm]) || (zc && !zero_copy)) continue;
            round_opts_t o = {cfg.algorithm, sm & 1, (sm >> 1) & 1, cached, zc, dtype, a == 1 ? max_recv : 0, fp8};
            snprintf(round_name, sizeof round_name, "%s %s send-only=%s%s%s%s%s%s", algo_names[a], dtype_name,
                     send_names[sm], cached ? " cached" : "", zc ? " zero-copy" : "", o.max_recv ? " drop" : "",
                     o.fp8_combine ? " fp8-combine" : "", backend ? " backend" : "");
            int before = failures;
            run_round(group, &s, &o);
            int bad = failures > before, any;
            MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
            if (my_rank == 0)
                printf("ep_test: %-50s %d ranks: %s\n", round_name, n_ranks, any ? "FAILED" : "ok");
        }
        CHECK(goepEpGroupDestroy(group));
    }
    int bad = failures > 0, any;
    MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    MPI_Finalize();
    return any ? 1 : 0;
}
