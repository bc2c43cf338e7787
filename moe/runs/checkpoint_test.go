package runs_test

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goep/goep/ep"
	"github.com/goep/goep/internal/mpitesting"
	"github.com/goep/goep/moe"
	"github.com/goep/goep/moe/runs"
	"github.com/goep/goep/mpi"
)

// testRunID is the run id of the checkpoints the tests write themselves.
const testRunID = "20250812T141502Z-3f9a1c2b"

// A run of 2N steps and a run of N steps, a checkpoint, and N more steps in
// a new trainer end with bit-identical parameters, Adam state and losses:
// in both modes, and with a shared expert under each grad sync, whose
// per-rank error feedback (and, for A2SGD, each rank's own copy of the
// data-parallel parameters) the checkpoint holds. Every rank gets the
// checkpoint's run id back.
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
			require.NoError(t, runs.SaveCheckpoint(first, path, testRunID))
			require.NoError(t, first.Close())

			second, err := moe.NewTrainer(w, cfg)
			require.NoError(t, err)
			defer second.Close()
			id, err := runs.LoadCheckpoint(second, path)
			require.NoError(t, err)
			assert.Equal(t, testRunID, id)
			_, err = sameOnEveryRank(w, id)
			require.NoError(t, err)
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
// gate, as the layers hold them, and the run id, step, world size,
// configuration and device.
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
	require.NoError(t, runs.SaveCheckpoint(tr, path, testRunID))
	p := tr.Layer().Params()
	all := make([]float64, len(p.W1)*w.Size())
	require.NoError(t, mpi.AllgatherSlice(w, p.W1, all))
	if w.Rank() != 0 {
		return
	}
	ck, err := runs.ReadCheckpoint(path)
	require.NoError(t, err)
	assert.Equal(t, testRunID, ck.RunID)
	assert.Equal(t, int64(3), ck.Step)
	assert.Equal(t, int64(3), ck.AdamT)
	assert.Equal(t, w.Size(), ck.WorldSize)
	assert.Equal(t, cfg, ck.Config)
	assert.Equal(t, moe.Device{Backend: "cpu"}, ck.Device)
	assert.Equal(t, p.Gate, ck.Model.Gate)
	assert.Equal(t, all, ck.Model.W1)
	assert.Len(t, ck.AdamV.B2, cfg.Experts*cfg.Hidden)
}

// Resuming with another model or training configuration names every field
// that differs and both values, on every rank, and changes nothing. The
// number of ranks, the mode, the element type and the tokens per rank are
// not among them (moe's TestRestoreStateReshards, and TestCheckpointChanges).
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
	require.NoError(t, runs.SaveCheckpoint(tr, path, testRunID))
	require.NoError(t, tr.Close())

	other := cfg
	other.Hidden, other.LR, other.Mode, other.Tokens = 8, 0.5, ep.LowLatency, 16
	tr2, err := moe.NewTrainer(w, other)
	require.NoError(t, err)
	defer tr2.Close()
	before := tr2.Layer().Params().Clone()
	_, err = runs.LoadCheckpoint(tr2, path)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "hidden = 16 in the checkpoint, 8 in this run")
	assert.Contains(t, err.Error(), "lr = 0.01 in the checkpoint, 0.5 in this run")
	assert.Contains(t, err.Error(), path)
	assert.NotContains(t, err.Error(), "mode")
	assert.NotContains(t, err.Error(), "tokens")
	assert.True(t, paramsEqual(&before, tr2.Layer().Params()), "a refused resume changed the parameters")
	assert.Zero(t, tr2.StepsDone())

	if w.Rank() == 0 {
		ck, err := runs.ReadCheckpointInfo(path)
		require.NoError(t, err)
		assert.Equal(t, testRunID, ck.RunID)
		n := 3 // ranks that do not divide the experts
		if cfg.Experts%n == 0 {
			n = 7
		}
		err = ck.Compatible(cfg, n)
		require.Error(t, err)
		assert.Contains(t, err.Error(), fmt.Sprintf("experts = %d in the checkpoint is not a multiple of the %d ranks of this run", cfg.Experts, n))
	}
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
	require.NoError(t, runs.SaveCheckpoint(tr, good, testRunID))
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
		_, err := runs.LoadCheckpoint(tr, path)
		require.Error(t, err, c.name)
		assert.Contains(t, err.Error(), c.want, c.name)
		assert.Contains(t, err.Error(), path, c.name)
	}
	_, err = runs.LoadCheckpoint(tr, filepath.Join(dir, "missing.h5"))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "no such file")

	// A valid HDF5 file that is not a checkpoint: a trace.
	trace := filepath.Join(dir, "trace.h5")
	var terr error
	if w.Rank() == 0 {
		f, err := runs.CreateTrace(trace, runs.TraceInfo{RunID: testRunID, Config: cfg, Segment: runs.Segment{WorldSize: w.Size(), Nodes: 1}})
		if terr = err; err == nil {
			terr = f.Close()
		}
	}
	require.NoError(t, terr)
	_, err = runs.LoadCheckpoint(tr, trace)
	require.Error(t, err)
	assert.Contains(t, err.Error(), `format attribute is "goep-moe-trace", want "goep-moe-checkpoint"`)
	assert.True(t, paramsEqual(&before, tr.Layer().Params()), "a failed resume changed the parameters")
}

