package moe

import (
	"fmt"
	"time"

	"github.com/goep/goep/mpi"
)

// Trainer trains a Layer (the student) to reproduce a Teacher on random
// tokens, with Adam. The loss of a step is
//
//	loss  = sum over ranks and tokens of |out - target|^2 / (tokens * Hidden)
//	total = loss + AuxCoef * aux
//
// (tokens counts every rank's), and Adam minimises total. Every method is
// collective.
type Trainer struct {
	cfg     TrainConfig
	comm    *mpi.Comm
	layer   *Layer
	teacher *Teacher
	adam    *Adam
	step    int64
}

// StepStats is what one training step measured. The per-rank slices are
// indexed by rank and the same on every rank.
type StepStats struct {
	Step            int64     // 1 for the first step of a run from scratch
	Loss            float64   // the task loss (mean squared error) before the update
	AuxLoss         float64   // the load-balancing loss before the update
	TokensPerExpert []int64   // [Experts]: (token, slot) pairs per expert, all ranks
	DispatchUS      []float64 // [ranks]: microseconds in the step's dispatches
	CombineUS       []float64 // [ranks]: microseconds in the step's combines
	BytesSent       []int64   // [ranks]: payload bytes sent to other ranks (see CommStats)
	Tokens          int       // tokens over all ranks
	Elapsed         time.Duration
}

// NewTrainer creates the student layer (collective), the teacher and Adam.
func NewTrainer(comm *mpi.Comm, cfg TrainConfig) (*Trainer, error) {
	if err := cfg.Validate(comm.Size()); err != nil {
		return nil, err
	}
	l, err := NewLayer(comm, cfg.Config)
	if err != nil {
		return nil, err
	}
	return &Trainer{cfg: cfg, comm: comm, layer: l, teacher: NewTeacher(cfg.Config, cfg.TeacherSeed),
		adam: NewAdam(cfg.LR, l.Params())}, nil
}

// Close releases the layer's ep group.
func (tr *Trainer) Close() error { return tr.layer.Close() }

// Config returns the trainer's config.
func (tr *Trainer) Config() TrainConfig { return tr.cfg }

// Layer is the student.
func (tr *Trainer) Layer() *Layer { return tr.layer }

// Teacher is the teacher.
func (tr *Trainer) Teacher() *Teacher { return tr.teacher }

// Adam is the optimiser and its state.
func (tr *Trainer) Adam() *Adam { return tr.adam }

// StepsDone is the number of steps taken, counting those before the
// checkpoint a run resumed from.
func (tr *Trainer) StepsDone() int64 { return tr.step }

// Step runs one training step: the batch of step StepsDone()+1 (see Batch:
// this rank's share of the step's global batch), forward, backward and an
// Adam update.
func (tr *Trainer) Step() (*StepStats, error) {
	start := time.Now()
	s := tr.step + 1
	l := tr.layer
	x, target := Batch(tr.cfg.Config, tr.teacher, tr.cfg.Seed, s, tr.comm.Rank(), tr.comm.Size())
	out, aux, err := l.Forward(x)
	if err != nil {
		return nil, fmt.Errorf("moe: step %d: %w", s, err)
	}
	N, H := l.GlobalTokens(), tr.cfg.Hidden
	scale := 1 / float64(N*H)
	grad := make([]float64, len(out))
	sse := 0.0
	for i, v := range out {
		d := v - target[i]
		sse += d * d
		grad[i] = 2 * d * scale
	}
	l.ZeroGrad()
	if _, err := l.Backward(grad, tr.cfg.AuxCoef); err != nil {
		return nil, fmt.Errorf("moe: step %d: %w", s, err)
	}
	tr.adam.Step(l.Params(), l.Grads())
	tr.step = s

	cs := l.TakeCommStats()
	mine := []float64{sse, float64(cs.Dispatch.Nanoseconds()) / 1e3, float64(cs.Combine.Nanoseconds()) / 1e3, float64(cs.BytesSent)}
	R := tr.comm.Size()
	all := make([]float64, len(mine)*R)
	if err := mpi.AllgatherSlice(tr.comm, mine, all); err != nil {
		return nil, fmt.Errorf("moe: step %d: gathering statistics: %w", s, err)
	}
	st := &StepStats{Step: s, AuxLoss: aux, TokensPerExpert: l.TokensPerExpert(), Tokens: N,
		DispatchUS: make([]float64, R), CombineUS: make([]float64, R), BytesSent: make([]int64, R)}
	total := 0.0
	for r := 0; r < R; r++ { // in rank order: the same sum on every rank
		v := all[r*len(mine) : (r+1)*len(mine)]
		total += v[0]
		st.DispatchUS[r], st.CombineUS[r], st.BytesSent[r] = v[1], v[2], int64(v[3])
	}
	st.Loss = total * scale
	st.Elapsed = time.Since(start)
	return st, nil
}
