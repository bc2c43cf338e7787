package moe_test

import (
	"os"
	"path/filepath"
	"slices"
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
		slices.Equal(a.W2, b.W2) && slices.Equal(a.B2, b.B2)
}

// A run of 2N steps and a run of N steps, a checkpoint, and N more steps in
// a new trainer end with bit-identical parameters, Adam state and losses.
func TestResumeIsBitIdentical(t *testing.T) {
	w := mpitesting.World
	const N = 12
	for _, tc := range []struct {
		mode  ep.Mode
		dtype moe.DType
	}{{ep.LowLatency, moe.Float32}, {ep.HighThroughput, moe.BFloat16}} {
		t.Run(tc.mode.String()+"-"+tc.dtype.String(), func(t *testing.T) {
			defer mpitesting.Agree(t, w)
			cfg := smallConfig(tc.mode, tc.dtype)
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

// Resuming with another configuration or world size names every field that
// differs and both values, on every rank.
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
	other.Hidden, other.LR = 8, 0.5
	tr2, err := moe.NewTrainer(w, other)
	require.NoError(t, err)
	defer tr2.Close()
	err = tr2.LoadCheckpoint(path)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "hidden = 16 in the checkpoint, 8 in this run")
	assert.Contains(t, err.Error(), "lr = 0.01 in the checkpoint, 0.5 in this run")
	assert.Contains(t, err.Error(), path)

	// Another world size: rewrite the checkpoint as if from more ranks.
	var werr error
	if w.Rank() == 0 {
		ck, err := moe.ReadCheckpoint(path)
		require.NoError(t, err)
		ck.WorldSize = w.Size() * 2 // a size that divides the 8 experts
		if ck.WorldSize > 8 {
			ck.WorldSize = w.Size() / 2
		}
		werr = moe.WriteCheckpoint(path, ck)
	}
	require.NoError(t, werr)
	tr3, err := moe.NewTrainer(w, cfg)
	require.NoError(t, err)
	defer tr3.Close()
	err = tr3.LoadCheckpoint(path)
	require.Error(t, err)
	assert.Regexp(t, `world size \(ranks\) = \d+ in the checkpoint, \d+ in this run`, err.Error())
	assert.NotContains(t, err.Error(), "hidden")
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
		f, err := moe.CreateTrace(trace, moe.TraceInfo{Config: cfg, WorldSize: w.Size(), Nodes: 1})
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
