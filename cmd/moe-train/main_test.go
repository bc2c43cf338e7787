package main

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goep/goep/internal/mpitesting"
	"github.com/goep/goep/moe"
	"github.com/goep/goep/moe/runs"
)

var (
	buildOnce sync.Once
	binPath   string
	buildErr  error
	buildOut  []byte
)

// buildMPI builds this command with the mpi tag, once per test binary.
func buildMPI(t *testing.T) string {
	t.Helper()
	mpitesting.RequireTool(t, "mpirun", "pkg-config", "h5dump", "h5ls")
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "moe-train-test-")
		if err != nil {
			buildErr = err
			return
		}
		binPath = filepath.Join(dir, "moe-train")
		buildOut, buildErr = exec.Command("go", "build", "-tags", "mpi", "-o", binPath, ".").CombinedOutput()
	})
	require.NoError(t, buildErr, "go build -tags mpi: %s", buildOut)
	return binPath
}

func TestMain(m *testing.M) {
	code := m.Run()
	if binPath != "" {
		os.RemoveAll(filepath.Dir(binPath))
	}
	if base.dir != "" {
		os.RemoveAll(base.dir)
	}
	os.Exit(code)
}

// small are the flags of a tiny, fast model.
var small = []string{"-experts", "8", "-topk", "2", "-hidden", "16", "-ffn", "32", "-tokens", "32", "-timeout", "30s"}

// mpirun runs the program on np ranks and returns its combined output and
// error; it fails the test if mpirun has not ended within limit.
func mpirun(t *testing.T, np int, limit time.Duration, args ...string) (string, error) {
	t.Helper()
	return mpirunSim(t, np, 0, limit, args...)
}

// mpirunEnv is mpirun with the variables vars of this process's
// environment passed to the ranks (-x).
func mpirunEnv(t *testing.T, np int, limit time.Duration, vars []string, args ...string) (string, error) {
	t.Helper()
	var env []string
	for _, v := range vars {
		env = append(env, v+"="+os.Getenv(v))
	}
	return mpirunWith(t, np, 0, limit, vars, env, args...)
}

// mpirunSim is mpirun with simulated nodes of perNode ranks
// (GOEP_RANKS_PER_NODE; 0: none).
func mpirunSim(t *testing.T, np, perNode int, limit time.Duration, args ...string) (string, error) {
	t.Helper()
	return mpirunWith(t, np, perNode, limit, nil, nil, args...)
}

// mpirunWith is mpirunSim passing the variables vars, set to env, to the
// ranks.
func mpirunWith(t *testing.T, np, perNode int, limit time.Duration, vars, extra []string, args ...string) (string, error) {
	t.Helper()
	bin := buildMPI(t)
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	launch := mpitesting.MPIRunArgs(np)
	env := append(mpitesting.LauncherFreeEnv(), extra...)
	for _, v := range vars {
		launch = append(launch, "-x", v)
	}
	if perNode > 0 {
		launch = append(launch, "-x", "GOEP_RANKS_PER_NODE")
		env = append(env, "GOEP_RANKS_PER_NODE="+strconv.Itoa(perNode))
	}
	cmd := exec.CommandContext(ctx, "mpirun", append(append(launch, bin), args...)...)
	cmd.Env = env
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	out, err := cmd.CombinedOutput()
	require.NoError(t, ctx.Err(), "mpirun did not end within %v:\n%s", limit, out)
	return string(out), err
}

// base is a 2-rank HT run of 30 steps with checkpoints at 10, 20 and 30,
// shared by several tests; TestMain removes its directory.
var base struct {
	once sync.Once
	dir  string
	out  string
	err  error
}

func baseRun(t *testing.T) (dir, out string) {
	t.Helper()
	buildMPI(t)
	base.once.Do(func() {
		base.dir, base.err = os.MkdirTemp("", "moe-train-base-")
		if base.err != nil {
			return
		}
		base.out, base.err = mpirun(t, 2, 2*time.Minute, append(slices.Clone(small), "-mode", "ht", "-steps", "30",
			"-ckpt-every", "10", "-ckpt-dir", base.dir, "-trace", filepath.Join(base.dir, "trace.h5"), "-progress-every", "10")...)
	})
	require.NoError(t, base.err, "%s", base.out)
	return base.dir, base.out
}

