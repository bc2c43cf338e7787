// Command readme is the README's Go snippet as a complete program: one low-latency dispatch and
// combine of bfloat16 tokens over every rank, each expert scaling its rows by a power of two, and
// every combined value checked against out[t] = sum over k of weights[t][k] * scale(expert) * x[t],
// computed on the token's rank from its own inputs alone. scripts/check-snippets.sh checks that the
// README's lines are this file's, and runs it:
//
//	go build -tags mpi -o bin/readme ./examples/readme
//	mpirun -np 2 bin/readme
package main

import (
	"fmt"
	"math"
	"os"

	"github.com/goep/goep/ep"
	"github.com/goep/goep/mpi"
)

// T is the number of tokens each rank dispatches.
const T = 96

// A rank that exits with an error, without mpi.Finalize, makes mpirun end the others.
func main() {
	err := run()
	if err == nil {
		err = mpi.Finalize()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "readme:", err)
		os.Exit(1)
	}
}

func run() error {
	world, err := mpi.Init() // MPI_Init; mpi.Finalize() at the end
	if err != nil {
		return err
	}
	g, err := ep.NewGroup[ep.BF16](world, ep.Config{Mode: ep.LowLatency, NumExperts: 64,
		MaxTokensPerRank: 128, Hidden: 7168, TopK: 8}) // collective; once per layout
	if err != nil {
		return err
	}
	defer g.Close()
	x, topk, weights := tokens(world.Rank())
	out := make([]ep.BF16, T*7168)
	// x: T tokens of 7168 elements, row after row; topk, weights: T rows of 8 (-1: no expert)
	h, err := g.Dispatch(ep.Tokens(ep.Host(x), topk, weights))
	if err != nil {
		return err
	}
	// the local experts read h.Recv() (LL: [local expert][slot][hidden], counts in h.ExpertCounts())
	// and write their outputs in place
	experts(world, h.Recv().Host(), h.ExpertCounts())
	err = g.Combine(h, h.Recv(), ep.Host(out), nil) // out[t] = sum over k of weights[t][k] * expert output
	if err != nil {
		return err
	}
	return check(world, x, topk, weights, out)
}

// tokens is a rank's input: values that are multiples of 1/8 in [-1, 1] (exact in bfloat16),
// each token sent to 8 different experts (7 is prime to 64) but one in five to 7, with gate
// weights 1/2, 1/3, ... 1/9.
func tokens(rank int) (x []ep.BF16, topk []int32, weights []float32) {
	x = make([]ep.BF16, T*7168)
	topk, weights = make([]int32, T*8), make([]float32, T*8)
	for t := range T {
		for i := range 7168 {
			x[t*7168+i] = ep.BF16From(float32((rank*131+t*7+i)%17-8) / 8)
		}
		for k := range 8 {
			topk[t*8+k] = int32((t + 7*k + 3*rank) % 64)
			if k == 7 && t%5 == 0 {
				topk[t*8+k] = -1
			}
			weights[t*8+k] = 1 / float32(k+2)
		}
	}
	return x, topk, weights
}

// scale is what expert e multiplies its rows by: 1, 2 or 4, exact in bfloat16.
func scale(e int) float32 { return float32(int(1) << (e % 3)) }

// experts runs this rank's experts in place on the rows received for them: recv is
// [local expert][slot][7168], the first counts[l] rows of expert l valid.
func experts(world *mpi.Comm, recv []ep.BF16, counts []int) {
	local := 64 / world.Size()
	slots := len(recv) / local
	for l, n := range counts {
		s := scale(world.Rank()*local + l)
		rows := recv[l*slots : l*slots+n*7168]
		for i, v := range rows {
			rows[i] = ep.BF16From(s * v.Float32())
		}
	}
}

// check compares out with the reference, in float64 from this rank's inputs. The group sums in
// float32 and rounds to bfloat16, within 1/256 of the magnitude of a value's terms; a wrong or
// missing term is over 1/66 of it (weights 1/2 to 1/9, scales 1 to 4), so the bound is 1/100.
// Every rank learns whether all were right; rank 0 says so.
func check(world *mpi.Comm, x []ep.BF16, topk []int32, weights []float32, out []ep.BF16) error {
	var bad []string
	for t := range T {
		for i := range 7168 {
			xv := float64(x[t*7168+i].Float32())
			var want, mag float64
			for k := range 8 {
				if e := topk[t*8+k]; e >= 0 {
					term := float64(weights[t*8+k]) * float64(scale(int(e))) * xv
					want, mag = want+term, mag+math.Abs(term)
				}
			}
			if got := float64(out[t*7168+i].Float32()); math.Abs(got-want) > mag/100 && len(bad) < 5 {
				bad = append(bad, fmt.Sprintf("token %d element %d: combined %g, want %g", t, i, got, want))
			}
		}
	}
	mine, all := []int64{int64(len(bad))}, []int64{0}
	if err := mpi.Allreduce(world, mpi.OpSum, mine, all); err != nil {
		return err
	}
	if len(bad) > 0 {
		return fmt.Errorf("rank %d: combined values differ from the reference: %v", world.Rank(), bad)
	}
	if all[0] > 0 {
		return fmt.Errorf("rank %d: another rank's combined values differ from the reference", world.Rank())
	}
	if world.Rank() == 0 {
		fmt.Printf("readme: %d tokens on each of %d ranks: combined values right\n", T, world.Size())
	}
	return nil
}
