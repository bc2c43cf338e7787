package epgpu_test

import (
	"fmt"
	"log"

	"github.com/goep/goep/ep"
	"github.com/goep/goep/ep/epgpu"
	"github.com/goep/goep/mpi"
)

// A dispatch/combine round on the emulated device, on every rank under
// mpirun: the tokens live in device memory, moved in and out by
// ep.Upload and ep.Download. epgpu.CUDA runs the same code on a GPU.
func ExampleEmulated() {
	world, err := mpi.Init()
	if err != nil {
		log.Fatal(err)
	}
	cfg := ep.Config{Mode: ep.LowLatency, NumExperts: 2 * world.Size(), MaxTokensPerRank: 8, Hidden: 4, TopK: 2,
		Backend: epgpu.Emulated}
	g, err := ep.NewGroup[float32](world, cfg)
	if err != nil {
		log.Fatal(err)
	}
	defer g.Close()
	x, err := ep.Alloc[float32](g.Memory(), 8) // 2 tokens of 4 elements, on the device
	if err != nil {
		log.Fatal(err)
	}
	defer ep.Free(x)
	if err := ep.Upload(x, []float32{1, 0, 0, 0, 2, 0, 0, 0}); err != nil {
		log.Fatal(err)
	}
	topk := []int32{0, 1, 1, -1}             // token 0 -> experts 0 and 1; token 1 -> expert 1
	weights := []float32{0.75, 0.25, 0.5, 0} // on the host
	h, err := g.Dispatch(ep.Tokens(x, topk, weights))
	if err != nil {
		log.Fatal(err)
	}
	out, err := ep.Alloc[float32](g.Memory(), 8)
	if err != nil {
		log.Fatal(err)
	}
	defer ep.Free(out)
	if err := g.Combine(h, h.Recv(), out, nil); err != nil { // identity experts
		log.Fatal(err)
	}
	host := make([]float32, 8)
	if err := ep.Download(host, out); err != nil {
		log.Fatal(err)
	}
	fmt.Println(g.Memory(), host[0], host[4])
	// Output: emulated:0 1 1
}
