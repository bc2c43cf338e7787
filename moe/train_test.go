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

// testExperts is the experts of the tests' layers: 8, or the least
// multiple of the ranks above it (10 on the 5 ranks of nodes of unequal
// size, 2+2+1).
func testExperts() int {
	R := mpitesting.World.Size()
	return max(8, R) + (R-max(8, R)%R)%R
}

// smallConfig is the tiny training setup of the tests.
func smallConfig(mode ep.Mode, dtype moe.DType) moe.TrainConfig {
	return moe.TrainConfig{
		Config: moe.Config{Mode: mode, DType: dtype, Experts: testExperts(), TopK: 2, Hidden: 16, FFN: 32, Tokens: 32,
			Act: moe.SiLU, Seed: 1},
		TeacherSeed: 2, LR: 1e-2, AuxCoef: 0.01,
	}
}

// With a zero gate every probability is 1/E and every token picks experts
// 0..K-1 (ties go to the lower index), so f_e = 1/K for those, and
// aux = E * sum_e f_e * P_e = E * K * (1/K) * (1/E) = 1.
func TestAuxLossUniformRouter(t *testing.T) {
	w := mpitesting.World
	defer mpitesting.Agree(t, w)
	cfg := smallConfig(ep.LowLatency, moe.Float32).Config
	l, err := moe.NewLayer(w, cfg)
	require.NoError(t, err)
	defer l.Close()
	clear(l.Params().Gate)
	_, aux, err := l.Forward(randNormal(3, uint64(w.Rank()), 10*cfg.Hidden, 1))
	require.NoError(t, err)
	assert.InDelta(t, 1.0, aux, 1e-12)
	counts := l.TokensPerExpert()
	want := make([]int64, cfg.Experts) // experts 0 and 1 (top-2), 10 tokens per rank
	want[0], want[1] = int64(10*w.Size()), int64(10*w.Size())
	assert.Equal(t, want, counts)
}

// lossFallSteps and lossFallFactor are the claim of TestLossFalls: within
// this many steps the loss falls by at least this factor (the mean of the
// last 20 steps' losses against the first step's).
const (
	lossFallSteps  = 150
	lossFallFactor = 3.0
)

// The student learns the teacher: in both modes and with both wire types,
// the loss falls by lossFallFactor within lossFallSteps steps. Every rank
// ends with the same gate (it is replicated and updated with the same
// all-reduced gradient).
func TestLossFalls(t *testing.T) {
	w := mpitesting.World
	for _, mode := range []ep.Mode{ep.LowLatency, ep.HighThroughput} {
		for _, dtype := range []moe.DType{moe.Float32, moe.BFloat16, moe.FP8} {
			t.Run(fmt.Sprintf("%v-%v", mode, dtype), func(t *testing.T) {
				defer mpitesting.Agree(t, w)
				tr, err := moe.NewTrainer(w, smallConfig(mode, dtype))
				require.NoError(t, err)
				defer tr.Close()
				var losses []float64
				for i := 0; i < lossFallSteps; i++ {
					st, err := tr.Step()
					require.NoError(t, err)
					require.False(t, math.IsNaN(st.Loss), "step %d: loss is NaN", st.Step)
					losses = append(losses, st.Loss)
				}
				tail := 0.0
				for _, l := range losses[len(losses)-20:] {
					tail += l / 20
				}
				if w.Rank() == 0 {
					t.Logf("%d ranks: loss %.4f at step 1, %.4f over steps %d-%d: %.1fx lower",
						w.Size(), losses[0], tail, lossFallSteps-19, lossFallSteps, losses[0]/tail)
				}
				assert.Less(t, tail*lossFallFactor, losses[0], "the loss must fall %gx within %d steps", lossFallFactor, lossFallSteps)

				gate := tr.Layer().Params().Gate
				all := make([]float64, len(gate)*w.Size())
				require.NoError(t, mpi.AllgatherSlice(w, gate, all))
				for r := 0; r < w.Size(); r++ {
					require.True(t, slices.Equal(gate, all[r*len(gate):(r+1)*len(gate)]), "rank %d's gate differs from rank %d's", r, w.Rank())
				}
			})
		}
	}
}

