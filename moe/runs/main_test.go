package runs_test

import (
	"fmt"
	"math"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/goep/goep/ep"
	"github.com/goep/goep/internal/mpitesting"
	"github.com/goep/goep/moe"
	"github.com/goep/goep/mpi"
)

// The tests run on one rank with go test, and on every rank of an MPI job
// under the mpitest harness (make test-mpi); every test is collective.
func TestMain(m *testing.M) { mpitesting.Main(m) }

// testExperts is the experts of the tests' layers: 8, or the least
// multiple of the ranks above it (10 on the 5 ranks of nodes of unequal
// size, 2+2+1).
func testExperts() int {
	R := mpitesting.World.Size()
	return max(8, R) + (R-max(8, R)%R)%R
}

// smallConfig is the tiny training setup of the tests (moe's own).
func smallConfig(mode ep.Mode, dtype moe.DType) moe.TrainConfig {
	return moe.TrainConfig{
		Config: moe.Config{Mode: mode, DType: dtype, Experts: testExperts(), TopK: 2, Hidden: 16, FFN: 32, Tokens: 32,
			Act: moe.SiLU, Seed: 1},
		TeacherSeed: 2, LR: 1e-2, AuxCoef: 0.01,
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

// tempDir is a directory of rank 0's: only rank 0 reads and writes the
// files of a run, and every rank passes the same path.
func tempDir(t *testing.T, w *mpi.Comm) string {
	d := t.TempDir()
	buf := make([]byte, 4096)
	copy(buf, d)
	require.NoError(t, w.Bcast(buf, 0))
	return string(buf[:slices.Index(buf, 0)])
}

// paramsEqual reports whether two Params are bit for bit the same.
func paramsEqual(a, b *moe.Params) bool {
	return slices.Equal(a.Gate, b.Gate) && slices.Equal(a.W1, b.W1) && slices.Equal(a.B1, b.B1) &&
		slices.Equal(a.W2, b.W2) && slices.Equal(a.B2, b.B2) &&
		slices.Equal(a.SharedW1, b.SharedW1) && slices.Equal(a.SharedB1, b.SharedB1) &&
		slices.Equal(a.SharedW2, b.SharedW2) && slices.Equal(a.SharedB2, b.SharedB2)
}

func floatsNorm(v []float64) float64 {
	s := 0.0
	for _, x := range v {
		s += x * x
	}
	return math.Sqrt(s)
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

// sameOnEveryRank returns rank 0's s if every rank of c has the same, else
// an error naming the first rank that differs.
func sameOnEveryRank(c *mpi.Comm, s string) (string, error) {
	mine := make([]byte, 64)
	copy(mine, s)
	all := make([]byte, 64*c.Size())
	if err := c.Allgather(mine, all); err != nil {
		return "", err
	}
	for r := 1; r < c.Size(); r++ {
		if !slices.Equal(all[:64], all[r*64:(r+1)*64]) {
			return "", fmt.Errorf("rank %d has %q, rank 0 %q", r, all[r*64:(r+1)*64], all[:64])
		}
	}
	return s, nil
}
