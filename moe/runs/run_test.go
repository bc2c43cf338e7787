package runs_test

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goep/goep/ep"
	"github.com/goep/goep/internal/h5"
	"github.com/goep/goep/internal/mpitesting"
	"github.com/goep/goep/moe"
	"github.com/goep/goep/moe/runs"
	"github.com/goep/goep/mpi"
)

// Run writes a trace with a row per step and the checkpoints it was asked
// for; a second Run resumed from the middle checkpoint ends with the same
// final checkpoint, bit for bit, and the same losses in its trace.
func TestRunTraceCheckpointsResume(t *testing.T) {
	w := mpitesting.World
	R := w.Size()
	defer mpitesting.Agree(t, w)
	const N = 10
	dir := tempDir(t, w)
	o := runs.Options{TrainConfig: smallConfig(ep.HighThroughput, moe.Float32), Steps: 2 * N,
		TracePath: filepath.Join(dir, "a", "trace.h5"), CheckpointDir: filepath.Join(dir, "a"), CheckpointEvery: N,
		Nodes: 1, Command: "test"}
	E := o.Config.Experts
	calls := 0
	o.OnStep = func(*moe.StepStats) { calls++ }
	res, err := runs.Train(w, o)
	require.NoError(t, err)
	assert.Equal(t, 2*N, calls)
	assert.Equal(t, int64(2*N), res.Steps)
	assert.Equal(t, int64(1), res.First.Step)
	assert.Equal(t, int64(2*N), res.Last.Step)
	assert.Equal(t, int64(2*N*32*R), res.Tokens)
	assert.Positive(t, res.TokensPerSecond())

	b := o
	b.TracePath, b.CheckpointDir, b.OnStep = filepath.Join(dir, "b", "trace.h5"), filepath.Join(dir, "b"), nil
	b.Resume = runs.CheckpointPath(o.CheckpointDir, N)
	resB, err := runs.Train(w, b)
	require.NoError(t, err)
	assert.Equal(t, int64(N), resB.Steps)
	assert.Equal(t, res.Last.Loss, resB.Last.Loss)

	if w.Rank() != 0 {
		assert.Empty(t, res.Files)
		return
	}
	assert.Equal(t, []string{o.TracePath, runs.CheckpointPath(o.CheckpointDir, N), runs.CheckpointPath(o.CheckpointDir, 2*N)}, res.Files)
	tr, err := runs.ReadTrace(o.TracePath)
	require.NoError(t, err)
	assert.Equal(t, o.TrainConfig, tr.Config)
	assert.Equal(t, R, tr.WorldSize)
	assert.Equal(t, runs.TraceVersion, tr.Version)
	require.Len(t, tr.Step, 2*N)
	for i := range tr.Step {
		assert.Equal(t, int64(i+1), tr.Step[i])
		sum := int64(0)
		for _, c := range tr.TokensPerExpert[i*E : (i+1)*E] {
			sum += c
		}
		assert.Equal(t, int64(32*R*2), sum, "step %d: pairs over experts", i+1)
		if i > 0 {
			assert.GreaterOrEqual(t, tr.WallTime[i], tr.WallTime[i-1])
		}
	}
	require.Len(t, tr.DispatchUS, 2*N*R)
	require.Len(t, tr.BytesSent, 2*N*R)
	for i, v := range tr.DispatchUS {
		assert.Positive(t, v, "dispatch_us[%d][%d]", i/R, i%R)
		assert.Positive(t, tr.CombineUS[i], "combine_us[%d][%d]", i/R, i%R)
		if R > 1 {
			assert.Positive(t, tr.BytesSent[i], "bytes_sent[%d][%d]", i/R, i%R)
		} else {
			assert.Zero(t, tr.BytesSent[i])
		}
	}

	trB, err := runs.ReadTrace(b.TracePath)
	require.NoError(t, err)
	assert.Equal(t, int64(N), trB.StartStep)
	assert.Equal(t, b.Resume, trB.ResumedFrom)
	assert.Equal(t, tr.Step[N:], trB.Step)
	assert.Equal(t, tr.Loss[N:], trB.Loss, "losses after the resume")
	assert.Equal(t, tr.TokensPerExpert[N*E:], trB.TokensPerExpert)

	ckA, err := runs.ReadCheckpoint(runs.CheckpointPath(o.CheckpointDir, 2*N))
	require.NoError(t, err)
	ckB, err := runs.ReadCheckpoint(runs.CheckpointPath(b.CheckpointDir, 2*N))
	require.NoError(t, err)
	assert.True(t, paramsEqual(&ckA.Model, &ckB.Model), "final models differ")
	assert.True(t, paramsEqual(&ckA.AdamM, &ckB.AdamM) && paramsEqual(&ckA.AdamV, &ckB.AdamV), "final Adam states differ")
	assert.True(t, slices.Equal(ckA.Model.W2, ckB.Model.W2))
}

