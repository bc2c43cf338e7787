/*
 * ep_errors.c: goep's C interface refuses bad input with the right result code and a message
 * naming the bad value, writes nothing when it refuses, stays usable afterwards, and turns a peer
 * that stalls into an error (goepEpTimeout) or, with enable_mask, into a masked rank
 * (goepEpGetAsyncError, goepEpMaskQuery, goepEpMaskClean), never a hang.
 *
 *   mpirun -np 2 bin/capi/ep_errors [-s]   (-s: also the stalled-peer cases, about 12 s; 2 ranks or more)
 *
 * Every rank passes the same bad input at the same time, so no collective call is left half made.
 * Exits non-zero if any check fails on any rank.
 */
#define _POSIX_C_SOURCE 200809L
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../examples/ep_reference.h"
#include "check.h"
#include "goep_ep.h"

static int my_rank, n_ranks, failures, checks;

#define OK(call) EXPECT_RC(call, goepEpSuccess, "")

enum { H = 32, K = 2, E_PER_RANK = 4, MAXT = 8 };
static const uint16_t SENTINEL = 0x7fc1; /* a bfloat16 NaN no dispatch writes */
/* The stall cases' group timeout, and how long the stalled rank sleeps: well past it. Not shorter: every
 * collective of the group, its destroy included, waits at most the timeout for a peer, and on a shared
 * machine a rank may lag by that much. */
static const uint64_t STALL_TIMEOUT_NS = 2000ull * 1000 * 1000;
static const double STALL_S = 3.5;

static ref_shape_t shape(void) { return (ref_shape_t){n_ranks, E_PER_RANK * n_ranks, E_PER_RANK, K, H, MAXT}; }

static goepEpGroupConfig_t config(goepEpAlgorithm_t algo) {
    goepEpGroupConfig_t c = GOEP_EP_GROUP_CONFIG_INIT;
    c.algorithm = algo;
    c.num_experts = E_PER_RANK * n_ranks;
    c.max_dispatch_tokens_per_rank = MAXT;
    c.max_token_bytes = H * 2;
    c.num_topk = K;
    c.timeout_ns = 20ull * 1000 * 1000 * 1000;
    return c;
}

/* The routing and tokens of this rank, as the example's. */
typedef struct {
    int T;
    int32_t topk[MAXT * K];
    float w[MAXT * K];
    uint16_t x[MAXT * H];
    size_t x_dims[2], k_dims[2];
    goepEpTensor_t x_t, topk_t, w_t;
} inputs_t;

static void make_inputs(inputs_t* in) {
    ref_shape_t s = shape();
    in->T = num_tokens_of(&s, my_rank);
    for (int t = 0; t < in->T; t++) {
        for (int k = 0; k < K; k++) in->topk[t * K + k] = ref_expert(&s, my_rank, t, k), in->w[t * K + k] = ref_weight(t, k);
        for (int h = 0; h < H; h++) in->x[t * H + h] = bf16_of(ref_value(my_rank, t, h));
    }
    in->x_dims[0] = in->T, in->x_dims[1] = H;
    in->k_dims[0] = in->T, in->k_dims[1] = K;
    in->x_t = tensor(goepEpBfloat16, in->x, 2, in->x_dims);
    in->topk_t = tensor(goepEpInt32, in->topk, 2, in->k_dims);
    in->w_t = tensor(goepEpFloat32, in->w, 2, in->k_dims);
}

static int all_sentinel(const uint16_t* p, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (p[i] != SENTINEL) return 0;
    return 1;
}

static void fill(uint16_t* p, size_t n) {
    for (size_t i = 0; i < n; i++) p[i] = SENTINEL;
}

static goepEpAllocResult_t test_alloc(void** p, size_t n, void* ctx) {
    (void)ctx;
    *p = malloc(n);
    return *p ? 0 : 2;
}