func TestTrainWritesTraceAndCheckpoints(t *testing.T) {
	dir, out := baseRun(t)
	// Under mpirun with its output in a pipe, progress comes as lines.
	assert.NotContains(t, out, "\r")
	for _, s := range []string{"step 10/30 loss", "step 20/30 loss", "step 30/30 loss", "tok/s", "dispatch", "combine", "ETA"} {
		assert.Contains(t, out, s)
	}
	assert.Regexp(t, `loss\s+\d\.\d+ -> \d\.\d+ \(\d+\.\dx lower\)`, out)
	assert.Regexp(t, `speed\s+[0-9.]+k? tokens/s`, out)
	assert.Contains(t, out, filepath.Join(dir, "trace.h5"))
	assert.Contains(t, out, "checkpoints 3: "+filepath.Join(dir, "ckpt-000010.h5")+" ... "+filepath.Join(dir, "ckpt-000030.h5"))
	for _, step := range []int{10, 20, 30} {
		assert.FileExists(t, runs.CheckpointPath(dir, int64(step)))
	}

	trace := filepath.Join(dir, "trace.h5")
	ls, err := exec.Command("h5ls", "-r", trace).CombinedOutput()
	require.NoError(t, err, "%s", ls)
	for _, s := range []string{`/trace/loss\s+Dataset \{30/Inf\}`, `/trace/tokens_per_expert\s+Dataset \{30/Inf, 8\}`,
		`/trace/dispatch_us\s+Dataset \{30/Inf, 2\}`, `/trace/bytes_sent\s+Dataset \{30/Inf, 2\}`} {
		assert.Regexp(t, s, string(ls))
	}
	dump, err := exec.Command("h5dump", "-A", trace).CombinedOutput()
	require.NoError(t, err, "%s", dump)
	for _, s := range []string{`ATTRIBUTE "world_size"`, `ATTRIBUTE "nodes"`, `"ht"`, `"f32"`, `ATTRIBUTE "start_time"`, `ATTRIBUTE "version"`} {
		assert.Contains(t, string(dump), s)
	}
	tr, err := runs.ReadTrace(trace)
	require.NoError(t, err)
	assert.Len(t, tr.Loss, 30)
	assert.Equal(t, 2, tr.WorldSize)
	assert.Less(t, tr.Loss[29], tr.Loss[0])

	ck := runs.CheckpointPath(dir, 30)
	dump, err = exec.Command("h5dump", "-H", ck).CombinedOutput()
	require.NoError(t, err, "%s", dump)
	assert.Contains(t, string(dump), `DATASET "w1"`)
	c, err := runs.ReadCheckpoint(ck)
	require.NoError(t, err)
	assert.Equal(t, int64(30), c.Step)
	assert.Len(t, c.Model.W1, 8*16*32)
}

// Run 30 steps, or resume at step 10 and run to 30: the final checkpoints are
// bit-identical, and so are the losses.
func TestResumeIsBitIdentical(t *testing.T) {
	dir, _ := baseRun(t)
	b := t.TempDir()
	out, err := mpirun(t, 2, 2*time.Minute, append(slices.Clone(small), "-mode", "ht", "-steps", "30", "-ckpt-every", "10",
		"-ckpt-dir", b, "-trace", filepath.Join(b, "trace.h5"), "-resume", runs.CheckpointPath(dir, 10), "-progress", "bar")...)
	require.NoError(t, err, "%s", out)
	assert.Contains(t, out, "\rstep", "-progress bar draws a live line")
	assert.Regexp(t, `done: run \S+, steps 11\.\.30`, out)
	a, err := runs.ReadCheckpoint(runs.CheckpointPath(dir, 30))
	require.NoError(t, err)
	c, err := runs.ReadCheckpoint(runs.CheckpointPath(b, 30))
	require.NoError(t, err)
	assert.Equal(t, a.Model, c.Model, "final model")
	assert.Equal(t, a.AdamM, c.AdamM, "final Adam moments")
	assert.Equal(t, a.AdamV, c.AdamV, "final Adam moments")
	ta, err := runs.ReadTrace(filepath.Join(dir, "trace.h5"))
	require.NoError(t, err)
	tb, err := runs.ReadTrace(filepath.Join(b, "trace.h5"))
	require.NoError(t, err)
	assert.Equal(t, ta.Loss[10:], tb.Loss)
	assert.NoFileExists(t, runs.CheckpointPath(b, 10), "no checkpoint for steps before the resume")
}

