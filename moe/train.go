package moe

import (
	"fmt"
	"math"
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
	device  Device // what its ep calls run on (SetDevice)
	// betweenPasses, if set, is called between each step's forward and
	// backward (SetBetweenPasses).
	betweenPasses func(step int64)
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
	SyncUS          []float64 // [ranks]: microseconds in the data-parallel gradient sync
	SyncBytes       []int64   // [ranks]: bytes the data-parallel gradient sync sent (see SyncStats)
	// Per pair of ranks, [ranks][ranks] row-major, row i for rank i and
	// column j for its peer j (see CommStats): WaitUS, the microseconds rank
	// i waited for rank j in the step's ep calls (NaN where the engine does
	// not measure waits); PeerSent and PeerRecv, the token-row bytes rank i
	// sent to and received from rank j (the diagonal: rows a rank kept).
	WaitUS             []float64
	PeerSent, PeerRecv []int64
	// [ranks]: the copies between the host and the ep group's memory in the
	// step (CommStats.Copies): their number, bytes (both ways) and
	// microseconds. Zero with the CPU engine.
	Copies, CopyBytes []int64
	CopyUS            []float64
	Tokens            int // tokens over all ranks
	Elapsed           time.Duration
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
		adam: NewAdam(cfg.LR, l.Params()), device: Device{Backend: l.Backend()}}, nil
}

// SetDevice describes the device the trainer's ep calls run on (what a
// run's traces and checkpoints record); its Backend is always the layer's.
// Not collective.
func (tr *Trainer) SetDevice(d Device) {
	d.Backend = tr.layer.Backend()
	tr.device = d
}

// Device describes the device the trainer's ep calls run on (SetDevice).
func (tr *Trainer) Device() Device { return tr.device }

// Comm is the communicator of the trainer's ranks.
func (tr *Trainer) Comm() *mpi.Comm { return tr.comm }

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

// StepsDone is the number of steps taken, counting those before the state
// it was restored to (RestoreState).
func (tr *Trainer) StepsDone() int64 { return tr.step }

// SetBetweenPasses sets f to be called on this rank between each step's
// forward and backward, with the step's number (nil: nothing): time spent
// in it delays this rank's backward, and the other ranks wait for it in
// the backward's first ep call, as for a rank whose experts compute slowly
// (tests of the per-peer waits use it). Not collective.
func (tr *Trainer) SetBetweenPasses(f func(step int64)) { tr.betweenPasses = f }

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
	if tr.betweenPasses != nil {
		tr.betweenPasses(s)
	}
	l.ZeroGrad()
	if _, err := l.Backward(grad, tr.cfg.AuxCoef); err != nil {
		return nil, fmt.Errorf("moe: step %d: %w", s, err)
	}
	tr.adam.Step(l.Params(), l.Grads())
	tr.step = s

	cs := l.TakeCommStats()
	R := tr.comm.Size()
	mine := []float64{sse, float64(cs.Dispatch.Nanoseconds()) / 1e3, float64(cs.Combine.Nanoseconds()) / 1e3, float64(cs.BytesSent),
		float64(cs.Sync.Nanoseconds()) / 1e3, float64(cs.SyncBytes),
		float64(cs.Copies), float64(cs.CopyBytes), float64(cs.CopyTime.Nanoseconds()) / 1e3}
	const scalars = 9
	for p := 0; p < R; p++ { // per peer: wait (NaN: not measured), bytes sent and received (exact below 2^53)
		wait := math.NaN()
		if cs.PeerWait != nil {
			wait = float64(cs.PeerWait[p].Nanoseconds()) / 1e3
		}
		mine = append(mine, wait, float64(cs.PeerSent[p]), float64(cs.PeerRecv[p]))
	}
	all := make([]float64, len(mine)*R)
	if err := mpi.AllgatherSlice(tr.comm, mine, all); err != nil {
		return nil, fmt.Errorf("moe: step %d: gathering statistics: %w", s, err)
	}
	st := &StepStats{Step: s, AuxLoss: aux, TokensPerExpert: l.TokensPerExpert(), Tokens: N,
		DispatchUS: make([]float64, R), CombineUS: make([]float64, R), BytesSent: make([]int64, R),
		SyncUS: make([]float64, R), SyncBytes: make([]int64, R),
		Copies: make([]int64, R), CopyBytes: make([]int64, R), CopyUS: make([]float64, R),
		WaitUS: make([]float64, R*R), PeerSent: make([]int64, R*R), PeerRecv: make([]int64, R*R)}
	total := 0.0
	for r := 0; r < R; r++ { // in rank order: the same sum on every rank
		v := all[r*len(mine) : (r+1)*len(mine)]
		total += v[0]
		st.DispatchUS[r], st.CombineUS[r], st.BytesSent[r] = v[1], v[2], int64(v[3])
		st.SyncUS[r], st.SyncBytes[r] = v[4], int64(v[5])
		st.Copies[r], st.CopyBytes[r], st.CopyUS[r] = int64(v[6]), int64(v[7]), v[8]
		for p := 0; p < R; p++ {
			pv := v[scalars+3*p:]
			st.WaitUS[r*R+p], st.PeerSent[r*R+p], st.PeerRecv[r*R+p] = pv[0], int64(pv[1]), int64(pv[2])
		}
	}
	st.Loss = total * scale
	st.Elapsed = time.Since(start)
	return st, nil
}
