package moe_test

import (
	"fmt"
	"math"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goep/goep/ep"
	"github.com/goep/goep/internal/mpitesting"
	"github.com/goep/goep/moe"
	"github.com/goep/goep/mpi"
)

// paramsEqual reports whether two Params are bit for bit the same.
func paramsEqual(a, b *moe.Params) bool {
	return slices.Equal(a.Gate, b.Gate) && slices.Equal(a.W1, b.W1) && slices.Equal(a.B1, b.B1) &&
		slices.Equal(a.W2, b.W2) && slices.Equal(a.B2, b.B2) &&
		slices.Equal(a.SharedW1, b.SharedW1) && slices.Equal(a.SharedB1, b.SharedB1) &&
		slices.Equal(a.SharedW2, b.SharedW2) && slices.Equal(a.SharedB2, b.SharedB2)
}

// lcm is the least common multiple of a and b (both positive).
func lcm(a, b int) int {
	x, y := a, b
	for y != 0 {
		x, y = y, x%y
	}
	return a / x * b
}

// onRanks runs f on a communicator of the first n ranks of w (the others
// wait), and frees it.
func onRanks(t *testing.T, w *mpi.Comm, n int, f func(c *mpi.Comm)) {
	t.Helper()
	color := -1
	if w.Rank() < n {
		color = 0
	}
	c, err := w.Split(color, w.Rank(), fmt.Sprintf("first-%d", n))
	require.NoError(t, err)
	if c == nil {
		return
	}
	defer func() { require.NoError(t, c.Free()) }()
	f(c)
}

// gathered returns every rank's s, in rank order (collective).
func gathered(t *testing.T, c *mpi.Comm, s []float64) []float64 {
	t.Helper()
	all := make([]float64, len(s)*c.Size())
	require.NoError(t, mpi.AllgatherSlice(c, s, all))
	return all
}

// The gathered state holds every rank's experts in global order, and the
// gate, as the layers hold them, and Adam's update count; rank 0 has it.
func TestGatherStateHoldsEveryExpert(t *testing.T) {
	w := mpitesting.World
	defer mpitesting.Agree(t, w)
	cfg := smallConfig(ep.LowLatency, moe.Float32)
	tr, err := moe.NewTrainer(w, cfg)
	require.NoError(t, err)
	defer tr.Close()
	for i := 0; i < 3; i++ {
		_, err := tr.Step()
		require.NoError(t, err)
	}
	st, err := tr.GatherState()
	require.NoError(t, err)
	p := tr.Layer().Params()
	all := gathered(t, w, p.W1)
	adamV := gathered(t, w, tr.Adam().V.B2)
	if w.Rank() != 0 {
		assert.Nil(t, st, "the state is rank 0's")
		return
	}
	require.NotNil(t, st)
	assert.Equal(t, int64(3), st.AdamT)
	assert.Equal(t, p.Gate, st.Model.Gate)
	assert.Equal(t, all, st.Model.W1)
	assert.Equal(t, adamV, st.AdamV.B2)
	assert.Len(t, st.AdamV.B2, cfg.Experts*cfg.Hidden)
	assert.Nil(t, st.Sync, "allreduce keeps no per-rank state")
}

