package serve

import (
	"fmt"
	"math"
	"math/rand/v2"
	"time"

	"github.com/goep/goep/ep"
	"github.com/goep/goep/moe"
	"github.com/goep/goep/moe/runs"
)

// ModelConfig is the decoder's shape. Every rank must pass the same one.
type ModelConfig struct {
	Layers    int            // decoder layers, each attention then a MoE layer
	Vocab     int            // token ids 0..Vocab-1; the embedding is tied to the output
	Hidden    int            // model width
	FFN       int            // each expert's inner width
	SharedFFN int            // the shared expert's inner width (0: none)
	Experts   int            // routed experts per layer, a multiple of the ranks
	TopK      int            // experts per token
	Act       moe.Activation // the experts' activation
	Seed      uint64         // every parameter not taken from a checkpoint
}

// layer is the MoE layer's configuration for package moe's building blocks.
func (c ModelConfig) layer() moe.Config {
	return moe.Config{Mode: ep.LowLatency, DType: moe.Float32, Experts: c.Experts, TopK: c.TopK, Hidden: c.Hidden,
		FFN: c.FFN, Tokens: 1, Act: c.Act, SharedFFN: c.SharedFFN}
}

// Validate checks the shape for a job of size ranks.
func (c ModelConfig) Validate(size int) error {
	bad := func(format string, a ...any) error { return fmt.Errorf("serve: invalid model: "+format, a...) }
	switch {
	case c.Layers <= 0:
		return bad("layers = %d, want > 0", c.Layers)
	case c.Vocab < 2:
		return bad("vocab = %d, want >= 2", c.Vocab)
	case c.Hidden <= 0:
		return bad("hidden = %d, want > 0", c.Hidden)
	case c.FFN <= 0:
		return bad("ffn = %d, want > 0", c.FFN)
	case c.SharedFFN < 0:
		return bad("shared ffn = %d, want >= 0 (0: none)", c.SharedFFN)
	case c.Experts <= 0:
		return bad("experts = %d, want > 0", c.Experts)
	case size > 0 && c.Experts%size != 0:
		return bad("experts = %d is not a multiple of the %d ranks", c.Experts, size)
	case c.TopK <= 0 || c.TopK > c.Experts || c.TopK > ep.MaxTopK:
		return bad("topk = %d, want 1..%d", c.TopK, min(c.Experts, ep.MaxTopK))
	case c.Act != moe.SiLU && c.Act != moe.GELU:
		return bad("activation %v: choose silu or gelu", c.Act)
	}
	return nil
}

// Workload is the stream of requests: Requests of them, arriving as a
// Poisson process of Rate requests per second (0: all at once), each with a
// prompt of PromptMin..PromptMax random tokens and GenMin..GenMax tokens to
// generate, drawn from Seed. Request i depends on (Seed, i) alone and its
// arrival on Seed and the rate, so every run of a workload serves the same
// requests.
type Workload struct {
	Requests             int
	Rate                 float64
	PromptMin, PromptMax int
	GenMin, GenMax       int
	Seed                 uint64
}

// Validate checks the workload.
func (w Workload) Validate() error {
	bad := func(format string, a ...any) error { return fmt.Errorf("serve: invalid workload: "+format, a...) }
	switch {
	case w.Requests <= 0:
		return bad("requests = %d, want > 0", w.Requests)
	case !(w.Rate >= 0) || math.IsInf(w.Rate, 1):
		return bad("rate = %v requests/s, want >= 0 (0: all at once)", w.Rate)
	case w.PromptMin <= 0 || w.PromptMax < w.PromptMin:
		return bad("prompt lengths %d..%d, want 1 <= min <= max", w.PromptMin, w.PromptMax)
	case w.GenMin <= 0 || w.GenMax < w.GenMin:
		return bad("generated lengths %d..%d, want 1 <= min <= max", w.GenMin, w.GenMax)
	}
	return nil
}

// Request is one request of a workload.
type Request struct {
	ID      int
	Arrival time.Duration // after the start of serving
	Prompt  []int32       // token ids
	Gen     int           // tokens to generate (greedy; there is no end token)
}

// Random streams, mixed with the seeds.
const (
	streamRequest = 0x7265710000000000 // "req" + request id
	streamArrival = 0x6172720000000000 // "arr"
	streamEmbed   = 0x656d620000000000 // "emb"
	streamAttn    = 0x6174740000000000 // "att" + layer
	streamMoE     = 0x6d6f650000000000 // "moe" + layer
)