// Errors that every rank meets at the same point are CollectiveErrors: a
// bad config, a resume past the end.
func TestRunCollectiveErrors(t *testing.T) {
	w := mpitesting.World
	defer mpitesting.Agree(t, w)
	o := runs.Options{TrainConfig: smallConfig(ep.LowLatency, moe.Float32), Steps: 2}
	o.TopK = 20
	_, err := runs.Train(w, o)
	var ce *runs.CollectiveError
	require.ErrorAs(t, err, &ce)
	assert.Contains(t, err.Error(), "topk = 20")

	dir := tempDir(t, w)
	o = runs.Options{TrainConfig: smallConfig(ep.LowLatency, moe.Float32), Steps: 2, CheckpointDir: dir}
	_, err = runs.Train(w, o)
	require.NoError(t, err)
	o.Resume = runs.CheckpointPath(dir, 2)
	_, err = runs.Train(w, o)
	require.ErrorAs(t, err, &ce)
	assert.Contains(t, err.Error(), "nothing to do")
}

// snapshot maps every file under dir to a hash of its contents (rank 0's
// view; nil elsewhere): a refused run must leave it as it was.
func snapshot(t *testing.T, w *mpi.Comm, dir string) map[string]string {
	t.Helper()
	if w.Rank() != 0 {
		return nil
	}
	out := map[string]string{}
	require.NoError(t, filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		out[rel] = fmt.Sprintf("%x", sha256.Sum256(data))
		return nil
	}))
	return out
}

