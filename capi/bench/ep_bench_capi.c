/*
 * ep_bench_capi.c: the cost of the C boundary. The same round, timed through goep's C interface and
 * in Go inside the library (goepEpBenchGoRounds), on the same group, alternately, in one run:
 *
 *   C:  goepEpCreateHandle(topk, NULL), goepEpDispatch into the caller's buffers, goepEpCombine of those
 *       buffers as the expert outputs (an identity expert) into the caller's output, goepEpHandleDestroy
 *   C zero-copy: the same, but the dispatch leaves the rows in the group's buffer and the combine reads
 *       them there (outputs->tokens NULL, goepEpHandleRecvTokens): the calls without the copies
 *   Go: g.Dispatch(x, topk, weights), g.Combine(h, h.Recv(), out) (the identity expert on the group's
 *       receive buffer in place, as a Go program would run it)
 *   Go with copies: the same, the rows received copied into a buffer of its own and combined from there
 *       (goepEpBenchGoCopiedRounds): the copies C's round makes, without the boundary
 *
 *   mpirun -np 2 bin/capi/ep_bench_capi -m ll -t 128 [-d 7168] [-k 8] [-e 256] [-i 200] [-r 5]
 *
 * Each timed round starts after a barrier. Prints one JSON line per interface (rank 0): the slowest
 * rank's median round in microseconds, its minimum, and the round over the Go round (vs_go) and over the
 * Go round with copies (vs_go_copies).
 */
#define _POSIX_C_SOURCE 200809L
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../examples/ep_reference.h"
#include "goep_ep.h"
#include "goep_ep_bench.h"

static int my_rank, n_ranks;

#define CHECK(call)                                                                                         \
    do {                                                                                                    \
        goepEpResult_t rc_ = (call);                                                                        \
        if (rc_ != goepEpSuccess) {                                                                         \
            fprintf(stderr, "rank %d: %s failed: %s\n  %s\n", my_rank, #call, goepEpGetErrorString(rc_),      \
                    goepEpGetLastError());                                                                  \
            MPI_Abort(MPI_COMM_WORLD, 2);                                                                   \
        }                                                                                                   \
    } while (0)

static int cmp_double(const void* a, const void* b) {
    double x = *(const double*)a, y = *(const double*)b;
    return (x > y) - (x < y);
}

