// Command ep-bench measures ep dispatch and combine under mpirun, beside the
// same work done by hand with MPI_Alltoallv (ep.Alltoallv's baseline) and the
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
// -device takes any backend registered with ep (ep.OpenBackend: a name
// with options, such as cuda,device=1); -device list prints them with the
// features each declares.
//
// With -json, rank 0 prints one JSON object per configuration and line
// instead of the table.
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/goep/goep/internal/benchfmt"
	"github.com/goep/goep/mpi"
)

func main() { os.Exit(run(os.Stdout, os.Stderr, os.Args[1:])) }

// Result is one configuration's figures: the JSON line of -json, in the
// format the scaling study reads.
type Result = benchfmt.Record

func run(stdout, stderr io.Writer, args []string) int {
	opt, err := parseFlags(stderr, args)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintln(stderr, "ep-bench:", err)
		return 2
	}
	if opt.device == "list" {
		listBackends(stdout)
		return 0
	}
	if opt.planRanks > 0 {
		return plan(stdout, stderr, opt)
	}
	world, err := mpi.Init()
	if err != nil {
		fmt.Fprintln(stderr, "ep-bench:", err)
		return 1
	}
	var floor float64
	if opt.latency {
		if floor, err = flagRoundTrip(world, 7, 20000); err != nil {
			fmt.Fprintf(stderr, "ep-bench: rank %d: flag round trip: %v\n", world.Rank(), err)
			mpi.Abort(1, err.Error())
		}
	}
	var results []*Result
	for _, cfg := range opt.configs() {
		res, err := measure(world, cfg, opt)
		if err != nil {
			fmt.Fprintf(stderr, "ep-bench: rank %d: %v: %v\n", world.Rank(), cfg, err)
			mpi.Abort(1, err.Error())
		}
		res.FlagRoundTripUS = floor
		results = append(results, res)
		if world.Rank() == 0 {
			if opt.jsonOut {
				b, _ := json.Marshal(res)
				fmt.Fprintln(stdout, string(b))
			} else {
				printTable(stdout, res, !opt.skipBaseline)
			}
		}
	}
	if opt.latency && !opt.jsonOut && world.Rank() == 0 {
		printLatency(stdout, results, floor)
	}
	if err := mpi.Finalize(); err != nil {
		fmt.Fprintln(stderr, "ep-bench:", err)
		return 1
	}
	return 0
}