// The first failure: a run to step 3N, resumed from the checkpoint
// of step 2N to step 4N with the same trace path, used to leave a trace of
// steps 2N+1..4N alone. Now the trace keeps the rows up to 2N, drops those
// of 2N+1..3N (saying so), and the resumed steps append; the segments are
// recorded, and the checkpoint of step 3N the resume supersedes is moved
// aside, not overwritten. On the same ranks the resumed steps repeat the
// first run's bit for bit.
func TestRunContinuesItsTrace(t *testing.T) {
	mpitesting.RequireTool(t, "h5dump")
	w := mpitesting.World
	R := w.Size()
	defer mpitesting.Agree(t, w)
	const N = 5
	dir := tempDir(t, w)
	o := runs.Options{TrainConfig: smallConfig(ep.LowLatency, moe.Float32), Steps: 3 * N,
		TracePath: filepath.Join(dir, "trace.h5"), CheckpointDir: dir, CheckpointEvery: N, Nodes: 1, Command: "first"}
	resA, err := runs.Train(w, o)
	require.NoError(t, err)
	var first *runs.TraceData
	var firstCkpt *runs.Checkpoint
	if w.Rank() == 0 {
		first, err = runs.ReadTrace(o.TracePath)
		require.NoError(t, err)
		firstCkpt, err = runs.ReadCheckpoint(runs.CheckpointPath(dir, 3*N))
		require.NoError(t, err)
	}

	b := o
	b.Steps, b.Resume, b.Command = 4*N, runs.CheckpointPath(dir, 2*N), "second"
	resB, err := runs.Train(w, b)
	require.NoError(t, err)
	assert.Equal(t, resA.RunID, resB.RunID, "a resume keeps the run id")
	assert.Equal(t, int64(2*N), resB.StartStep)
	assert.Equal(t, int64(2*N), resB.Steps)
	if w.Rank() != 0 {
		return
	}
	notes := strings.Join(resB.Notes, "\n")
	assert.Equal(t, int64(N), resB.DroppedRows)
	assert.Contains(t, notes, fmt.Sprintf("dropped %d rows of steps %d..%d", N, 2*N+1, 3*N))
	assert.Contains(t, notes, "moved 1 file(s) of run "+resA.RunID)

	tr, err := runs.ReadTrace(o.TracePath)
	require.NoError(t, err)
	assert.Equal(t, resA.RunID, tr.RunID)
	require.Len(t, tr.Step, 4*N)
	for i, s := range tr.Step {
		assert.Equal(t, int64(i+1), s)
	}
	assert.Equal(t, first.Loss, tr.Loss[:3*N], "steps 1..2N kept, 2N+1..3N recomputed bit for bit")
	assert.Equal(t, first.WallTime[:2*N], tr.WallTime[:2*N], "the kept rows are the first run's")
	require.Len(t, tr.Segments, 2)
	s0, s1 := tr.Segments[0], tr.Segments[1]
	assert.Equal(t, int64(0), s0.StartStep)
	assert.Equal(t, "first", s0.Command)
	assert.Equal(t, int64(2*N), s1.StartStep)
	assert.Equal(t, b.Resume, s1.Checkpoint)
	assert.Equal(t, int64(N), s1.DroppedRows)
	assert.Equal(t, int64(4*N), s1.Steps)
	assert.Equal(t, "second", s1.Command)
	for _, s := range tr.Segments {
		assert.Equal(t, R, s.WorldSize)
		assert.Equal(t, ep.LowLatency, s.Mode)
		assert.Equal(t, moe.Float32, s.DType)
		assert.Regexp(t, `^[^:,]+:\d+(,[^:,]+:\d+)*$`, s.Hosts)
	}
	assert.Equal(t, []int{0, 0, 1, 1}, []int{tr.SegmentOf(0), tr.SegmentOf(2*N - 1), tr.SegmentOf(2 * N), tr.SegmentOf(4*N - 1)})

	// The superseded checkpoint of step 3N is aside, whole; the new one
	// in its place is the same state, computed again.
	aside, err := filepath.Glob(filepath.Join(dir, "moved-aside", "*", "ckpt-000015.h5"))
	require.NoError(t, err)
	require.Len(t, aside, 1, "the old checkpoint of step 3N, moved aside")
	old, err := runs.ReadCheckpoint(aside[0])
	require.NoError(t, err)
	again, err := runs.ReadCheckpoint(runs.CheckpointPath(dir, 3*N))
	require.NoError(t, err)
	assert.Equal(t, firstCkpt.Model, old.Model)
	assert.Equal(t, old.Model, again.Model)
	assert.Equal(t, resA.RunID, again.RunID)

	// h5dump reads the segments.
	dump, err := exec.Command("h5dump", "-g", "/segments", o.TracePath).CombinedOutput()
	require.NoError(t, err, "%s", dump)
	for _, s := range []string{`GROUP "0000"`, `GROUP "0001"`, `ATTRIBUTE "start_step"`, `ATTRIBUTE "hosts"`, `"second"`} {
		assert.Contains(t, string(dump), s)
	}
	dump, err = exec.Command("h5dump", "-a", "/run_id", o.TracePath).CombinedOutput()
	require.NoError(t, err, "%s", dump)
	assert.Contains(t, string(dump), resA.RunID)
}

