package runs_test

import (
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goep/goep/ep"
	"github.com/goep/goep/ep/epgpu"
	"github.com/goep/goep/internal/mpitesting"
	"github.com/goep/goep/moe"
	"github.com/goep/goep/moe/runs"
	"github.com/goep/goep/mpi"
)

// emulated bootstraps the emulated device's backend over w (its
// communicator's ID made on rank 0 and handed over MPI), for one layer.
func emulated(t *testing.T, w *mpi.Comm) *epgpu.Bootstrapped {
	t.Helper()
	b, err := epgpu.Bootstrap(w, epgpu.Emulated)
	require.NoError(t, err)
	return b
}

// A run resumes from a CPU checkpoint onto the emulated device and back:
// the checkpoints and the trace's segments record each backend and device
// (h5dump reads them), each resume says that the backend changed, and the
// run ends bit for bit where an uninterrupted CPU run does.
func TestResumeAcrossBackends(t *testing.T) {
	w := mpitesting.World
	defer mpitesting.Agree(t, w)
	const N = 4
	dir := tempDir(t, w)
	cfg := smallConfig(ep.HighThroughput, moe.BFloat16)
	ref := runs.Options{TrainConfig: cfg, Steps: 3 * N, TracePath: filepath.Join(dir, "ref", "trace.h5"),
		CheckpointDir: filepath.Join(dir, "ref"), CheckpointEvery: N, Nodes: 1, Command: "test"}
	_, err := runs.Train(w, ref)
	require.NoError(t, err)

	b := ref
	b.TracePath, b.CheckpointDir = filepath.Join(dir, "b", "trace.h5"), filepath.Join(dir, "b")
	b.Steps, b.Resume = 2*N, runs.CheckpointPath(ref.CheckpointDir, N)
	boot := emulated(t, w)
	b.Backend = boot.Backend
	b.Device = moe.Device{Name: boot.Device.Name, Libraries: boot.Device.Libraries, CommID: boot.ID.Digest()}
	onDevice, err := runs.Train(w, b)
	require.NoError(t, err)
	assert.Equal(t, "gpu:emulated", onDevice.Device.Backend)
	assert.Positive(t, onDevice.Copies)
	assert.Positive(t, onDevice.CopyBytes)

	b.Steps, b.Resume, b.Backend, b.Device = 3*N, runs.ResumeAuto, nil, moe.Device{}
	back, err := runs.Train(w, b)
	require.NoError(t, err)
	assert.Equal(t, "cpu", back.Device.Backend)
	assert.Zero(t, back.Copies)
	if w.Rank() != 0 {
		return
	}
	assert.Contains(t, onDevice.Notes, "backend = cpu in the checkpoint, gpu:emulated in this run: a checkpoint is the model, not the device; the run goes on on gpu:emulated")
	assert.Contains(t, back.Notes, "backend = gpu:emulated in the checkpoint, cpu in this run: a checkpoint is the model, not the device; the run goes on on cpu")

	want, err := runs.ReadCheckpoint(runs.CheckpointPath(ref.CheckpointDir, 3*N))
	require.NoError(t, err)
	gotCk, err := runs.ReadCheckpoint(runs.CheckpointPath(b.CheckpointDir, 3*N))
	require.NoError(t, err)
	assert.True(t, paramsEqual(&want.Model, &gotCk.Model), "the final model")
	assert.True(t, paramsEqual(&want.AdamM, &gotCk.AdamM) && paramsEqual(&want.AdamV, &gotCk.AdamV), "the final Adam moments")
	assert.Equal(t, moe.Device{Backend: "cpu"}, gotCk.Device)

	mid, err := runs.ReadCheckpoint(runs.CheckpointPath(b.CheckpointDir, 2*N))
	require.NoError(t, err)
	assert.Equal(t, moe.Device{Backend: "gpu:emulated", Name: "emulated:0", Libraries: boot.Device.Libraries, CommID: boot.ID.Digest()}, mid.Device)
	dump, err := exec.Command("h5dump", "-a", "/backend", "-a", "/device", "-a", "/comm_id", mid.Path).CombinedOutput()
	require.NoError(t, err, "%s", dump)
	for _, s := range []string{`"gpu:emulated"`, `"emulated:0"`, `"` + boot.ID.Digest() + `"`} {
		assert.Contains(t, string(dump), s)
	}

	wantTr, err := runs.ReadTrace(ref.TracePath)
	require.NoError(t, err)
	gotTr, err := runs.ReadTrace(b.TracePath)
	require.NoError(t, err)
	require.Len(t, gotTr.Segments, 2)
	assert.Equal(t, "gpu:emulated", gotTr.Segments[0].Device.Backend)
	assert.Equal(t, boot.ID.Digest(), gotTr.Segments[0].Device.CommID)
	assert.Equal(t, "cpu", gotTr.Segments[1].Device.Backend)
	assert.Equal(t, "cpu", gotTr.Device.Backend, "the latest segment's")
	assert.Equal(t, wantTr.Loss[N:], gotTr.Loss, "the losses of steps %d..%d", N+1, 3*N)
	R := w.Size()
	for i := range gotTr.Step {
		onDev := gotTr.Step[i] <= 2*N
		for r := 0; r < R; r++ {
			assert.Equal(t, onDev, gotTr.Copies[i*R+r] > 0, "step %d, rank %d: copies %d", gotTr.Step[i], r, gotTr.Copies[i*R+r])
		}
	}
	dump, err = exec.Command("h5dump", "-a", "/segments/0000/backend", "-a", "/segments/0001/backend", b.TracePath).CombinedOutput()
	require.NoError(t, err, "%s", dump)
	assert.Equal(t, 2, strings.Count(string(dump), `(0): "`), "%s", dump)
	assert.Contains(t, string(dump), `"gpu:emulated"`)
	assert.Contains(t, string(dump), `"cpu"`)
	assert.True(t, slices.ContainsFunc(gotTr.Segments, func(s runs.Segment) bool { return s.Device.Name == "emulated:0" }))
}