// CommStats.BytesSent counts, over all ranks, four rows per remote (token,
// expert) pair in LL mode and per remote (token, rank) pair in HT mode: the
// token side sends it in the forward dispatch and the backward's cached
// dispatch (in FP8: codes and a float32 scale per 128 elements), the expert
// side returns it in both combines.
func TestBytesSent(t *testing.T) {
	w := mpitesting.World
	R, me := w.Size(), w.Rank()
	for _, mode := range []ep.Mode{ep.LowLatency, ep.HighThroughput} {
		for _, dtype := range []moe.DType{moe.Float32, moe.BFloat16, moe.FP8} {
			t.Run(fmt.Sprintf("%v-%v", mode, dtype), func(t *testing.T) {
				defer mpitesting.Agree(t, w)
				cfg := smallConfig(mode, dtype).Config
				l, err := moe.NewLayer(w, cfg)
				require.NoError(t, err)
				defer l.Close()
				x := randNormal(4, uint64(me), cfg.Tokens*cfg.Hidden, 1)
				out, _, err := l.Forward(x)
				require.NoError(t, err)
				_, err = l.Backward(out, 0)
				require.NoError(t, err)
				st := l.TakeCommStats()
				assert.Positive(t, st.Dispatch)
				assert.Positive(t, st.Combine)
				L, K := cfg.Experts/R, cfg.TopK
				remote := 0
				topk := l.TopK()
				for tok := 0; tok < cfg.Tokens; tok++ {
					ranks := map[int]bool{}
					for _, e := range topk[tok*K : (tok+1)*K] {
						if d := int(e) / L; d != me {
							if mode == ep.LowLatency {
								remote++
							}
							ranks[d] = true
						}
					}
					if mode == ep.HighThroughput {
						remote += len(ranks)
					}
				}
				H := int64(cfg.Hidden)
				row := map[moe.DType][2]int64{ // bytes of a dispatched row, of a combined row
					moe.Float32: {4 * H, 4 * H}, moe.BFloat16: {2 * H, 2 * H}, moe.FP8: {H + 4*((H+127)/128), 2 * H}}[dtype]
				var sums [2]int64
				require.NoError(t, mpi.Allreduce(w, mpi.OpSum, []int64{st.BytesSent, int64(remote)}, sums[:]))
				assert.Equal(t, 2*(row[0]+row[1])*sums[1], sums[0])
				assert.Zero(t, l.TakeCommStats().BytesSent, "TakeCommStats resets")
			})
		}
	}
}

// syncConfigs are the three grad syncs on the small setup with a shared
// expert of width 32 (1200 data-parallel parameters; Top-K sends 5%).
func syncConfigs() []moe.TrainConfig {
	var out []moe.TrainConfig
	for _, gs := range []moe.GradSync{{}, {Method: moe.SyncA2SGD}, {Method: moe.SyncTopK, K: 60}} {
		c := smallConfig(ep.LowLatency, moe.Float32)
		c.SharedFFN, c.GradSync = 32, gs
		out = append(out, c)
	}
	return out
}

// trainTail trains cfg for lossFallSteps steps and returns the first loss
// and the mean of the last 20, and the trainer (to close). With frozen, the
// data-parallel parameters are put back to their initial values after every
// step: only the routed experts learn.
func trainTail(t *testing.T, w *mpi.Comm, cfg moe.TrainConfig, frozen bool) (first, tail float64, tr *moe.Trainer) {
	tr, err := moe.NewTrainer(w, cfg)
	require.NoError(t, err)
	p := tr.Layer().Params()
	init := p.Clone()
	var losses []float64
	for i := 0; i < lossFallSteps; i++ {
		st, err := tr.Step()
		require.NoError(t, err)
		require.False(t, math.IsNaN(st.Loss), "step %d: loss is NaN", st.Step)
		losses = append(losses, st.Loss)
		if frozen {
			for j, s := range [][]float64{p.Gate, p.SharedW1, p.SharedB1, p.SharedW2, p.SharedB2} {
				copy(s, [][]float64{init.Gate, init.SharedW1, init.SharedB1, init.SharedW2, init.SharedB2}[j])
			}
		}
	}
	for _, l := range losses[len(losses)-20:] {
		tail += l / 20
	}
	return losses[0], tail, tr
}

// With a shared expert, every grad sync trains the student: the loss falls
// by lossFallFactor within lossFallSteps steps, and ends at least 10% below
// the loss of a run that trains only the routed experts (the gate and the
// shared expert frozen): the sync does train the data-parallel parameters.
// Allreduce and Top-K keep them identical on every rank (every rank applies
// the same sum); A2SGD's ranks apply their own signs, and their copies drift
// apart (logged, not asserted).
func TestGradSyncLossFalls(t *testing.T) {
	w := mpitesting.World
	_, frozenTail, tr := trainTail(t, w, syncConfigs()[0], true)
	require.NoError(t, tr.Close())
	for _, cfg := range syncConfigs() {
		t.Run(cfg.GradSync.String(), func(t *testing.T) {
			defer mpitesting.Agree(t, w)
			first, tail, tr := trainTail(t, w, cfg, false)
			defer tr.Close()
			p := tr.Layer().Params()
			dp := slices.Concat(p.Gate, p.SharedW1, p.SharedB1, p.SharedW2, p.SharedB2)
			all := make([]float64, len(dp)*w.Size())
			require.NoError(t, mpi.AllgatherSlice(w, dp, all))
			spread := 0.0 // the largest difference between two ranks' copies
			for r := 0; r < w.Size(); r++ {
				for i, v := range all[r*len(dp) : (r+1)*len(dp)] {
					spread = max(spread, math.Abs(v-dp[i]))
				}
			}
			if w.Rank() == 0 {
				t.Logf("%d ranks: loss %.4f at step 1, %.4f over steps %d-%d: %.1fx lower (%.4f with the gate and shared expert frozen); copies differ by up to %.2g",
					w.Size(), first, tail, lossFallSteps-19, lossFallSteps, first/tail, frozenTail, spread)
			}
			assert.Less(t, tail*lossFallFactor, first, "the loss must fall %gx within %d steps", lossFallFactor, lossFallSteps)
			assert.Less(t, tail, 0.9*frozenTail, "the loss must end 10%% below that of training the routed experts alone")
			if cfg.GradSync.Replicated() {
				assert.Zero(t, spread, "rank %d's gate or shared expert differs from another rank's", w.Rank())
			}
		})
	}
}