static void test_group_config(void) {
    goepEpGroup_t g;
    goepEpGroupConfig_t c = config(GOEP_EP_ALGO_LOW_LATENCY);
    EXPECT_RC(goepEpCreateGroup(&g, MPI_COMM_WORLD, NULL), goepEpInvalidArgument, "config is NULL");
    EXPECT_RC(goepEpCreateGroup(NULL, MPI_COMM_WORLD, &c), goepEpInvalidArgument, "group is NULL");
    c.magic = 0xdeadbeef;
    EXPECT_RC(goepEpCreateGroup(&g, MPI_COMM_WORLD, &c), goepEpInvalidArgument, "magic 0xdeadbeef");
    c = config(GOEP_EP_ALGO_LOW_LATENCY), c.size = 88;
    EXPECT_RC(goepEpCreateGroup(&g, MPI_COMM_WORLD, &c), goepEpInvalidArgument, "has size 88, want at least 96");
    /* A version-1 config (NCCL EP's first 96 bytes) has no num_topk: each handle gives its own. */
    c = config(GOEP_EP_ALGO_LOW_LATENCY), c.size = GOEP_EP_GROUP_CONFIG_V1_SIZE, c.version = 1;
    OK(goepEpCreateGroup(&g, MPI_COMM_WORLD, &c));
    OK(goepEpGroupDestroy(g)); /* before any handle opened it */
    c = config(GOEP_EP_ALGO_LOW_LATENCY), c.version = 0;
    EXPECT_RC(goepEpCreateGroup(&g, MPI_COMM_WORLD, &c), goepEpInvalidArgument, "config.version = 0");
    c.version = GOEP_EP_API_VERSION + 1;
    EXPECT_RC(goepEpCreateGroup(&g, MPI_COMM_WORLD, &c), goepEpInvalidArgument, "newer API");
    /* The fields a CPU has no use for are accepted (the groups below are made with them); zero copy,
     * an unpaired allocator and unknown enum values are refused by name. */
    c = config(GOEP_EP_ALGO_LOW_LATENCY), c.zero_copy = GOEP_EP_ZERO_COPY_ON;
    EXPECT_RC(goepEpCreateGroup(&g, MPI_COMM_WORLD, &c), goepEpInvalidUsage, "config.zero_copy = GOEP_EP_ZERO_COPY_ON");
    c.zero_copy = 3;
    EXPECT_RC(goepEpCreateGroup(&g, MPI_COMM_WORLD, &c), goepEpInvalidArgument, "config.zero_copy = 3");
    c = config(GOEP_EP_ALGO_HIGH_THROUGHPUT), c.overflow_policy = 3;
    EXPECT_RC(goepEpCreateGroup(&g, MPI_COMM_WORLD, &c), goepEpInvalidArgument, "config.overflow_policy = 3");
    c = config(GOEP_EP_ALGO_LOW_LATENCY), c.overflow_policy = GOEP_EP_OVERFLOW_DROP;
    EXPECT_RC(goepEpCreateGroup(&g, MPI_COMM_WORLD, &c), goepEpInvalidArgument, "is for HighThroughput groups");
    c = config(GOEP_EP_ALGO_LOW_LATENCY), c.alloc.alloc_fn = test_alloc;
    EXPECT_RC(goepEpCreateGroup(&g, MPI_COMM_WORLD, &c), goepEpInvalidArgument, "config.alloc: alloc_fn and free_fn go together");

    /* goep's options. */
    goepEpGroupOptions_t o = GOEP_EP_GROUP_OPTIONS_INIT;
    c = config(GOEP_EP_ALGO_LOW_LATENCY), o.token_datatype = goepEpInt32;
    EXPECT_RC(goepEpCreateGroupWithOptions(&g, MPI_COMM_WORLD, &c, &o), goepEpInvalidArgument,
              "options.token_datatype = int32");
    o = (goepEpGroupOptions_t)GOEP_EP_GROUP_OPTIONS_INIT, o.magic = 7;
    EXPECT_RC(goepEpCreateGroupWithOptions(&g, MPI_COMM_WORLD, &c, &o), goepEpInvalidArgument, "GOEP_EP_GROUP_OPTIONS_INIT");
    o = (goepEpGroupOptions_t)GOEP_EP_GROUP_OPTIONS_INIT, o.backend = "no-such-engine";
    EXPECT_RC(goepEpCreateGroupWithOptions(&g, MPI_COMM_WORLD, &c, &o), goepEpInvalidArgument,
              "options.backend = \"no-such-engine\": ep: backend \"no-such-engine\" is not registered: want one of alltoallv");
    o.backend = "alltoallv"; /* no call sequence checks: the C interface's contract needs them */
    EXPECT_RC(goepEpCreateGroupWithOptions(&g, MPI_COMM_WORLD, &c, &o), goepEpInvalidUsage, "which alltoallv does not declare");
    /* The NVFP4 combine is LL's, on rows of whole 16-byte pieces of codes (hidden a multiple of 32). */
    o = (goepEpGroupOptions_t)GOEP_EP_GROUP_OPTIONS_INIT, o.combine_quant = GOEP_EP_COMB_QUANT_NVFP4;
    c = config(GOEP_EP_ALGO_HIGH_THROUGHPUT);
    EXPECT_RC(goepEpCreateGroupWithOptions(&g, MPI_COMM_WORLD, &c, &o), goepEpInvalidArgument,
              "CombineWire nvfp4 is not a combine format of HighThroughput groups");
    c = config(GOEP_EP_ALGO_LOW_LATENCY), c.max_token_bytes = 2 * 40;
    EXPECT_RC(goepEpCreateGroupWithOptions(&g, MPI_COMM_WORLD, &c, &o), goepEpInvalidArgument, "Hidden must be a multiple of 32");
    o.combine_quant = 2;
    EXPECT_RC(goepEpCreateGroupWithOptions(&g, MPI_COMM_WORLD, &c, &o), goepEpInvalidArgument, "options.combine_quant = 0x2");
    o = (goepEpGroupOptions_t)GOEP_EP_GROUP_OPTIONS_INIT, o.dispatch_quant = GOEP_EP_DISP_QUANT_FWD_NVFP4;
    EXPECT_RC(goepEpCreateGroupWithOptions(&g, MPI_COMM_WORLD, &c, &o), goepEpInvalidArgument, "Hidden must be a multiple of 32");
    o.dispatch_round_scales = 1;
    c = config(GOEP_EP_ALGO_LOW_LATENCY);
    EXPECT_RC(goepEpCreateGroupWithOptions(&g, MPI_COMM_WORLD, &c, &o), goepEpInvalidArgument,
              "options.dispatch_round_scales = 1 with GOEP_EP_DISP_QUANT_FWD_NVFP4");
    o = (goepEpGroupOptions_t)GOEP_EP_GROUP_OPTIONS_INIT, o.combine_quant = GOEP_EP_COMB_QUANT_FP8;
    c = config(GOEP_EP_ALGO_HIGH_THROUGHPUT); /* HT has an FP8 combine too */
    OK(goepEpCreateGroupWithOptions(&g, MPI_COMM_WORLD, &c, &o));
    OK(goepEpGroupDestroy(g));
    c = config(GOEP_EP_ALGO_LOW_LATENCY);
    o = (goepEpGroupOptions_t)GOEP_EP_GROUP_OPTIONS_INIT, o.dispatch_quant = 3;
    EXPECT_RC(goepEpCreateGroupWithOptions(&g, MPI_COMM_WORLD, &c, &o), goepEpInvalidArgument, "options.dispatch_quant = 3");
    o.dispatch_quant = GOEP_EP_DISP_QUANT_FWD, o.dispatch_round_scales = 1;
    EXPECT_RC(goepEpCreateGroupWithOptions(&g, MPI_COMM_WORLD, &c, &o), goepEpInvalidArgument,
              "options.dispatch_round_scales = 1 with GOEP_EP_DISP_QUANT_FWD");
    o.dispatch_quant = GOEP_EP_DISP_QUANT_NONE;
    EXPECT_RC(goepEpCreateGroupWithOptions(&g, MPI_COMM_WORLD, &c, &o), goepEpInvalidArgument, "options.dispatch_round_scales = 1");
    /* A version-1 options struct (24 bytes) is read without the fields it lacks: its dispatches are NONE. */
    o = (goepEpGroupOptions_t)GOEP_EP_GROUP_OPTIONS_INIT, o.size = GOEP_EP_GROUP_OPTIONS_V1_SIZE, o.dispatch_quant = 3;
    OK(goepEpCreateGroupWithOptions(&g, MPI_COMM_WORLD, &c, &o));
    OK(goepEpGroupDestroy(g));
    c = config(GOEP_EP_ALGO_LOW_LATENCY), c.num_topk = 65;
    EXPECT_RC(goepEpCreateGroup(&g, MPI_COMM_WORLD, &c), goepEpInvalidArgument, "config.num_topk = 65: want 0 (each handle's) or 1..64");
    c = config(GOEP_EP_ALGO_LOW_LATENCY), c.max_token_bytes = 2 * H + 1;
    EXPECT_RC(goepEpCreateGroup(&g, MPI_COMM_WORLD, &c), goepEpInvalidArgument, "config.max_token_bytes = 65");
    c = config(GOEP_EP_ALGO_LOW_LATENCY), c.algorithm = 7;
    EXPECT_RC(goepEpCreateGroup(&g, MPI_COMM_WORLD, &c), goepEpInvalidArgument, "config.algorithm = 7");
    c = config(GOEP_EP_ALGO_HIGH_THROUGHPUT), c.enable_mask = 1;
    EXPECT_RC(goepEpCreateGroup(&g, MPI_COMM_WORLD, &c), goepEpInvalidArgument, "MaskStalledRanks is for LowLatency");
    c = config(GOEP_EP_ALGO_LOW_LATENCY), c.num_experts = 0;
    EXPECT_RC(goepEpCreateGroup(&g, MPI_COMM_WORLD, &c), goepEpInvalidArgument, "NumExperts = 0");
    c = config(GOEP_EP_ALGO_LOW_LATENCY);
    EXPECT_RC(goepEpCreateGroup(&g, MPI_COMM_NULL, &c), goepEpInvalidArgument, "MPI_COMM_NULL");

    goepEpMemInfo_t info = GOEP_EP_MEM_INFO_INIT;
    OK(goepEpBufferPlan(&c, 4, 2, &info));
    goepEpMemInfo_t info32 = GOEP_EP_MEM_INFO_INIT;
    o = (goepEpGroupOptions_t)GOEP_EP_GROUP_OPTIONS_INIT, o.token_datatype = goepEpFloat32;
    c.max_token_bytes = 4 * H;
    OK(goepEpBufferPlanWithOptions(&c, &o, 4, 2, &info32));
    c.max_token_bytes = 2 * H;
    /* The same hidden in float32 rows: a larger plan, computed from the options' token type. */
    EXPECT(info32.shared_per_rank > info.shared_per_rank, "float32 rows: shared %llu, bfloat16 rows: %llu",
           (unsigned long long)info32.shared_per_rank, (unsigned long long)info.shared_per_rank);
    EXPECT(info.shared_per_rank > 0 && info.window_per_rank > 0 && info.ranks_per_node == 2 &&
               info.per_node >= 2 * info.shared_per_rank,
           "goepEpBufferPlan(4 ranks, 2 nodes): shared %llu, window %llu, ranks per node %u, per node %llu",
           (unsigned long long)info.shared_per_rank, (unsigned long long)info.window_per_rank, info.ranks_per_node,
           (unsigned long long)info.per_node);
    /* FP8 rows: each row's codes and scales take less than its bfloat16 elements. */
    goepEpMemInfo_t info8 = GOEP_EP_MEM_INFO_INIT;
    o = (goepEpGroupOptions_t)GOEP_EP_GROUP_OPTIONS_INIT, o.dispatch_quant = GOEP_EP_DISP_QUANT_DS_FP8E3M4;
    OK(goepEpBufferPlanWithOptions(&c, &o, 4, 2, &info8));
    EXPECT(info8.shared_per_rank < info.shared_per_rank, "FP8 rows: shared %llu, bfloat16 rows: %llu",
           (unsigned long long)info8.shared_per_rank, (unsigned long long)info.shared_per_rank);
    EXPECT_RC(goepEpBufferPlan(&c, 4, 5, &info), goepEpInvalidArgument, "5 nodes for 4 ranks");
    info.magic = 0;
    EXPECT_RC(goepEpBufferPlan(&c, 4, 2, &info), goepEpInvalidArgument, "GOEP_EP_MEM_INFO_INIT");
}

