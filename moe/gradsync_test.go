package moe_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goep/goep/ep"
	"github.com/goep/goep/internal/mpitesting"
	"github.com/goep/goep/moe"
	"github.com/goep/goep/mpi"
)

func TestParseGradSync(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want moe.GradSync
		err  string
	}{
		{"allreduce", moe.GradSync{}, ""},
		{"a2sgd", moe.GradSync{Method: moe.SyncA2SGD}, ""},
		{"topk:100", moe.GradSync{Method: moe.SyncTopK, K: 100}, ""},
		{"topk:0", moe.GradSync{}, `"topk:0": K must be a positive integer`},
		{"topk:-3", moe.GradSync{}, `"topk:-3": K must be a positive integer`},
		{"topk:1%", moe.GradSync{}, `"topk:1%": K must be a positive integer`},
		{"topk", moe.GradSync{}, `unknown grad sync "topk"`},
		{"qsgd", moe.GradSync{}, `unknown grad sync "qsgd" (want allreduce, a2sgd or topk:K)`},
	} {
		got, err := moe.ParseGradSync(tc.in)
		if tc.err != "" {
			assert.ErrorContains(t, err, tc.err, tc.in)
			continue
		}
		require.NoError(t, err, tc.in)
		assert.Equal(t, tc.want, got, tc.in)
		assert.Equal(t, tc.in, got.String(), "String reads back")
	}
}

// A configuration whose grad sync cannot work is refused, naming the value.
func TestGradSyncConfigRefused(t *testing.T) {
	cfg := smallConfig(ep.LowLatency, moe.Float32).Config
	cfg.SharedFFN = 4 // the gate 16*E, the shared expert 2*16*4 + 4 + 16 data-parallel parameters
	n := 16*cfg.Experts + 2*16*4 + 4 + 16
	assert.Equal(t, n, cfg.DataParallelParams())
	cfg.GradSync = moe.GradSync{Method: moe.SyncTopK, K: n + 1}
	assert.ErrorContains(t, cfg.Validate(1), fmt.Sprintf("grad sync topk:%d: K must be 1..%d", n+1, n))
	cfg.GradSync.K = n
	assert.NoError(t, cfg.Validate(1))
	cfg.SharedFFN = -1
	assert.ErrorContains(t, cfg.Validate(1), "shared ffn = -1, want >= 0")
}

// refA2SGD is A2SGD written out for all ranks at once, as the paper states
// it, independently of the package: for each rank v = g + e, the means of
// v's positive and negative entries, their averages over ranks, each rank's
// update u (the average of its sign) and new error v - u. It returns the
// update of every rank scaled to a sum over ranks (R*u), and updates es.
func refA2SGD(gs, es [][]float64) [][]float64 {
	R := len(gs)
	var pos, neg float64
	vs := make([][]float64, R)
	for r := range gs {
		var p, n []float64
		vs[r] = make([]float64, len(gs[r]))
		for i := range gs[r] {
			v := gs[r][i] + es[r][i]
			vs[r][i] = v
			if v > 0 {
				p = append(p, v)
			} else if v < 0 {
				n = append(n, v)
			}
		}
		mean := func(s []float64) float64 {
			if len(s) == 0 {
				return 0
			}
			t := 0.0
			for _, x := range s {
				t += x
			}
			return t / float64(len(s))
		}
		pos += mean(p) // summed over ranks, then divided, as the sync's allreduce
		neg += mean(n)
	}
	pos, neg = pos/float64(R), neg/float64(R)
	out := make([][]float64, R)
	for r, v := range vs {
		out[r] = make([]float64, len(v))
		for i, x := range v {
			u := 0.0
			if x > 0 {
				u = pos
			} else if x < 0 {
				u = neg
			}
			es[r][i] = x - u
			out[r][i] = float64(R) * u
		}
	}
	return out
}

// refTopK is Top-K with error feedback for all ranks at once, by sorting:
// each rank sends the k entries of v = g + e of largest magnitude (ties:
// lower index) and keeps the rest as its error; every rank gets the sum.
func refTopK(gs, es [][]float64, k int) []float64 {
	out := make([]float64, len(gs[0]))
	for r := range gs {
		v := make([]float64, len(gs[r]))
		idx := make([]int, len(v))
		for i := range v {
			v[i] = gs[r][i] + es[r][i]
			idx[i] = i
		}
		slices.SortStableFunc(idx, func(a, b int) int {
			switch {
			case math.Abs(v[a]) > math.Abs(v[b]):
				return -1
			case math.Abs(v[a]) < math.Abs(v[b]):
				return 1
			}
			return a - b
		})
		copy(es[r], v)
		for _, i := range idx[:k] {
			out[i] += v[i]
			es[r][i] = 0
		}
	}
	return out
}

