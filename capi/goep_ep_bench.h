/*
 * goep_ep_bench.h: not part of the API. The boundary benchmark
 * (capi/bench/ep_bench_capi.c, python/bench/bench_boundary.py) times the same
 * round in Go inside the library with it, to compare with the round made
 * through the C or Python interface in the same process.
 */
#ifndef GOEP_EP_BENCH_H
#define GOEP_EP_BENCH_H
#include "goep_ep.h"
#ifdef __cplusplus
extern "C" {
#endif

/* Runs `iters` rounds on the group in Go: a barrier, then timed, the dispatch of x
 * ([tokens, hidden], the group's datatype) with topk and weights ([tokens, num_topk], int32 and float32)
 * and the combine of what arrived, unchanged (an identity expert, reading the group's receive buffer in
 * place), into a buffer of the library's. round_us[i] is round i's time in microseconds. Collective. */
goepEpResult_t goepEpBenchGoRounds(goepEpGroup_t group, const void* x, const int32_t* topk, const float* weights,
                                   int tokens, int iters, double* round_us);

/* The same rounds with the two copies a caller's own arrays cost, in Go: the rows received copied out of
 * the receive buffer into a buffer of the library's (each expert's valid rows in LL, the rows received in
 * HT), and the combine made from that copy, which the engine copies back where its peers read it. */
goepEpResult_t goepEpBenchGoCopiedRounds(goepEpGroup_t group, const void* x, const int32_t* topk,
                                         const float* weights, int tokens, int iters, double* round_us);

#ifdef __cplusplus
}
#endif
#endif