// A checkpoint of another model or training configuration is refused,
// naming each field and both values, once, and the job ends normally; a
// damaged one too. (The number of ranks, the mode and the element type may
// change: TestElasticResume.)
func TestResumeMismatchIsRefused(t *testing.T) {
	dir, _ := baseRun(t)
	ck := runs.CheckpointPath(dir, 20)
	b := t.TempDir()
	common := []string{"-mode", "ht", "-steps", "40", "-ckpt-dir", b, "-trace", "", "-resume", ck}

	out, err := mpirun(t, 4, 2*time.Minute, append(append(slices.Clone(small), common...), "-hidden", "8", "-lr", "0.5", "-dtype", "bf16")...)
	require.Error(t, err, "%s", out)
	assert.Contains(t, out, "hidden = 16 in the checkpoint, 8 in this run")
	assert.Contains(t, out, "lr = 0.01 in the checkpoint, 0.5 in this run")
	assert.Contains(t, out, ck)
	assert.NotContains(t, out, "dtype =", "the element type may change")
	assert.Equal(t, 1, strings.Count(out, "cannot resume"), "rank 0 reports it once:\n%s", out)
	assert.NotContains(t, out, "MPI_ABORT", "a refusal on every rank ends the job normally")
	entries, err := os.ReadDir(b)
	require.NoError(t, err)
	assert.Empty(t, entries, "a refused run writes nothing")

	bad := filepath.Join(b, "truncated.h5")
	data, err := os.ReadFile(ck)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(bad, data[:len(data)/3], 0o644))
	out, err = mpirun(t, 2, 2*time.Minute, append(slices.Clone(small), "-mode", "ht", "-steps", "40", "-ckpt-dir", b, "-trace", "", "-resume", bad)...)
	require.Error(t, err, "%s", out)
	assert.Contains(t, out, bad+" is not a usable checkpoint: not an HDF5 file, or truncated or corrupt")
}

// SIGKILL to one rank: mpirun ends with an error instead of hanging, and the
// last checkpoint and the trace are readable by h5dump and by package moe.
func TestKilledRank(t *testing.T) {
	bin := buildMPI(t)
	dir := t.TempDir()
	pids := filepath.Join(dir, "pids")
	args := append(append(mpitesting.MPIRunArgs(2), "-x", "GOEP_MOE_PID_DIR", bin), small...)
	args = append(args, "-steps", "10000000", "-ckpt-every", "20", "-ckpt-dir", dir, "-trace", filepath.Join(dir, "trace.h5"), "-progress-every", "0")
	cmd := exec.Command("mpirun", args...)
	cmd.Env = append(mpitesting.LauncherFreeEnv(), "GOEP_MOE_PID_DIR="+pids)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	require.NoError(t, cmd.Start())
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	rankPIDs := func() []int {
		var ps []int
		for r := 0; r < 2; r++ {
			b, err := os.ReadFile(filepath.Join(pids, "rank-"+strconv.Itoa(r)+".pid"))
			if p, perr := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && perr == nil {
				ps = append(ps, p)
			}
		}
		return ps
	}
	t.Cleanup(func() { // whatever happens, leave no process behind
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		for _, p := range rankPIDs() {
			syscall.Kill(p, syscall.SIGKILL)
		}
	})

	// Wait for a checkpoint (WriteAtomic renames whole files into place).
	deadline := time.Now().Add(90 * time.Second)
	var ckpts []string
	for len(ckpts) == 0 || len(rankPIDs()) < 2 {
		select {
		case err := <-done:
			t.Fatalf("mpirun ended before the kill: %v\n%s", err, out.String())
		default:
		}
		require.True(t, time.Now().Before(deadline), "no checkpoint after 90 s:\n%s", out.String())
		time.Sleep(50 * time.Millisecond)
		ckpts, _ = filepath.Glob(filepath.Join(dir, "ckpt-*.h5"))
	}
	victim := rankPIDs()[1]
	require.NoError(t, syscall.Kill(victim, syscall.SIGKILL))
	killed := time.Now()
	select {
	case err := <-done:
		require.Error(t, err, "mpirun must report the killed rank:\n%s", out.String())
		t.Logf("mpirun ended %.1fs after the kill: %v", time.Since(killed).Seconds(), err)
	case <-time.After(60 * time.Second):
		t.Fatalf("mpirun still running 60 s after rank 1 (pid %d) was killed:\n%s", victim, out.String())
	}

	ckpts, _ = filepath.Glob(filepath.Join(dir, "ckpt-*.h5"))
	slices.Sort(ckpts)
	last := ckpts[len(ckpts)-1]
	for _, f := range []string{last, filepath.Join(dir, "trace.h5")} {
		dump, err := exec.Command("h5dump", "-H", f).CombinedOutput()
		require.NoError(t, err, "h5dump -H %s:\n%s", f, dump)
	}
	c, err := runs.ReadCheckpoint(last)
	require.NoError(t, err)
	assert.Zero(t, c.Step%20)
	assert.Equal(t, 2, c.WorldSize)
	tr, err := runs.ReadTrace(filepath.Join(dir, "trace.h5"))
	require.NoError(t, err)
	assert.GreaterOrEqual(t, int64(len(tr.Step)), c.Step, "the trace was flushed at least up to the last checkpoint")
	t.Logf("last checkpoint at step %d, trace has %d rows", c.Step, len(tr.Step))
}

func TestBadFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-mode", "fast"}, `-mode "fast": want ll or ht`},
		{[]string{"-dtype", "fp4"}, `-dtype "fp4": want f32, bf16 or fp8`},
		{[]string{"-act", "relu"}, `-act "relu": want silu or gelu`},
		{[]string{"-hidden", "0"}, `-hidden 0: want a positive integer`},
		{[]string{"-topk", "9"}, `-topk 9: more than the 8 experts`},
		{[]string{"-steps", "-5"}, `-steps -5: want a positive integer`},
		{[]string{"-lr", "0"}, `-lr 0: want 0 < lr <= 1`},
		{[]string{"-ckpt-every", "-1"}, `-ckpt-every -1`},
		{[]string{"-progress", "fancy"}, `-progress "fancy": want auto, bar or lines`},
		{[]string{"-tokens", "many"}, `invalid value "many" for flag -tokens`},
		{[]string{"extra"}, `unexpected argument "extra"`},
		{[]string{"-fresh", "-resume", "auto"}, `-fresh starts a new run and -resume "auto" continues one`},
		{[]string{"-resume", "auto", "-ckpt-dir", ""}, `-resume auto looks for checkpoints in -ckpt-dir`},
		{[]string{"-shared-ffn", "-4"}, `-shared-ffn -4: want 0 (no shared expert) or a positive integer`},
		{[]string{"-grad-sync", "qsgd"}, `-grad-sync "qsgd": want allreduce, a2sgd or topk:K`},
		{[]string{"-grad-sync", "topk:0"}, `-grad-sync "topk:0": want allreduce, a2sgd or topk:K (K a positive integer)`},
		{[]string{"-device", "tpu"}, `-device: ep: backend "tpu" is not registered: want one of alltoallv, alltoallv-blocking, cpu, cpu-onesided, gpu:cuda, gpu:cuda+ipc, gpu:emulated, gpu:emulated+ipc`},
		{[]string{"-device", "cuda,devices=2"}, `-device: ep: backend "cuda,devices=2": gpu:cuda does not take option(s) devices: it takes only device`},
		{[]string{"-device", "emulate", "-dtype", "fp8"}, `-dtype fp8 -device emulate: backend gpu:emulated has no FP8 dispatch (ep.FeatureFP8Wire); use -dtype f32 or bf16 there, or -device cpu`},
		{[]string{"-device", "cuda", "-dtype", "fp8"}, `-dtype fp8 -device cuda: backend gpu:cuda has no FP8 dispatch`},
		{[]string{"-grad-sync", "topk:300", "-hidden", "4", "-experts", "8", "-shared-ffn", "4"},
			`-grad-sync topk:300: K = 300 is more than the 72 data-parallel parameters (gate 4x8, shared expert of -shared-ffn 4)`},
	} {
		var stdout, stderr bytes.Buffer
		code := run(&stdout, &stderr, tc.args)
		assert.Equal(t, 2, code, "%v", tc.args)
		assert.Contains(t, stderr.String(), tc.want, "%v", tc.args)
	}
	var stdout, stderr bytes.Buffer
	assert.Equal(t, 0, run(&stdout, &stderr, []string{"-h"}))
	assert.Contains(t, stderr.String(), "usage: mpirun -np N moe-train")
	assert.Contains(t, stderr.String(), "-ckpt-every")
	assert.Contains(t, stderr.String(), "-grad-sync")
	assert.Contains(t, stderr.String(), "-device")
}