static void test_handles_and_ll_dispatch(void) {
    ref_shape_t s = shape();
    goepEpGroupConfig_t c = config(GOEP_EP_ALGO_LOW_LATENCY);
    goepEpGroup_t g;
    OK(goepEpCreateGroup(&g, MPI_COMM_WORLD, &c));
    size_t bytes = 0;
    /* the buffers come with the group's first handle */
    EXPECT_RC(goepEpGroupBufferBytes(g, &bytes), goepEpInvalidUsage, "no handle has been made yet");
    inputs_t in;
    make_inputs(&in);
    goepEpHandle_t h;

    /* Handles: the topk_idx descriptor, the layout, the ids. */
    goepEpTensor_t bad = in.topk_t;
    bad.datatype = goepEpFloat32;
    EXPECT_RC(goepEpCreateHandle(&h, g, GOEP_EP_LAYOUT_EXPERT_MAJOR, &bad, NULL, NULL, NULL), goepEpInvalidArgument,
              "topk_idx has datatype float32, want int32 or int64");
    size_t wide[2] = {(size_t)in.T, K + 1};
    bad = in.topk_t, bad.sizes = wide;
    EXPECT_RC(goepEpCreateHandle(&h, g, GOEP_EP_LAYOUT_EXPERT_MAJOR, &bad, NULL, NULL, NULL), goepEpInvalidArgument,
              "num_topk = 3, more than the group's config.num_topk = 2");
    OK(goepEpGroupBufferBytes(g, &bytes)); /* the first handle, refused, opened the group */
    EXPECT(bytes > 0, "goepEpGroupBufferBytes = 0");
    int32_t many[(MAXT + 1) * K] = {0};
    size_t many_dims[2] = {MAXT + 1, K};
    bad = tensor(goepEpInt32, many, 2, many_dims);
    EXPECT_RC(goepEpCreateHandle(&h, g, GOEP_EP_LAYOUT_EXPERT_MAJOR, &bad, NULL, NULL, NULL), goepEpInvalidArgument,
              "more than config.max_dispatch_tokens_per_rank");
    bad = in.topk_t, bad.magic = 0;
    EXPECT_RC(goepEpCreateHandle(&h, g, GOEP_EP_LAYOUT_EXPERT_MAJOR, &bad, NULL, NULL, NULL), goepEpInvalidArgument,
              "GOEP_EP_TENSOR_INIT");
    bad = in.topk_t, bad.size = 16;
    EXPECT_RC(goepEpCreateHandle(&h, g, GOEP_EP_LAYOUT_EXPERT_MAJOR, &bad, NULL, NULL, NULL), goepEpInvalidArgument,
              "has size 16");
    bad = in.topk_t, bad.data = NULL;
    EXPECT_RC(goepEpCreateHandle(&h, g, GOEP_EP_LAYOUT_EXPERT_MAJOR, &bad, NULL, NULL, NULL), goepEpInvalidArgument,
              "data is NULL");
    bad = in.topk_t, bad.sizes = NULL;
    EXPECT_RC(goepEpCreateHandle(&h, g, GOEP_EP_LAYOUT_EXPERT_MAJOR, &bad, NULL, NULL, NULL), goepEpInvalidArgument,
              "sizes is NULL");
    int32_t out_of_range[K] = {0, E_PER_RANK * n_ranks};
    size_t one[2] = {1, K};
    bad = tensor(goepEpInt32, out_of_range, 2, one);
    EXPECT_RC(goepEpCreateHandle(&h, g, GOEP_EP_LAYOUT_EXPERT_MAJOR, &bad, NULL, NULL, NULL), goepEpInvalidArgument,
              "topk_idx");
    int64_t repeated[K] = {1, 1};
    bad = tensor(goepEpInt64, repeated, 2, one);
    EXPECT_RC(goepEpCreateHandle(&h, g, GOEP_EP_LAYOUT_EXPERT_MAJOR, &bad, NULL, NULL, NULL), goepEpInvalidArgument,
              "topk_idx");
    EXPECT_RC(goepEpCreateHandle(&h, g, GOEP_EP_LAYOUT_FLAT, &in.topk_t, NULL, NULL, NULL), goepEpInvalidUsage,
              "GOEP_EP_LAYOUT_FLAT is for HT groups");
    EXPECT_RC(goepEpCreateHandle(&h, g, GOEP_EP_LAYOUT_RANK_MAJOR, &in.topk_t, NULL, NULL, NULL), goepEpInvalidUsage,
              "the group's layout is GOEP_EP_LAYOUT_EXPERT_MAJOR, set by its first handle");
    EXPECT_RC(goepEpCreateHandle(&h, g, GOEP_EP_LAYOUT_UNSET, &in.topk_t, NULL, NULL, NULL), goepEpInvalidArgument,
              "GOEP_EP_LAYOUT_UNSET");
    goepEpLayoutInfo_t li = GOEP_EP_LAYOUT_INFO_INIT;
    EXPECT_RC(goepEpCreateHandle(&h, g, GOEP_EP_LAYOUT_EXPERT_MAJOR, &in.topk_t, &li, NULL, NULL), goepEpInvalidUsage,
              "layout_info must be NULL");
    OK(goepEpCreateHandle(&h, g, GOEP_EP_LAYOUT_EXPERT_MAJOR, &in.topk_t, NULL, NULL, NULL));

    /* Dispatch: every bad input is refused and nothing is written. */
    size_t rows = (size_t)n_ranks * MAXT;
    size_t recv_dims[3] = {E_PER_RANK, rows, H}, cnt_dims[1] = {E_PER_RANK};
    uint16_t* recv = malloc(E_PER_RANK * rows * H * 2);
    int32_t counts[E_PER_RANK];
    goepEpTensor_t recv_t = tensor(goepEpBfloat16, recv, 3, recv_dims);
    goepEpTensor_t cnt_t = tensor(goepEpInt32, counts, 1, cnt_dims);
    goepEpDispatchInputs_t din = GOEP_EP_DISPATCH_INPUTS_INIT;
    din.tokens = &in.x_t, din.topk_weights = &in.w_t;
    goepEpDispatchOutputs_t dout = GOEP_EP_DISPATCH_OUTPUTS_INIT;
    dout.tokens = &recv_t;
    li.expert_counters = &cnt_t;
    fill(recv, E_PER_RANK * rows * H);
    for (int l = 0; l < E_PER_RANK; l++) counts[l] = -7;

    goepEpTensor_t x_bad = in.x_t;
    size_t x_wide[2] = {(size_t)in.T, H + 1};
    x_bad.sizes = x_wide;
    din.tokens = &x_bad;
    EXPECT_RC(goepEpDispatch(h, &din, &dout, &li, NULL, NULL), goepEpInvalidArgument, "inputs->tokens has shape");
    x_bad = in.x_t, x_bad.datatype = goepEpFloat32;
    EXPECT_RC(goepEpDispatch(h, &din, &dout, &li, NULL, NULL), goepEpInvalidArgument,
              "inputs->tokens has datatype float32, want bfloat16");
    x_bad = in.x_t, x_bad.data = (char*)in.x + 1;
    EXPECT_RC(goepEpDispatch(h, &din, &dout, &li, NULL, NULL), goepEpInvalidArgument, "is not aligned");
    x_bad = in.x_t, x_bad.win_hdl = (goepEpWindow_t)(uintptr_t)0x1000;
    EXPECT_RC(goepEpDispatch(h, &din, &dout, &li, NULL, NULL), goepEpInvalidUsage, "inputs->tokens has a win_hdl");
    x_bad = in.x_t, x_bad.win_offset = 64;
    EXPECT_RC(goepEpDispatch(h, &din, &dout, &li, NULL, NULL), goepEpInvalidArgument, "inputs->tokens has win_offset = 64 without a window");
    din.tokens = NULL;
    EXPECT_RC(goepEpDispatch(h, &din, &dout, &li, NULL, NULL), goepEpInvalidArgument, "inputs->tokens is required");
    din.tokens = &in.x_t;
    din.size = 8;
    EXPECT_RC(goepEpDispatch(h, &din, &dout, &li, NULL, NULL), goepEpInvalidArgument, "inputs (goepEpDispatchInputs_t) has size 8");
    din.size = sizeof din;
    EXPECT_RC(goepEpDispatch(h, NULL, &dout, &li, NULL, NULL), goepEpInvalidArgument, "inputs is NULL");
    goepEpTensor_t w_bad = in.w_t;
    w_bad.datatype = goepEpFloat64;
    din.topk_weights = &w_bad;
    EXPECT_RC(goepEpDispatch(h, &din, &dout, &li, NULL, NULL), goepEpInvalidArgument, "inputs->topk_weights has datatype float64");
    din.topk_weights = &in.w_t;
    size_t recv_short[3] = {E_PER_RANK, rows - 1, H};
    goepEpTensor_t recv_bad = recv_t;
    recv_bad.sizes = recv_short;
    dout.tokens = &recv_bad;
    EXPECT_RC(goepEpDispatch(h, &din, &dout, &li, NULL, NULL), goepEpInvalidArgument, "outputs->tokens has shape");
    dout.tokens = &recv_t;
    dout.topk_idx = &in.topk_t;
    EXPECT_RC(goepEpDispatch(h, &din, &dout, &li, NULL, NULL), goepEpInvalidArgument, "must be NULL in the LL EXPERT_MAJOR layout");
    dout.topk_idx = NULL;
    EXPECT_RC(goepEpDispatch(h, &din, &dout, NULL, NULL, NULL), goepEpInvalidArgument, "layout_info is required");
    goepEpDispatchConfig_t dc = GOEP_EP_DISPATCH_CONFIG_INIT;
    dc.round_scales = 1;
    EXPECT_RC(goepEpDispatch(h, &din, &dout, &li, &dc, NULL), goepEpInvalidUsage, "round_scales");
    dc = (goepEpDispatchConfig_t)GOEP_EP_DISPATCH_CONFIG_INIT, dc.quant_recipe = GOEP_EP_DISP_QUANT_DS_FP8E3M4;
    EXPECT_RC(goepEpDispatch(h, &din, &dout, &li, &dc, NULL), goepEpInvalidUsage,
              "config.quant_recipe = GOEP_EP_DISP_QUANT_DS_FP8E3M4 and config.round_scales = 0, but this group's dispatches are "
              "GOEP_EP_DISP_QUANT_NONE");
    /* A version-1 config (20 bytes, no quant_recipe) is read without the field it lacks. */
    dc.size = GOEP_EP_DISPATCH_CONFIG_V1_SIZE, dc.round_scales = 1;
    EXPECT_RC(goepEpDispatch(h, &din, &dout, &li, &dc, NULL), goepEpInvalidUsage, "config.round_scales = 1");
    dc = (goepEpDispatchConfig_t)GOEP_EP_DISPATCH_CONFIG_INIT, dc.magic = 1;
    EXPECT_RC(goepEpDispatch(h, &din, &dout, &li, &dc, NULL), goepEpInvalidArgument, "GOEP_EP_DISPATCH_CONFIG_INIT");
    EXPECT(all_sentinel(recv, E_PER_RANK * rows * H), "a refused dispatch wrote into outputs->tokens");
    for (int l = 0; l < E_PER_RANK; l++) EXPECT(counts[l] == -7, "a refused dispatch wrote expert_counters[%d]", l);

    /* Out of order: combine before dispatch; complete with nothing to complete is fine. */
    size_t o_dims[2] = {(size_t)in.T, H};
    uint16_t out[MAXT * H];
    goepEpTensor_t out_t = tensor(goepEpBfloat16, out, 2, o_dims);
    goepEpCombineInputs_t cin = GOEP_EP_COMBINE_INPUTS_INIT;
    cin.tokens = &recv_t;
    goepEpCombineOutputs_t cout = GOEP_EP_COMBINE_OUTPUTS_INIT;
    cout.tokens = &out_t;
    EXPECT_RC(goepEpCombine(h, &cin, &cout, NULL, NULL), goepEpInvalidUsage, "has not been dispatched");
    OK(goepEpComplete(h, NULL, NULL));

    /* The group is still usable: a good round, whose combine first refuses a bad output. */
    OK(goepEpDispatch(h, &din, &dout, &li, NULL, NULL));
    fill(out, MAXT * H);
    size_t o_bad[2] = {(size_t)in.T + 1, H};
    goepEpTensor_t out_bad = tensor(goepEpBfloat16, out, 2, o_bad);
    cout.tokens = &out_bad;
    EXPECT_RC(goepEpCombine(h, &cin, &cout, NULL, NULL), goepEpInvalidArgument, "outputs->tokens has shape");
    cout.tokens = &out_t;
    goepEpTensor_t tw_in = in.w_t;
    cin.topk_weights = &tw_in;
    EXPECT_RC(goepEpCombine(h, &cin, &cout, NULL, NULL), goepEpInvalidArgument, "inputs->topk_weights is for HT combines");
    cin.topk_weights = NULL;
    cin.scales = &in.w_t;
    EXPECT_RC(goepEpCombine(h, &cin, &cout, NULL, NULL), goepEpInvalidUsage, "inputs->scales must be NULL");
    cin.scales = NULL;
    goepEpCombineConfig_t cc = GOEP_EP_COMBINE_CONFIG_INIT;
    cc.quant_recipe = GOEP_EP_COMB_QUANT_FP8;
    EXPECT_RC(goepEpCombine(h, &cin, &cout, &cc, NULL), goepEpInvalidUsage, "the group's combine format is 0x0");
    EXPECT(all_sentinel(out, (size_t)in.T * H), "a refused combine wrote into outputs->tokens");
    OK(goepEpCombine(h, &cin, &cout, NULL, NULL));
    for (int t = 0; t < in.T; t++)
        for (int j = 0; j < H; j++) {
            float got = float_of_bf16(out[t * H + j]), want = ref_combined(&s, NULL, my_rank, t, j);
            EXPECT(got == want, "after the refusals, combined token %d [%d] = %g, want %g", t, j, got, want);
        }

    /* Destroyed handles and groups are refused, never dereferenced (a destroyed handle of a live group, on every
     * rank here: its dispatch is refused everywhere, and the group stays usable). */
    OK(goepEpHandleDestroy(h));
    EXPECT_RC(goepEpDispatch(h, &din, &dout, &li, NULL, NULL), goepEpInvalidArgument, "has been destroyed");
    EXPECT_RC(goepEpHandleDestroy(h), goepEpInvalidArgument, "not a live handle");
    EXPECT_RC(goepEpHandleDestroy(NULL), goepEpInvalidArgument, "the handle is NULL");
    goepEpHandle_t h2;
    OK(goepEpCreateHandle(&h2, g, GOEP_EP_LAYOUT_EXPERT_MAJOR, &in.topk_t, NULL, NULL, NULL));
    EXPECT_RC(goepEpMaskQuery(g, counts, NULL), goepEpInvalidUsage, "enable_mask");
    OK(goepEpGroupDestroy(g));
    EXPECT_RC(goepEpDispatch(h2, &din, &dout, &li, NULL, NULL), goepEpInvalidArgument, "not a live handle");
    EXPECT_RC(goepEpCreateHandle(&h, g, GOEP_EP_LAYOUT_EXPERT_MAJOR, &in.topk_t, NULL, NULL, NULL), goepEpInvalidArgument,
              "not a live group");
    EXPECT_RC(goepEpGroupDestroy(g), goepEpInvalidArgument, "not a live group");
    EXPECT_RC(goepEpGroupBufferBytes(NULL, &bytes), goepEpInvalidArgument, "the group is NULL");
    EXPECT_RC(goepEpCreateHandle(&h, (goepEpGroup_t)(uintptr_t)0x12345, GOEP_EP_LAYOUT_EXPERT_MAJOR, &in.topk_t, NULL, NULL, NULL),
              goepEpInvalidArgument, "not a live group");
    free(recv);
}

