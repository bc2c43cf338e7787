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
	x := []float32{1, 0, 0, 0, 2, 0, 0, 0}                     // 2 tokens of 4 elements
	topk := []int32{0, 1, 1, -1}                               // token 0 -> experts 0 and 1; token 1 -> expert 1
	weights := []float32{0.75, 0.25, 0.5, 0}                   // gate weights per (token, slot)
	h, err := g.Dispatch(ep.Tokens(ep.Host(x), topk, weights)) // rows land in the experts' ranks
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

// Rows cast to FP8 e4m3 with a scale per 128 elements, exactly as an FP8
// dispatch casts them, and back: the group's largest value maps to 448,
// the others round to nearest even.
func ExampleQuantize() {
	x := []float32{7, -3.5, 1, 0.3}
	q := make([]ep.E4M3, len(x))
	scales := make([]float32, ep.ScaleGroups(len(x)))
	if err := ep.Quantize(q, scales, x, len(x), ep.WireFP8); err != nil {
		log.Fatal(err)
	}
	back := make([]float32, len(x))
	if err := ep.Dequantize(back, q, scales, len(x)); err != nil {
		log.Fatal(err)
	}
	fmt.Println(scales[0], q[0].Float32(), back)
	// Output: 0.015625 448 [7 -3.5 1 0.3125]
}

// An FP8 dispatch: the experts receive e4m3 codes and scales, and write
// their outputs (here the dequantized rows themselves) into the combine
// buffer in the element type.
func ExampleConfig_fp8() {
	world, err := mpi.Init()
	if err != nil {
		log.Fatal(err)
	}
	cfg := ep.Config{Mode: ep.LowLatency, NumExperts: world.Size(), MaxTokensPerRank: 1, Hidden: 4, TopK: 1,
		Wire: ep.WireFP8}
	g, err := ep.NewGroup[ep.BF16](world, cfg)
	if err != nil {
		log.Fatal(err)
	}
	defer g.Close()
	x := []ep.BF16{ep.BF16From(7), ep.BF16From(1), ep.BF16From(0.3), 0}
	h, err := g.Dispatch(ep.Tokens(ep.Host(x), []int32{int32(world.Rank())}, []float32{1})) // to this rank's own expert
	if err != nil {
		log.Fatal(err)
	}
	y := h.CombineBuffer().Host()[:cfg.Hidden] // the one valid row
	if err := ep.Dequantize(y, h.RecvFP8().Host()[:cfg.Hidden], h.RecvScales().Host()[:1], cfg.Hidden); err != nil {
		log.Fatal(err)
	}
	out := make([]ep.BF16, len(x))
	if err := g.Combine(h, h.CombineBuffer(), ep.Host(out), nil); err != nil {
		log.Fatal(err)
	}
	fmt.Println(out[0].Float32(), out[1].Float32(), out[2].Float32(), out[3].Float32())
	// Output: 7 1 0.3125 0
}

// Rows an FP8 GEMM produced, forwarded as they are (the scales-forward
// recipe): the caller passes e4m3 codes and its scales, the experts get
// them bit for bit, and combine is in the element type as always.
func ExampleDispatchInput_forwarded() {
	world, err := mpi.Init()
	if err != nil {
		log.Fatal(err)
	}
	const H = 4
	cfg := ep.Config{Mode: ep.LowLatency, NumExperts: world.Size(), MaxTokensPerRank: 1, Hidden: H, TopK: 1,
		Wire: ep.WireFP8Forward}
	g, err := ep.NewGroup[ep.BF16](world, cfg)
	if err != nil {
		log.Fatal(err)
	}
	defer g.Close()
	codes := make([]ep.E4M3, H) // what the caller's FP8 kernel wrote, here by Quantize
	scales := make([]float32, ep.ScaleGroups(H))
	if err := ep.Quantize(codes, scales, []float32{7, 1, 0.3, 0}, H, ep.WireFP8UE8M0); err != nil {
		log.Fatal(err)
	}
	h, err := g.Dispatch(ep.DispatchInput[ep.BF16]{Codes: ep.Host(codes), Scales: ep.Host(scales),
		TopK: []int32{int32(world.Rank())}, Weights: []float32{1}})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(h.RecvFP8().Host()[0] == codes[0], h.RecvScales().Host()[0])
	if err := g.Combine(h, h.CombineBuffer(), ep.Host(make([]ep.BF16, H)), nil); err != nil {
		log.Fatal(err)
	}
	// Output: true 0.015625
}

// A low-precision combine: the expert outputs travel as e4m3 with a scale
// per 128 elements and are summed in float32 on arrival, so a token comes
// back within the e4m3 rounding of its exact combine: with the row's
// largest value 448 the scale is 1, 448 and 0.5 are e4m3 values, and 3.3
// rounds to 3.25.
func ExampleConfig_fp8Combine() {
	world, err := mpi.Init()
	if err != nil {
		log.Fatal(err)
	}
	cfg := ep.Config{Mode: ep.LowLatency, NumExperts: world.Size(), MaxTokensPerRank: 1, Hidden: 3, TopK: 1,
		CombineWire: ep.WireFP8}
	g, err := ep.NewGroup[float32](world, cfg)
	if err != nil {
		log.Fatal(err)
	}
	defer g.Close()
	h, err := g.Dispatch(ep.Tokens(ep.Host([]float32{448, 3.3, 0.5}), []int32{int32(world.Rank())}, []float32{0.5}))
	if err != nil {
		log.Fatal(err)
	}
	out := make([]float32, 3)
	if err := g.Combine(h, h.Recv(), ep.Host(out), nil); err != nil { // identity experts
		log.Fatal(err)
	}
	fmt.Println(out)
	// Output: [224 1.625 0.25]
}