// Each grad sync trains a model with a shared expert under mpirun at 2 and
// 4 ranks: the loss falls, the summary and the trace give the sync's bytes
// per rank per step, as SyncStats counts them.
func TestGradSyncTrains(t *testing.T) {
	buildMPI(t)
	// 16x8 gate + a shared expert 16 -> 24 -> 16: 128 + 2*16*24 + 24 + 16 = 936 parameters
	const n = 936
	for _, np := range []int{2, 4} {
		for _, gs := range []string{"allreduce", "a2sgd", "topk:40"} {
			t.Run(fmt.Sprintf("%d-ranks-%s", np, gs), func(t *testing.T) {
				dir := t.TempDir()
				trace := filepath.Join(dir, "trace.h5")
				out, err := mpirun(t, np, 2*time.Minute, append(slices.Clone(small), "-shared-ffn", "24", "-grad-sync", gs,
					"-steps", "80", "-ckpt-every", "0", "-ckpt-dir", dir, "-trace", trace, "-progress-every", "40")...)
				require.NoError(t, err, "%s", out)
				assert.Contains(t, out, fmt.Sprintf("shared ffn 24, grad sync %s (%d data-parallel parameters)", gs, n))
				want := map[string]int64{"allreduce": 2 * int64(np-1) * 8 * n / int64(np), "a2sgd": 2 * int64(np-1) * 16 / int64(np),
					"topk:40": int64(np-1) * 12 * 40}[gs]
				assert.Contains(t, out, "sync      "+gs+": ")
				assert.Contains(t, out, " and "+bytesText(want)+" sent per rank per step")
				tr, err := runs.ReadTrace(trace)
				require.NoError(t, err)
				require.Len(t, tr.Loss, 80)
				assert.Equal(t, gs, tr.Config.GradSync.String())
				assert.Equal(t, 24, tr.Config.SharedFFN)
				for i, b := range tr.SyncBytes {
					require.Equal(t, want, b, "sync_bytes[%d][%d]", i/np, i%np)
				}
				first, last := tr.Loss[0], 0.0
				for _, l := range tr.Loss[70:] {
					last += l / 10
				}
				t.Logf("loss %.3f -> %.3f over the last 10 steps", first, last)
				assert.Less(t, 2*last, first, "the loss halves within 80 steps")
			})
		}
	}
}

// The summary's numbers are parsed back: the loss fell.
func TestSummaryLossFalls(t *testing.T) {
	_, out := baseRun(t)
	m := regexp.MustCompile(`loss\s+(\d\.\d+) -> (\d\.\d+)`).FindStringSubmatch(out)
	require.NotNil(t, m, out)
	first, _ := strconv.ParseFloat(m[1], 64)
	last, _ := strconv.ParseFloat(m[2], 64)
	assert.Less(t, last, first)
}

// -dtype fp8 trains: bf16 tokens dispatched in FP8 (with its cross-node
// path on simulated nodes), the loss falls, and the trace records the dtype.
func TestFP8Trains(t *testing.T) {
	for _, tc := range []struct {
		mode        string
		np, perNode int
	}{{"ll", 2, 0}, {"ht", 4, 2}} {
		t.Run(tc.mode, func(t *testing.T) {
			dir := t.TempDir()
			trace := filepath.Join(dir, "trace.h5")
			out, err := mpirunSim(t, tc.np, tc.perNode, 2*time.Minute, append(slices.Clone(small), "-mode", tc.mode,
				"-dtype", "fp8", "-steps", "60", "-progress-every", "20", "-trace", trace, "-ckpt-dir", dir)...)
			require.NoError(t, err, "%s", out)
			m := regexp.MustCompile(`loss\s+(\d\.\d+) -> (\d\.\d+)`).FindStringSubmatch(out)
			require.NotNil(t, m, out)
			first, _ := strconv.ParseFloat(m[1], 64)
			last, _ := strconv.ParseFloat(m[2], 64)
			assert.Less(t, 1.5*last, first, "the loss falls in FP8 as in the other modes:\n%s", out)
			tr, err := runs.ReadTrace(trace)
			require.NoError(t, err)
			require.NotEmpty(t, tr.Segments)
			assert.Equal(t, moe.FP8, tr.Segments[0].DType)
		})
	}
}