static void test_ht(void) {
    goepEpGroupConfig_t c = config(GOEP_EP_ALGO_HIGH_THROUGHPUT);
    goepEpGroup_t g;
    OK(goepEpCreateGroup(&g, MPI_COMM_WORLD, &c));
    inputs_t in;
    make_inputs(&in);
    goepEpHandle_t h;
    OK(goepEpCreateHandle(&h, g, GOEP_EP_LAYOUT_FLAT, &in.topk_t, NULL, NULL, NULL));
    size_t slots = (size_t)n_ranks * MAXT;
    uint16_t* recv = malloc(slots * H * 2);
    size_t one_row[2] = {1, H}, all_rows[2] = {slots, H}, tot_dims[1] = {1};
    int32_t total = -7;
    goepEpTensor_t recv1 = tensor(goepEpBfloat16, recv, 2, one_row), recv_all = tensor(goepEpBfloat16, recv, 2, all_rows);
    goepEpTensor_t tot_t = tensor(goepEpInt32, &total, 1, tot_dims);
    goepEpDispatchInputs_t din = GOEP_EP_DISPATCH_INPUTS_INIT;
    din.tokens = &in.x_t;
    goepEpDispatchOutputs_t dout = GOEP_EP_DISPATCH_OUTPUTS_INIT;
    dout.tokens = &recv1;
    goepEpLayoutInfo_t li = GOEP_EP_LAYOUT_INFO_INIT;
    li.recv_total_counter = &tot_t;
    EXPECT_RC(goepEpDispatch(h, &din, &dout, &li, NULL, NULL), goepEpInvalidArgument, "inputs->topk_weights is required");
    din.topk_weights = &in.w_t;
    /* One slot for more rows: the dispatch runs (it is collective) but writes nothing here. */
    fill(recv, slots * H);
    ref_shape_t s = shape();
    int want_rows = 0;
    for (int src = 0; src < n_ranks; src++)
        for (int t = 0; t < num_tokens_of(&s, src); t++) {
            int hit = 0;
            for (int k = 0; k < K; k++) {
                int e = ref_expert(&s, src, t, k);
                hit |= e >= 0 && ref_owner(&s, e) == my_rank;
            }
            want_rows += hit;
        }
    goepEpResult_t rc = goepEpDispatch(h, &din, &dout, &li, NULL, NULL);
    if (want_rows > 1) {
        EXPECT(rc == goepEpInvalidArgument && strstr(goepEpGetLastError(), "outputs->tokens has 1 rows"),
               "a dispatch into 1 slot of %d rows: %s: %s", want_rows, goepEpGetErrorString(rc), goepEpGetLastError());
        EXPECT(all_sentinel(recv, slots * H) && total == -7, "a dispatch into too few slots wrote its outputs");
    } else {
        EXPECT(rc == goepEpSuccess, "a dispatch of %d rows into 1 slot: %s", want_rows, goepEpGetLastError());
    }
    /* ... and the group goes on: the combine of that dispatch, then a backward pass. */
    dout.tokens = &recv_all;
    goepEpDispatchConfig_t bwd = GOEP_EP_DISPATCH_CONFIG_INIT;
    bwd.pass_direction = GOEP_EP_BWD_PASS;
    EXPECT_RC(goepEpDispatch(h, &din, &dout, &li, &bwd, NULL), goepEpInvalidArgument, "must be NULL in a backward dispatch");
    size_t o_dims[2] = {(size_t)in.T, H};
    uint16_t out[MAXT * H];
    goepEpTensor_t out_t = tensor(goepEpBfloat16, out, 2, o_dims);
    goepEpCombineInputs_t cin = GOEP_EP_COMBINE_INPUTS_INIT;
    cin.tokens = &recv_all;
    goepEpCombineOutputs_t cout = GOEP_EP_COMBINE_OUTPUTS_INIT;
    cout.tokens = &out_t;
    goepEpCombineConfig_t cbwd = GOEP_EP_COMBINE_CONFIG_INIT;
    cbwd.pass_direction = GOEP_EP_BWD_PASS;
    EXPECT_RC(goepEpCombine(h, &cin, &cout, &cbwd, NULL), goepEpInvalidArgument, "backward (GOEP_EP_BWD_PASS) HT combine needs");
    OK(goepEpCombine(h, &cin, &cout, NULL, NULL));

    /* The rows in place (goepEpHandleRecvTokens): described while they are there, refused after the
     * next dispatch reused the buffer. A refused HT dispatch counts as one: the other ranks' same
     * call may have received into the group's one receive buffer before it failed. */
    goepEpTensor_t v = GOEP_EP_TENSOR_INIT;
    size_t vd[3] = {0, 0, 0};
    EXPECT_RC(goepEpHandleRecvTokens(h, &v), goepEpInvalidArgument, "tokens->sizes is NULL");
    v.sizes = vd;
    if (rc != goepEpSuccess) {
        EXPECT_RC(goepEpHandleRecvTokens(h, &v), goepEpInvalidUsage, "the handle's rows are gone");
        dout.tokens = NULL; /* dispatch again, leaving the rows in the group's buffer */
        OK(goepEpDispatch(h, &din, &dout, &li, NULL, NULL));
    }
    OK(goepEpHandleRecvTokens(h, &v));
    EXPECT(v.ndim == 2 && vd[0] == (size_t)want_rows && vd[1] == H && v.datatype == goepEpBfloat16 && (v.data || !want_rows),
           "goepEpHandleRecvTokens: ndim %u, sizes [%zu, %zu], datatype %d", v.ndim, vd[0], vd[1], (int)v.datatype);
    goepEpHandle_t h2;
    OK(goepEpCreateHandle(&h2, g, GOEP_EP_LAYOUT_FLAT, &in.topk_t, NULL, NULL, NULL));
    EXPECT_RC(goepEpHandleRecvTokens(h2, &v), goepEpInvalidUsage, "has not been dispatched");
    dout.tokens = NULL;
    OK(goepEpDispatch(h2, &din, &dout, &li, NULL, NULL));
    EXPECT(total == want_rows, "recv_total_counter = %d, want %d", total, want_rows);
    EXPECT_RC(goepEpHandleRecvTokens(h, &v), goepEpInvalidUsage, "the handle's rows are gone");
    OK(goepEpHandleRecvTokens(h2, &v));
    OK(goepEpHandleDestroy(h2));
    OK(goepEpHandleDestroy(h));
    OK(goepEpGroupDestroy(g));
    free(recv);
}

