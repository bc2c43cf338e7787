/*
 * ep_round.cpp: a program written for NCCL EP's C API (nccl_ep.h, API version 2), with NCCL's and
 * CUDA's names, that goep runs after a renaming. It is never compiled as written here (this
 * repository has neither NCCL nor CUDA): scripts/capi/test-rename.sh renames ncclEp to goepEp,
 * NCCL_EP_ to GOEP_EP_ and nccl_ep.h to goep_ep.h, includes goep_nccl.h where this includes nccl.h,
 * replaces the two marked communicator blocks with an MPI communicator, and builds it with a host
 * stand-in for cuda_runtime.h; nothing else in it changes.
 *
 * Each round makes device buffers (cudaMalloc) described by ncclEpTensorAlloc descriptors, dispatches
 * a step's tokens on a stream, runs the experts on the host copy of what arrived (each step scales by
 * its own factor, so that a combine paired with another step's routing shows), combines, and checks
 * the result against ep_reference.h. The steps use one handle (ncclEpInitHandle, ncclEpUpdateHandle
 * per step) and then a handle of its own (ncclEpCreateHandle), in LL (expert-major, or rank-major with
 * -L rm) or HT (flat, or expert-major with zones padded to 4 rows with -L em).
 *
 *   mpirun -np 4 ep_round [-a ll|ht] [-L em|rm]
 */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <vector>

#include "cuda_runtime.h"
#include "ep_reference.h"
#include "nccl.h"
#include "nccl_ep.h"

static int rank, nranks, failures;
static const size_t ZONE_ALIGN = 4; /* HT expert-major zones */

