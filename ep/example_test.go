package ep_test

import (
	"fmt"

	"github.com/goep/goep/ep"
	"github.com/goep/goep/mpi"
)

// A dispatch/combine round with identity experts: every token comes back
// multiplied by the sum of its top-k weights.
func ExampleGroup_Dispatch() {
	world, _ := mpi.Init() // under mpirun, every rank runs this
	cfg := ep.Config{Mode: ep.LowLatency, NumExperts: 2 * world.Size(), MaxTokensPerRank: 8, Hidden: 4, TopK: 2}
	g, err := ep.NewGroup[float32](world, cfg)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer g.Close()
	T := 3
	x := make([]float32, T*cfg.Hidden)
	topk := make([]int32, T*cfg.TopK)
	weights := make([]float32, T*cfg.TopK)
	for t := 0; t < T; t++ {
		x[t*cfg.Hidden] = float32(t + 1)
		topk[t*2], topk[t*2+1] = int32(t%cfg.NumExperts), int32((t+1)%cfg.NumExperts)
		weights[t*2], weights[t*2+1] = 0.75, 0.25
	}
	h, err := g.Dispatch(x, topk, weights)
	if err != nil {
		fmt.Println(err)
		return
	}
	// The experts would run on h.Recv() here; identity experts combine it as is.
	out := make([]float32, T*cfg.Hidden)
	if err := g.Combine(h, h.Recv(), out, nil); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(out[0], out[cfg.Hidden], out[2*cfg.Hidden])
	// Output: 1 2 3
}
