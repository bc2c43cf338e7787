/*
 * readme.c: the round of docs/capi.md ("A round from C") as a complete program. One LL dispatch
 * and combine of bfloat16 tokens; each expert scales its rows by a power of two, so that every
 * combined value is checked against out[t] = sum over k of w[t][k] * scale(expert) * x[t],
 * computed on this rank from its own inputs alone. scripts/check-snippets.sh checks that the lines
 * docs/capi.md shows are this file's, and runs it.
 *
 *   mpicc -o readme capi/examples/readme.c $(pkg-config --cflags --libs bin/capi/goep_ep.pc)
 *   mpirun -np 2 ./readme
 */
#include <math.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "goep_ep.h"

static void check(goepEpResult_t r) { /* every call returns a goepEpResult_t */
    if (r != goepEpSuccess) { fprintf(stderr, "%s\n", goepEpGetLastError()); MPI_Abort(MPI_COMM_WORLD, 1); }
}

/* bfloat16 is the top half of a float32: rounded to nearest, ties to even. */
static uint16_t bf16_of(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)((u + 0x7FFF + ((u >> 16) & 1)) >> 16);
}
static float float_of(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Expert e multiplies its rows by 1, 2 or 4: exact in bfloat16. */
static float scale(int64_t e) { return (float)(1 << (e % 3)); }

int main(int argc, char** argv) {
    int provided, rank, nranks;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);   /* the program's, never goep's */
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);

    /* This rank's T tokens (multiples of 1/8 in [-1, 1], exact in bfloat16), each sent to 8
     * different experts (7 is prime to 8 * nranks) but one in five to 7, and their gate weights. */
    const size_t T = 48, hidden = 2048;
    const int num_experts = 8 * nranks;
    uint16_t* tokens = malloc(T * hidden * sizeof(uint16_t));
    int64_t* expert_ids = malloc(T * 8 * sizeof(int64_t));
    float* gate_weights = malloc(T * 8 * sizeof(float));
    for (size_t t = 0; t < T; t++) {
        for (size_t i = 0; i < hidden; i++) tokens[t * hidden + i] = bf16_of((float)((int)((rank * 131 + t * 7 + i) % 17) - 8) / 8);
        for (size_t k = 0; k < 8; k++) {
            expert_ids[t * 8 + k] = (k == 7 && t % 5 == 0) ? -1 : (int64_t)((t + 7 * k + 3 * (size_t)rank) % (size_t)num_experts);
            gate_weights[t * 8 + k] = 1.0f / (float)(k + 2);
        }
    }

    /* The caller's buffers for the received rows, their counts, the experts' outputs and the
     * combined tokens. */
    const size_t L = (size_t)num_experts / (size_t)nranks, slots = (size_t)nranks * 128;
    uint16_t* recv_rows = calloc(L * slots * hidden, sizeof(uint16_t));
    uint16_t* out_rows = calloc(L * slots * hidden, sizeof(uint16_t));
    int32_t* count_of = calloc(L, sizeof(int32_t));
    uint16_t* combined_rows = calloc(T * hidden, sizeof(uint16_t));
    size_t r_dims[3] = {L, slots, hidden}, c_dims[1] = {L}, o_dims[2] = {T, hidden};
    goepEpTensor_t recv = GOEP_EP_TENSOR_INIT, counts = GOEP_EP_TENSOR_INIT, expert_out = GOEP_EP_TENSOR_INIT,
                   combined = GOEP_EP_TENSOR_INIT;
    recv.ndim = 3, recv.datatype = goepEpBfloat16, recv.data = recv_rows, recv.sizes = r_dims;
    expert_out.ndim = 3, expert_out.datatype = goepEpBfloat16, expert_out.data = out_rows, expert_out.sizes = r_dims;
    counts.ndim = 1, counts.datatype = goepEpInt32, counts.data = count_of, counts.sizes = c_dims;
    combined.ndim = 2, combined.datatype = goepEpBfloat16, combined.data = combined_rows, combined.sizes = o_dims;

    goepEpGroupConfig_t cfg = GOEP_EP_GROUP_CONFIG_INIT;             /* size, magic, version set */
    cfg.algorithm = GOEP_EP_ALGO_LOW_LATENCY;
    cfg.num_experts = 8 * nranks;
    cfg.max_dispatch_tokens_per_rank = 128;
    cfg.max_token_bytes = hidden * 2;                                 /* bfloat16 rows (the default token type) */
    cfg.num_topk = 8;
    goepEpGroup_t group;
    check(goepEpCreateGroup(&group, MPI_COMM_WORLD, &cfg));          /* collective */

    size_t x_dims[2] = {T, hidden}, k_dims[2] = {T, 8};
    goepEpTensor_t x = GOEP_EP_TENSOR_INIT, topk = GOEP_EP_TENSOR_INIT, w = GOEP_EP_TENSOR_INIT;
    x.ndim = 2, x.datatype = goepEpBfloat16, x.data = tokens, x.sizes = x_dims;
    topk.ndim = 2, topk.datatype = goepEpInt64, topk.data = expert_ids, topk.sizes = k_dims;
    w.ndim = 2, w.datatype = goepEpFloat32, w.data = gate_weights, w.sizes = k_dims;

    goepEpHandle_t h;
    check(goepEpCreateHandle(&h, group, GOEP_EP_LAYOUT_EXPERT_MAJOR, &topk, NULL, NULL, NULL));   /* local */
    goepEpDispatchInputs_t in = GOEP_EP_DISPATCH_INPUTS_INIT;
    in.tokens = &x, in.topk_weights = &w;
    goepEpDispatchOutputs_t out = GOEP_EP_DISPATCH_OUTPUTS_INIT;
    out.tokens = &recv;                        /* [local_experts, nranks * 128, hidden] */
    goepEpLayoutInfo_t info = GOEP_EP_LAYOUT_INFO_INIT;
    info.expert_counters = &counts;            /* [local_experts] int32 */
    check(goepEpDispatch(h, &in, &out, &info, NULL, NULL));          /* collective; NULL stream */
    /* ... experts: the first counts[l] rows of recv[l] -> expert_out[l] ... */
    for (size_t l = 0; l < L; l++) {
        float s = scale((int64_t)((size_t)rank * L + l));
        for (size_t i = 0; i < (size_t)count_of[l] * hidden; i++) {
            size_t at = l * slots * hidden + i;
            out_rows[at] = bf16_of(s * float_of(recv_rows[at]));
        }
    }
    goepEpCombineInputs_t cin = GOEP_EP_COMBINE_INPUTS_INIT;
    cin.tokens = &expert_out;
    goepEpCombineOutputs_t cout = GOEP_EP_COMBINE_OUTPUTS_INIT;
    cout.tokens = &combined;                   /* [T, hidden] */
    check(goepEpCombine(h, &cin, &cout, NULL, NULL));                /* collective */
    check(goepEpHandleDestroy(h));
    check(goepEpGroupDestroy(group));                                /* collective */

    /* The reference, in double from this rank's inputs. The library sums in float32 and rounds to
     * bfloat16, within 1/256 of the magnitude of a value's terms; a wrong or missing term is over
     * 1/66 of it (weights 1/2 to 1/9, scales 1 to 4), so the bound is 1/100. */
    long bad = 0;
    for (size_t t = 0; t < T; t++) {
        for (size_t i = 0; i < hidden; i++) {
            double want = 0, mag = 0, xv = float_of(tokens[t * hidden + i]);
            for (size_t k = 0; k < 8; k++) {
                int64_t e = expert_ids[t * 8 + k];
                if (e < 0) continue;
                double term = (double)gate_weights[t * 8 + k] * scale(e) * xv;
                want += term, mag += fabs(term);
            }
            double got = float_of(combined_rows[t * hidden + i]);
            if (fabs(got - want) > mag / 100 && bad++ < 5)
                fprintf(stderr, "rank %d: token %zu element %zu: combined %g, want %g\n", rank, t, i, got, want);
        }
    }
    long bad_total = 0;
    MPI_Allreduce(&bad, &bad_total, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    if (rank == 0) printf("readme.c: %zu tokens on each of %d ranks: %s\n", T, nranks, bad_total ? "MISMATCH" : "combined values right");
    free(tokens), free(expert_ids), free(gate_weights), free(recv_rows), free(out_rows), free(count_of), free(combined_rows);
    MPI_Finalize();
    return bad_total != 0;
}
