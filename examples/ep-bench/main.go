// Command ep-bench measures ep dispatch and combine under mpirun, beside the
// same work done by hand with MPI_Alltoallv (ep.AlltoallvGroup) and the
// memcpy bandwidth of the same bytes, all in the same run.
//
// Every numeric flag takes a comma-separated list; each combination is one
// configuration. For each, every timed iteration starts with a barrier; the
// reported time is the median over iterations on each rank, then the slowest
// rank's median. Algorithm bandwidth per rank is the bytes a rank's
// (token, expert) pairs (LL) or (token, rank) pairs (HT) carry, over that
// time, averaged over ranks.
//
// The decode and prefill configurations of the issue:
//
//	mpirun -np 2 bin/ep-bench -mode ll -tokens 128 -hidden 7168 -topk 8 -experts 64 -dtype bf16
//	mpirun -np 2 bin/ep-bench -mode ht -tokens 4096 -hidden 7168 -topk 8 -experts 64 -dtype bf16
//	GOEP_RANKS_PER_NODE=1 mpirun -x GOEP_RANKS_PER_NODE -np 2 bin/ep-bench -mode ht ...   # 2 simulated nodes
//
// -device says which backend is measured: cpu (the default, ep's CPU
// engine), emulate (the GPU backend, package epgpu, on an emulated device:
// its logic, not a GPU's speed) or cuda (the GPU backend on each rank's
// GPU, with NCCL). With a device, the CPU engine runs the same work in the
// same run: its results are what the device's are checked against, and its
// times are printed beside them, with a copy of the same bytes inside the
// device's memory (cuMemcpyDtoD on a GPU) as the device's bandwidth
// reference:
//
//	mpirun -np 2 bin/ep-bench -device emulate -mode ll,ht -tokens 64 -hidden 1024 -experts 8
//	mpirun -np 8 bin/ep-bench -device cuda -mode ll -tokens 128 -hidden 7168 -topk 8 -experts 256
//
// With -json, rank 0 prints one JSON object per configuration and line
// instead of the table.
package main

import (
	"os"
)

func main() { os.Exit(run(os.Stdout, os.Stderr, os.Args[1:])) }
