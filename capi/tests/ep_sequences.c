/*
 * ep_sequences.c: one rank's refusal never shifts a result to another step. The sequences that once
 * paired one rank's step with another's, from C, each checked for the error on every rank (naming the
 * rank) and for the combined values of the steps after it, in LL and HT:
 *
 *   1. one rank's goepEpCreateHandle is refused (an expert id out of range) and it goes on: the
 *      others' dispatch of that step fails naming it; the next steps are right. If the others retry
 *      that dispatch instead, every rank fails with goepEpMismatch.
 *   2. a combine refused on one rank, the handle destroyed on every rank: the LL buffers come back.
 *   3. a handle destroyed with its send-only dispatch or combine pending (no goepEpComplete).
 *   4. one handle for every step (goepEpInitHandle, its routing in the caller's handle_mem, then
 *      goepEpUpdateHandle per step): one rank's update refused (an expert id out of range) fails that
 *      step's dispatch on every rank naming it; an update of an LL handle whose dispatch has not been
 *      combined is refused on every rank, and that dispatch still combines right (HT: such an update
 *      is taken); the combined values of every step after are right.
 *   5. (-d) a rank that ends (MPI_Finalize, no goepEpGroupDestroy) while the others dispatch: they
 *      get goepEpTimeout naming it within the group's timeout, and goepEpGroupDestroy then returns at
 *      once (success: it does not wait for the rank that ended), so the job ends.
 *
 *   mpirun -np 4 bin/capi/ep_sequences      mpirun -np 2 bin/capi/ep_sequences -d
 *
 * Each step's experts scale their rows by the step's own factor (1, 2, 4, ...: exact in bfloat16), so
 * that a combine paired with another rank's step gives values of the wrong factor. Exits non-zero if
 * any check fails on any rank.
 */
#define _POSIX_C_SOURCE 200809L
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../examples/ep_reference.h"
#include "check.h"
#include "goep_ep.h"

static int my_rank, n_ranks, bad_rank, failures, checks;

#define OK(call) EXPECT_RC(call, goepEpSuccess, "")

enum { H = 16, K = 2, E_PER_RANK = 4, MAXT = 6 };

static ref_shape_t shape(void) { return (ref_shape_t){n_ranks, E_PER_RANK * n_ranks, E_PER_RANK, K, H, MAXT}; }

/* A group and the buffers of its steps. */
typedef struct {
    goepEpGroup_t g;
    int ll, T;
    int32_t topk[MAXT * K], bad_topk[MAXT * K];
    float w[MAXT * K];
    uint16_t x[MAXT * H];
    size_t x_dims[2], k_dims[2], recv_dims[3], rw_dims[2], out_dims[2], bad_out_dims[2], cnt_dims[1];
    goepEpTensor_t x_t, topk_t, bad_topk_t, w_t, recv_t, rw_t, out_t, bad_out_t, cnt_t;
    uint16_t* recv;
    float* recv_w;
    uint16_t* y;
    uint16_t out[(MAXT + 1) * H];
    int32_t counts[E_PER_RANK];
    size_t rows;
} steps_t;