// Changes says, one sentence each, what a resume changes among the things
// that may change (the ranks, the mode, the element type, the backend, the
// tokens per rank), says when the global batch changes, and what becomes of
// a grad sync's per-rank state on another number of ranks; nothing when
// nothing changes. Compatible accepts each of them.
func TestCheckpointChanges(t *testing.T) {
	base := smallConfig(ep.LowLatency, moe.Float32)
	base.Experts = 8
	a2sgd, topk := syncConfigs()[1], syncConfigs()[2]
	a2sgd.Experts, topk.Experts = 8, 8
	for _, c := range []struct {
		name    string
		ck, now moe.TrainConfig
		ranks   int      // the ranks of the resumed run (the checkpoint's: 4)
		device  string   // the checkpoint's backend ("": written before backends were recorded)
		want    []string // one sentence each, in order
	}{
		{"nothing", base, base, 4, "cpu", nil},
		{"no backend recorded", base, base, 4, "", nil},
		{"ranks, same batch", base, with(base, func(c *moe.TrainConfig) { c.Tokens = 64 }), 2, "cpu", []string{
			"world size = 4 ranks in the checkpoint, 2 in this run: its 8 experts are resharded, 4 per rank",
			"tokens per rank = 32 in the checkpoint, 64 in this run; the global batch is 128 tokens per step in both"}},
		{"ranks, another batch", base, base, 8, "cpu", []string{
			"world size = 4 ranks in the checkpoint, 8 in this run: its 8 experts are resharded, 1 per rank",
			"the global batch changed: 4 ranks x 32 tokens = 128 tokens per step in the checkpoint, 8 x 32 = 256 in this run: the steps after 7 train on other tokens than an uninterrupted run would (keep tokens x ranks = 128 to train on the same)"}},
		{"mode and dtype", base, with(base, func(c *moe.TrainConfig) { c.Mode, c.DType = ep.HighThroughput, moe.BFloat16 }), 4, "cpu", []string{
			"mode = ll in the checkpoint, ht in this run", "dtype = f32 in the checkpoint, bf16 in this run"}},
		{"backend", base, base, 4, "gpu:emulated", []string{
			"backend = gpu:emulated in the checkpoint, cpu in this run: a checkpoint is the model, not the device; the run goes on on cpu"}},
		{"topk on other ranks", topk, with(topk, func(c *moe.TrainConfig) { c.Tokens = 64 }), 2, "cpu", []string{
			"world size = 4 ranks in the checkpoint, 2 in this run: its 8 experts are resharded, 4 per rank",
			"grad sync topk:60: the 4 ranks' error feedback (gradient not yet applied) does not map onto 2 ranks: it is pooled and spread evenly, so that none of it is lost, though which rank holds what changes",
			"tokens per rank = 32 in the checkpoint, 64 in this run; the global batch is 128 tokens per step in both"}},
		{"a2sgd on other ranks", a2sgd, with(a2sgd, func(c *moe.TrainConfig) { c.Tokens = 64 }), 2, "cpu", []string{
			"world size = 4 ranks in the checkpoint, 2 in this run: its 8 experts are resharded, 4 per rank",
			"grad sync a2sgd: the 4 ranks' error feedback (gradient not yet applied) does not map onto 2 ranks: it is pooled and spread evenly, so that none of it is lost, though which rank holds what changes; every rank starts from rank 0's copy of the gate and the shared expert and of their Adam moments (a2sgd lets the ranks' copies drift apart; the others are dropped)",
			"tokens per rank = 32 in the checkpoint, 64 in this run; the global batch is 128 tokens per step in both"}},
		{"a2sgd on the same ranks", a2sgd, a2sgd, 4, "cpu", nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			ck := runs.CheckpointInfo{Path: "ckpt.h5", Step: 7, WorldSize: 4, Config: c.ck, Device: moe.Device{Backend: c.device}}
			require.NoError(t, ck.Compatible(c.now, c.ranks))
			assert.Equal(t, c.want, ck.Changes(c.now, c.ranks))
		})
	}
}

// with returns c changed by f.
func with(c moe.TrainConfig, f func(*moe.TrainConfig)) moe.TrainConfig {
	f(&c)
	return c
}
