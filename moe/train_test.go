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

// smallConfig is the tiny training setup of the tests.
func smallConfig(mode ep.Mode, dtype moe.DType) moe.TrainConfig {
	return moe.TrainConfig{
		Config: moe.Config{Mode: mode, DType: dtype, Experts: 8, TopK: 2, Hidden: 16, FFN: 32, Tokens: 32,
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
	N := int64(10 * w.Size())
	assert.Equal(t, []int64{N, N, 0, 0, 0, 0, 0, 0}, counts)
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
