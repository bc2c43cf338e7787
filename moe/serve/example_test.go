package serve_test

import (
	"fmt"
	"time"

	"github.com/goep/goep/moe"
	"github.com/goep/goep/moe/serve"
)

// A workload is the same every time it is drawn: request i depends on the
// seed and i alone.
func ExampleWorkload() {
	w := serve.Workload{Requests: 3, Rate: 10, PromptMin: 4, PromptMax: 8, GenMin: 2, GenMax: 5, Seed: 1}
	arrivals := w.Arrivals()
	for i := 0; i < w.Requests; i++ {
		r := w.Request(i, arrivals, 100)
		fmt.Printf("request %d: arrives at %v, %d prompt tokens, %d to generate\n", r.ID, r.Arrival.Round(time.Millisecond), len(r.Prompt), r.Gen)
	}
	// Output:
	// request 0: arrives at 10ms, 6 prompt tokens, 3 to generate
	// request 1: arrives at 122ms, 6 prompt tokens, 3 to generate
	// request 2: arrives at 179ms, 4 prompt tokens, 4 to generate
}

// Reference decodes a request alone, with every expert and no ep: what
// Serve must give for it on any number of ranks, bit for bit.
func ExampleReference() {
	cfg := serve.ModelConfig{Layers: 2, Vocab: 50, Hidden: 8, FFN: 16, Experts: 4, TopK: 2, Act: moe.SiLU, Seed: 1}
	m, err := serve.NewModel(cfg, 0, cfg.Experts, nil) // every expert
	if err != nil {
		fmt.Println(err)
		return
	}
	req := serve.Request{Prompt: []int32{3, 14, 15, 9}, Gen: 4}
	tokens, _, err := serve.Reference(m, moe.Float32, req)
	fmt.Println(len(tokens), err)
	// Output: 4 <nil>
}