static void open_steps_k(steps_t* st, int ll, uint64_t timeout_ns, int num_topk) {
    memset(st, 0, sizeof *st);
    ref_shape_t s = shape();
    st->ll = ll;
    goepEpGroupConfig_t c = GOEP_EP_GROUP_CONFIG_INIT;
    c.algorithm = ll ? GOEP_EP_ALGO_LOW_LATENCY : GOEP_EP_ALGO_HIGH_THROUGHPUT;
    c.num_experts = E_PER_RANK * n_ranks;
    c.max_dispatch_tokens_per_rank = MAXT;
    c.max_token_bytes = H * 2;
    c.num_topk = (unsigned)num_topk;
    c.timeout_ns = timeout_ns;
    OK(goepEpCreateGroup(&st->g, MPI_COMM_WORLD, &c));
    st->T = num_tokens_of(&s, my_rank);
    for (int t = 0; t < st->T; t++) {
        for (int k = 0; k < K; k++) {
            st->topk[t * K + k] = ref_expert(&s, my_rank, t, k);
            st->bad_topk[t * K + k] = E_PER_RANK * n_ranks; /* out of range */
            st->w[t * K + k] = ref_weight(t, k);
        }
        for (int h = 0; h < H; h++) st->x[t * H + h] = bf16_of(ref_value(my_rank, t, h));
    }
    st->x_dims[0] = st->T, st->x_dims[1] = H;
    st->k_dims[0] = st->T, st->k_dims[1] = K;
    st->x_t = tensor(goepEpBfloat16, st->x, 2, st->x_dims);
    st->topk_t = tensor(goepEpInt32, st->topk, 2, st->k_dims);
    st->bad_topk_t = tensor(goepEpInt32, st->bad_topk, 2, st->k_dims);
    st->w_t = tensor(goepEpFloat32, st->w, 2, st->k_dims);
    st->rows = ll ? (size_t)E_PER_RANK * n_ranks * MAXT : (size_t)n_ranks * MAXT;
    st->recv = calloc(st->rows * H, 2);
    st->y = calloc(st->rows * H, 2);
    st->recv_w = calloc(st->rows * K, 4);
    if (ll) {
        st->recv_dims[0] = E_PER_RANK, st->recv_dims[1] = (size_t)n_ranks * MAXT, st->recv_dims[2] = H;
        st->recv_t = tensor(goepEpBfloat16, st->recv, 3, st->recv_dims);
    } else {
        st->recv_dims[0] = st->rows, st->recv_dims[1] = H;
        st->recv_t = tensor(goepEpBfloat16, st->recv, 2, st->recv_dims);
        st->rw_dims[0] = st->rows, st->rw_dims[1] = K;
        st->rw_t = tensor(goepEpFloat32, st->recv_w, 2, st->rw_dims);
    }
    st->out_dims[0] = st->T, st->out_dims[1] = H;
    st->out_t = tensor(goepEpBfloat16, st->out, 2, st->out_dims);
    st->bad_out_dims[0] = st->T + 1, st->bad_out_dims[1] = H;
    st->bad_out_t = tensor(goepEpBfloat16, st->out, 2, st->bad_out_dims);
    st->cnt_dims[0] = E_PER_RANK;
    st->cnt_t = tensor(goepEpInt32, st->counts, 1, st->cnt_dims);
}

static void open_steps(steps_t* st, int ll, uint64_t timeout_ns) { open_steps_k(st, ll, timeout_ns, K); }

static void close_steps(steps_t* st) {
    OK(goepEpGroupDestroy(st->g));
    free(st->recv), free(st->y), free(st->recv_w);
}

static goepEpResult_t dispatch(steps_t* st, goepEpHandle_t h, int send_only) {
    goepEpDispatchInputs_t in = GOEP_EP_DISPATCH_INPUTS_INIT;
    in.tokens = &st->x_t, in.topk_weights = &st->w_t;
    goepEpDispatchOutputs_t out = GOEP_EP_DISPATCH_OUTPUTS_INIT;
    out.tokens = &st->recv_t;
    if (!st->ll) out.topk_weights = &st->rw_t;
    goepEpLayoutInfo_t li = GOEP_EP_LAYOUT_INFO_INIT;
    li.expert_counters = &st->cnt_t;
    goepEpDispatchConfig_t cfg = GOEP_EP_DISPATCH_CONFIG_INIT;
    cfg.send_only = (unsigned)send_only;
    return goepEpDispatch(h, &in, &out, &li, &cfg, NULL);
}

/* The step's experts: factor times each received row (HT: times its weights too, which HT experts
 * apply). */
static void experts(steps_t* st, float factor) {
    for (size_t r = 0; r < st->rows; r++) {
        float ws = 1;
        if (!st->ll) {
            ws = 0;
            for (int k = 0; k < K; k++) ws += st->recv_w[r * K + k];
        }
        for (int h = 0; h < H; h++) st->y[r * H + h] = bf16_of(float_of_bf16(st->recv[r * H + h]) * factor * ws);
    }
}