// A straggler (GOEP_MOE_STRAGGLER: rank 1 sleeps 5 ms between each step's
// forward and backward) is the one the others wait for: the summary names
// it and its host, and the trace's wait matrix, summed over the steps, says
// the same (rank 0 waited for rank 1 more than twice as long as the other
// way round). No bound on the times: the machine may be loaded.
func TestSummaryNamesStraggler(t *testing.T) {
	buildMPI(t)
	dir := t.TempDir()
	trace := filepath.Join(dir, "trace.h5")
	// 25 ms a step: far above what a loaded machine adds to a step (at 5 ms,
	// beside a make test-long, the other rank waited half as long for its
	// peer and the straggler missed the 2x that names it).
	t.Setenv("GOEP_MOE_STRAGGLER", "1:25ms")
	out, err := mpirunEnv(t, 2, 2*time.Minute, []string{"GOEP_MOE_STRAGGLER"},
		append(slices.Clone(small), "-steps", "120", "-ckpt-dir", dir, "-trace", trace, "-progress-every", "0")...)
	require.NoError(t, err, "%s", out)
	t.Logf("summary:\n%s", out)
	host, herr := os.Hostname()
	require.NoError(t, herr)
	assert.Contains(t, out, "waits     slowest rank 1 on host "+host+": the others waited ")

	tr, err := runs.ReadTrace(trace)
	require.NoError(t, err)
	require.Len(t, tr.Step, 120)
	var for1, for0 float64 // rank 0's waits for rank 1, rank 1's for rank 0
	for s := range tr.Step {
		for0 += tr.WaitUS[s*4+1*2+0]
		for1 += tr.WaitUS[s*4+0*2+1]
	}
	assert.Greater(t, for1, 2*for0, "rank 0 waited %.0f us for rank 1, rank 1 %.0f us for rank 0", for1, for0)
	dump, err := exec.Command("h5dump", "-H", "-d", "/trace/wait_us", trace).CombinedOutput()
	require.NoError(t, err, "%s", dump)
	assert.Contains(t, string(dump), "SIMPLE { ( 120, 2, 2 ) / ( H5S_UNLIMITED, 2, 2 ) }")

	t.Setenv("GOEP_MOE_STRAGGLER", "one:5ms")
	out, err = mpirunEnv(t, 2, time.Minute, []string{"GOEP_MOE_STRAGGLER"}, append(slices.Clone(small), "-steps", "1")...)
	require.Error(t, err, "%s", out)
	assert.Contains(t, out, `GOEP_MOE_STRAGGLER="one:5ms": want RANK:DURATION, such as 1:5ms`)
}

// digestLine matches the start-up line of a device: the communicator's
// unique ID made on rank 0 and handed to every rank over MPI, shown by
// its digest (group 1) and first bytes (the emulator's mark).
var digestLine = regexp.MustCompile(`moe-train: device emulate: the GPU engine \(gpu:emulated\), rank 0 on emulated:0, .*communicator's unique ID made on rank 0 \(emulator\.UniqueID\) and handed to the (\d) ranks over MPI \(mpi\.BootstrapID\): ([0-9a-f]{12}) \(sha256; first bytes 67 6f 65 70 65 6d 75 01\), the same on every rank`)