/* The slowest rank's median and minimum of us[0..n). */
static void stats(double* us, int n, double* median, double* minimum) {
    qsort(us, n, sizeof(double), cmp_double);
    double mine[2] = {us[n / 2], us[0]}, all[2];
    MPI_Allreduce(mine, all, 2, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    *median = all[0], *minimum = all[1];
}

static goepEpTensor_t tensor(goepEpDataType_t d, void* data, unsigned ndim, size_t* dims) {
    goepEpTensor_t t = GOEP_EP_TENSOR_INIT;
    t.datatype = d, t.data = data, t.ndim = ndim, t.sizes = dims;
    return t;
}

int main(int argc, char** argv) {
    int provided;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &my_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &n_ranks);
    const char* mode = "ll";
    int T = 128, H = 7168, K = 8, E = 256, iters = 200, repeats = 5, opt;
    while ((opt = getopt(argc, argv, "m:t:d:k:e:i:r:")) != -1) {
        switch (opt) {
            case 'm': mode = optarg; break;
            case 't': T = atoi(optarg); break;
            case 'd': H = atoi(optarg); break;
            case 'k': K = atoi(optarg); break;
            case 'e': E = atoi(optarg); break;
            case 'i': iters = atoi(optarg); break;
            case 'r': repeats = atoi(optarg); break;
            default:
                if (my_rank == 0) fprintf(stderr, "usage: see the comment at the top of ep_bench_capi.c\n");
                MPI_Abort(MPI_COMM_WORLD, 2);
        }
    }
    int ll = strcmp(mode, "ht") != 0, L = E / n_ranks;
    goepEpGroupConfig_t cfg = GOEP_EP_GROUP_CONFIG_INIT;
    cfg.algorithm = ll ? GOEP_EP_ALGO_LOW_LATENCY : GOEP_EP_ALGO_HIGH_THROUGHPUT;
    cfg.num_experts = E;
    cfg.max_dispatch_tokens_per_rank = T;
    cfg.max_token_bytes = 2 * H;
    cfg.num_topk = K;
    goepEpGroup_t group;
    CHECK(goepEpCreateGroup(&group, MPI_COMM_WORLD, &cfg));

    /* Inputs: every token to K distinct experts spread over the ranks (the reference's routing with no
     * empty slots), bfloat16 values, the reference's weights. */
    uint16_t* x = malloc((size_t)T * H * 2);
    int32_t* topk = malloc((size_t)T * K * 4);
    float* w = malloc((size_t)T * K * 4);
    for (int t = 0; t < T; t++) {
        for (int h = 0; h < H; h++) x[(size_t)t * H + h] = bf16_of(ref_value(my_rank, t, h));
        for (int k = 0; k < K; k++) {
            int stride = E / K > 0 ? E / K : 1;
            topk[t * K + k] = (my_rank * 5 + t * 3 + k * stride) % E;
            w[t * K + k] = ref_weight(t, k);
        }
    }
    size_t rows = ll ? (size_t)L * n_ranks * T : (size_t)n_ranks * T;
    uint16_t* recv = malloc(rows * H * 2);
    uint16_t* out = malloc((size_t)T * H * 2);
    float* recv_w = malloc(rows * K * 4);
    int32_t* recv_idx = malloc(rows * K * 4);
    int32_t* counts = malloc((size_t)L * 4);
    memset(recv, 0, rows * H * 2);
    size_t x_dims[2] = {(size_t)T, (size_t)H}, k_dims[2] = {(size_t)T, (size_t)K}, cnt_dims[1] = {(size_t)L};
    size_t recv_dims[3] = {(size_t)L, (size_t)n_ranks * T, (size_t)H}, flat_dims[2] = {rows, (size_t)H};
    size_t rk_dims[2] = {rows, (size_t)K};
    goepEpTensor_t x_t = tensor(goepEpBfloat16, x, 2, x_dims), topk_t = tensor(goepEpInt32, topk, 2, k_dims);
    goepEpTensor_t w_t = tensor(goepEpFloat32, w, 2, k_dims), out_t = tensor(goepEpBfloat16, out, 2, x_dims);
    goepEpTensor_t recv_t = ll ? tensor(goepEpBfloat16, recv, 3, recv_dims) : tensor(goepEpBfloat16, recv, 2, flat_dims);
    goepEpTensor_t rw_t = tensor(goepEpFloat32, recv_w, 2, rk_dims), ri_t = tensor(goepEpInt32, recv_idx, 2, rk_dims);
    goepEpTensor_t cnt_t = tensor(goepEpInt32, counts, 1, cnt_dims);
    goepEpDispatchInputs_t din = GOEP_EP_DISPATCH_INPUTS_INIT;
    din.tokens = &x_t, din.topk_weights = &w_t;
    goepEpDispatchOutputs_t dout = GOEP_EP_DISPATCH_OUTPUTS_INIT;
    dout.tokens = &recv_t;
    if (!ll) dout.topk_weights = &rw_t, dout.topk_idx = &ri_t;
    goepEpLayoutInfo_t info = GOEP_EP_LAYOUT_INFO_INIT;
    info.expert_counters = &cnt_t;
    goepEpCombineInputs_t cin = GOEP_EP_COMBINE_INPUTS_INIT;
    cin.tokens = &recv_t;
    goepEpCombineOutputs_t cout = GOEP_EP_COMBINE_OUTPUTS_INIT;
    cout.tokens = &out_t;

    goepEpDispatchOutputs_t dout_zc = dout;
    dout_zc.tokens = NULL;
    goepEpTensor_t view = GOEP_EP_TENSOR_INIT;
    size_t view_dims[3];
    view.sizes = view_dims;
    goepEpCombineInputs_t cin_zc = GOEP_EP_COMBINE_INPUTS_INIT;
    cin_zc.tokens = &view;
    double* zc_us = malloc(sizeof(double) * iters * repeats);
    double* c_us = malloc(sizeof(double) * iters * repeats);
    double* go_us = malloc(sizeof(double) * iters * repeats);
    double* gocp_us = malloc(sizeof(double) * iters * repeats);
    double* warm = malloc(sizeof(double) * 5);
    for (int rep = -1; rep < repeats; rep++) { /* rep -1 warms both up */
        int n = rep < 0 ? (iters < 5 ? iters : 5) : iters;
        CHECK(goepEpBenchGoRounds(group, x, topk, w, T, n, rep < 0 ? warm : go_us + rep * iters));
        CHECK(goepEpBenchGoCopiedRounds(group, x, topk, w, T, n, rep < 0 ? warm : gocp_us + rep * iters));
        for (int i = 0; i < n; i++) {
            MPI_Barrier(MPI_COMM_WORLD);
            double t0 = MPI_Wtime();
            goepEpHandle_t h;
            CHECK(goepEpCreateHandle(&h, group, ll ? GOEP_EP_LAYOUT_EXPERT_MAJOR : GOEP_EP_LAYOUT_FLAT, &topk_t, NULL, NULL, NULL));
            CHECK(goepEpDispatch(h, &din, &dout, &info, NULL, NULL));
            CHECK(goepEpCombine(h, &cin, &cout, NULL, NULL));
            CHECK(goepEpHandleDestroy(h));
            double us = (MPI_Wtime() - t0) * 1e6;
            if (rep >= 0) c_us[rep * iters + i] = us;
        }
        for (int i = 0; i < n; i++) {
            MPI_Barrier(MPI_COMM_WORLD);
            double t0 = MPI_Wtime();
            goepEpHandle_t h;
            CHECK(goepEpCreateHandle(&h, group, ll ? GOEP_EP_LAYOUT_EXPERT_MAJOR : GOEP_EP_LAYOUT_FLAT, &topk_t, NULL, NULL, NULL));
            CHECK(goepEpDispatch(h, &din, &dout_zc, &info, NULL, NULL));
            CHECK(goepEpHandleRecvTokens(h, &view));
            CHECK(goepEpCombine(h, &cin_zc, &cout, NULL, NULL));
            CHECK(goepEpHandleDestroy(h));
            double us = (MPI_Wtime() - t0) * 1e6;
            if (rep >= 0) zc_us[rep * iters + i] = us;
        }
    }
    double go_med, go_min, gocp_med, gocp_min, c_med, c_min, zc_med, zc_min;
    stats(go_us, iters * repeats, &go_med, &go_min);
    stats(gocp_us, iters * repeats, &gocp_med, &gocp_min);
    stats(c_us, iters * repeats, &c_med, &c_min);
    stats(zc_us, iters * repeats, &zc_med, &zc_min);
    int nodes = 1;
    const char* rpn = getenv("GOEP_RANKS_PER_NODE");
    if (rpn && atoi(rpn) > 0) nodes = (n_ranks + atoi(rpn) - 1) / atoi(rpn);
    if (my_rank == 0) {
        const char* fmt =
            "{\"api\":\"%s\",\"mode\":\"%s\",\"ranks\":%d,\"nodes\":%d,\"tokens\":%d,\"hidden\":%d,\"topk\":%d,"
            "\"experts\":%d,\"dtype\":\"bf16\",\"iters\":%d,\"round_us\":%.1f,\"round_min_us\":%.1f,\"vs_go\":%.3f,"
            "\"vs_go_copies\":%.3f}\n";
        printf(fmt, "go", mode, n_ranks, nodes, T, H, K, E, iters * repeats, go_med, go_min, 1.0, go_med / gocp_med);
        printf(fmt, "go-copies", mode, n_ranks, nodes, T, H, K, E, iters * repeats, gocp_med, gocp_min, gocp_med / go_med,
               1.0);
        printf(fmt, "c", mode, n_ranks, nodes, T, H, K, E, iters * repeats, c_med, c_min, c_med / go_med, c_med / gocp_med);
        printf(fmt, "c-zero-copy", mode, n_ranks, nodes, T, H, K, E, iters * repeats, zc_med, zc_min, zc_med / go_med,
               zc_med / gocp_med);
        fflush(stdout);
    }
    CHECK(goepEpGroupDestroy(group));
    free(x), free(topk), free(w), free(recv), free(out), free(recv_w), free(recv_idx), free(counts);
    free(c_us), free(zc_us), free(go_us), free(gocp_us), free(warm);
    MPI_Finalize();
    return 0;
}