#define NCCLCHECK(cmd)                                                                                      \
    do {                                                                                                    \
        ncclResult_t r_ = (cmd);                                                                            \
        if (r_ != ncclSuccess) {                                                                            \
            fprintf(stderr, "rank %d: %s:%d: %s: %s\n", rank, __FILE__, __LINE__, #cmd, ncclGetErrorString(r_)); \
            MPI_Abort(MPI_COMM_WORLD, 2);                                                                   \
        }                                                                                                   \
    } while (0)
#define CUDACHECK(cmd)                                                                                       \
    do {                                                                                                     \
        cudaError_t e_ = (cmd);                                                                              \
        if (e_ != cudaSuccess) {                                                                             \
            fprintf(stderr, "rank %d: %s:%d: %s: %s\n", rank, __FILE__, __LINE__, #cmd, cudaGetErrorString(e_)); \
            MPI_Abort(MPI_COMM_WORLD, 2);                                                                    \
        }                                                                                                    \
    } while (0)

enum { HIDDEN = 32, TOPK = 3, EXPERTS_PER_RANK = 4, MAX_TOKENS = 10 };

/* The program's device allocator, given to the group (NCCL EP allocates through it). */
static cudaError_t poolAlloc(void** ptr, size_t size, void* context) {
    (void)context;
    return cudaMalloc(ptr, size);
}
static cudaError_t poolFree(void* ptr, void* context) {
    (void)context;
    return cudaFree(ptr);
}

/* A device buffer of ndim extents of dt and a library-made descriptor of it. */
struct DeviceTensor {
    ncclEpTensor_t* t = nullptr;
    size_t bytes = 0;
};

static size_t typeBytes(ncclDataType_t dt) {
    switch (dt) {
        case ncclUint8: return 1;
        case ncclBfloat16: return 2;
        case ncclInt64: return 8;
        default: return 4;
    }
}

static DeviceTensor makeTensor(ncclDataType_t dt, unsigned ndim, size_t d0, size_t d1 = 1, size_t d2 = 1) {
    size_t dims[3] = {d0, d1, d2};
    DeviceTensor d;
    d.bytes = typeBytes(dt);
    for (unsigned i = 0; i < ndim; i++) d.bytes *= dims[i];
    void* data = nullptr;
    CUDACHECK(cudaMalloc(&data, d.bytes));
    CUDACHECK(cudaMemset(data, 0, d.bytes));
    NCCLCHECK(ncclEpTensorAlloc(&d.t, ndim, dt, dims, nullptr));
    d.t->data = data;
    return d;
}

static void freeTensor(DeviceTensor& d) {
    void* data = d.t ? d.t->data : nullptr;
    NCCLCHECK(ncclEpTensorDestroy(d.t));
    d.t = nullptr;
    CUDACHECK(cudaFree(data));
}

static void expect(bool ok, const char* what, int step, int t, int h, float got, float want) {
    if (!ok && failures++ < 10)
        fprintf(stderr, "rank %d: step %d: %s: token %d [%d] = %g, want %g\n", rank, step, what, t, h, got, want);
}

/* One step on handle h (its routing already given): dispatch, experts scaling by factor, combine, check. */
static void runStep(ncclEpHandle_t h, bool ll, ncclEpLayout_t layout, const ref_shape_t& s, float factor, int step,
                    cudaStream_t stream) {
    int T = num_tokens_of(&s, rank), L = s.local_experts;
    bool rm = layout == NCCL_EP_LAYOUT_RANK_MAJOR, em = !ll && layout == NCCL_EP_LAYOUT_EXPERT_MAJOR;
    /* HT expert-major: a row per (token, local expert) pair, and each zone's padding. */
    size_t slots = em ? (size_t)nranks * MAX_TOKENS * TOPK + (size_t)L * (ZONE_ALIGN - 1) : (size_t)nranks * MAX_TOKENS;
    std::vector<uint16_t> x((size_t)T * HIDDEN);
    std::vector<float> w((size_t)T * TOPK);
    for (int t = 0; t < T; t++) {
        for (int j = 0; j < HIDDEN; j++) x[(size_t)t * HIDDEN + j] = bf16_of(ref_value(rank, t, j));
        for (int k = 0; k < TOPK; k++) w[(size_t)t * TOPK + k] = ref_weight(t, k);
    }
    DeviceTensor dx = makeTensor(ncclBfloat16, 2, T, HIDDEN), dw = makeTensor(ncclFloat32, 2, T, TOPK);
    CUDACHECK(cudaMemcpyAsync(dx.t->data, x.data(), dx.bytes, cudaMemcpyHostToDevice, stream));
    CUDACHECK(cudaMemcpyAsync(dw.t->data, w.data(), dw.bytes, cudaMemcpyHostToDevice, stream));

    DeviceTensor recv = rm   ? makeTensor(ncclBfloat16, 3, nranks, MAX_TOKENS, HIDDEN)
                        : ll ? makeTensor(ncclBfloat16, 3, L, slots, HIDDEN)
                             : makeTensor(ncclBfloat16, 2, slots, HIDDEN);
    DeviceTensor recvW = rm   ? makeTensor(ncclFloat32, 3, nranks, MAX_TOKENS, TOPK)
                         : em ? makeTensor(ncclFloat32, 1, slots)
                              : makeTensor(ncclFloat32, 2, slots, TOPK);
    DeviceTensor recvIdx = rm ? makeTensor(ncclInt64, 3, nranks, MAX_TOKENS, TOPK) : makeTensor(ncclInt64, 2, slots, TOPK);
    DeviceTensor counters = makeTensor(ncclInt32, 1, L), total = makeTensor(ncclInt32, 1, 1);
    DeviceTensor srcCounters = makeTensor(ncclInt32, 1, nranks), offsets = makeTensor(ncclInt64, 1, L);

    ncclEpDispatchInputs_t in = NCCL_EP_DISPATCH_INPUTS_INIT;
    in.tokens = dx.t;
    in.topk_weights = dw.t;
    ncclEpDispatchOutputs_t out = NCCL_EP_DISPATCH_OUTPUTS_INIT;
    out.tokens = recv.t;
    if (!ll || rm) {
        out.topk_weights = recvW.t;
        if (!em) out.topk_idx = recvIdx.t;
    }
    ncclEpLayoutInfo_t info = NCCL_EP_LAYOUT_INFO_INIT;
    if (rm)
        info.src_rank_counters = srcCounters.t;
    else
        info.expert_counters = counters.t;
    if (em) info.expert_offsets = offsets.t;
    info.recv_total_counter = total.t;
    info.recv_topk_idx_kind = NCCL_EP_EXPERT_ID_LOCAL;
    ncclEpDispatchConfig_t dcfg = NCCL_EP_DISPATCH_CONFIG_INIT;
    dcfg.quant_recipe = NCCL_EP_DISP_QUANT_NONE;
    NCCLCHECK(ncclEpDispatch(h, &in, &out, &info, &dcfg, stream));
    NCCLCHECK(ncclEpComplete(h, nullptr, stream));
    CUDACHECK(cudaStreamSynchronize(stream));

    /* The experts, on the host: LL scales each valid row of each expert; HT scales each row by the sum
     * of its weights (HT experts apply them) and the factor. */
    std::vector<uint16_t> rows(recv.bytes / 2);
    std::vector<float> rowW(recvW.bytes / 4);
    std::vector<int32_t> cnt(L), tot(1), src(nranks);
    CUDACHECK(cudaMemcpy(rows.data(), recv.t->data, recv.bytes, cudaMemcpyDeviceToHost));
    CUDACHECK(cudaMemcpy(rowW.data(), recvW.t->data, recvW.bytes, cudaMemcpyDeviceToHost));
    CUDACHECK(cudaMemcpy(cnt.data(), counters.t->data, counters.bytes, cudaMemcpyDeviceToHost));
    CUDACHECK(cudaMemcpy(tot.data(), total.t->data, total.bytes, cudaMemcpyDeviceToHost));
    CUDACHECK(cudaMemcpy(src.data(), srcCounters.t->data, srcCounters.bytes, cudaMemcpyDeviceToHost));
    if (rm) { /* rank-major: the experts apply the weights of each row's slots */
        for (int r = 0; r < nranks; r++)
            for (int i = 0; i < src[r]; i++) {
                size_t row = (size_t)r * MAX_TOKENS + i;
                float ws = 0;
                for (int k = 0; k < TOPK; k++) ws += rowW[row * TOPK + k];
                for (int j = 0; j < HIDDEN; j++) {
                    uint16_t& v = rows[row * HIDDEN + j];
                    v = bf16_of(float_of_bf16(v) * ws * factor);
                }
            }
    } else if (em) { /* expert-major zones: one weight per row (0 on the padding) */
        for (int r = 0; r < tot[0]; r++)
            for (int j = 0; j < HIDDEN; j++) {
                uint16_t& v = rows[(size_t)r * HIDDEN + j];
                v = bf16_of(float_of_bf16(v) * rowW[r] * factor);
            }
    } else if (ll) {
        for (int l = 0; l < L; l++)
            for (int r = 0; r < cnt[l]; r++)
                for (int j = 0; j < HIDDEN; j++) {
                    uint16_t& v = rows[((size_t)l * slots + r) * HIDDEN + j];
                    v = bf16_of(float_of_bf16(v) * factor);
                }
    } else {
        for (int r = 0; r < tot[0]; r++) {
            float ws = 0;
            for (int k = 0; k < TOPK; k++) ws += rowW[(size_t)r * TOPK + k];
            for (int j = 0; j < HIDDEN; j++) {
                uint16_t& v = rows[(size_t)r * HIDDEN + j];
                v = bf16_of(float_of_bf16(v) * ws * factor);
            }
        }
    }
    DeviceTensor y = rm   ? makeTensor(ncclBfloat16, 3, nranks, MAX_TOKENS, HIDDEN)
                     : ll ? makeTensor(ncclBfloat16, 3, L, slots, HIDDEN)
                          : makeTensor(ncclBfloat16, 2, slots, HIDDEN);
    CUDACHECK(cudaMemcpy(y.t->data, rows.data(), y.bytes, cudaMemcpyHostToDevice));
    DeviceTensor combined = makeTensor(ncclBfloat16, 2, T, HIDDEN);
    ncclEpCombineInputs_t cin = NCCL_EP_COMBINE_INPUTS_INIT;
    cin.tokens = y.t;
    ncclEpCombineOutputs_t cout = NCCL_EP_COMBINE_OUTPUTS_INIT;
    cout.tokens = combined.t;
    ncclEpCombineConfig_t ccfg = NCCL_EP_COMBINE_CONFIG_INIT;
    ccfg.quant_recipe = NCCL_EP_COMB_QUANT_NONE;
    NCCLCHECK(ncclEpCombine(h, &cin, &cout, &ccfg, stream));
    CUDACHECK(cudaStreamSynchronize(stream));

    std::vector<uint16_t> got((size_t)T * HIDDEN);
    CUDACHECK(cudaMemcpy(got.data(), combined.t->data, combined.bytes, cudaMemcpyDeviceToHost));
    for (int t = 0; t < T; t++)
        for (int j = 0; j < HIDDEN; j++) {
            float g = float_of_bf16(got[(size_t)t * HIDDEN + j]), want = ref_combined(&s, nullptr, rank, t, j) * factor;
            expect(g == want, "combined", step, t, j, g, want);
        }
    DeviceTensor* all[] = {&dx, &dw, &recv, &recvW, &recvIdx, &counters, &total, &srcCounters, &offsets, &y, &combined};
    for (DeviceTensor* d : all) freeTensor(*d);
}

int main(int argc, char** argv) {
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);
    bool ll = true, other = false;
    for (int opt; (opt = getopt(argc, argv, "a:L:")) != -1;) {
        if (opt == 'a') ll = strcmp(optarg, "ht") != 0;
        if (opt == 'L') other = strcmp(optarg, "em") == 0 || strcmp(optarg, "rm") == 0; /* the mode's other layout */
    }

    // communicator set-up: begin
    ncclUniqueId id;
    if (rank == 0) ncclGetUniqueId(&id);
    MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
    ncclComm_t comm;
    NCCLCHECK(ncclCommInitRank(&comm, nranks, id, rank));
    // communicator set-up: end
    CUDACHECK(cudaSetDevice(0));
    cudaStream_t stream;
    CUDACHECK(cudaStreamCreate(&stream));

    ref_shape_t s = {nranks, EXPERTS_PER_RANK * nranks, EXPERTS_PER_RANK, TOPK, HIDDEN, MAX_TOKENS};
    ncclEpGroupConfig_t config = NCCL_EP_GROUP_CONFIG_INIT;
    config.algorithm = ll ? NCCL_EP_ALGO_LOW_LATENCY : NCCL_EP_ALGO_HIGH_THROUGHPUT;
    config.num_experts = s.num_experts;
    config.max_dispatch_tokens_per_rank = MAX_TOKENS;
    config.max_recv_tokens_per_rank = ll || other ? NCCL_EP_AUTO : nranks * MAX_TOKENS;
    config.max_token_bytes = HIDDEN * 2;
    config.rdma_buffer_size = NCCL_EP_AUTO;
    config.num_qp_per_rank = NCCL_EP_AUTO;
    config.num_channels = NCCL_EP_AUTO;
    config.max_num_sms = NCCL_EP_AUTO;
    config.alloc.alloc_fn = poolAlloc;
    config.alloc.free_fn = poolFree;
    config.timeout_ns = 60ull * 1000 * 1000 * 1000;
    config.zero_copy = NCCL_EP_ZERO_COPY_AUTO;
    config.overflow_policy = NCCL_EP_OVERFLOW_AUTO;
    config.num_topk = TOPK;
    ncclEpGroup_t group;
    NCCLCHECK(ncclEpCreateGroup(&group, comm, &config));

    /* One handle for the steps, its routing in memory of the program's. */
    ncclEpLayout_t layout = ll ? (other ? NCCL_EP_LAYOUT_RANK_MAJOR : NCCL_EP_LAYOUT_EXPERT_MAJOR)
                               : (other ? NCCL_EP_LAYOUT_EXPERT_MAJOR : NCCL_EP_LAYOUT_FLAT);
    ncclEpHandleConfig_t hcfg = NCCL_EP_HANDLE_CONFIG_INIT;
    if (!ll && other) hcfg.dispatch_output_per_expert_alignment = ZONE_ALIGN;
    size_t memBytes = 0;
    NCCLCHECK(ncclEpHandleMemSize(group, layout, &hcfg, &memBytes, TOPK));
    DeviceTensor handleMem = makeTensor(ncclUint8, 1, memBytes);
    ncclEpHandle_t handle;
    NCCLCHECK(ncclEpInitHandle(&handle, group, layout, &hcfg, TOPK, handleMem.t));
    int T = num_tokens_of(&s, rank);
    std::vector<int64_t> topk((size_t)T * TOPK);
    for (int t = 0; t < T; t++)
        for (int k = 0; k < TOPK; k++) topk[(size_t)t * TOPK + k] = ref_expert(&s, rank, t, k);
    DeviceTensor dTopk = makeTensor(ncclInt64, 2, T, TOPK);
    CUDACHECK(cudaMemcpy(dTopk.t->data, topk.data(), dTopk.bytes, cudaMemcpyHostToDevice));
    int step = 0;
    for (float factor = 1; factor <= 4; factor *= 2, step++) {
        NCCLCHECK(ncclEpUpdateHandle(handle, dTopk.t, nullptr, stream));
        runStep(handle, ll, layout, s, factor, step, stream);
    }
    NCCLCHECK(ncclEpHandleDestroy(handle));

    /* A handle of its own for a step. */
    ncclEpHandle_t once;
    NCCLCHECK(ncclEpCreateHandle(&once, group, layout, dTopk.t, nullptr, &hcfg, stream));
    runStep(once, ll, layout, s, 8, step, stream);
    NCCLCHECK(ncclEpHandleDestroy(once));

    freeTensor(dTopk);
    freeTensor(handleMem);
    NCCLCHECK(ncclEpGroupDestroy(group));
    CUDACHECK(cudaStreamDestroy(stream));
    // communicator tear-down: begin
    ncclCommDestroy(comm);
    // communicator tear-down: end
    int bad = failures > 0, any = 0;
    MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (rank == 0) printf("ep_round: %s %s, %d ranks, %d steps: %s\n", ll ? "ll" : "ht",
                          other ? (ll ? "rank-major" : "expert-major") : (ll ? "expert-major" : "flat"), nranks, step + 1,
                          any ? "FAILED" : "ok");
    MPI_Finalize();
    return any ? 1 : 0;
}