// -device emulate trains through the GPU engine on the emulated device
// with the loss trajectory of -device cpu, bit for bit (the emulated
// engine's results are the CPU engine's): LL bf16 on 2 ranks, HT f32 on 4
// ranks across 2 simulated nodes. The start-up lines show the ID
// exchange, the summary the copies, and the trace records the backend,
// the device and the communicator's ID (h5dump) and the copies of every
// step. (moe's TestEmulatedTrainingMatchesCPU covers 1 to 8 ranks, both
// modes and element types, in process.)
func TestDeviceEmulateMatchesCPU(t *testing.T) {
	for _, tc := range []struct {
		mode, dtype string
		np, perNode int
	}{{"ll", "bf16", 2, 0}, {"ht", "f32", 4, 2}} {
		t.Run(fmt.Sprintf("%s-%s-%d", tc.mode, tc.dtype, tc.np), func(t *testing.T) {
			dir := t.TempDir()
			losses := map[string][]float64{}
			for _, device := range []string{"cpu", "emulate"} {
				out, tr := trainOn(t, dir, tc.np, tc.perNode, 20, "-mode", tc.mode, "-dtype", tc.dtype, "-device", device, "-progress-every", "10")
				losses[device] = tr.Loss
				trace := filepath.Join(dir, device, "trace.h5")
				if device == "cpu" {
					assert.Contains(t, out, "moe-train: device cpu: ep's CPU engine")
					assert.Contains(t, out, "  copies    none: the CPU engine's tensors are host memory")
					assert.Equal(t, "cpu", tr.Device.Backend)
					continue
				}
				m := digestLine.FindStringSubmatch(out)
				require.NotNil(t, m, "no start-up line of the ID exchange:\n%s", out)
				assert.Equal(t, strconv.Itoa(tc.np), m[1])
				assert.Regexp(t, `copies    \d+\.\d host<->emulated:0 copies per rank per step, [0-9.]+ KiB and [0-9.]+ u?m?s`, out)
				assert.Contains(t, out, "-device emulate) in ")
				assert.Equal(t, moe.Device{Backend: "gpu:emulated", Name: "emulated:0", Libraries: tr.Device.Libraries, CommID: m[2]}, tr.Device)
				for i, n := range tr.Copies {
					require.Positive(t, n, "copies[%d][%d]", i/tc.np, i%tc.np)
				}
				dump, err := exec.Command("h5dump", "-a", "/backend", "-a", "/device", "-a", "/comm_id", trace).CombinedOutput()
				require.NoError(t, err, "%s", dump)
				for _, s := range []string{`"gpu:emulated"`, `"emulated:0"`, `"` + m[2] + `"`} {
					assert.Contains(t, string(dump), s)
				}
			}
			requireSameLosses(t, losses, "cpu", "emulate")
		})
	}
}

// -device opens any registered backend: the alltoallv baseline and the CPU
// engine with one-sided puts train on one node with -device cpu's losses,
// bit for bit (the same reductions in the same order), and the trace
// records the backend.
func TestDeviceAnyRegisteredBackend(t *testing.T) {
	dir := t.TempDir()
	losses := map[string][]float64{}
	for _, device := range []string{"cpu", "alltoallv", "cpu-onesided"} {
		out, tr := trainOn(t, dir, 2, 0, 12, "-mode", "ll", "-dtype", "f32", "-device", device, "-progress-every", "0")
		losses[device] = tr.Loss
		assert.Equal(t, device, tr.Device.Backend)
		if device != "cpu" {
			assert.Contains(t, out, "moe-train: device "+device+": backend "+device+", tokens in host memory")
			assert.Contains(t, out, "  copies    none: the tensors of backend "+device+" are host memory")
		}
	}
	requireSameLosses(t, losses, "cpu", "alltoallv", "cpu-onesided")
}

// trainOn runs moe-train for steps steps on np ranks (perNode to a
// simulated node, 0 for one node) with the small model and args, its trace
// and checkpoints in dir/<the -device of args>; its output and trace.
func trainOn(t *testing.T, dir string, np, perNode, steps int, args ...string) (string, *runs.TraceData) {
	t.Helper()
	device := args[slices.Index(args, "-device")+1]
	trace := filepath.Join(dir, device, "trace.h5")
	out, err := mpirunSim(t, np, perNode, 2*time.Minute, append(slices.Concat(small, args),
		"-steps", strconv.Itoa(steps), "-ckpt-every", "0", "-trace", trace, "-ckpt-dir", filepath.Join(dir, device))...)
	require.NoError(t, err, "%s", out)
	tr, err := runs.ReadTrace(trace)
	require.NoError(t, err)
	require.Len(t, tr.Loss, steps)
	return out, tr
}

// requireSameLosses requires the losses of each of the devices others to
// be those of device ref, bit for bit, step by step.
func requireSameLosses(t *testing.T, losses map[string][]float64, ref string, others ...string) {
	t.Helper()
	for _, device := range others {
		require.Len(t, losses[device], len(losses[ref]), device)
		for i := range losses[ref] {
			require.Equal(t, math.Float64bits(losses[ref][i]), math.Float64bits(losses[device][i]),
				"step %d: loss %v on -device %s, %v on -device %s", i+1, losses[ref][i], ref, losses[device][i], device)
		}
	}
}