static goepEpResult_t combine(steps_t* st, goepEpHandle_t h, float factor, int bad_out, int send_only) {
    experts(st, factor);
    goepEpTensor_t y_t = st->recv_t;
    y_t.data = st->y;
    goepEpCombineInputs_t in = GOEP_EP_COMBINE_INPUTS_INIT;
    in.tokens = &y_t;
    goepEpCombineOutputs_t out = GOEP_EP_COMBINE_OUTPUTS_INIT;
    out.tokens = bad_out ? &st->bad_out_t : &st->out_t;
    if (st->ll) out.topk_weights = &st->w_t;
    goepEpCombineConfig_t cfg = GOEP_EP_COMBINE_CONFIG_INIT;
    cfg.send_only = (unsigned)send_only;
    memset(st->out, 0, sizeof st->out);
    return goepEpCombine(h, &in, &out, &cfg, NULL);
}

static void check(steps_t* st, float factor, const char* what) {
    ref_shape_t s = shape();
    for (int t = 0; t < st->T; t++)
        for (int j = 0; j < H; j++) {
            float got = float_of_bf16(st->out[t * H + j]), want = ref_combined(&s, NULL, my_rank, t, j) * factor;
            if (got != want) {
                FAIL("%s %s: combined token %d [%d] = %g, want %g (the step with factor %g)", st->ll ? "ll" : "ht", what,
                     t, j, got, want, factor);
                return;
            }
        }
    checks++;
}

static void good_step(steps_t* st, float factor, const char* what) {
    goepEpHandle_t h;
    OK(goepEpCreateHandle(&h, st->g, st->ll ? GOEP_EP_LAYOUT_EXPERT_MAJOR : GOEP_EP_LAYOUT_FLAT, &st->topk_t, NULL, NULL, NULL));
    OK(dispatch(st, h, 0));
    OK(combine(st, h, factor, 0, 0));
    OK(goepEpHandleDestroy(h));
    check(st, factor, what);
}

static char refused_by_bad[64];

/* 1. A refused goepEpCreateHandle: the others' dispatch fails naming the rank; the next steps are
 * right. With retry, the others dispatch again instead of going on: every rank gets goepEpMismatch. */
static void test_refused_create(int ll, int retry) {
    steps_t st;
    open_steps(&st, ll, 60ull * 1000 * 1000 * 1000);
    goepEpLayout_t layout = ll ? GOEP_EP_LAYOUT_EXPERT_MAJOR : GOEP_EP_LAYOUT_FLAT;
    good_step(&st, 1, "the step before");
    goepEpHandle_t h;
    if (my_rank == bad_rank) {
        EXPECT_RC(goepEpCreateHandle(&h, st.g, layout, &st.bad_topk_t, NULL, NULL, NULL), goepEpInvalidArgument,
                  "is not an expert id");
        if (retry) { /* its next step, where the others retry theirs */
            OK(goepEpCreateHandle(&h, st.g, layout, &st.topk_t, NULL, NULL, NULL));
            EXPECT_RC(dispatch(&st, h, 0), goepEpMismatch, "no longer match");
            OK(goepEpHandleDestroy(h));
        }
    } else {
        OK(goepEpCreateHandle(&h, st.g, layout, &st.topk_t, NULL, NULL, NULL));
        EXPECT_RC(dispatch(&st, h, 0), goepEpRemoteError, refused_by_bad);
        EXPECT(strstr(goepEpGetLastError(), "is not an expert id"), "the reason is named: %s", goepEpGetLastError());
        if (retry) EXPECT_RC(dispatch(&st, h, 0), goepEpMismatch, "no longer match");
        OK(goepEpHandleDestroy(h));
    }
    if (retry) {
        OK(goepEpCreateHandle(&h, st.g, layout, &st.topk_t, NULL, NULL, NULL));
        EXPECT_RC(dispatch(&st, h, 0), goepEpMismatch, "unusable");
        OK(goepEpHandleDestroy(h));
    } else {
        for (float f = 2; f <= 8; f *= 2) good_step(&st, f, "a step after the refused create");
    }
    close_steps(&st);
}

/* 2. A combine refused on one rank, the handle destroyed on every rank, three times: more than the two
 * LL dispatches that may wait for their combine. */