// The second failure: a new run in a directory of another run's
// files used to overwrite some and leave the rest, and auto-resume then
// picked the old run. Now the new run is refused, naming what is there and
// the flag that starts over, and changes no file; -fresh moves the old files
// aside; auto-resume continues the run that is there, refuses a directory of
// two runs, and does nothing for a run that is done.
func TestRunRefusesAnotherRunsFiles(t *testing.T) {
	w := mpitesting.World
	defer mpitesting.Agree(t, w)
	const N = 4
	dir := tempDir(t, w)
	trace := filepath.Join(dir, "trace.h5")
	o := runs.Options{TrainConfig: smallConfig(ep.HighThroughput, moe.Float32), Steps: 2 * N,
		TracePath: trace, CheckpointDir: dir, CheckpointEvery: N, Nodes: 1}
	// Auto-resume with nothing there starts a new run.
	auto := o
	auto.Resume = runs.ResumeAuto
	resA, err := runs.Train(w, auto)
	require.NoError(t, err)
	assert.Empty(t, resA.ResumedFrom)
	if w.Rank() == 0 {
		assert.Contains(t, strings.Join(resA.Notes, "\n"), "from scratch")
	}
	before := snapshot(t, w, dir)

	var ce *runs.CollectiveError
	_, err = runs.Train(w, o)
	require.ErrorAs(t, err, &ce)
	for _, s := range []string{"refusing to start a new run", "run " + resA.RunID, trace, runs.CheckpointPath(dir, N), "-fresh", "-resume auto"} {
		assert.Contains(t, err.Error(), s)
	}
	assert.Equal(t, before, snapshot(t, w, dir), "a refused run changed files")

	both := o
	both.Fresh, both.Resume = true, runs.ResumeAuto
	_, err = runs.Train(w, both)
	require.ErrorAs(t, err, &ce)
	assert.Contains(t, err.Error(), "contradict")

	fresh := o
	fresh.Fresh = true
	resB, err := runs.Train(w, fresh)
	require.NoError(t, err)
	assert.NotEqual(t, resA.RunID, resB.RunID)
	var aside string
	if w.Rank() == 0 {
		notes := strings.Join(resB.Notes, "\n")
		assert.Contains(t, notes, "moved 3 file(s) of run "+resA.RunID+" to "+filepath.Join(dir, "moved-aside"))
		m, err := filepath.Glob(filepath.Join(dir, "moved-aside", "*"))
		require.NoError(t, err)
		require.Len(t, m, 1)
		aside = m[0]
		for name, sum := range before { // every old file, unchanged, aside
			assert.Equal(t, sum, snapshot(t, w, aside)[name], "%s moved aside", name)
		}
		tr, err := runs.ReadTrace(trace)
		require.NoError(t, err)
		assert.Equal(t, resB.RunID, tr.RunID)
		assert.Len(t, tr.Segments, 1)
	}

	// Auto-resume continues run B, not A (whose files are aside).
	auto.Steps = 3 * N
	resC, err := runs.Train(w, auto)
	require.NoError(t, err)
	assert.Equal(t, resB.RunID, resC.RunID)
	assert.Equal(t, runs.CheckpointPath(dir, 2*N), resC.ResumedFrom)
	if w.Rank() == 0 {
		tr, err := runs.ReadTrace(trace)
		require.NoError(t, err)
		assert.Len(t, tr.Step, 3*N)
		assert.Len(t, tr.Segments, 2)
		ck, err := runs.ReadCheckpointInfo(runs.CheckpointPath(dir, 3*N))
		require.NoError(t, err)
		assert.Equal(t, resB.RunID, ck.RunID)
	}
	// Done: nothing to do, nothing changed.
	before = snapshot(t, w, dir)
	resD, err := runs.Train(w, auto)
	require.NoError(t, err)
	assert.True(t, resD.NothingToDo)
	assert.Equal(t, resB.RunID, resD.RunID)
	assert.Zero(t, resD.Steps)
	assert.Equal(t, before, snapshot(t, w, dir))

	// A checkpoint of run A back in the directory: two runs there.
	if w.Rank() == 0 {
		data, err := os.ReadFile(filepath.Join(aside, "ckpt-000004.h5"))
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(runs.CheckpointPath(dir, 1), data, 0o644))
	}
	before = snapshot(t, w, dir)
	auto.Steps = 4 * N
	_, err = runs.Train(w, auto)
	require.ErrorAs(t, err, &ce)
	for _, s := range []string{"2 runs", "run " + resA.RunID, "run " + resB.RunID, runs.CheckpointPath(dir, 1)} {
		assert.Contains(t, err.Error(), s)
	}
	explicit := o
	explicit.Steps, explicit.Resume = 4*N, runs.CheckpointPath(dir, 3*N)
	_, err = runs.Train(w, explicit)
	require.ErrorAs(t, err, &ce)
	assert.Contains(t, err.Error(), fmt.Sprintf("%s belongs to another run: run_id = %q in that checkpoint, %q in this run", runs.CheckpointPath(dir, 1), resA.RunID, resB.RunID))
	assert.Equal(t, before, snapshot(t, w, dir), "a refused run changed files")
}

