package moe_test

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goep/goep/ep"
	"github.com/goep/goep/internal/mpitesting"
	"github.com/goep/goep/moe"
	"github.com/goep/goep/mpi"
)

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

// A run of 2N steps and a run of N steps, a checkpoint, and N more steps in
// a new trainer end with bit-identical parameters, Adam state and losses:
// in both modes, and with a shared expert under each grad sync, whose
// per-rank error feedback (and, for A2SGD, each rank's own copy of the
// data-parallel parameters) the checkpoint holds.
func TestResumeIsBitIdentical(t *testing.T) {
	w := mpitesting.World
	const N = 12
	cases := []moe.TrainConfig{smallConfig(ep.LowLatency, moe.Float32), smallConfig(ep.HighThroughput, moe.BFloat16)}
	cases = append(cases, syncConfigs()...)
	for _, cfg := range cases {
		name := cfg.Mode.String() + "-" + cfg.DType.String()
		if cfg.SharedFFN > 0 {
			name += fmt.Sprintf("-shared%d-%v", cfg.SharedFFN, cfg.GradSync)
		}
		t.Run(name, func(t *testing.T) {
			defer mpitesting.Agree(t, w)
			dir := tempDir(t, w)
			path := filepath.Join(dir, "ckpt.h5")

			whole, err := moe.NewTrainer(w, cfg)
			require.NoError(t, err)
			defer whole.Close()
			var want []float64
			for i := 0; i < 2*N; i++ {
				st, err := whole.Step()
				require.NoError(t, err)
				want = append(want, st.Loss)
			}

			first, err := moe.NewTrainer(w, cfg)
			require.NoError(t, err)
			for i := 0; i < N; i++ {
				_, err := first.Step()
				require.NoError(t, err)
			}
			require.NoError(t, first.SaveCheckpoint(path))
			require.NoError(t, first.Close())

			second, err := moe.NewTrainer(w, cfg)
			require.NoError(t, err)
			defer second.Close()
			require.NoError(t, second.LoadCheckpoint(path))
			require.Equal(t, int64(N), second.StepsDone())
			var got []float64
			for i := 0; i < N; i++ {
				st, err := second.Step()
				require.NoError(t, err)
				got = append(got, st.Loss)
			}
			assert.Equal(t, want[N:], got, "losses of steps %d..%d", N+1, 2*N)
			assert.True(t, paramsEqual(whole.Layer().Params(), second.Layer().Params()), "parameters differ")
			assert.True(t, paramsEqual(&whole.Adam().M, &second.Adam().M), "Adam's first moments differ")
			assert.True(t, paramsEqual(&whole.Adam().V, &second.Adam().V), "Adam's second moments differ")
			assert.Equal(t, whole.Adam().T, second.Adam().T)
			assert.Equal(t, whole.Layer().Syncer().Residual(), second.Layer().Syncer().Residual(), "error feedback differs")
			if cfg.GradSync.PerRankState() {
				assert.Positive(t, floatsNorm(second.Layer().Syncer().Residual()), "an error was kept")
			}
		})
	}
}

// The checkpoint holds every rank's experts in global order, and the
// gate, as the layers hold them.
func TestCheckpointGathersEveryExpert(t *testing.T) {
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
	path := filepath.Join(tempDir(t, w), "ckpt.h5")
	require.NoError(t, tr.SaveCheckpoint(path))
	p := tr.Layer().Params()
	all := make([]float64, len(p.W1)*w.Size())
	require.NoError(t, mpi.AllgatherSlice(w, p.W1, all))
	if w.Rank() != 0 {
		return
	}
	ck, err := moe.ReadCheckpoint(path)
	require.NoError(t, err)
	assert.Equal(t, int64(3), ck.Step)
	assert.Equal(t, w.Size(), ck.WorldSize)
	assert.Equal(t, cfg, ck.Config)
	assert.Equal(t, p.Gate, ck.Model.Gate)
	assert.Equal(t, all, ck.Model.W1)
	assert.Len(t, ck.AdamV.B2, cfg.Experts*cfg.Hidden)
}