// mix is the SplitMix64 finaliser.
func mix(z uint64) uint64 {
	z += 0x9e3779b97f4a7c15
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

func newRand(seed, stream, sub uint64) *rand.Rand {
	return rand.New(rand.NewPCG(mix(seed^mix(stream)), mix(sub^mix(stream+1))))
}

// Arrivals are the requests' arrival times: exponential gaps of mean 1/Rate
// from one stream, the first request at its first gap; all zero at rate 0.
func (w Workload) Arrivals() []time.Duration {
	out := make([]time.Duration, w.Requests)
	if w.Rate == 0 {
		return out
	}
	r := newRand(w.Seed, streamArrival, 0)
	t := 0.0
	for i := range out {
		t += r.ExpFloat64() / w.Rate
		out[i] = time.Duration(t * float64(time.Second))
	}
	return out
}

// Request returns request i (its arrival from arrivals, Arrivals' result),
// with token ids below vocab.
func (w Workload) Request(i int, arrivals []time.Duration, vocab int) Request {
	r := newRand(w.Seed, streamRequest, uint64(i))
	p := w.PromptMin + r.IntN(w.PromptMax-w.PromptMin+1)
	req := Request{ID: i, Arrival: arrivals[i], Prompt: make([]int32, p), Gen: w.GenMin + r.IntN(w.GenMax-w.GenMin+1)}
	for j := range req.Prompt {
		req.Prompt[j] = int32(r.IntN(vocab))
	}
	return req
}

// Config is how the ranks serve. Every rank must pass the same one.
type Config struct {
	Model ModelConfig
	// DType is the element type of the rows on the wire: moe.Float32 or
	// moe.BFloat16.
	DType moe.DType
	// Batch is the most requests one rank holds at once, and so the most
	// tokens it decodes in a step (the LL group's MaxTokensPerRank).
	Batch int
	// Prefill is the mode prompts go through: ep.LowLatency (in chunks of
	// at most PrefillTokens per rank and step through the decode's LL group)
	// or ep.HighThroughput (an HT group of PrefillTokens per rank, one per
	// micro-batch).
	Prefill ep.Mode
	// PrefillTokens is the most prompt tokens one rank runs in a prefill
	// step.
	PrefillTokens int
	// Overlap runs each step as two micro-batches, one's dispatch or combine
	// in flight while the other computes (DeepEP's two-batch overlap); off,
	// the step's tokens go as one batch, call after call.
	Overlap bool
	// MaskStalled sets ep's MaskStalledRanks on the LL group: a rank that
	// does not arrive within Timeout is masked and the others serve on
	// without it; it rejoins (SetMask) when it comes back. Needs Prefill
	// ep.LowLatency.
	MaskStalled bool
	// Timeout bounds every ep wait for a peer (and is how long a stalled
	// rank is waited for before it is masked).
	Timeout time.Duration
	// ControlTimeout bounds how long a rank waits for rank 0's next
	// instruction, and how long rank 0 waits for a masked rank that holds
	// requests to come back.
	ControlTimeout time.Duration
	// Backend is the ep backend both groups run on (nil: ep's default, the
	// CPU engine). Its tensors must be host memory: the serving loop hands
	// ep its Go slices (a backend on device memory is refused at start).
	Backend ep.Backend
	// Checkpoint, when set, is a moe-train checkpoint whose MoE layer (gate,
	// experts, shared expert) every decoder layer uses; the model's Hidden,
	// FFN, SharedFFN, Experts, TopK and Act must be the checkpoint's
	// (ModelFromCheckpoint gives them).
	Checkpoint string
}

// llTokens is the LL group's MaxTokensPerRank.
func (c Config) llTokens() int {
	if c.Prefill == ep.LowLatency {
		return max(c.Batch, c.PrefillTokens)
	}
	return c.Batch
}

// Validate checks the configuration for a job of size ranks.
func (c Config) Validate(size int) error {
	if err := c.Model.Validate(size); err != nil {
		return err
	}
	bad := func(format string, a ...any) error { return fmt.Errorf("serve: invalid config: "+format, a...) }
	switch {
	case c.DType != moe.Float32 && c.DType != moe.BFloat16:
		return bad("dtype %v: choose f32 or bf16", c.DType)
	case c.Batch <= 0:
		return bad("batch = %d, want > 0", c.Batch)
	case c.Prefill != ep.LowLatency && c.Prefill != ep.HighThroughput:
		return bad("prefill mode %v: choose ll or ht", c.Prefill)
	case c.PrefillTokens <= 0:
		return bad("prefill tokens = %d, want > 0", c.PrefillTokens)
	case c.MaskStalled && c.Prefill != ep.LowLatency:
		return bad("masking stalled ranks needs prefill through LL: ep masks in LowLatency groups only")
	case c.Timeout <= 0:
		return bad("timeout = %v, want > 0", c.Timeout)
	case c.ControlTimeout <= 0:
		return bad("control timeout = %v, want > 0", c.ControlTimeout)
	}
	return nil
}

// ModelFromCheckpoint returns m with the MoE layer's shape (Hidden, FFN,
// SharedFFN, Experts, TopK, Act) of the moe-train checkpoint at path.
func ModelFromCheckpoint(m ModelConfig, path string) (ModelConfig, error) {
	info, err := runs.ReadCheckpointInfo(path)
	if err != nil {
		return m, err
	}
	c := info.Config
	m.Hidden, m.FFN, m.SharedFFN, m.Experts, m.TopK, m.Act = c.Hidden, c.FFN, c.SharedFFN, c.Experts, c.TopK, c.Act
	return m, nil
}