// rankGradient is the known gradient of rank r at step s: integers and
// halves of both signs, with zeros and ties, so that the sums are exact.
func rankGradient(r, s, n int) []float64 {
	g := make([]float64, n)
	for i := range g {
		g[i] = float64((i*7+r*5+s*3)%11-5) / 2
	}
	return g
}

// Hand-computed cases at one rank, then the same vector on every rank
// (every rank then has the same means, and the sum is R times one rank's).
func TestSyncKnownVectors(t *testing.T) {
	w := mpitesting.World
	R := float64(w.Size())
	defer mpitesting.Agree(t, w)
	for _, tc := range []struct {
		name     string
		sync     moe.GradSync
		g        []float64
		out, err []float64 // one rank's share of out, and its error
	}{
		// mu+ = (3+2)/2 = 2.5, mu- = (-1-5)/2 = -3.
		{"a2sgd", moe.GradSync{Method: moe.SyncA2SGD}, []float64{3, -1, 0, 2, -5}, []float64{2.5, -3, 0, 2.5, -3}, []float64{0.5, 2, 0, -0.5, -2}},
		{"a2sgd-positive", moe.GradSync{Method: moe.SyncA2SGD}, []float64{1, 2, 6}, []float64{3, 3, 3}, []float64{-2, -1, 3}},
		{"a2sgd-zero", moe.GradSync{Method: moe.SyncA2SGD}, []float64{0, 0}, []float64{0, 0}, []float64{0, 0}},
		// The two largest magnitudes, -5 and 3.
		{"topk", moe.GradSync{Method: moe.SyncTopK, K: 2}, []float64{3, -1, 0, 2, -5}, []float64{3, 0, 0, 0, -5}, []float64{0, -1, 0, 2, 0}},
		// A tie of magnitudes goes to the lower index.
		{"topk-ties", moe.GradSync{Method: moe.SyncTopK, K: 2}, []float64{1, -1, 1, 0.5}, []float64{1, -1, 0, 0}, []float64{0, 0, 1, 0.5}},
		{"topk-all", moe.GradSync{Method: moe.SyncTopK, K: 3}, []float64{1, -2, 0}, []float64{1, -2, 0}, []float64{0, 0, 0}},
	} {
		s, err := moe.NewSyncer(w, tc.sync, len(tc.g))
		require.NoError(t, err, tc.name)
		g := slices.Clone(tc.g)
		st, err := s.Sync(g)
		require.NoError(t, err, tc.name)
		for i := range g {
			assert.Equal(t, R*tc.out[i], g[i], "%s: out[%d]", tc.name, i)
		}
		assert.Equal(t, tc.err, s.Residual(), "%s: error kept", tc.name)
		assert.GreaterOrEqual(t, st.Time.Nanoseconds(), int64(0))
	}
	// NaN reaches every rank's update instead of hiding in the error.
	for _, gs := range []moe.GradSync{{Method: moe.SyncA2SGD}, {Method: moe.SyncTopK, K: 1}} {
		s, err := moe.NewSyncer(w, gs, 3)
		require.NoError(t, err)
		g := []float64{1, 2, 3}
		if w.Rank() == 0 {
			g[1] = math.NaN()
		}
		_, err = s.Sync(g)
		require.NoError(t, err)
		assert.True(t, slices.ContainsFunc(g, math.IsNaN), "%v: a NaN on rank 0 shows in rank %d's update %v", gs, w.Rank(), g)
	}
}

// On every rank count, A2SGD and Top-K give each rank the update and error
// of the independent references over several steps (error feedback
// included), and Allreduce the exact sum; bytes are counted as documented.
func TestSyncMatchesReference(t *testing.T) {
	w := mpitesting.World
	R, me := w.Size(), w.Rank()
	const n, steps = 23, 6
	for _, gsync := range []moe.GradSync{{}, {Method: moe.SyncA2SGD}, {Method: moe.SyncTopK, K: 1}, {Method: moe.SyncTopK, K: 5}} {
		t.Run(gsync.String(), func(t *testing.T) {
			defer mpitesting.Agree(t, w)
			s, err := moe.NewSyncer(w, gsync, n)
			require.NoError(t, err)
			es := make([][]float64, R)
			for r := range es {
				es[r] = make([]float64, n)
			}
			for step := 0; step < steps; step++ {
				gs := make([][]float64, R)
				for r := range gs {
					gs[r] = rankGradient(r, step, n)
				}
				var want []float64
				switch gsync.Method {
				case moe.SyncAllreduce:
					want = make([]float64, n)
					for r := range gs {
						for i, v := range gs[r] {
							want[i] += v
						}
					}
				case moe.SyncA2SGD:
					want = refA2SGD(gs, es)[me]
				case moe.SyncTopK:
					want = refTopK(gs, es, gsync.K)
				}
				g := slices.Clone(gs[me])
				st, err := s.Sync(g)
				require.NoError(t, err)
				for i := range g {
					assert.InDelta(t, want[i], g[i], 1e-12*float64(R), "step %d: out[%d]", step, i)
				}
				if gsync.Method != moe.SyncAllreduce {
					for i, v := range s.Residual() {
						assert.InDelta(t, es[me][i], v, 1e-12, "step %d: error[%d]", step, i)
					}
				} else {
					assert.Nil(t, s.Residual())
				}
				wantBytes := map[moe.SyncMethod]int64{moe.SyncAllreduce: 2 * int64(R-1) * 8 * n / int64(R),
					moe.SyncA2SGD: 2 * int64(R-1) * 16 / int64(R), moe.SyncTopK: int64(R-1) * 12 * int64(gsync.K)}[gsync.Method]
				assert.Equal(t, wantBytes, st.BytesSent)
			}
		})
	}
}