static void test_refused_combine(int ll) {
    steps_t st;
    open_steps(&st, ll, 60ull * 1000 * 1000 * 1000);
    for (int i = 0; i < 3; i++) {
        goepEpHandle_t h;
        OK(goepEpCreateHandle(&h, st.g, ll ? GOEP_EP_LAYOUT_EXPERT_MAJOR : GOEP_EP_LAYOUT_FLAT, &st.topk_t, NULL, NULL, NULL));
        OK(dispatch(&st, h, 0));
        if (my_rank == bad_rank)
            EXPECT_RC(combine(&st, h, 1, 1, 0), goepEpInvalidArgument, "outputs->tokens has shape");
        else
            EXPECT_RC(combine(&st, h, 1, 0, 0), goepEpRemoteError, refused_by_bad);
        OK(goepEpHandleDestroy(h));
    }
    for (float f = 2; f <= 16; f *= 2) good_step(&st, f, "a step after refused combines");
    close_steps(&st);
}

/* 3. One rank destroys its handle while a send-only dispatch or combine of it is pending; the others
 * complete theirs and get right results; every next step is right. */
static void test_destroy_pending(int ll, int pending_combine) {
    steps_t st;
    open_steps(&st, ll, 60ull * 1000 * 1000 * 1000);
    goepEpHandle_t h;
    OK(goepEpCreateHandle(&h, st.g, ll ? GOEP_EP_LAYOUT_EXPERT_MAJOR : GOEP_EP_LAYOUT_FLAT, &st.topk_t, NULL, NULL, NULL));
    OK(dispatch(&st, h, !pending_combine));
    if (pending_combine) OK(combine(&st, h, 1, 0, 1));
    if (my_rank != bad_rank) {
        OK(goepEpComplete(h, NULL, NULL));
        if (pending_combine) check(&st, 1, "the send-only combine the others completed");
    }
    OK(goepEpHandleDestroy(h));
    for (float f = 2; f <= 8; f *= 2) good_step(&st, f, "a step after a destroy with a pending send-only call");
    close_steps(&st);
}

/* 4. One handle, updated each step. */
static void test_update(int ll) {
    steps_t st;
    open_steps(&st, ll, 60ull * 1000 * 1000 * 1000);
    goepEpLayout_t layout = ll ? GOEP_EP_LAYOUT_EXPERT_MAJOR : GOEP_EP_LAYOUT_FLAT;
    size_t mem_bytes = 0;
    OK(goepEpHandleMemSize(st.g, layout, NULL, &mem_bytes, K));
    uint32_t* mem = malloc(mem_bytes);
    size_t mem_dims[1] = {mem_bytes};
    goepEpTensor_t mem_t = tensor(goepEpUint8, mem, 1, mem_dims);
    goepEpHandle_t h;
    OK(goepEpInitHandle(&h, st.g, layout, NULL, ll ? K : -1, &mem_t));
    float f = 1;
    for (; f <= 2; f *= 2) {
        OK(goepEpUpdateHandle(h, &st.topk_t, NULL, NULL));
        OK(dispatch(&st, h, 0));
        OK(combine(&st, h, f, 0, 0));
        check(&st, f, "a step of an updated handle");
    }
    if (my_rank == bad_rank) {
        EXPECT_RC(goepEpUpdateHandle(h, &st.bad_topk_t, NULL, NULL), goepEpInvalidArgument, "is not an expert id");
        /* its part in the step's dispatch: the refusal the others see, then its own error */
        EXPECT_RC(dispatch(&st, h, 0), goepEpInvalidUsage, "goepEpUpdateHandle refused the handle's routing");
    } else {
        OK(goepEpUpdateHandle(h, &st.topk_t, NULL, NULL));
        EXPECT_RC(dispatch(&st, h, 0), goepEpRemoteError, refused_by_bad);
        EXPECT(strstr(goepEpGetLastError(), "goepEpUpdateHandle refused") && strstr(goepEpGetLastError(), "is not an expert id"),
               "the reason is named: %s", goepEpGetLastError());
    }
    for (; f <= 8; f *= 2) {
        OK(goepEpUpdateHandle(h, &st.topk_t, NULL, NULL));
        OK(dispatch(&st, h, 0));
        OK(combine(&st, h, f, 0, 0));
        check(&st, f, "a step after a refused update");
    }
    OK(goepEpUpdateHandle(h, &st.topk_t, NULL, NULL));
    OK(dispatch(&st, h, 0));
    if (ll) {
        EXPECT_RC(goepEpUpdateHandle(h, &st.topk_t, NULL, NULL), goepEpInvalidUsage, "has not been combined");
    } else {
        OK(goepEpUpdateHandle(h, &st.topk_t, NULL, NULL)); /* the earlier dispatch released, dispatched again */
        OK(dispatch(&st, h, 0));
    }
    OK(combine(&st, h, f, 0, 0));
    check(&st, f, ll ? "the combine of a dispatch whose handle's update was refused" : "a step updated before its combine");
    for (f *= 2; f <= 64; f *= 2) {
        OK(goepEpUpdateHandle(h, &st.topk_t, NULL, NULL));
        OK(dispatch(&st, h, 0));
        OK(combine(&st, h, f, 0, 0));
        check(&st, f, "a step after the refused update of an uncombined handle");
    }
    OK(goepEpHandleDestroy(h));
    close_steps(&st);
    free(mem);
}

