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
// With -json, rank 0 prints one JSON object per configuration and line
// instead of the table.
package main

import (
	"os"
)

func main() { os.Exit(run(os.Stdout, os.Stderr, os.Args[1:])) }