// Resuming with another model or training configuration names every field
// that differs and both values, on every rank, and changes nothing. The
// number of ranks, the mode, the element type and the tokens per rank are
// not among them (TestCheckpointReshards).
func TestResumeMismatch(t *testing.T) {
	w := mpitesting.World
	defer mpitesting.Agree(t, w)
	cfg := smallConfig(ep.HighThroughput, moe.Float32)
	dir := tempDir(t, w)
	path := filepath.Join(dir, "ckpt.h5")
	tr, err := moe.NewTrainer(w, cfg)
	require.NoError(t, err)
	_, err = tr.Step()
	require.NoError(t, err)
	require.NoError(t, tr.SaveCheckpoint(path))
	require.NoError(t, tr.Close())

	other := cfg
	other.Hidden, other.LR, other.Mode, other.Tokens = 8, 0.5, ep.LowLatency, 16
	tr2, err := moe.NewTrainer(w, other)
	require.NoError(t, err)
	defer tr2.Close()
	before := tr2.Layer().Params().Clone()
	err = tr2.LoadCheckpoint(path)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "hidden = 16 in the checkpoint, 8 in this run")
	assert.Contains(t, err.Error(), "lr = 0.01 in the checkpoint, 0.5 in this run")
	assert.Contains(t, err.Error(), path)
	assert.NotContains(t, err.Error(), "mode")
	assert.NotContains(t, err.Error(), "tokens")
	assert.True(t, paramsEqual(&before, tr2.Layer().Params()), "a refused resume changed the parameters")
	assert.Zero(t, tr2.StepsDone())

	if w.Rank() == 0 {
		ck, err := moe.ReadCheckpointInfo(path)
		require.NoError(t, err)
		assert.Equal(t, tr.RunID(), ck.RunID)
		n := 3 // ranks that do not divide the experts
		if cfg.Experts%n == 0 {
			n = 7
		}
		err = ck.Compatible(cfg, n)
		require.Error(t, err)
		assert.Contains(t, err.Error(), fmt.Sprintf("experts = %d in the checkpoint is not a multiple of the %d ranks of this run", cfg.Experts, n))
	}
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

// A checkpoint written by a ranks resumes on b ranks, in the other mode and
// element type, with tokens per rank scaled to keep the global batch: every
// rank takes its share of the experts and of Adam's moments in global order,
// the gate, the step and the run id. The loss of the next step (before its
// update: the same parameters and tokens) is the one the writer computes,
// within rounding: to 1e-12 for the same mode and element type (only sums in
// another order; measured 3e-16), 1e-7 from LL to HT (float32 partial sums
// in another order; measured 1.4e-9), 1e-3 from float32 to bfloat16 on the
// wire (measured 4e-5).
func TestCheckpointReshards(t *testing.T) {
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
				path := filepath.Join(tempDir(t, w), "ckpt.h5")
				var runID string
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
					require.NoError(t, tr.SaveCheckpoint(path))
					runID = tr.RunID()
					st, err := tr.Step()
					require.NoError(t, err)
					nextLoss = st.Loss
				})
				got := []float64{nextLoss}
				require.NoError(t, mpi.BcastSlice(w, got, 0))
				nextLoss = got[0]
				if w.Rank() == 0 {
					ck, err := moe.ReadCheckpoint(path)
					require.NoError(t, err)
					assert.Equal(t, p.a, ck.WorldSize)
					assert.Equal(t, runID, ck.RunID)
				}
				onRanks(t, w, p.b, func(c *mpi.Comm) {
					cr := cfg
					cr.Mode, cr.DType, cr.Tokens = to.mode, to.dtype, G/p.b
					tr, err := moe.NewTrainer(c, cr)
					require.NoError(t, err)
					defer tr.Close()
					require.NoError(t, tr.LoadCheckpoint(path))
					assert.Equal(t, int64(3), tr.StepsDone())
					assert.Equal(t, int64(3), tr.Adam().T)
					id, err := gatherString(c, tr.RunID())
					require.NoError(t, err)
					// Every rank's experts, gathered in rank order, are the
					// checkpoint's in global order.
					gate := slices.Clone(tr.Layer().Params().Gate)
					mine := [][]float64{tr.Layer().Params().W1, tr.Layer().Params().B2, tr.Adam().M.W2, tr.Adam().V.B1}
					var all [][]float64
					for _, s := range mine {
						a := make([]float64, len(s)*c.Size())
						require.NoError(t, mpi.AllgatherSlice(c, s, a))
						all = append(all, a)
					}
					st, err := tr.Step()
					require.NoError(t, err)
					if c.Rank() != 0 {
						return
					}
					ck, err := moe.ReadCheckpoint(path)
					require.NoError(t, err)
					assert.Equal(t, ck.RunID, id, "run id")
					assert.Equal(t, ck.Model.W1, all[0], "W1")
					assert.Equal(t, ck.Model.B2, all[1], "B2")
					assert.Equal(t, ck.AdamM.W2, all[2], "Adam's m of W2")
					assert.Equal(t, ck.AdamV.B1, all[3], "Adam's v of B1")
					assert.Equal(t, ck.Model.Gate, gate, "gate")
					rel := math.Abs(st.Loss-nextLoss) / nextLoss
					t.Logf("%d -> %d ranks, %v/%v -> %v/%v: step 4 loss %.9g, the writer's %.9g (relative difference %.2g)",
						p.a, p.b, cfg.Mode, cfg.DType, to.mode, to.dtype, st.Loss, nextLoss, rel)
					assert.LessOrEqual(t, rel, to.tol, "the loss of step 4 after the resume")
				})
			})
		}
	}
}