// Files of version 1 (before run ids) are read. A version 1 checkpoint
// resumes explicitly, as a run with a new id; auto-resume and a new run
// refuse a directory of version 1 files, naming them.
func TestRunVersion1Files(t *testing.T) {
	w := mpitesting.World
	defer mpitesting.Agree(t, w)
	dir := tempDir(t, w)
	o := runs.Options{TrainConfig: smallConfig(ep.LowLatency, moe.Float32), Steps: 3,
		TracePath: filepath.Join(dir, "trace.h5"), CheckpointDir: dir}
	_, err := runs.Train(w, o)
	require.NoError(t, err)
	var werr error
	if w.Rank() == 0 { // make them version 1 files: the readers then ignore run_id and /segments
		for _, p := range []string{o.TracePath, runs.CheckpointPath(dir, 3)} {
			f, err := h5.OpenRW(p)
			require.NoError(t, err)
			require.NoError(t, f.SetAttr("/", "version", 1))
			werr = errors.Join(werr, f.Close())
		}
		tr, err := runs.ReadTrace(o.TracePath)
		require.NoError(t, err)
		assert.Equal(t, 1, tr.Version)
		assert.Empty(t, tr.RunID)
		require.Len(t, tr.Segments, 1)
		assert.Equal(t, w.Size(), tr.Segments[0].WorldSize)
		ck, err := runs.ReadCheckpoint(runs.CheckpointPath(dir, 3))
		require.NoError(t, err)
		assert.Equal(t, 1, ck.Version)
		assert.Empty(t, ck.RunID)
	}
	require.NoError(t, werr)

	var ce *runs.CollectiveError
	auto := o
	auto.Steps, auto.Resume = 6, runs.ResumeAuto
	_, err = runs.Train(w, auto)
	require.ErrorAs(t, err, &ce)
	assert.Contains(t, err.Error(), "files with no run id (written before run ids: version 1)")
	_, err = runs.Train(w, o)
	require.ErrorAs(t, err, &ce)
	assert.Contains(t, err.Error(), "refusing to start a new run")

	other := tempDir(t, w)
	resume := runs.Options{TrainConfig: o.TrainConfig, Steps: 6, Resume: runs.CheckpointPath(dir, 3),
		TracePath: filepath.Join(other, "trace.h5"), CheckpointDir: other}
	res, err := runs.Train(w, resume)
	require.NoError(t, err)
	assert.NotEmpty(t, res.RunID)
	assert.Equal(t, int64(3), res.StartStep)
	if w.Rank() == 0 {
		assert.Contains(t, strings.Join(res.Notes, "\n"), "has no run id (checkpoint version 1")
		ck, err := runs.ReadCheckpointInfo(runs.CheckpointPath(other, 6))
		require.NoError(t, err)
		assert.Equal(t, res.RunID, ck.RunID)
		assert.Equal(t, runs.CheckpointVersion, ck.Version)
	}
}

