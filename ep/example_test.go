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
	h, err := g.Dispatch(ep.Host(x), []int32{int32(world.Rank())}, []float32{1}) // to this rank's own expert
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
func ExampleGroup_DispatchFP8() {
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
	h, err := g.DispatchFP8(ep.Host(codes), ep.Host(scales), []int32{int32(world.Rank())}, []float32{1})
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
	h, err := g.Dispatch(ep.Host([]float32{448, 3.3, 0.5}), []int32{int32(world.Rank())}, []float32{0.5})
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