/* 5. A group created with num_topk 0 opens at its first handle, with that handle's top-k: buffer
 * plans and handle sizes work before; first handles whose top-k differs across ranks fail on every
 * rank naming a rank, and leave the group to be opened again; a narrower LL handle (top-k 1 after 2)
 * is padded and its values are right; a wider one is refused on every rank, by name. */
static void test_lazy(int ll) {
    steps_t st;
    open_steps_k(&st, ll, 60ull * 1000 * 1000 * 1000, 0);
    goepEpLayout_t layout = ll ? GOEP_EP_LAYOUT_EXPERT_MAJOR : GOEP_EP_LAYOUT_FLAT;
    size_t n = 0;
    OK(goepEpHandleMemSize(st.g, layout, NULL, &n, K));
    EXPECT(n == (size_t)MAXT * K * 4, "goepEpHandleMemSize before the group opens: %zu bytes, want %d", n, MAXT * K * 4);
    EXPECT_RC(goepEpHandleMemSize(st.g, layout, NULL, &n, 0), goepEpInvalidArgument, "num_topk = 0");
    EXPECT_RC(goepEpGroupBufferBytes(st.g, &n), goepEpInvalidUsage, "first goepEpInitHandle or goepEpCreateHandle");
    int mask[64];
    if (n_ranks <= 64) /* as before the group opens as after: the group has no enable_mask */
        EXPECT_RC(goepEpMaskQuery(st.g, mask, NULL), goepEpInvalidUsage, "config.enable_mask = 1");

    /* The bad rank's first handle has top-k 1, the others' 2: NewGroup compares, and every rank fails. */
    ref_shape_t s1 = shape();
    s1.topk = 1;
    int32_t topk1[MAXT];
    float w1[MAXT];
    for (int t = 0; t < st.T; t++) topk1[t] = ref_expert(&s1, my_rank, t, 0), w1[t] = ref_weight(t, 0);
    size_t k1_dims[2] = {(size_t)st.T, 1};
    goepEpTensor_t topk1_t = tensor(goepEpInt32, topk1, 2, k1_dims), w1_t = tensor(goepEpFloat32, w1, 2, k1_dims);
    char named[32];
    snprintf(named, sizeof named, "rank %d has TopK = 1", bad_rank);
    goepEpHandle_t h;
    EXPECT_RC(goepEpCreateHandle(&h, st.g, layout, my_rank == bad_rank ? &topk1_t : &st.topk_t, NULL, NULL, NULL), goepEpInvalidArgument,
              named);
    EXPECT_RC(goepEpGroupBufferBytes(st.g, &n), goepEpInvalidUsage, "no handle has been made yet");

    /* Then every rank agrees on top-k 2: the group opens, and its rounds give the reference values. */
    good_step(&st, 1, "the first step of a group opened by its first handle");
    OK(goepEpGroupBufferBytes(st.g, &n));
    EXPECT(n > 0, "goepEpGroupBufferBytes once open: %zu", n);
    good_step(&st, 2, "the second step");

    if (ll) {
        /* top-k 1 in a top-k 2 group: padded with -1; the combine applies the one weight per token */
        OK(goepEpCreateHandle(&h, st.g, layout, &topk1_t, NULL, NULL, NULL));
        goepEpTensor_t saved_w = st.w_t;
        st.w_t = w1_t;
        OK(dispatch(&st, h, 0));
        OK(combine(&st, h, 4, 0, 0));
        st.w_t = saved_w;
        OK(goepEpHandleDestroy(h));
        for (int t = 0; t < st.T; t++)
            for (int j = 0; j < H; j++) {
                float got = float_of_bf16(st.out[t * H + j]), want = ref_combined(&s1, NULL, my_rank, t, j) * 4;
                if (got != want) {
                    FAIL("ll top-k 1 handle in a top-k 2 group: combined token %d [%d] = %g, want %g", t, j, got, want);
                    t = st.T;
                    break;
                }
            }
        checks++;
    } else {
        EXPECT_RC(goepEpCreateHandle(&h, st.g, layout, &topk1_t, NULL, NULL, NULL), goepEpInvalidUsage, "in LL groups only");
    }
    /* top-k 3: wider than the group's, refused on every rank naming why */
    int32_t topk3[MAXT * 3];
    for (int i = 0; i < MAXT * 3; i++) topk3[i] = -1;
    size_t k3_dims[2] = {(size_t)st.T, 3};
    goepEpTensor_t topk3_t = tensor(goepEpInt32, topk3, 2, k3_dims);
    EXPECT_RC(goepEpCreateHandle(&h, st.g, layout, &topk3_t, NULL, NULL, NULL), goepEpInvalidUsage, "does not re-open a group");
    EXPECT_RC(goepEpInitHandle(&h, st.g, layout, NULL, 3, NULL), goepEpInvalidUsage, "does not re-open a group");
    good_step(&st, 8, "a step after the refused handles");
    close_steps(&st);
}