/* goepEpTensorAlloc / goepEpTensorDestroy, and a handle made by goepEpInitHandle and given its routing by
 * goepEpUpdateHandle from an allocated descriptor: refusals by name, then a round against the reference. */
static void test_alloc_and_update(void) {
    ref_shape_t s = shape();
    inputs_t in;
    make_inputs(&in);
    size_t dims[2] = {(size_t)in.T, K};
    goepEpTensor_t* t = NULL;
    OK(goepEpTensorAlloc(&t, 2, goepEpInt32, dims, NULL));
    EXPECT(t && t->size == sizeof(goepEpTensor_t) && t->magic == GOEP_EP_TENSOR_MAGIC_ALLOC && t->ndim == 2 &&
               t->datatype == goepEpInt32 && t->data == NULL && t->win_hdl == NULL && t->win_offset == 0 && t->sizes &&
               t->sizes != dims && t->sizes[0] == (size_t)in.T && t->sizes[1] == K,
           "goepEpTensorAlloc's descriptor");
    dims[0] = 1000; /* the descriptor has its own copy */
    EXPECT(t->sizes[0] == (size_t)in.T, "goepEpTensorAlloc's sizes follow the caller's array: %zu", t->sizes[0]);
    goepEpTensor_t* t2 = NULL;
    goepEpTensorAllocConfig_t ac = GOEP_EP_TENSOR_ALLOC_CONFIG_INIT;
    EXPECT_RC(goepEpTensorAlloc(NULL, 1, goepEpUint8, dims, NULL), goepEpInvalidArgument, "tensor is NULL");
    EXPECT_RC(goepEpTensorAlloc(&t2, 0, goepEpUint8, dims, NULL), goepEpInvalidArgument, "ndim = 0, want 1 to 8");
    EXPECT_RC(goepEpTensorAlloc(&t2, 9, goepEpUint8, dims, NULL), goepEpInvalidArgument, "ndim = 9, want 1 to 8");
    EXPECT_RC(goepEpTensorAlloc(&t2, 1, (goepEpDataType_t)99, dims, NULL), goepEpInvalidArgument, "datatype = 99");
    EXPECT_RC(goepEpTensorAlloc(&t2, 1, goepEpUint8, NULL, NULL), goepEpInvalidArgument, "sizes is NULL");
    ac.magic = 0;
    EXPECT_RC(goepEpTensorAlloc(&t2, 1, goepEpUint8, dims, &ac), goepEpInvalidArgument, "GOEP_EP_TENSOR_ALLOC_CONFIG_INIT");
    EXPECT(t2 == NULL, "a refused goepEpTensorAlloc set *tensor");
    goepEpTensor_t mine = in.topk_t;
    EXPECT_RC(goepEpTensorDestroy(&mine), goepEpInvalidArgument, "was not made by goepEpTensorAlloc");
    EXPECT(mine.magic == GOEP_EP_TENSOR_MAGIC && mine.data == in.topk, "a refused goepEpTensorDestroy touched the descriptor");
    OK(goepEpTensorDestroy(NULL));
    t->data = in.topk;

    goepEpGroupConfig_t c = config(GOEP_EP_ALGO_LOW_LATENCY);
    goepEpGroup_t g;
    OK(goepEpCreateGroup(&g, MPI_COMM_WORLD, &c));
    goepEpHandle_t h;
    size_t mem_bytes = 0;
    OK(goepEpHandleMemSize(g, GOEP_EP_LAYOUT_EXPERT_MAJOR, NULL, &mem_bytes, K));
    EXPECT(mem_bytes >= (size_t)MAXT * K * 4, "goepEpHandleMemSize = %zu, less than the routing of %d tokens", mem_bytes, MAXT);
    uint32_t* mem = malloc(mem_bytes);
    size_t mem_dims[1] = {mem_bytes}, small_dims[1] = {mem_bytes - 1};
    goepEpTensor_t mem_t = tensor(goepEpUint8, mem, 1, mem_dims), bad = tensor(goepEpUint8, mem, 1, small_dims);
    EXPECT_RC(goepEpInitHandle(&h, g, GOEP_EP_LAYOUT_EXPERT_MAJOR, NULL, K + 1, NULL), goepEpInvalidArgument,
              "num_topk = 3, more than the group's config.num_topk = 2");
    EXPECT_RC(goepEpInitHandle(&h, g, GOEP_EP_LAYOUT_FLAT, NULL, K, NULL), goepEpInvalidUsage, "GOEP_EP_LAYOUT_FLAT is for HT groups");
    EXPECT_RC(goepEpInitHandle(&h, g, GOEP_EP_LAYOUT_EXPERT_MAJOR, NULL, K, &bad), goepEpInvalidArgument, "handle_mem has");
    bad = mem_t, bad.datatype = goepEpInt32;
    EXPECT_RC(goepEpInitHandle(&h, g, GOEP_EP_LAYOUT_EXPERT_MAJOR, NULL, K, &bad), goepEpInvalidArgument,
              "handle_mem has datatype int32, want uint8");
    EXPECT_RC(goepEpInitHandle(NULL, g, GOEP_EP_LAYOUT_EXPERT_MAJOR, NULL, K, NULL), goepEpInvalidArgument, "handle is NULL");
    OK(goepEpInitHandle(&h, g, GOEP_EP_LAYOUT_EXPERT_MAJOR, NULL, -1, &mem_t));

    size_t rows = (size_t)n_ranks * MAXT;
    size_t recv_dims[3] = {E_PER_RANK, rows, H}, cnt_dims[1] = {E_PER_RANK}, o_dims[2] = {(size_t)in.T, H};
    uint16_t* recv = malloc(E_PER_RANK * rows * H * 2);
    uint16_t out[MAXT * H];
    int32_t counts[E_PER_RANK];
    goepEpTensor_t recv_t = tensor(goepEpBfloat16, recv, 3, recv_dims), cnt_t = tensor(goepEpInt32, counts, 1, cnt_dims);
    goepEpTensor_t out_t = tensor(goepEpBfloat16, out, 2, o_dims);
    goepEpDispatchInputs_t din = GOEP_EP_DISPATCH_INPUTS_INIT;
    din.tokens = &in.x_t, din.topk_weights = &in.w_t;
    goepEpDispatchOutputs_t dout = GOEP_EP_DISPATCH_OUTPUTS_INIT;
    dout.tokens = &recv_t;
    goepEpLayoutInfo_t li = GOEP_EP_LAYOUT_INFO_INIT;
    li.expert_counters = &cnt_t;
    goepEpCombineInputs_t cin = GOEP_EP_COMBINE_INPUTS_INIT;
    cin.tokens = &recv_t;
    goepEpCombineOutputs_t cout = GOEP_EP_COMBINE_OUTPUTS_INIT;
    cout.tokens = &out_t;
    /* Every rank: a dispatch before any routing, and an update with layout_info, are refused. */
    EXPECT_RC(goepEpDispatch(h, &din, &dout, &li, NULL, NULL), goepEpInvalidUsage, "the handle has no routing");
    EXPECT_RC(goepEpUpdateHandle(h, t, &li, NULL), goepEpInvalidUsage, "layout_info must be NULL");
    EXPECT_RC(goepEpDispatch(h, &din, &dout, &li, NULL, NULL), goepEpInvalidUsage,
              "goepEpUpdateHandle refused the handle's routing");
    OK(goepEpUpdateHandle(h, t, NULL, NULL));
    OK(goepEpDispatch(h, &din, &dout, &li, NULL, NULL));
    OK(goepEpCombine(h, &cin, &cout, NULL, NULL));
    int bad_values = 0;
    for (int i = 0; i < in.T * H; i++)
        bad_values += float_of_bf16(out[i]) != ref_combined(&s, NULL, my_rank, i / H, i % H);
    EXPECT(bad_values == 0, "a round of goepEpInitHandle + goepEpUpdateHandle (routing from goepEpTensorAlloc's descriptor): "
           "%d combined values differ from the reference", bad_values);
    OK(goepEpHandleDestroy(h));
    OK(goepEpGroupDestroy(g));
    OK(goepEpTensorDestroy(t));
    EXPECT_RC(goepEpTensorDestroy(t), goepEpInvalidArgument, "or was destroyed already");
    free(mem), free(recv);
}