// A state gathered on a ranks is restored on b ranks, in the other mode and
// element type, with tokens per rank scaled to keep the global batch: every
// rank takes its share of the experts and of Adam's moments in global order,
// the gate and the step. The loss of the next step (before its update: the
// same parameters and tokens) is the one the first trainer computes, within
// rounding: to 1e-12 for the same mode and element type (only sums in
// another order; measured 3e-16), 1e-7 from LL to HT (float32 partial sums
// in another order; measured 1.4e-9), 1e-3 from float32 to bfloat16 on the
// wire (measured 4e-5).
func TestRestoreStateReshards(t *testing.T) {
	w := mpitesting.World
	R := w.Size()
	type pair struct{ a, b int }
	pairs := []pair{{R, R}}
	if R > 1 {
		pairs = []pair{{R, 1}, {R, R / 2}, {1, R}, {R / 2, R}}
	}
	for _, p := range pairs {
		for _, to := range []struct {
			mode  ep.Mode
			dtype moe.DType
			tol   float64
		}{{ep.LowLatency, moe.Float32, 1e-12}, {ep.HighThroughput, moe.Float32, 1e-7}, {ep.HighThroughput, moe.BFloat16, 1e-3}} {
			t.Run(fmt.Sprintf("%d-to-%d-ranks-%v-%v", p.a, p.b, to.mode, to.dtype), func(t *testing.T) {
				defer mpitesting.Agree(t, w)
				G := lcm(p.a, p.b) * ((32 + lcm(p.a, p.b) - 1) / lcm(p.a, p.b)) // tokens per step over all ranks: 32, or the least multiple of both rank counts above it
				cfg := smallConfig(ep.LowLatency, moe.Float32)
				var st *moe.State // rank 0's
				var nextLoss float64
				onRanks(t, w, p.a, func(c *mpi.Comm) {
					cw := cfg
					cw.Tokens = G / p.a
					tr, err := moe.NewTrainer(c, cw)
					require.NoError(t, err)
					defer tr.Close()
					for i := 0; i < 3; i++ {
						_, err := tr.Step()
						require.NoError(t, err)
					}
					st, err = tr.GatherState()
					require.NoError(t, err)
					next, err := tr.Step()
					require.NoError(t, err)
					nextLoss = next.Loss
				})
				got := []float64{nextLoss}
				require.NoError(t, mpi.BcastSlice(w, got, 0))
				nextLoss = got[0]
				onRanks(t, w, p.b, func(c *mpi.Comm) {
					cr := cfg
					cr.Mode, cr.DType, cr.Tokens = to.mode, to.dtype, G/p.b
					tr, err := moe.NewTrainer(c, cr)
					require.NoError(t, err)
					defer tr.Close()
					require.NoError(t, tr.RestoreState(st))
					assert.Equal(t, int64(3), tr.StepsDone())
					assert.Equal(t, int64(3), tr.Adam().T)
					// Every rank's experts, gathered in rank order, are the
					// state's in global order.
					gate := slices.Clone(tr.Layer().Params().Gate)
					var all [][]float64
					for _, s := range [][]float64{tr.Layer().Params().W1, tr.Layer().Params().B2, tr.Adam().M.W2, tr.Adam().V.B1} {
						all = append(all, gathered(t, c, s))
					}
					next, err := tr.Step()
					require.NoError(t, err)
					if c.Rank() != 0 {
						return
					}
					assert.Equal(t, st.Model.W1, all[0], "W1")
					assert.Equal(t, st.Model.B2, all[1], "B2")
					assert.Equal(t, st.AdamM.W2, all[2], "Adam's m of W2")
					assert.Equal(t, st.AdamV.B1, all[3], "Adam's v of B1")
					assert.Equal(t, st.Model.Gate, gate, "gate")
					rel := math.Abs(next.Loss-nextLoss) / nextLoss
					t.Logf("%d -> %d ranks, %v/%v -> %v/%v: step 4 loss %.9g, the first trainer's %.9g (relative difference %.2g)",
						p.a, p.b, cfg.Mode, cfg.DType, to.mode, to.dtype, next.Loss, nextLoss, rel)
					assert.LessOrEqual(t, rel, to.tol, "the loss of step 4 after the restore")
				})
			})
		}
	}
}

// The state of a grad sync with per-rank state, restored on another number
// of ranks: the ranks' error feedback is pooled, none of it lost (the
// residuals of the new ranks sum to those of the old), and under A2SGD,
// whose ranks' copies differ, every new rank starts from rank 0's copy (the
// state's model). On the same number of ranks each rank gets its own row
// back. (On one rank, only the latter.)
func TestSyncStateReshards(t *testing.T) {
	w := mpitesting.World
	R := w.Size()
	resumeOn := []int{R}
	if R > 1 {
		resumeOn = []int{R / 2, R}
	}
	for _, cfg := range syncConfigs()[1:] {
		t.Run(cfg.GradSync.String(), func(t *testing.T) {
			defer mpitesting.Agree(t, w)
			var st *moe.State // rank 0's
			func() {
				tr, err := moe.NewTrainer(w, cfg)
				require.NoError(t, err)
				defer tr.Close()
				for i := 0; i < 5; i++ {
					_, err := tr.Step()
					require.NoError(t, err)
				}
				st, err = tr.GatherState()
				require.NoError(t, err)
			}()
			if w.Rank() == 0 {
				n := cfg.DataParallelParams()
				require.NotNil(t, st.Sync)
				require.Len(t, st.Sync.Residual, R*n)
				if cfg.GradSync.Replicated() {
					assert.Nil(t, st.Sync.Model)
				} else {
					require.Len(t, st.Sync.Model, R*n)
					assert.Equal(t, st.Model.Gate, st.Sync.Model[:len(st.Model.Gate)], "the model's gate is rank 0's")
					if R > 1 {
						assert.NotEqual(t, st.Sync.Model[:n], st.Sync.Model[n:2*n], "a2sgd: ranks 0 and 1 hold different copies")
					}
				}
			}
			for _, b := range resumeOn {
				onRanks(t, w, b, func(c *mpi.Comm) {
					cr := cfg
					cr.Tokens = cfg.Tokens * R / b
					tr, err := moe.NewTrainer(c, cr)
					require.NoError(t, err)
					defer tr.Close()
					require.NoError(t, tr.RestoreState(st))
					e := tr.Layer().Syncer().Residual()
					all := gathered(t, c, e)
					gate := slices.Clone(tr.Layer().Params().Gate)
					gates := gathered(t, c, gate)
					if c.Rank() != 0 {
						return
					}
					n := len(e)
					if b == R { // each rank its own row
						assert.Equal(t, st.Sync.Residual, all, "residuals")
						if !cfg.GradSync.Replicated() {
							for r := 0; r < b; r++ {
								assert.Equal(t, st.Sync.Model[r*n:r*n+len(gate)], gates[r*len(gate):(r+1)*len(gate)], "rank %d's gate", r)
							}
						}
						return
					}
					for i := 0; i < n; i++ {
						was, now := 0.0, 0.0
						for r := 0; r < R; r++ {
							was += st.Sync.Residual[r*n+i]
						}
						for r := 0; r < b; r++ {
							now += all[r*n+i]
						}
						require.InDelta(t, was, now, 1e-12*(1+math.Abs(was)), "residual %d summed over ranks", i)
					}
					for r := 0; r < b; r++ {
						assert.Equal(t, st.Model.Gate, gates[r*len(gate):(r+1)*len(gate)], "rank %d starts from rank 0's gate", r)
					}
				})
			}
		})
	}
}