// gatherString returns rank 0's s if every rank of c has the same, else an
// error.
func gatherString(c *mpi.Comm, s string) (string, error) {
	mine := make([]byte, 64)
	copy(mine, s)
	all := make([]byte, 64*c.Size())
	if err := c.Allgather(mine, all); err != nil {
		return "", err
	}
	for r := 1; r < c.Size(); r++ {
		if !slices.Equal(all[:64], all[r*64:(r+1)*64]) {
			return "", fmt.Errorf("rank %d has run id %q, rank 0 %q", r, all[r*64:(r+1)*64], all[:64])
		}
	}
	return s, nil
}

// A truncated, damaged or foreign file is refused with a clear error on
// every rank, and the trainer is untouched.
func TestCorruptCheckpoint(t *testing.T) {
	w := mpitesting.World
	defer mpitesting.Agree(t, w)
	cfg := smallConfig(ep.LowLatency, moe.Float32)
	dir := tempDir(t, w)
	good := filepath.Join(dir, "ckpt.h5")
	tr, err := moe.NewTrainer(w, cfg)
	require.NoError(t, err)
	defer tr.Close()
	require.NoError(t, tr.SaveCheckpoint(good))
	before := tr.Layer().Params().Clone()

	cases := []struct {
		name, want string
		damage     func(data []byte) []byte
	}{
		{"truncated", "not an HDF5 file, or truncated or corrupt", func(d []byte) []byte { return d[:len(d)/2] }},
		{"empty", "not an HDF5 file, or truncated or corrupt", func(d []byte) []byte { return nil }},
		{"garbage", "not an HDF5 file, or truncated or corrupt", func(d []byte) []byte { return []byte("this is not a checkpoint\n") }},
		// Bytes flipped in the middle of the file, inside the arrays' data:
		// HDF5 reads them, the checksum does not match.
		{"flipped", "the data is corrupt", func(d []byte) []byte {
			for i := len(d) / 2; i < len(d)/2+16; i++ {
				d[i] ^= 0x5a
			}
			return d
		}},
	}
	for _, c := range cases {
		path := filepath.Join(dir, c.name+".h5")
		if w.Rank() == 0 {
			data, err := os.ReadFile(good)
			require.NoError(t, err)
			require.NoError(t, os.WriteFile(path, c.damage(data), 0o644))
		}
		err := tr.LoadCheckpoint(path)
		require.Error(t, err, c.name)
		assert.Contains(t, err.Error(), c.want, c.name)
		assert.Contains(t, err.Error(), path, c.name)
	}
	err = tr.LoadCheckpoint(filepath.Join(dir, "missing.h5"))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "no such file")

	// A valid HDF5 file that is not a checkpoint: a trace.
	trace := filepath.Join(dir, "trace.h5")
	var terr error
	if w.Rank() == 0 {
		f, err := moe.CreateTrace(trace, moe.TraceInfo{RunID: tr.RunID(), Config: cfg, Segment: moe.Segment{WorldSize: w.Size(), Nodes: 1}})
		if terr = err; err == nil {
			terr = f.Close()
		}
	}
	require.NoError(t, terr)
	err = tr.LoadCheckpoint(trace)
	require.Error(t, err)
	assert.Contains(t, err.Error(), `format attribute is "goep-moe-trace", want "goep-moe-checkpoint"`)
	assert.True(t, paramsEqual(&before, tr.Layer().Params()), "a failed resume changed the parameters")
}

