package moe_test

import (
	"fmt"
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goep/goep/ep"
	"github.com/goep/goep/ep/epgpu"
	"github.com/goep/goep/internal/mpitesting"
	"github.com/goep/goep/moe"
	"github.com/goep/goep/mpi"
)

// deviceSteps is the length of the trainings on the emulated device: long
// enough for the gate, and so the routing, to change, short for CI.
const deviceSteps = 8

// emulated bootstraps the emulated device's backend over w (its
// communicator's ID made on rank 0 and handed over MPI), for one layer.
func emulated(t *testing.T, w *mpi.Comm) *epgpu.Bootstrapped {
	t.Helper()
	b, err := epgpu.Bootstrap(w, epgpu.Emulated)
	require.NoError(t, err)
	return b
}

// trainSteps trains cfg for n steps and returns every step's statistics
// and this rank's final parameters.
func trainSteps(t *testing.T, w *mpi.Comm, cfg moe.TrainConfig, n int) ([]*moe.StepStats, moe.Params) {
	t.Helper()
	tr, err := moe.NewTrainer(w, cfg)
	require.NoError(t, err)
	defer func() { require.NoError(t, tr.Close()) }()
	var steps []*moe.StepStats
	for i := 0; i < n; i++ {
		st, err := tr.Step()
		require.NoError(t, err)
		steps = append(steps, st)
	}
	return steps, *tr.Layer().Params()
}

// Training through the GPU engine on the emulated device (its tokens
// uploaded to device memory, the received rows and results brought back)
// is training on the CPU engine, bit for bit: the GPU engine's results equal
// the CPU engine's (the ep conformance suite), so every step's loss, aux
// loss, routing and byte counts and the final parameters must too, in both
// modes and both wire types, at every rank count and across simulated nodes.
// (HT across nodes sums a token's partials per node first on the CPU engine
// and rank by rank on the GPU's; with top-2 routing a token has at most two
// partials, whose sum is the same either way.) The CPU engine copies
// nothing; the device run counts its copies: LL, 6 + 5 per local expert
// that received rows, per step (the tokens up and, per such expert, its
// rows and weights down after the dispatch, its outputs up for each
// combine, its gradient rows down after the cached dispatch; the results
// down after each combine, the backward's tokens and row values up, its
// slot values down); HT, 12 (the same with one span of rows, and the
// received rows' expert ids down).
func TestEmulatedTrainingMatchesCPU(t *testing.T) {
	w := mpitesting.World
	R, me := w.Size(), w.Rank()
	for _, mode := range []ep.Mode{ep.LowLatency, ep.HighThroughput} {
		for _, dtype := range []moe.DType{moe.Float32, moe.BFloat16} {
			t.Run(fmt.Sprintf("%v-%v", mode, dtype), func(t *testing.T) {
				defer mpitesting.Agree(t, w)
				cfg := smallConfig(mode, dtype)
				ref, refParams := trainSteps(t, w, cfg, deviceSteps)
				cfg.Backend = emulated(t, w).Backend
				got, gotParams := trainSteps(t, w, cfg, deviceSteps)
				L := cfg.Experts / R
				for i := range ref {
					a, b := ref[i], got[i]
					require.Equal(t, math.Float64bits(a.Loss), math.Float64bits(b.Loss), "step %d: loss %v on the CPU engine, %v on the emulated device", a.Step, a.Loss, b.Loss)
					require.Equal(t, math.Float64bits(a.AuxLoss), math.Float64bits(b.AuxLoss), "step %d: aux loss", a.Step)
					require.Equal(t, a.TokensPerExpert, b.TokensPerExpert, "step %d: routing", a.Step)
					require.Equal(t, a.BytesSent, b.BytesSent, "step %d: payload bytes", a.Step)
					require.Equal(t, a.PeerSent, b.PeerSent, "step %d: per-peer bytes sent (ep.Stats)", a.Step)
					require.Equal(t, a.PeerRecv, b.PeerRecv, "step %d: per-peer bytes received (ep.Stats)", a.Step)
					for r := 0; r < R; r++ {
						require.Zero(t, a.Copies[r], "step %d: the CPU engine copies nothing", a.Step)
						require.Zero(t, a.CopyBytes[r], "step %d", a.Step)
						want := int64(12)
						if mode == ep.LowLatency {
							busy := 0
							for _, n := range b.TokensPerExpert[r*L : (r+1)*L] {
								if n > 0 {
									busy++
								}
							}
							want = int64(6 + 5*busy)
						}
						require.Equal(t, want, b.Copies[r], "step %d: rank %d's copies", b.Step, r)
						// At least the tokens' side: tokens up twice, results down twice.
						require.GreaterOrEqual(t, b.CopyBytes[r], int64(4*cfg.Tokens*cfg.Hidden*map[moe.DType]int{moe.Float32: 4, moe.BFloat16: 2}[dtype]), "step %d: rank %d's copy bytes", b.Step, r)
						require.Positive(t, b.CopyUS[r])
					}
				}
				assert.True(t, paramsEqual(&refParams, &gotParams), "rank %d: the final parameters differ", me)
				if me == 0 {
					t.Logf("%d ranks: loss %.6f -> %.6f on both, %d copies by rank 0 in the last step on the device", R, ref[0].Loss, ref[len(ref)-1].Loss, got[len(got)-1].Copies[0])
				}
			})
		}
	}
}

// FP8 dispatch is refused by name on a backend without it (the GPU
// engine, for now), before any group is made.
func TestFP8RefusedOnTheGPUEngine(t *testing.T) {
	w := mpitesting.World
	defer mpitesting.Agree(t, w)
	cfg := smallConfig(ep.LowLatency, moe.FP8)
	cfg.Backend = epgpu.Emulated
	_, err := moe.NewTrainer(w, cfg)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "dtype fp8: the gpu:emulated backend has no FP8 dispatch (ep.FeatureFP8Wire) yet; choose f32 or bf16")
}