static void sleep_s(double s) {
    struct timespec ts = {(time_t)s, (long)((s - (time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

/* A rank that stalls past the timeout: the others' dispatch fails with goepEpTimeout naming it. */
static void test_stalled_peer(void) {
    int victim = n_ranks - 1;
    goepEpGroupConfig_t c = config(GOEP_EP_ALGO_LOW_LATENCY);
    c.timeout_ns = STALL_TIMEOUT_NS;
    goepEpGroup_t g;
    char name[32];
    snprintf(name, sizeof name, "rank %d", victim);
    if (my_rank != victim) {
        EXPECT_RC(goepEpCreateGroup(&g, MPI_COMM_WORLD, &c), goepEpTimeout, name);
    } else {
        sleep_s(STALL_S); /* skips goepEpCreateGroup */
    }
    MPI_Barrier(MPI_COMM_WORLD);
    OK(goepEpCreateGroup(&g, MPI_COMM_WORLD, &c));
    inputs_t in;
    make_inputs(&in);
    goepEpHandle_t h;
    OK(goepEpCreateHandle(&h, g, GOEP_EP_LAYOUT_EXPERT_MAJOR, &in.topk_t, NULL, NULL, NULL));
    size_t rows = (size_t)n_ranks * MAXT;
    size_t recv_dims[3] = {E_PER_RANK, rows, H}, cnt_dims[1] = {E_PER_RANK};
    uint16_t* recv = malloc(E_PER_RANK * rows * H * 2);
    int32_t counts[E_PER_RANK];
    goepEpTensor_t recv_t = tensor(goepEpBfloat16, recv, 3, recv_dims), cnt_t = tensor(goepEpInt32, counts, 1, cnt_dims);
    goepEpDispatchInputs_t din = GOEP_EP_DISPATCH_INPUTS_INIT;
    din.tokens = &in.x_t, din.topk_weights = &in.w_t;
    goepEpDispatchOutputs_t dout = GOEP_EP_DISPATCH_OUTPUTS_INIT;
    dout.tokens = &recv_t;
    goepEpLayoutInfo_t li = GOEP_EP_LAYOUT_INFO_INIT;
    li.expert_counters = &cnt_t;
    if (my_rank != victim) {
        double start = MPI_Wtime();
        EXPECT_RC(goepEpDispatch(h, &din, &dout, &li, NULL, NULL), goepEpTimeout, name);
        EXPECT(MPI_Wtime() - start < 10, "the timeout took %.1f s", MPI_Wtime() - start);
        EXPECT_RC(goepEpDispatch(h, &din, &dout, &li, NULL, NULL), goepEpTimeout, "unusable after an earlier failure");
    } else {
        sleep_s(STALL_S);
    }
    MPI_Barrier(MPI_COMM_WORLD); /* everybody meets again before the collective destroy */
    OK(goepEpGroupDestroy(g));
    free(recv);
}

/* enable_mask: the others mask a stalled rank and go on without it; it gets goepEpMasked when it comes
 * back, and goepEpMaskClean, called by every rank, lets it rejoin. */
static void test_mask(void) {
    int victim = n_ranks - 1;
    ref_shape_t s = shape();
    goepEpGroupConfig_t c = config(GOEP_EP_ALGO_LOW_LATENCY);
    c.timeout_ns = STALL_TIMEOUT_NS;
    c.enable_mask = 1;
    goepEpGroup_t g;
    OK(goepEpCreateGroup(&g, MPI_COMM_WORLD, &c));
    inputs_t in;
    make_inputs(&in);
    size_t rows = (size_t)n_ranks * MAXT;
    size_t recv_dims[3] = {E_PER_RANK, rows, H}, cnt_dims[1] = {E_PER_RANK}, o_dims[2] = {(size_t)in.T, H};
    uint16_t* recv = malloc(E_PER_RANK * rows * H * 2);
    uint16_t out[MAXT * H];
    int32_t counts[E_PER_RANK];
    goepEpTensor_t recv_t = tensor(goepEpBfloat16, recv, 3, recv_dims), cnt_t = tensor(goepEpInt32, counts, 1, cnt_dims);
    goepEpTensor_t out_t = tensor(goepEpBfloat16, out, 2, o_dims);
    goepEpDispatchInputs_t din = GOEP_EP_DISPATCH_INPUTS_INIT;
    din.tokens = &in.x_t, din.topk_weights = &in.w_t;
    goepEpDispatchOutputs_t dout = GOEP_EP_DISPATCH_OUTPUTS_INIT;
    dout.tokens = &recv_t;
    goepEpLayoutInfo_t li = GOEP_EP_LAYOUT_INFO_INIT;
    li.expert_counters = &cnt_t;
    goepEpCombineInputs_t cin = GOEP_EP_COMBINE_INPUTS_INIT;
    cin.tokens = &recv_t;
    goepEpCombineOutputs_t cout = GOEP_EP_COMBINE_OUTPUTS_INIT;
    cout.tokens = &out_t;
    int* masked = calloc(n_ranks, sizeof(int));
    int* status = calloc(n_ranks, sizeof(int));
    /* round: a dispatch and combine with identity experts, checked against the reference without
     * the experts of the masked ranks. */
#define ROUND(what)                                                                                           \
    do {                                                                                                      \
        goepEpHandle_t h_;                                                                                    \
        OK(goepEpCreateHandle(&h_, g, GOEP_EP_LAYOUT_EXPERT_MAJOR, &in.topk_t, NULL, NULL, NULL));                  \
        OK(goepEpDispatch(h_, &din, &dout, &li, NULL, NULL));                                                       \
        OK(goepEpCombine(h_, &cin, &cout, NULL, NULL));                                                             \
        OK(goepEpHandleDestroy(h_));                                                                          \
        for (int t = 0; t < in.T; t++)                                                                        \
            for (int j = 0; j < H; j++) {                                                                     \
                float got = float_of_bf16(out[t * H + j]), want = ref_combined(&s, masked, my_rank, t, j);    \
                if (got != want) {                                                                            \
                    FAIL("%s: combined token %d [%d] = %g, want %g", what, t, j, got, want);                  \
                    t = in.T;                                                                                 \
                    break;                                                                                    \
                }                                                                                             \
            }                                                                                                 \
    } while (0)
    int flag = -1;
    ROUND("before the stall");
    OK(goepEpGetAsyncError(g, &flag));
    EXPECT(flag == 0, "async error %d before any stall", flag);
    if (my_rank == victim) {
        sleep_s(STALL_S); /* stalls: the others mask it and go on */
        goepEpHandle_t h;
        OK(goepEpCreateHandle(&h, g, GOEP_EP_LAYOUT_EXPERT_MAJOR, &in.topk_t, NULL, NULL, NULL));
        EXPECT_RC(goepEpDispatch(h, &din, &dout, &li, NULL, NULL), goepEpMasked, "masked");
        OK(goepEpHandleDestroy(h));
        MPI_Barrier(MPI_COMM_WORLD);
    } else {
        masked[victim] = 1;
        ROUND("the round that masks the stalled rank");
        OK(goepEpGetAsyncError(g, &flag));
        EXPECT(flag == 1, "async error %d after a rank was masked", flag);
        OK(goepEpMaskQuery(g, status, NULL));
        for (int r = 0; r < n_ranks; r++) EXPECT(status[r] == !masked[r], "mask_status[%d] = %d", r, status[r]);
        ROUND("a round without the masked rank");
        OK(goepEpErrorClear(g));
        OK(goepEpGetAsyncError(g, &flag));
        EXPECT(flag == 0, "async error %d after goepEpErrorClear", flag);
        MPI_Barrier(MPI_COMM_WORLD);
        masked[victim] = 0;
    }
    status[0] = 3;
    EXPECT_RC(goepEpMaskUpdate(g, status, NULL), goepEpInvalidArgument, "mask[0] = 3");
    OK(goepEpMaskClean(g, NULL)); /* every rank, the stalled one back with them */
    OK(goepEpMaskQuery(g, status, NULL));
    for (int r = 0; r < n_ranks; r++) EXPECT(status[r] == 1, "after goepEpMaskClean, mask_status[%d] = %d", r, status[r]);
    ROUND("after goepEpMaskClean");
    OK(goepEpGroupDestroy(g));
    free(recv), free(masked), free(status);
}

/* The backends and their features: "cpu" is listed and declares every feature the CPU engine declares
 * (ep.CPU: all of goepEpFeature_t's, as Go's ep.Supports says); bad names, features and buffers are refused
 * naming them. Local calls. */
static void test_backends(void) {
    static const goepEpFeature_t cpu_features[] = {
        GOEP_EP_FEATURE_FP8_WIRE,        GOEP_EP_FEATURE_MASK_STALLED_RANKS, GOEP_EP_FEATURE_FP8_FORWARD,
        GOEP_EP_FEATURE_FP8_COMBINE,     GOEP_EP_FEATURE_OVERFLOW_DROP,      GOEP_EP_FEATURE_REFUSALS,
        GOEP_EP_FEATURE_METER,           GOEP_EP_FEATURE_NAMED_TIMEOUTS,     GOEP_EP_FEATURE_ZERO_ALLOCS,
        GOEP_EP_FEATURE_HT_EXPERT_MAJOR, GOEP_EP_FEATURE_LL_RANK_MAJOR,      GOEP_EP_FEATURE_GLOBAL_EXPERT_IDS,
        GOEP_EP_FEATURE_CALL_SEQUENCE};
    int count = 0, cpu = 0;
    OK(goepEpBackendCount(&count));
    EXPECT(count >= 2, "goepEpBackendCount = %d, want the CPU engine's backends at least", count);
    char name[64];
    for (int i = 0; i < count; i++) {
        memset(name, 'x', sizeof name);
        OK(goepEpBackendName(i, name, sizeof name));
        EXPECT(memchr(name, 0, sizeof name) != NULL, "goepEpBackendName(%d): no NUL", i);
        if (!strcmp(name, "cpu")) cpu++;
    }
    EXPECT(cpu == 1, "\"cpu\" listed %d times among %d backends", cpu, count);
    EXPECT_RC(goepEpBackendName(count, name, sizeof name), goepEpInvalidArgument, "i = ");
    EXPECT_RC(goepEpBackendName(-1, name, sizeof name), goepEpInvalidArgument, "i = -1");
    EXPECT_RC(goepEpBackendName(0, name, 1), goepEpInvalidArgument, "len = 1");
    for (size_t k = 0; k < sizeof cpu_features / sizeof cpu_features[0]; k++) {
        int supported = -1;
        OK(goepEpBackendSupports("cpu", cpu_features[k], &supported));
        EXPECT(supported == 1, "goepEpBackendSupports(\"cpu\", %d) = %d, want 1", (int)cpu_features[k], supported);
    }
    int supported = -1;
    EXPECT_RC(goepEpBackendSupports("no-such-backend", GOEP_EP_FEATURE_FP8_WIRE, &supported), goepEpInvalidArgument,
              "\"no-such-backend\" is not registered");
    EXPECT(supported == -1, "a refused goepEpBackendSupports wrote %d", supported);
    EXPECT_RC(goepEpBackendSupports("cpu", (goepEpFeature_t)0, &supported), goepEpInvalidArgument, "feature = 0");
    EXPECT_RC(goepEpBackendSupports("cpu", (goepEpFeature_t)99, &supported), goepEpInvalidArgument, "feature = 99");
    EXPECT_RC(goepEpBackendSupports(NULL, GOEP_EP_FEATURE_FP8_WIRE, &supported), goepEpInvalidArgument,
              "backend is NULL");
    EXPECT_RC(goepEpBackendSupports("cpu", GOEP_EP_FEATURE_FP8_WIRE, NULL), goepEpInvalidArgument, "supported is NULL");
}

int main(int argc, char** argv) {
    int provided;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &my_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &n_ranks);
    int stalls = argc > 1 && !strcmp(argv[1], "-s");
    if (stalls && n_ranks < 2) {
        if (my_rank == 0) fprintf(stderr, "ep_errors: -s needs 2 ranks or more (a peer to stall)\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    int version = 0;
    OK(goepEpGetVersion(&version));
    EXPECT(version == GOEP_EP_VERSION_CODE, "goepEpGetVersion = %d, the header says %d", version, GOEP_EP_VERSION_CODE);
    EXPECT(goepEpStructSize("goepEpGroupConfig_t") == sizeof(goepEpGroupConfig_t) && goepEpStructSize("nope") == 0,
           "goepEpStructSize");
    test_backends();
    test_group_config();
    test_handles_and_ll_dispatch();
    test_ht();
    test_alloc_and_update();
    if (stalls) {
        test_stalled_peer();
        test_mask();
    }
    int bad = failures > 0, any;
    MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (my_rank == 0) printf("ep_errors: %d checks on %d ranks: %s\n", checks, n_ranks, any ? "FAILED" : "ok");
    MPI_Finalize();
    return any ? 1 : 0;
}