// A checkpoint of a grad sync with per-rank state, resumed on another
// number of ranks: the ranks' error feedback is pooled, none of it lost (the
// residuals of the new ranks sum to those of the old), and under A2SGD,
// whose ranks' copies differ, every new rank starts from rank 0's copy (the
// checkpoint's model). CheckpointInfo.Changes says so. On the same number of
// ranks each rank gets its own row back. (On one rank, only the latter.)
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
			path := filepath.Join(tempDir(t, w), "ckpt.h5")
			onRanks(t, w, R, func(c *mpi.Comm) {
				tr, err := moe.NewTrainer(c, cfg)
				require.NoError(t, err)
				defer tr.Close()
				for i := 0; i < 5; i++ {
					_, err := tr.Step()
					require.NoError(t, err)
				}
				require.NoError(t, tr.SaveCheckpoint(path))
			})
			var ck *moe.Checkpoint
			if w.Rank() == 0 {
				var err error
				ck, err = moe.ReadCheckpoint(path)
				require.NoError(t, err)
				n := cfg.DataParallelParams()
				require.NotNil(t, ck.Sync)
				require.Len(t, ck.Sync.Residual, R*n)
				if cfg.GradSync.Replicated() {
					assert.Nil(t, ck.Sync.Model)
				} else {
					require.Len(t, ck.Sync.Model, R*n)
					assert.Equal(t, ck.Model.Gate, ck.Sync.Model[:len(ck.Model.Gate)], "the model's gate is rank 0's")
					if R > 1 {
						assert.NotEqual(t, ck.Sync.Model[:n], ck.Sync.Model[n:2*n], "a2sgd: ranks 0 and 1 hold different copies")
					}
				}
				changes := strings.Join(ck.Changes(cfg, 2*R), "\n")
				assert.Contains(t, changes, fmt.Sprintf("grad sync %v: the %d ranks' error feedback", cfg.GradSync, R))
				assert.Contains(t, changes, "pooled and spread evenly")
				assert.Equal(t, !cfg.GradSync.Replicated(), strings.Contains(changes, "every rank starts from rank 0's copy"))
				assert.Empty(t, ck.Changes(cfg, R), "same ranks: nothing changes")
			}
			for _, b := range resumeOn {
				onRanks(t, w, b, func(c *mpi.Comm) {
					cr := cfg
					cr.Tokens = cfg.Tokens * R / b
					tr, err := moe.NewTrainer(c, cr)
					require.NoError(t, err)
					defer tr.Close()
					require.NoError(t, tr.LoadCheckpoint(path))
					e := tr.Layer().Syncer().Residual()
					all := make([]float64, len(e)*b)
					require.NoError(t, mpi.AllgatherSlice(c, e, all))
					p := tr.Layer().Params()
					gate := slices.Clone(p.Gate)
					gates := make([]float64, len(gate)*b)
					require.NoError(t, mpi.AllgatherSlice(c, gate, gates))
					if c.Rank() != 0 {
						return
					}
					n := len(e)
					if b == R { // each rank its own row
						assert.Equal(t, ck.Sync.Residual, all, "residuals")
						if !cfg.GradSync.Replicated() {
							for r := 0; r < b; r++ {
								assert.Equal(t, ck.Sync.Model[r*n:r*n+len(gate)], gates[r*len(gate):(r+1)*len(gate)], "rank %d's gate", r)
							}
						}
						return
					}
					for i := 0; i < n; i++ {
						was, now := 0.0, 0.0
						for r := 0; r < R; r++ {
							was += ck.Sync.Residual[r*n+i]
						}
						for r := 0; r < b; r++ {
							now += all[r*n+i]
						}
						require.InDelta(t, was, now, 1e-12*(1+math.Abs(was)), "residual %d summed over ranks", i)
					}
					for r := 0; r < b; r++ {
						assert.Equal(t, ck.Model.Gate, gates[r*len(gate):(r+1)*len(gate)], "rank %d starts from rank 0's gate", r)
					}
				})
			}
		})
	}
}