// A state that does not fit the trainer is refused on every rank, naming
// the array and both sizes, and the trainer is left as it was.
func TestRestoreStateRefusesAnotherShape(t *testing.T) {
	w := mpitesting.World
	defer mpitesting.Agree(t, w)
	cfg := syncConfigs()[2] // topk: per-rank state
	tr, err := moe.NewTrainer(w, cfg)
	require.NoError(t, err)
	defer tr.Close()
	_, err = tr.Step()
	require.NoError(t, err)
	good, err := tr.GatherState()
	require.NoError(t, err)
	before := tr.Layer().Params().Clone()
	n := cfg.DataParallelParams()
	for _, c := range []struct {
		name  string
		spoil func(st *moe.State) *moe.State
		want  string
	}{
		{"none", func(*moe.State) *moe.State { return nil }, "rank 0 has no state to restore"},
		{"fewer experts", func(st *moe.State) *moe.State {
			st.Model.W1 = st.Model.W1[:len(st.Model.W1)/2]
			return st
		}, fmt.Sprintf("the state's model w1 has %d values, this model (%d experts, hidden 16, ffn 32, shared ffn 32) has %d",
			cfg.Experts*16*32/2, cfg.Experts, cfg.Experts*16*32)},
		{"another shared expert", func(st *moe.State) *moe.State {
			st.AdamV.SharedB1 = nil
			return st
		}, "the state's Adam's v shared_b1 has 0 values"},
		{"no sync state", func(st *moe.State) *moe.State {
			st.Sync = nil
			return st
		}, "grad sync topk:60 keeps per-rank state, and the state has none"},
		{"ragged residual", func(st *moe.State) *moe.State {
			st.Sync.Residual = append(st.Sync.Residual, 0)
			return st
		}, fmt.Sprintf("the sync state's residual has %d values, not a whole number of ranks' %d", w.Size()*n+1, n)},
		{"per-rank copies", func(st *moe.State) *moe.State {
			st.Sync.Model = make([]float64, len(st.Sync.Residual))
			return st
		}, fmt.Sprintf("the sync state's per-rank model has %d values, grad sync topk:60 on %d ranks wants 0", w.Size()*n, w.Size())},
	} {
		t.Run(c.name, func(t *testing.T) {
			defer mpitesting.Agree(t, w)
			var st *moe.State
			if w.Rank() == 0 {
				cp := *good
				cp.Model, cp.AdamV = good.Model.Clone(), good.AdamV.Clone()
				cp.Sync = &moe.SyncState{Residual: slices.Clone(good.Sync.Residual)}
				st = c.spoil(&cp)
			}
			err := tr.RestoreState(st)
			require.Error(t, err)
			assert.Contains(t, err.Error(), c.want)
			assert.True(t, paramsEqual(&before, tr.Layer().Params()), "a refused state changed the parameters")
			assert.Equal(t, int64(1), tr.StepsDone())
		})
	}
}