// Error feedback loses nothing: over many steps of random gradients, what
// a rank applied plus the error it keeps equals the sum of its raw
// gradients. For A2SGD a rank applies its own share u (Sync returns R*u);
// for Top-K every rank applies the sum of every rank's sent entries, so the
// sum over ranks holds: the summed updates plus every rank's error equal
// every rank's raw gradients summed.
func TestErrorFeedbackConserves(t *testing.T) {
	w := mpitesting.World
	R, me := w.Size(), w.Rank()
	const n, steps = 200, 40
	for _, gsync := range []moe.GradSync{{Method: moe.SyncA2SGD}, {Method: moe.SyncTopK, K: 7}} {
		t.Run(gsync.String(), func(t *testing.T) {
			defer mpitesting.Agree(t, w)
			s, err := moe.NewSyncer(w, gsync, n)
			require.NoError(t, err)
			raw, applied := make([]float64, n), make([]float64, n)
			rng := rand.New(rand.NewPCG(uint64(me), 9))
			for step := 0; step < steps; step++ {
				g := make([]float64, n)
				scale := math.Pow(10, float64(step%5-2)) // gradients of varying size
				for i := range g {
					g[i] = scale * rng.NormFloat64()
					raw[i] += g[i]
				}
				_, err := s.Sync(g)
				require.NoError(t, err)
				for i, v := range g {
					applied[i] += v
				}
			}
			e := s.Residual()
			if gsync.Method == moe.SyncA2SGD {
				worst := 0.0
				for i := range raw {
					worst = max(worst, math.Abs(applied[i]/float64(R)+e[i]-raw[i]))
				}
				t.Logf("rank %d: largest |applied + error - raw| = %.2g (gradients up to ~300)", me, worst)
				assert.Less(t, worst, 1e-9)
				return
			}
			rawAll, eAll := make([]float64, n), make([]float64, n)
			require.NoError(t, mpi.Allreduce(w, mpi.OpSum, raw, rawAll))
			require.NoError(t, mpi.Allreduce(w, mpi.OpSum, e, eAll))
			worst := 0.0
			for i := range raw {
				worst = max(worst, math.Abs(applied[i]+eAll[i]-rawAll[i]))
			}
			assert.Less(t, worst, 1e-9, "largest |applied + errors - raw| over ranks")
			// Nothing was sent twice or lost: the error is what was not sent.
			assert.Positive(t, floatsNorm(e), "Top-K with K << n keeps an error")
		})
	}
}

func floatsNorm(v []float64) float64 {
	s := 0.0
	for _, x := range v {
		s += x * x
	}
	return math.Sqrt(s)
}

// A Syncer refuses a gradient of the wrong length on every rank, before any
// communication.
func TestSyncWrongLength(t *testing.T) {
	w := mpitesting.World
	defer mpitesting.Agree(t, w)
	for _, gs := range []moe.GradSync{{}, {Method: moe.SyncA2SGD}, {Method: moe.SyncTopK, K: 2}} {
		s, err := moe.NewSyncer(w, gs, 4)
		require.NoError(t, err)
		_, err = s.Sync(make([]float64, 5))
		assert.ErrorContains(t, err, fmt.Sprintf("moe: %s sync: 5 gradient entries, want 4", map[moe.SyncMethod]string{0: "allreduce", 1: "a2sgd", 2: "topk"}[gs.Method]))
	}
	_, err := moe.NewSyncer(w, moe.GradSync{Method: moe.SyncTopK, K: 5}, 4)
	assert.ErrorContains(t, err, "topk:5: K must be 1..4")
}