// The trace records the data-parallel gradient sync of every step: each
// rank's bytes (as SyncStats counts them) and time, and the step's time;
// h5dump reads them, and the run's shared expert and grad sync are
// attributes.
func TestRunTracesTheSync(t *testing.T) {
	mpitesting.RequireTool(t, "h5dump")
	w := mpitesting.World
	R := w.Size()
	for _, cfg := range syncConfigs() {
		t.Run(cfg.GradSync.String(), func(t *testing.T) {
			defer mpitesting.Agree(t, w)
			dir := tempDir(t, w)
			o := runs.Options{TrainConfig: cfg, Steps: 4, TracePath: filepath.Join(dir, "trace.h5")}
			res, err := runs.Train(w, o)
			require.NoError(t, err)
			n := int64(cfg.DataParallelParams())
			want := map[moe.SyncMethod]int64{moe.SyncAllreduce: 2 * int64(R-1) * 8 * n / int64(R),
				moe.SyncA2SGD: 2 * int64(R-1) * 16 / int64(R), moe.SyncTopK: int64(R-1) * 12 * int64(cfg.GradSync.K)}[cfg.GradSync.Method]
			assert.Equal(t, want, res.SyncBytes, "mean sync bytes per step")
			assert.Positive(t, res.MeanSync)
			if w.Rank() != 0 {
				return
			}
			tr, err := runs.ReadTrace(o.TracePath)
			require.NoError(t, err)
			assert.Equal(t, cfg, tr.Config)
			require.Len(t, tr.SyncBytes, 4*R)
			for i, b := range tr.SyncBytes {
				assert.Equal(t, want, b, "sync_bytes[%d][%d]", i/R, i%R)
				assert.Positive(t, tr.SyncUS[i], "sync_us[%d][%d]", i/R, i%R)
			}
			for i, us := range tr.StepUS {
				assert.Greater(t, us, tr.SyncUS[i*R], "step_us[%d] holds its sync", i)
			}
			dump, err := exec.Command("h5dump", "-d", "/trace/sync_bytes", o.TracePath).CombinedOutput()
			require.NoError(t, err, "%s", dump)
			assert.Contains(t, string(dump), fmt.Sprintf("(0,0): %d", want))
			dump, err = exec.Command("h5dump", "-A", o.TracePath).CombinedOutput()
			require.NoError(t, err, "%s", dump)
			for _, s := range []string{`ATTRIBUTE "grad_sync"`, fmt.Sprintf("%q", cfg.GradSync.String()), `ATTRIBUTE "shared_ffn"`} {
				assert.Contains(t, string(dump), s)
			}
		})
	}
}

// Files of the previous versions (trace schema 2, checkpoint version 2,
// written by the program before the shared expert and the grad sync;
// testdata/v2) are read, with no shared expert, the allreduce sync, and
// unknown sync statistics; a run resumes from them and continues the trace
// in the current schema.
func TestRunVersion2Files(t *testing.T) {
	w := mpitesting.World
	defer mpitesting.Agree(t, w)
	cfg := moe.TrainConfig{Config: moe.Config{Mode: ep.LowLatency, DType: moe.Float32, Experts: 2, TopK: 1, Hidden: 4, FFN: 4,
		Tokens: 4, Act: moe.SiLU, Seed: 1}, TeacherSeed: 2, LR: 0.01, AuxCoef: 0.01}
	dir := tempDir(t, w)
	onRanks(t, w, 1, func(c *mpi.Comm) {
		tr, err := runs.ReadTrace("testdata/v2/trace.h5")
		require.NoError(t, err)
		assert.Equal(t, 2, tr.Version)
		assert.Equal(t, cfg, tr.Config)
		require.Len(t, tr.Step, 3)
		assert.Equal(t, []int64{-1, -1, -1}, tr.SyncBytes)
		assert.True(t, math.IsNaN(tr.SyncUS[0]) && math.IsNaN(tr.StepUS[2]), "unknown sync time")
		ck, err := runs.ReadCheckpoint("testdata/v2/ckpt-000003.h5")
		require.NoError(t, err)
		assert.Equal(t, 2, ck.Version)
		assert.Equal(t, cfg, ck.Config)
		assert.Nil(t, ck.Sync)
		assert.Empty(t, ck.Model.SharedW1)

		for _, f := range []string{"trace.h5", "ckpt-000003.h5"} {
			data, err := os.ReadFile(filepath.Join("testdata/v2", f))
			require.NoError(t, err)
			require.NoError(t, os.WriteFile(filepath.Join(dir, f), data, 0o644))
		}
		res, err := runs.Train(c, runs.Options{TrainConfig: cfg, Steps: 5, TracePath: filepath.Join(dir, "trace.h5"),
			CheckpointDir: dir, Resume: runs.ResumeAuto})
		require.NoError(t, err)
		assert.Equal(t, tr.RunID, res.RunID)
		assert.Equal(t, int64(3), res.StartStep)
		now, err := runs.ReadTrace(filepath.Join(dir, "trace.h5"))
		require.NoError(t, err)
		assert.Equal(t, runs.TraceVersion, now.Version)
		assert.Equal(t, tr.Loss, now.Loss[:3], "the old rows are kept")
		assert.Equal(t, []int64{-1, -1, -1, 0, 0}, now.SyncBytes, "unknown for the old rows, none sent on one rank")
		assert.Positive(t, now.StepUS[4])
		// One rank: the per-peer matrices are 1x1, unknown in the old rows.
		assert.True(t, math.IsNaN(now.WaitUS[2]) && !math.IsNaN(now.WaitUS[3]), "waits: %v", now.WaitUS)
		assert.Equal(t, []int64{-1, -1, -1}, now.PeerSent[:3])
		assert.Positive(t, now.PeerSent[4], "the rows rank 0 kept")
		assert.Equal(t, now.PeerSent, now.PeerRecv)
		ck, err = runs.ReadCheckpoint(runs.CheckpointPath(dir, 5))
		require.NoError(t, err)
		assert.Equal(t, runs.CheckpointVersion, ck.Version)
	})
}

