// Command deadrank runs dispatch and combine rounds on every rank until one
// rank dies, for the test that a dead rank ends the job (main_test.go): a
// rank that panics exits without MPI_Finalize, and mpirun ends the job;
// one that returns after MPI_Finalize leaves the others to time out within
// the group's timeout, name it, close the group at once and end too.
//
// Usage (under mpirun, built with the mpi tag):
//
//	deadrank [-die R] [-how panic|finalize] [-timeout D]
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/goep/goep/ep"
	"github.com/goep/goep/mpi"
)

func main() { os.Exit(run(os.Stdout, os.Stderr, os.Args[1:])) }

func run(stdout, stderr io.Writer, args []string) int {
	fs := flag.NewFlagSet("deadrank", flag.ContinueOnError)
	fs.SetOutput(stderr)
	die := fs.Int("die", -1, "the rank that dies after the first round (-1: none)")
	how := fs.String("how", "panic", "how it dies: panic (exits without MPI_Finalize) or finalize (returns after it)")
	timeout := fs.Duration("timeout", 0, "the group's timeout (0: ep.DefaultTimeout)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	world, err := mpi.Init()
	if err != nil {
		fmt.Fprintln(stderr, "deadrank:", err)
		return 1
	}
	g, err := ep.NewGroup[float32](world, ep.Config{Mode: ep.LowLatency, NumExperts: 2 * world.Size(),
		MaxTokensPerRank: 4, Hidden: 8, TopK: 2, Timeout: *timeout})
	if err != nil {
		fmt.Fprintln(stderr, "deadrank:", err)
		mpi.Abort(1, err.Error())
	}
	x, out := make([]float32, 4*8), make([]float32, 4*8)
	topk, weights := []int32{0, 1, 2, 3, 1, 2, 3, 0}, []float32{1, 1, 1, 1, 1, 1, 1, 1}
	for i := range topk {
		topk[i] %= int32(2 * world.Size())
	}
	for round := 0; ; round++ {
		if round == 1 && world.Rank() == *die {
			if *how == "finalize" {
				fmt.Fprintf(stderr, "deadrank: rank %d returns without closing the group\n", world.Rank())
				mpi.Finalize()
				return 3
			}
			panic(fmt.Sprintf("deadrank: rank %d dies", world.Rank()))
		}
		h, err := g.Dispatch(ep.Tokens(ep.Host(x), topk, weights))
		if err == nil {
			err = g.Combine(h, h.Recv(), ep.Host(out), nil)
		}
		if err != nil {
			start := time.Now()
			cerr := g.Close()
			fmt.Fprintf(stderr, "deadrank: rank %d: %v; Close took %v: %v\n", world.Rank(), err, time.Since(start).Round(time.Millisecond), cerr)
			mpi.Finalize()
			return 1
		}
		if round == 100 && *die < 0 {
			break
		}
	}
	if err := g.Close(); err != nil {
		mpi.Abort(1, err.Error())
	}
	mpi.Finalize()
	fmt.Fprintln(stdout, "deadrank: every round done")
	return 0
}