// HighThroughput's expert-major layout: the rows arrive grouped by local
// expert, each zone padded to the alignment with zero rows, as a grouped
// GEMM takes them; the experts apply the gate weights and Combine sums.
func ExampleConfig_expertMajor() {
	world, err := mpi.Init()
	if err != nil {
		log.Fatal(err)
	}
	cfg := ep.Config{Mode: ep.HighThroughput, NumExperts: 2 * world.Size(), MaxTokensPerRank: 2, Hidden: 2, TopK: 2,
		Layout: ep.LayoutExpertMajor, ExpertAlignment: 2}
	g, err := ep.NewGroup[float32](world, cfg)
	if err != nil {
		log.Fatal(err)
	}
	defer g.Close()
	e0 := int32(world.Rank() * 2)            // this rank's first expert
	x := []float32{1, 2, 3, 4}               // 2 tokens of 2 elements
	topk := []int32{e0, e0 + 1, e0 + 1, -1}  // token 0 -> both experts here; token 1 -> the second
	weights := []float32{0.75, 0.25, 0.5, 0} // gate weights per (token, slot)
	h, err := g.Dispatch(ep.Tokens(ep.Host(x), topk, weights))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(h.ExpertOffsets(), h.ExpertCounts(), h.RecvWeights().Host())
	rows, w, y := h.Recv().Host(), h.RecvWeights().Host(), h.CombineBuffer().Host()
	for r := range w { // the experts: y = weight * x (padding rows have weight 0)
		for c := 0; c < cfg.Hidden; c++ {
			y[r*cfg.Hidden+c] = w[r] * rows[r*cfg.Hidden+c]
		}
	}
	out := make([]float32, len(x))
	if err := g.Combine(h, h.CombineBuffer(), ep.Host(out), nil); err != nil {
		log.Fatal(err)
	}
	fmt.Println(out)
	// Output:
	// [0 2 4] [1 2] [0.75 0 0.25 0.5]
	// [1 2 1.5 2]
}

// LowLatency's rank-major layout: a token arrives once per rank, in its
// source's block, with its top-k ids (here global) and weights.
func ExampleConfig_rankMajor() {
	world, err := mpi.Init()
	if err != nil {
		log.Fatal(err)
	}
	cfg := ep.Config{Mode: ep.LowLatency, NumExperts: 2 * world.Size(), MaxTokensPerRank: 1, Hidden: 2, TopK: 2,
		Layout: ep.LayoutRankMajor, RecvIDs: ep.GlobalExpertIDs}
	g, err := ep.NewGroup[float32](world, cfg)
	if err != nil {
		log.Fatal(err)
	}
	defer g.Close()
	e0 := int32(world.Rank() * 2)
	h, err := g.Dispatch(ep.Tokens(ep.Host([]float32{1, 2}), []int32{e0 + 1, e0}, []float32{0.25, 0.75}))
	if err != nil {
		log.Fatal(err)
	}
	me := world.Rank() // this rank's block holds its own token
	ids := h.RecvTopK().Host()[2*me : 2*me+2]
	fmt.Println(h.SourceCounts()[me], ids[0] == e0+1, ids[1] == e0, h.RecvWeights().Host()[2*me:2*me+2])
	// Output: 1 true true [0.25 0.75]
}

// The memory a configuration needs, area by area, before anything is
// allocated: NCCL EP's ncclEpHandleMemSize, for a job not yet launched.
func ExampleBufferPlan() {
	cfg := ep.Config{Mode: ep.HighThroughput, NumExperts: 64, MaxTokensPerRank: 4096, Hidden: 7168, TopK: 8,
		Layout: ep.LayoutExpertMajor, ExpertAlignment: 128, MaxRecvTokensPerRank: 40000}
	f, err := ep.BufferPlan(cfg, ep.BFloat16, 8, 2) // 8 ranks on 2 nodes
	if err != nil {
		log.Fatal(err)
	}
	for _, a := range f.Layout {
		if a.Memory == "shared" && a.Name == "HT received rows (expert-major zones)" {
			fmt.Printf("%s: %d rows of 14336 bytes\n", a.Name, a.Bytes/14336)
		}
	}
	fmt.Println(f.RanksPerNode, f.WindowPerRank > 0)
	// Output:
	// HT received rows (expert-major zones): 40000 rows of 14336 bytes
	// 4 true
}

// A backend by name, with options where it takes any (the GPU engine's
// are linked by importing github.com/goep/goep/ep/backends).
func ExampleOpenBackend() {
	b, err := ep.OpenBackend("alltoallv")
	if err != nil {
		log.Fatal(err)
	}
	cfg := ep.Config{Mode: ep.LowLatency, NumExperts: 8, MaxTokensPerRank: 8, Hidden: 4, TopK: 2, Backend: b}
	fmt.Println(cfg.Backend.Name())
	_, err = ep.OpenBackend("cpu,threads=4")
	fmt.Println(err)
	// Output:
	// alltoallv
	// ep: backend "cpu,threads=4": cpu does not take option(s) threads: it takes no options
}