// A run resumes from a CPU checkpoint onto -device emulate and back: each
// resume says the backend changed, and the run ends, bit for bit, where the
// uninterrupted CPU run does.
func TestResumeAcrossDevices(t *testing.T) {
	dir, _ := baseRun(t)
	b := t.TempDir()
	common := append(slices.Clone(small), "-mode", "ht", "-ckpt-every", "10", "-ckpt-dir", b, "-trace", filepath.Join(b, "trace.h5"))
	out, err := mpirun(t, 2, 2*time.Minute, append(slices.Clone(common), "-device", "emulate", "-steps", "20", "-resume", runs.CheckpointPath(dir, 10))...)
	require.NoError(t, err, "%s", out)
	assert.Contains(t, out, "backend = cpu in the checkpoint, gpu:emulated in this run: a checkpoint is the model, not the device")
	out, err = mpirun(t, 2, 2*time.Minute, append(slices.Clone(common), "-device", "cpu", "-steps", "30", "-resume", "auto")...)
	require.NoError(t, err, "%s", out)
	assert.Contains(t, out, "backend = gpu:emulated in the checkpoint, cpu in this run: a checkpoint is the model, not the device")
	want, err := runs.ReadCheckpoint(runs.CheckpointPath(dir, 30))
	require.NoError(t, err)
	got, err := runs.ReadCheckpoint(runs.CheckpointPath(b, 30))
	require.NoError(t, err)
	assert.Equal(t, want.Model, got.Model, "final model")
	assert.Equal(t, want.AdamM, got.AdamM, "final Adam moments")
	assert.Equal(t, want.AdamV, got.AdamV, "final Adam moments")
	mid, err := runs.ReadCheckpointInfo(runs.CheckpointPath(b, 20))
	require.NoError(t, err)
	assert.Equal(t, "gpu:emulated", mid.Device.Backend)
	ta, err := runs.ReadTrace(filepath.Join(dir, "trace.h5"))
	require.NoError(t, err)
	tb, err := runs.ReadTrace(filepath.Join(b, "trace.h5"))
	require.NoError(t, err)
	assert.Equal(t, ta.Loss[10:], tb.Loss)
	require.Len(t, tb.Segments, 2)
	assert.Equal(t, []string{"gpu:emulated", "cpu"}, []string{tb.Segments[0].Device.Backend, tb.Segments[1].Device.Backend})
}

// -device cuda where the CUDA driver and NCCL are missing (forced here by
// pointing their variables at nothing, so that the test means the same on
// a GPU machine) is refused before anything is written: one line, from
// rank 0, naming the rank and what it lacks; every rank exits with an
// error, and the job ends without MPI_Abort.
func TestDeviceCUDARefused(t *testing.T) {
	buildMPI(t)
	dir := filepath.Join(t.TempDir(), "out")
	vars := []string{"GOEP_CUDA_LIB", "GOEP_NCCL_LIB"}
	env := []string{"GOEP_CUDA_LIB=/nonexistent/libcuda.so.1", "GOEP_NCCL_LIB=/nonexistent/libnccl.so.2"}
	out, err := mpirunWith(t, 2, 0, time.Minute, vars, env, append(slices.Clone(small), "-device", "cuda", "-steps", "10",
		"-trace", filepath.Join(dir, "trace.h5"), "-ckpt-dir", dir)...)
	require.Error(t, err, "%s", out)
	var lines []string
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "moe-train") {
			lines = append(lines, l)
		}
	}
	require.Len(t, lines, 1, "one line:\n%s", out)
	assert.Contains(t, lines[0], "moe-train: -device cuda: epgpu: Bootstrap: gpu:cuda: rank 0: this rank cannot run the CUDA backend (it lacks the CUDA driver and NCCL): ")
	assert.Contains(t, lines[0], "/nonexistent/libcuda.so.1")
	assert.Contains(t, lines[0], "GOEP_NCCL_LIB")
	assert.NotContains(t, out, "MPI_ABORT", "a refusal on every rank ends the job normally")
	assert.NoDirExists(t, dir, "nothing is written")
}