// A trace of schema version 3 (written by the program before the per-peer
// statistics, on 2 ranks; testdata/v3) is read with unknown wait and
// per-peer byte matrices, and a run resumed from its checkpoint continues
// it in the current schema: the old rows stay unknown, the new ones are
// measured.
func TestRunVersion3Files(t *testing.T) {
	w := mpitesting.World
	defer mpitesting.Agree(t, w)
	if w.Size() < 2 {
		t.Log("one rank: only the reading (the resume needs the trace's 2 ranks)")
	}
	tr, err := runs.ReadTrace("testdata/v3/trace.h5")
	require.NoError(t, err)
	assert.Equal(t, 3, tr.Version)
	require.Len(t, tr.Step, 3)
	require.Equal(t, 2, tr.RankColumns)
	require.Len(t, tr.WaitUS, 3*4)
	for i := range tr.WaitUS {
		assert.True(t, math.IsNaN(tr.WaitUS[i]), "wait_us unknown in a version 3 trace")
		assert.Equal(t, int64(-1), tr.PeerSent[i])
		assert.Equal(t, int64(-1), tr.PeerRecv[i])
	}
	assert.Positive(t, tr.SyncBytes[0], "version 3's own columns are read")
	if w.Size() < 2 {
		return
	}
	dir := tempDir(t, w)
	onRanks(t, w, 2, func(c *mpi.Comm) {
		if c.Rank() == 0 {
			for _, f := range []string{"trace.h5", "ckpt-000003.h5"} {
				data, err := os.ReadFile(filepath.Join("testdata/v3", f))
				require.NoError(t, err)
				require.NoError(t, os.WriteFile(filepath.Join(dir, f), data, 0o644))
			}
		}
		require.NoError(t, c.Barrier())
		res, err := runs.Train(c, runs.Options{TrainConfig: tr.Config, Steps: 5, TracePath: filepath.Join(dir, "trace.h5"),
			CheckpointDir: dir, Resume: runs.ResumeAuto})
		require.NoError(t, err)
		assert.Equal(t, int64(3), res.StartStep)
		if c.Rank() != 0 {
			return
		}
		now, err := runs.ReadTrace(filepath.Join(dir, "trace.h5"))
		require.NoError(t, err)
		assert.Equal(t, runs.TraceVersion, now.Version)
		require.Len(t, now.Step, 5)
		assert.Equal(t, tr.Loss, now.Loss[:3], "the old rows are kept")
		for i := 0; i < 5*4; i++ {
			assert.Equal(t, i < 3*4, math.IsNaN(now.WaitUS[i]), "wait_us[%d][%d][%d]: unknown in the old rows only", i/4, i/2%2, i%2)
			assert.Equal(t, i < 3*4, now.PeerSent[i] < 0, "peer_sent_bytes[%d][%d][%d]", i/4, i/2%2, i%2)
		}
	})
}