/* 6. The bad rank ends: MPI_Finalize, never goepEpGroupDestroy. The others' dispatch is goepEpTimeout
 * naming it, and their goepEpGroupDestroy returns at once with success: it waits for no rank. */
static int test_dead_rank(void) {
    steps_t st;
    open_steps(&st, 1, 3ull * 1000 * 1000 * 1000);
    good_step(&st, 1, "the step before");
    if (my_rank == bad_rank) {
        free(st.recv), free(st.y), free(st.recv_w);
        return 1; /* ends: main finalizes MPI */
    }
    goepEpHandle_t h;
    OK(goepEpCreateHandle(&h, st.g, GOEP_EP_LAYOUT_EXPERT_MAJOR, &st.topk_t, NULL, NULL, NULL));
    char named[32];
    snprintf(named, sizeof named, "rank %d", bad_rank);
    EXPECT_RC(dispatch(&st, h, 0), goepEpTimeout, named);
    OK(goepEpHandleDestroy(h));
    close_steps(&st); /* OK: at once, not a second timeout waiting for the rank that ended */
    return 0;
}

int main(int argc, char** argv) {
    int provided;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &my_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &n_ranks);
    bad_rank = n_ranks - 1;
    snprintf(refused_by_bad, sizeof refused_by_bad, "rank %d refused the call", bad_rank);
    int dead = argc > 1 && strcmp(argv[1], "-d") == 0;
    if (n_ranks < 2) {
        if (my_rank == 0) fprintf(stderr, "ep_sequences: needs 2 ranks or more (one whose calls differ)\n");
        MPI_Finalize();
        return 2;
    }
    int ended = 0;
    if (dead) {
        ended = test_dead_rank();
    } else {
        for (int ll = 1; ll >= 0; ll--) {
            test_refused_create(ll, 0);
            test_refused_create(ll, 1);
            test_refused_combine(ll);
            test_destroy_pending(ll, 0);
            test_destroy_pending(ll, 1);
            test_update(ll);
            test_lazy(ll);
        }
    }
    int all = failures;
    if (!dead) MPI_Allreduce(&failures, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (my_rank == 0) printf("ep_sequences%s: %d checks on %d ranks: %s\n", dead ? " -d" : "", checks, n_ranks, all ? "FAILED" : "ok");
    (void)ended;
    MPI_Finalize();
    return all ? 1 : 0;
}
