package moe

import (
	"fmt"
	"time"

	"github.com/goep/goep/ep"
)

// DType is the element type that token rows have on the wire (in ep's
// buffers). Parameters and expert compute are float64 whatever it is. Its
// zero value is invalid, so that a Config must choose.
type DType int

// Wire element types.
const (
	Float32  DType = iota + 1 // float32 rows: ep.Group[float32]
	BFloat16                  // bfloat16 rows: ep.Group[ep.BF16]
	// FP8 is bfloat16 rows dispatched in FP8 e4m3 with one scale per 128
	// elements (ep.Group[ep.BF16] with Wire ep.WireFP8), in the forward
	// dispatch and the backward's cached one; combines stay bfloat16.
	FP8
)

func (d DType) String() string {
	switch d {
	case Float32:
		return "f32"
	case BFloat16:
		return "bf16"
	case FP8:
		return "fp8"
	}
	return fmt.Sprintf("DType(%d)", int(d))
}

// ParseDType reads "f32", "bf16" or "fp8".
func ParseDType(s string) (DType, error) {
	switch s {
	case "f32", "float32":
		return Float32, nil
	case "bf16", "bfloat16":
		return BFloat16, nil
	case "fp8":
		return FP8, nil
	}
	return 0, fmt.Errorf("moe: unknown dtype %q (want f32, bf16 or fp8)", s)
}

// Activation is the nonlinearity between the two layers of an expert. Its
// zero value is invalid.
type Activation int

// Activations.
const (
	SiLU Activation = iota + 1 // x * sigmoid(x)
	GELU                       // x * Phi(x), the exact (erf) form
)

func (a Activation) String() string {
	switch a {
	case SiLU:
		return "silu"
	case GELU:
		return "gelu"
	}
	return fmt.Sprintf("Activation(%d)", int(a))
}

// ParseActivation reads "silu" or "gelu".
func ParseActivation(s string) (Activation, error) {
	switch s {
	case "silu", "SiLU":
		return SiLU, nil
	case "gelu", "GELU":
		return GELU, nil
	}
	return 0, fmt.Errorf("moe: unknown activation %q (want silu or gelu)", s)
}

// Config describes a Layer. Every rank must pass the same Config.
type Config struct {
	Mode    ep.Mode    // ep.LowLatency or ep.HighThroughput
	DType   DType      // element type on the wire
	Experts int        // experts in all; a multiple of the number of ranks
	TopK    int        // experts per token, 1..Experts
	Hidden  int        // model width: the layer maps [tokens][Hidden] to [tokens][Hidden]
	FFN     int        // width of each expert's inner layer
	Tokens  int        // most tokens one rank passes to Forward at once
	Act     Activation // SiLU or GELU
	Seed    uint64     // initial parameters (see Init)
	// SharedFFN is the width of the shared expert's inner layer: a dense
	// FFN (Hidden -> SharedFFN -> Hidden, activation Act) that every token
	// passes through, replicated on every rank, whose output is added to the
	// routed experts'. 0: none.
	SharedFFN int
	// GradSync is how the gradient of the data-parallel parameters (the gate
	// and the shared expert) is summed over the ranks; the zero value is the
	// exact allreduce.
	GradSync GradSync
	// Timeout bounds every wait for a peer inside ep; 0 means ep's default.
	Timeout time.Duration
	// Backend moves the token rows (ep.Config.Backend): nil for ep's CPU
	// engine, whose tensors are host memory; a GPU backend (package epgpu)
	// keeps them in its device's memory, and every step copies the tokens
	// in and the received rows and results out (CommStats.Copies). It
	// places the work and is no part of the model: a run may resume on
	// another backend.
	Backend ep.Backend
}

// BackendName is the name of c.Backend: "cpu" for nil, ep's CPU engine.
func (c Config) BackendName() string {
	if c.Backend == nil {
		return ep.CPU.Name()
	}
	return c.Backend.Name()
}

// Validate checks the config for a job of size ranks.
func (c Config) Validate(size int) error {
	bad := func(format string, a ...any) error { return fmt.Errorf("moe: invalid config: "+format, a...) }
	switch {
	case c.Mode != ep.LowLatency && c.Mode != ep.HighThroughput:
		return bad("mode %v: choose ll or ht", c.Mode)
	case c.DType != Float32 && c.DType != BFloat16 && c.DType != FP8:
		return bad("dtype %v: choose f32, bf16 or fp8", c.DType)
	case c.Act != SiLU && c.Act != GELU:
		return bad("activation %v: choose silu or gelu", c.Act)
	case c.Experts <= 0:
		return bad("experts = %d, want > 0", c.Experts)
	case size > 0 && c.Experts%size != 0:
		return bad("experts = %d is not a multiple of the %d ranks", c.Experts, size)
	case c.TopK <= 0 || c.TopK > c.Experts || c.TopK > ep.MaxTopK:
		return bad("topk = %d, want 1..%d", c.TopK, min(c.Experts, ep.MaxTopK))
	case c.Hidden <= 0:
		return bad("hidden = %d, want > 0", c.Hidden)
	case c.FFN <= 0:
		return bad("ffn = %d, want > 0", c.FFN)
	case c.Tokens <= 0:
		return bad("tokens = %d, want > 0", c.Tokens)
	case c.SharedFFN < 0:
		return bad("shared ffn = %d, want >= 0 (0: no shared expert)", c.SharedFFN)
	case c.Timeout < 0:
		return bad("timeout = %v is negative", c.Timeout)
	case c.DType == FP8 && c.Backend != nil && !ep.Supports(c.Backend, ep.FeatureFP8Wire):
		return bad("dtype fp8: the %s backend has no FP8 dispatch (ep.FeatureFP8Wire) yet; choose f32 or bf16", c.Backend.Name())
	}
	if err := c.GradSync.validate(c.DataParallelParams()); err != nil {
		return bad("%v", err)
	}
	return nil
}

// DataParallelParams is the number of parameters every rank holds a copy
// of: the gate's and the shared expert's.
func (c Config) DataParallelParams() int {
	n := c.Hidden * c.Experts
	if c.SharedFFN > 0 {
		n += 2*c.Hidden*c.SharedFFN + c.SharedFFN + c.Hidden
	}
	return n
}

// TrainConfig describes a training run of the synthetic task (see Trainer).
type TrainConfig struct {
	Config
	TeacherSeed uint64  // the teacher MoE's parameters
	LR          float64 // Adam's learning rate
	AuxCoef     float64 // weight of the load-balancing loss in the total loss
}

// Validate checks the config for a job of size ranks.
func (c TrainConfig) Validate(size int) error {
	if err := c.Config.Validate(size); err != nil {
		return err
	}
	if !(c.LR > 0) || c.LR > 1 {
		return fmt.Errorf("moe: invalid config: lr = %v, want 0 < lr <= 1", c.LR)
	}
	if !(c.AuxCoef >= 0) || c.AuxCoef > 1e3 {
		return fmt.Errorf("moe: invalid config: aux coefficient = %v, want 0 <= aux <= 1000", c.AuxCoef)
	}
	return nil
}