// A trace of schema version 4 and a checkpoint of version 3 (written by
// the program before backends and copies were recorded, on 2 ranks;
// testdata/v4) are read as the CPU engine's, the only backend then, with
// unknown copy statistics; a run resumed from the checkpoint continues the
// trace in the current schema: the old rows stay unknown, the new ones are
// measured (no copies on the CPU engine).
func TestRunVersion4Files(t *testing.T) {
	w := mpitesting.World
	defer mpitesting.Agree(t, w)
	tr, err := runs.ReadTrace("testdata/v4/trace.h5")
	require.NoError(t, err)
	assert.Equal(t, 4, tr.Version)
	require.Len(t, tr.Step, 3)
	require.Equal(t, 2, tr.RankColumns)
	assert.Equal(t, moe.Device{Backend: "cpu"}, tr.Device)
	assert.Equal(t, moe.Device{Backend: "cpu"}, tr.Segments[0].Device)
	require.Len(t, tr.Copies, 3*2)
	for i := range tr.Copies {
		assert.Equal(t, int64(-1), tr.Copies[i], "copies unknown in a version 4 trace")
		assert.Equal(t, int64(-1), tr.CopyBytes[i])
		assert.True(t, math.IsNaN(tr.CopyUS[i]))
	}
	assert.Positive(t, tr.PeerSent[0], "version 4's own columns are read")
	ck, err := runs.ReadCheckpointInfo("testdata/v4/ckpt-000003.h5")
	require.NoError(t, err)
	assert.Equal(t, 3, ck.Version)
	assert.Equal(t, moe.Device{Backend: "cpu"}, ck.Device)
	if w.Size() < 2 {
		t.Log("one rank: only the reading (the resume needs the trace's 2 ranks)")
		return
	}
	dir := tempDir(t, w)
	onRanks(t, w, 2, func(c *mpi.Comm) {
		if c.Rank() == 0 {
			for _, f := range []string{"trace.h5", "ckpt-000003.h5"} {
				data, err := os.ReadFile(filepath.Join("testdata/v4", f))
				require.NoError(t, err)
				require.NoError(t, os.WriteFile(filepath.Join(dir, f), data, 0o644))
			}
		}
		require.NoError(t, c.Barrier())
		res, err := runs.Train(c, runs.Options{TrainConfig: tr.Config, Steps: 5, TracePath: filepath.Join(dir, "trace.h5"),
			CheckpointDir: dir, Resume: runs.ResumeAuto})
		require.NoError(t, err)
		assert.Equal(t, int64(3), res.StartStep)
		if c.Rank() != 0 {
			return
		}
		for _, n := range res.Notes {
			assert.NotContains(t, n, "backend", "the CPU engine then and now")
		}
		now, err := runs.ReadTrace(filepath.Join(dir, "trace.h5"))
		require.NoError(t, err)
		assert.Equal(t, runs.TraceVersion, now.Version)
		require.Len(t, now.Step, 5)
		assert.Equal(t, tr.Loss, now.Loss[:3], "the old rows are kept")
		for i := 0; i < 5*2; i++ {
			assert.Equal(t, i < 3*2, now.Copies[i] < 0, "copies[%d][%d]: unknown in the old rows only", i/2, i%2)
			assert.Equal(t, i < 3*2, math.IsNaN(now.CopyUS[i]), "copy_us[%d][%d]", i/2, i%2)
		}
		assert.Equal(t, []int64{0, 0}, now.Copies[3*2:4*2], "the CPU engine copies nothing")
		ck, err := runs.ReadCheckpoint(runs.CheckpointPath(dir, 5))
		require.NoError(t, err)
		assert.Equal(t, runs.CheckpointVersion, ck.Version)
		assert.Equal(t, "cpu", ck.Device.Backend)
	})
}
