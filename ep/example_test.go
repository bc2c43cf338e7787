package ep_test

import (
	"fmt"
	"log"

	"github.com/goep/goep/ep"
	"github.com/goep/goep/mpi"
)

// A whole dispatch/combine round, run on every rank under mpirun. With
// identity experts each token comes back times the sum of its weights.
func ExampleGroup_Dispatch() {
	world, err := mpi.Init()
	if err != nil {
		log.Fatal(err)
	}
	cfg := ep.Config{Mode: ep.LowLatency, NumExperts: 2 * world.Size(), MaxTokensPerRank: 8, Hidden: 4, TopK: 2}
	g, err := ep.NewGroup[float32](world, cfg)
	if err != nil {
		log.Fatal(err)
	}
	defer g.Close()
	x := []float32{1, 0, 0, 0, 2, 0, 0, 0}          // 2 tokens of 4 elements
	topk := []int32{0, 1, 1, -1}                    // token 0 -> experts 0 and 1; token 1 -> expert 1
	weights := []float32{0.75, 0.25, 0.5, 0}        // gate weights per (token, slot)
	h, err := g.Dispatch(ep.Host(x), topk, weights) // rows land in the experts' ranks
	if err != nil {
		log.Fatal(err)
	}
	out := make([]float32, len(x))                                    // the experts would transform h.Recv() here
	if err := g.Combine(h, h.Recv(), ep.Host(out), nil); err != nil { // weighted sum back home
		log.Fatal(err)
	}
	fmt.Println(out[0], out[4])
	// Output: 1 1
}
