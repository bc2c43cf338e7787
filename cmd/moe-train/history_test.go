package main

import (
	"crypto/sha256"
	"fmt"
	"io/fs"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goep/goep/moe/runs"
)

// copyRun copies the files of a run directory (not its subdirectories) into
// a new directory, so that a test may change them.
func copyRun(t *testing.T, dir string) string {
	t.Helper()
	d := t.TempDir()
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	for _, e := range entries {
		if e.IsDir() {
			continue
		}
		data, err := os.ReadFile(filepath.Join(dir, e.Name()))
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(d, e.Name()), data, 0o644))
	}
	return d
}

// hashTree maps every file under dir to a hash of its contents.
func hashTree(t *testing.T, dir string) map[string]string {
	t.Helper()
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

// h5attr is a root attribute of an HDF5 file as h5dump prints it.
func h5attr(t *testing.T, file, attr string) string {
	t.Helper()
	out, err := exec.Command("h5dump", "-a", attr, file).CombinedOutput()
	require.NoError(t, err, "h5dump -a %s %s: %s", attr, file, out)
	for _, line := range strings.Split(string(out), "\n") {
		if _, v, ok := strings.Cut(line, "(0): "); ok {
			return strings.Trim(strings.TrimSpace(v), `"`)
		}
	}
	t.Fatalf("h5dump -a %s %s: no value in\n%s", attr, file, out)
	return ""
}

// The first failure, as a user met it: a run to step 30 with a
// trace, resumed from the checkpoint of step 20 to step 40 with the same
// trace path, left a trace of steps 21-40 only. Now the trace holds steps
// 1-40: the first run's rows up to 20, its rows 21-30 dropped (the output
// says so) and recomputed, then 31-40; /segments has both segments.
func TestResumeKeepsTheTracesPast(t *testing.T) {
	base, _ := baseRun(t)
	dir := copyRun(t, base)
	trace := filepath.Join(dir, "trace.h5")
	out, err := mpirun(t, 2, 2*time.Minute, append(slices.Clone(small), "-mode", "ht", "-steps", "40", "-ckpt-every", "10",
		"-ckpt-dir", dir, "-trace", trace, "-resume", runs.CheckpointPath(dir, 20), "-progress-every", "10")...)
	require.NoError(t, err, "%s", out)
	assert.Contains(t, out, "dropped 10 rows of steps 21..30")
	assert.Contains(t, out, "moved 1 file(s) of run")
	assert.Contains(t, out, "done: run ")

	ls, err := exec.Command("h5ls", "-r", trace).CombinedOutput()
	require.NoError(t, err, "%s", ls)
	assert.Regexp(t, `/trace/loss\s+Dataset \{40/Inf\}`, string(ls))
	first, err := runs.ReadTrace(filepath.Join(base, "trace.h5"))
	require.NoError(t, err)
	tr, err := runs.ReadTrace(trace)
	require.NoError(t, err)
	require.Len(t, tr.Step, 40)
	assert.Equal(t, int64(1), tr.Step[0])
	assert.Equal(t, int64(40), tr.Step[39])
	assert.Equal(t, first.Loss, tr.Loss[:30], "steps 1-20 kept, 21-30 recomputed bit for bit on the same 2 ranks")
	assert.Equal(t, first.RunID, tr.RunID)
	require.Len(t, tr.Segments, 2)
	assert.Equal(t, "2", h5attr(t, trace, "/segment_count"))
	assert.Equal(t, "20", h5attr(t, trace, "/segments/0001/start_step"))
	assert.Equal(t, "10", h5attr(t, trace, "/segments/0001/dropped_rows"))
	assert.Equal(t, runs.CheckpointPath(dir, 20), h5attr(t, trace, "/segments/0001/checkpoint"))
	assert.Equal(t, first.RunID, h5attr(t, runs.CheckpointPath(dir, 40), "/run_id"))
}

// The second failure: a new run into a directory of another run's
// files overwrote some of them, and auto-resume then continued the old run.
// Now the new run is refused, naming the files and the flags, and changes no
// file; with -fresh the old files are moved aside (the output says where)
// and -resume auto continues the new run.
func TestNewRunRefusesAnotherRunsFiles(t *testing.T) {
	base, _ := baseRun(t)
	dir := copyRun(t, base)
	trace := filepath.Join(dir, "trace.h5")
	old, err := runs.ReadTrace(trace)
	require.NoError(t, err)
	before := hashTree(t, dir)
	args := append(slices.Clone(small), "-mode", "ht", "-steps", "20", "-ckpt-every", "10", "-ckpt-dir", dir, "-trace", trace)

	out, err := mpirun(t, 2, 2*time.Minute, args...)
	require.Error(t, err, "%s", out)
	for _, s := range []string{"refusing to start a new run", "run " + old.RunID, trace, "3 checkpoints", "-fresh", "-resume auto"} {
		assert.Contains(t, out, s)
	}
	assert.Equal(t, 1, strings.Count(out, "refusing"), "rank 0 reports it once:\n%s", out)
	assert.NotContains(t, out, "MPI_ABORT")
	assert.Equal(t, before, hashTree(t, dir), "the refused run changed files")

	out, err = mpirun(t, 2, 2*time.Minute, append(args, "-fresh")...)
	require.NoError(t, err, "%s", out)
	assert.Contains(t, out, "moved 4 file(s) of run "+old.RunID+" to "+filepath.Join(dir, "moved-aside"))
	aside, err := filepath.Glob(filepath.Join(dir, "moved-aside", "*"))
	require.NoError(t, err)
	require.Len(t, aside, 1)
	assert.Equal(t, before, hashTree(t, aside[0]), "every file of the old run, unchanged, aside")
	newID := h5attr(t, trace, "/run_id")
	assert.NotEqual(t, old.RunID, newID)

	out, err = mpirun(t, 2, 2*time.Minute, append(args, "-steps", "30", "-resume", "auto")...)
	require.NoError(t, err, "%s", out)
	assert.Contains(t, out, "run "+newID+": resuming (newest checkpoint) from "+runs.CheckpointPath(dir, 20))
	assert.Equal(t, newID, h5attr(t, runs.CheckpointPath(dir, 30), "/run_id"))
	tr, err := runs.ReadTrace(trace)
	require.NoError(t, err)
	assert.Len(t, tr.Step, 30)
	assert.Len(t, tr.Segments, 2)

	out, err = mpirun(t, 2, 2*time.Minute, append(args, "-steps", "30", "-resume", "auto")...)
	require.NoError(t, err, "%s", out)
	assert.Contains(t, out, "nothing to do")
	assert.NotContains(t, out, "done:")
}

// elasticTolerances bound, for TestElasticResume, the relative difference
// between the loss of a step of a run resumed on another number of ranks
// (with the same global batch) and that of the uninterrupted run, over the
// steps after the resume, by mode and element type; and the relative
// difference of their mean losses over those steps. docs/trace-schema.md
// gives the measurements and how they were made.
var elasticTolerances = map[string]struct{ step, mean float64 }{
	"ll/f32":  {1e-12, 1e-12},
	"ll/bf16": {1e-12, 1e-12},
	"ht/f32":  {1e-6, 1e-6},
	"ht/bf16": {1e-3, 1e-4},
}

// The third failure: a checkpoint of 4 ranks was refused on 2 or 8.
// Now a run of 4 ranks to step K, resumed on 2 ranks to 2K and then on 8
// (2 simulated nodes) to 3K, with tokens per rank scaled to keep 64 tokens
// per step, trains on the same tokens as an uninterrupted 4-rank run and
// follows its loss within elasticTolerances; its one trace records the three
// segments, with per-rank tables 8 wide. A resume that changes tokens x
// ranks, the mode and the element type says so. K is 20; GOEP_ELASTIC_STEPS
// sets it, and GOEP_ELASTIC_CONFIGS the configurations (default
// "ll/f32 ht/bf16"), to measure the tolerances over longer runs.
func TestElasticResume(t *testing.T) {
	K := 20
	if s := os.Getenv("GOEP_ELASTIC_STEPS"); s != "" {
		var err error
		K, err = strconv.Atoi(s)
		require.NoError(t, err, "GOEP_ELASTIC_STEPS")
	}
	configs := strings.Fields(os.Getenv("GOEP_ELASTIC_CONFIGS"))
	if len(configs) == 0 {
		configs = []string{"ll/f32", "ht/bf16"}
	}
	for _, c := range configs {
		mode, dtype, _ := strings.Cut(c, "/")
		tol, ok := elasticTolerances[c]
		require.True(t, ok, "GOEP_ELASTIC_CONFIGS: %q is not one of ll/f32 ll/bf16 ht/f32 ht/bf16", c)
		t.Run(mode+"-"+dtype, func(t *testing.T) { elasticResume(t, K, mode, dtype, tol.step, tol.mean) })
	}
}

func elasticResume(t *testing.T, K int, mode, dtype string, stepTol, meanTol float64) {
	limit := time.Duration(K/10+2) * time.Minute
	model := []string{"-experts", "8", "-topk", "2", "-hidden", "16", "-ffn", "32", "-timeout", "60s", "-mode", mode, "-dtype", dtype,
		"-ckpt-every", strconv.Itoa(K), "-progress-every", "0"}
	step := func(n int) string { return strconv.Itoa(n) }

	ref := t.TempDir()
	out, err := mpirun(t, 4, limit, append(slices.Clone(model), "-tokens", "16", "-steps", step(3*K), "-ckpt-dir", ref, "-trace", filepath.Join(ref, "trace.h5"))...)
	require.NoError(t, err, "%s", out)

	dir := t.TempDir()
	trace := filepath.Join(dir, "trace.h5")
	files := []string{"-ckpt-dir", dir, "-trace", trace}
	out, err = mpirun(t, 4, limit, append(append(slices.Clone(model), files...), "-tokens", "16", "-steps", step(K))...)
	require.NoError(t, err, "%s", out)
	out, err = mpirun(t, 2, limit, append(append(slices.Clone(model), files...), "-tokens", "32", "-steps", step(2*K), "-resume", "auto")...)
	require.NoError(t, err, "%s", out)
	assert.Contains(t, out, "world size = 4 ranks in the checkpoint, 2 in this run")
	assert.Contains(t, out, "tokens per rank = 16 in the checkpoint, 32 in this run; the global batch is 64 tokens per step in both")
	assert.NotContains(t, out, "global batch changed")
	out, err = mpirunSim(t, 8, 4, limit, append(append(slices.Clone(model), files...), "-tokens", "8", "-steps", step(3*K), "-resume", "auto")...)
	require.NoError(t, err, "%s", out)
	assert.Contains(t, out, "8 ranks on 2 node(s)")
	assert.Contains(t, out, "world size = 2 ranks in the checkpoint, 8 in this run")

	want, err := runs.ReadTrace(filepath.Join(ref, "trace.h5"))
	require.NoError(t, err)
	got, err := runs.ReadTrace(trace)
	require.NoError(t, err)
	require.Len(t, got.Step, 3*K)
	assert.Equal(t, want.Loss[:K], got.Loss[:K], "the first segment is the reference's, bit for bit")
	for seg, ranks := range map[int]int{1: 2, 2: 8} {
		worst, at := 0.0, 0
		var sumGot, sumWant float64
		for i := seg * K; i < (seg+1)*K; i++ {
			if d := math.Abs(got.Loss[i]-want.Loss[i]) / want.Loss[i]; d > worst || math.IsNaN(d) {
				worst, at = d, i+1
			}
			sumGot, sumWant = sumGot+got.Loss[i], sumWant+want.Loss[i]
		}
		mean := math.Abs(sumGot-sumWant) / sumWant
		t.Logf("%s/%s, resumed on %d ranks, steps %d-%d, against the uninterrupted 4-rank run: largest relative loss difference %.3g (step %d, loss %.6f), of the mean loss %.3g",
			mode, dtype, ranks, seg*K+1, (seg+1)*K, worst, at, want.Loss[at-1], mean)
		assert.LessOrEqual(t, worst, stepTol, "segment on %d ranks: a step's loss", ranks)
		assert.LessOrEqual(t, mean, meanTol, "segment on %d ranks: the mean loss", ranks)
	}
	a, err := runs.ReadCheckpoint(runs.CheckpointPath(ref, int64(3*K)))
	require.NoError(t, err)
	b, err := runs.ReadCheckpoint(runs.CheckpointPath(dir, int64(3*K)))
	require.NoError(t, err)
	t.Logf("final parameters: relative difference %.3g (gate), %.3g (w1), %.3g (w2)",
		relDiff(a.Model.Gate, b.Model.Gate), relDiff(a.Model.W1, b.Model.W1), relDiff(a.Model.W2, b.Model.W2))
	assert.NotEqual(t, a.RunID, b.RunID, "two runs")
	assert.Equal(t, got.RunID, b.RunID)
	assert.Equal(t, 8, b.WorldSize)

	// One trace, three segments; per-rank tables as wide as the largest.
	require.Len(t, got.Segments, 3)
	for i, w := range []struct{ ranks, nodes, tokens int }{{4, 1, 16}, {2, 1, 32}, {8, 2, 8}} {
		s := got.Segments[i]
		assert.Equal(t, w.ranks, s.WorldSize, "segment %d", i)
		assert.Equal(t, w.nodes, s.Nodes, "segment %d", i)
		assert.Equal(t, w.tokens, s.Tokens, "segment %d", i)
		assert.Equal(t, int64(i*K), s.StartStep, "segment %d", i)
	}
	assert.Equal(t, 8, got.RankColumns)
	assert.Equal(t, "8", h5attr(t, trace, "/rank_columns"))
	assert.Equal(t, "2", h5attr(t, trace, "/segments/0002/nodes"))
	first, last := got.DispatchUS[:8], got.DispatchUS[(3*K-1)*8:]
	for r := 0; r < 8; r++ {
		assert.Equal(t, r >= 4, math.IsNaN(first[r]), "step 1, rank column %d: %v", r, first[r])
		assert.Positive(t, last[r], "step %d, rank %d", 3*K, r)
	}
	assert.Equal(t, int64(-1), got.BytesSent[K*8+2], "step %d ran on 2 ranks: column 2 is -1", K+1)

	// Another global batch, mode and element type: allowed, and said.
	other := t.TempDir()
	out, err = mpirun(t, 2, limit, append(slices.Clone(model), "-tokens", "16", "-mode", "ll", "-dtype", "f32", "-steps", step(K+2),
		"-resume", runs.CheckpointPath(ref, int64(K)), "-ckpt-dir", other, "-trace", filepath.Join(other, "trace.h5"))...)
	require.NoError(t, err, "%s", out)
	assert.Contains(t, out, "the global batch changed: 4 ranks x 16 tokens = 64 tokens per step in the checkpoint, 2 x 16 = 32 in this run")
	if mode != "ll" {
		assert.Contains(t, out, "mode = "+mode+" in the checkpoint, ll in this run")
	}
	if dtype != "f32" {
		assert.Contains(t, out, "dtype = "+dtype+" in the checkpoint, f32 in this run")
	}
	assert.Contains(t, out, "no trace at "+filepath.Join(other, "trace.h5"))
}

// relDiff is |a - b| / |a| (Euclidean norms).
func relDiff(a, b []float64) float64 {
	var d, n float64
	for i := range a {
		d += (a[i] - b[i]) * (a[i] - b[i])
		n += a[i] * a[i]
	}
	return math.Sqrt(d / n)
}
