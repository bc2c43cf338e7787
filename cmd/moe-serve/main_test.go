package main

import (
	"bytes"
	"context"
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

	"github.com/goep/goep/ep"
	"github.com/goep/goep/internal/mpitesting"
	"github.com/goep/goep/moe"
	"github.com/goep/goep/moe/runs"
	"github.com/goep/goep/moe/serve"
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
	mpitesting.RequireTool(t, "mpirun", "pkg-config", "h5dump")
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "moe-serve-test-")
		if err != nil {
			buildErr = err
			return
		}
		binPath = filepath.Join(dir, "moe-serve")
		buildOut, buildErr = exec.Command("go", "build", "-tags", "mpi faultinject", "-o", binPath, ".").CombinedOutput()
	})
	require.NoError(t, buildErr, "go build -tags mpi: %s", buildOut)
	return binPath
}

func TestMain(m *testing.M) {
	code := m.Run()
	if binPath != "" {
		os.RemoveAll(filepath.Dir(binPath))
	}
	os.Exit(code)
}

// small are the flags of a tiny model and a short stream.
var small = []string{"-layers", "2", "-vocab", "64", "-hidden", "16", "-ffn", "24", "-experts", "8", "-topk", "2",
	"-requests", "24", "-rate", "0", "-prompt", "2:20", "-gen", "2:10", "-batch", "4", "-prefill-tokens", "8", "-timeout", "30s"}

// mpirun runs the program on np ranks (perNode > 0: simulated nodes of
// that many ranks), with env added to the ranks' environment, and returns
// its combined output and error; it fails the test if mpirun has not
// ended within limit.
func mpirun(t *testing.T, np, perNode int, env []string, limit time.Duration, args ...string) (string, error) {
	t.Helper()
	cmd, out := start(t, np, perNode, env, args...)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		return out.String(), err
	case <-time.After(limit):
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-done
		t.Fatalf("mpirun did not end within %v:\n%s", limit, out.String())
		return "", nil
	}
}

// start starts mpirun as mpirun does, in a process group of its own.
func start(t *testing.T, np, perNode int, env []string, args ...string) (*exec.Cmd, *bytes.Buffer) {
	t.Helper()
	bin := buildMPI(t)
	launch := mpitesting.MPIRunArgs(np)
	full := mpitesting.LauncherFreeEnv()
	if perNode > 0 {
		env = append(env, "GOEP_RANKS_PER_NODE="+strconv.Itoa(perNode))
	}
	for _, kv := range env {
		name, _, _ := strings.Cut(kv, "=")
		launch = append(launch, "-x", name)
		full = append(full, kv)
	}
	cmd := exec.CommandContext(context.Background(), "mpirun", append(append(launch, bin), args...)...)
	cmd.Env = full
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) })
	return cmd, &out
}

func args(extra ...string) []string { return append(slices.Clone(small), extra...) }

// The program serves every request and says how it went: the summary's
// figures, and a trace that h5dump and serve.ReadTrace read, whose tokens
// are those the reference decoder gives each request alone.
func TestServeSummaryAndTrace(t *testing.T) {
	dir := t.TempDir()
	trace := filepath.Join(dir, "serve.h5")
	out, err := mpirun(t, 2, 0, nil, 2*time.Minute, args("-trace", trace, "-shared-ffn", "8")...)
	require.NoError(t, err, "%s", out)
	t.Logf("%s", out)
	for _, re := range []string{
		`moe-serve: 2 ranks on 1 node\(s\), 2 layers, hidden 16, 8 experts top-2, ffn 24, shared ffn 8, f32 on the wire; 24 requests \(all at once\)`,
		`done: 24 requests, \d+ tokens generated \(\d+ prompt tokens\) on 2 ranks, 1 node\(s\), overlap on, in [0-9.]+ s`,
		`decode    p50 [0-9.]+ (us|ms)  p90 [0-9.]+ (us|ms)  p99 [0-9.]+ (us|ms)  max [0-9.]+ (us|ms|s) \(\d+ steps, LL`,
		`prefill   p50 .* \(\d+ steps, ll, up to 8 prompt tokens per rank\)`,
		`TTFT      p50 [0-9.]+ (us|ms|s)`,
		`tokens/s  \d+ in all, \d+ per rank \(ranks: \d+, \d+\)`,
		`trace     ` + regexp.QuoteMeta(trace),
	} {
		assert.Regexp(t, re, out)
	}
	assert.NotContains(t, out, "masking")

	dump, err := exec.Command("h5dump", "-A", trace).CombinedOutput()
	require.NoError(t, err, "%s", dump)
	for _, s := range []string{`"goep-moe-serve-trace"`, `ATTRIBUTE "decode_p50_us"`, `ATTRIBUTE "overlap"`} {
		assert.Contains(t, string(dump), s)
	}
	res, info, err := serve.ReadTrace(trace)
	require.NoError(t, err)
	assert.Contains(t, info.Command, "-shared-ffn 8")
	assert.Equal(t, 2, res.Ranks)
	m, err := serve.NewModel(res.Config.Model, 0, res.Config.Model.Experts, nil)
	require.NoError(t, err)
	arr := res.Workload.Arrivals()
	for i, q := range res.Requests {
		want, hash, err := serve.Reference(m, moe.Float32, res.Workload.Request(i, arr, res.Config.Model.Vocab))
		require.NoError(t, err)
		assert.Equal(t, want, q.Tokens, "request %d", i)
		assert.Equal(t, hash, q.Hash, "request %d", i)
	}
	f := res.Figures()
	assert.Equal(t, 24, f.Requests)
	assert.Positive(t, f.TokensPerSecond)
	assert.Positive(t, f.Decode.P50)
}

// The same requests, served on 1 rank and on 4 ranks in 2 simulated nodes,
// with and without the overlap, prompts through LL and HT: every request's
// tokens, and the bits of its logits, are the same in every run.
func TestServedTokensAgree(t *testing.T) {
	dir := t.TempDir()
	type run struct {
		np, perNode int
		flags       []string
	}
	runs := []run{
		{1, 0, []string{"-overlap=false"}},
		{4, 2, []string{"-overlap=true"}},
		{4, 2, []string{"-overlap=false"}},
		{4, 2, []string{"-overlap=true", "-prefill", "ht"}},
		{4, 0, []string{"-overlap=false", "-prefill", "ht"}},
		{2, 0, []string{"-overlap=true", "-device", "alltoallv"}},
		{4, 2, []string{"-overlap=true", "-prefill", "ht", "-device", "cpu-onesided"}},
	}
	var first *serve.Result
	for i, r := range runs {
		trace := filepath.Join(dir, strconv.Itoa(i)+".h5")
		out, err := mpirun(t, r.np, r.perNode, nil, 2*time.Minute, args(append(r.flags, "-trace", trace)...)...)
		require.NoError(t, err, "%v: %s", r, out)
		res, _, err := serve.ReadTrace(trace)
		require.NoError(t, err)
		if first == nil {
			first = res
			continue
		}
		for j, q := range res.Requests {
			assert.Equal(t, first.Requests[j].Tokens, q.Tokens, "%v: request %d", r, j)
			assert.Equal(t, first.Requests[j].Hash, q.Hash, "%v: request %d: logits", r, j)
		}
	}
}

// checkpoint writes a moe-train checkpoint of a random layer (the teacher
// of its seed) and returns its path and the layer's config.
func checkpoint(t *testing.T, dir string) (string, moe.Config) {
	t.Helper()
	c := moe.Config{Mode: ep.LowLatency, DType: moe.Float32, Experts: 4, TopK: 2, Hidden: 12, FFN: 20, Tokens: 8,
		Act: moe.GELU, Seed: 1, SharedFFN: 6}
	p := moe.TeacherParams(c, 77, 0, c.Experts)
	zero := p.Clone()
	zero.Zero()
	ck := &runs.Checkpoint{CheckpointInfo: runs.CheckpointInfo{Version: runs.CheckpointVersion, RunID: "test", Step: 10, WorldSize: 2,
		Config: moe.TrainConfig{Config: c, TeacherSeed: 2, LR: 0.01}}, State: moe.State{Model: p, AdamM: zero, AdamV: zero.Clone(), AdamT: 10}}
	path := filepath.Join(dir, "ckpt.h5")
	require.NoError(t, runs.WriteCheckpoint(path, ck))
	return path, c
}

// -ckpt puts a moe-train checkpoint's layer in every decoder layer: the
// shape comes from it (and flags that would set it are refused), and the
// tokens are the reference's with that layer.
func TestServeFromCheckpoint(t *testing.T) {
	dir := t.TempDir()
	ck, c := checkpoint(t, dir)
	trace := filepath.Join(dir, "serve.h5")
	base := []string{"-layers", "2", "-vocab", "64", "-requests", "8", "-rate", "0", "-prompt", "2:9", "-gen", "2:6", "-batch", "3",
		"-prefill-tokens", "6", "-timeout", "30s", "-ckpt", ck, "-trace", trace}
	out, err := mpirun(t, 2, 0, nil, 2*time.Minute, base...)
	require.NoError(t, err, "%s", out)
	assert.Contains(t, out, "hidden 12, 4 experts top-2, ffn 20, shared ffn 6, MoE layers from "+ck)
	res, _, err := serve.ReadTrace(trace)
	require.NoError(t, err)
	assert.Equal(t, c.Hidden, res.Config.Model.Hidden)
	assert.Equal(t, moe.GELU, res.Config.Model.Act)
	loaded, err := runs.ReadCheckpoint(ck)
	require.NoError(t, err)
	m, err := serve.NewModel(res.Config.Model, 0, c.Experts, loaded)
	require.NoError(t, err)
	arr := res.Workload.Arrivals()
	for i, q := range res.Requests {
		want, hash, err := serve.Reference(m, moe.Float32, res.Workload.Request(i, arr, 64))
		require.NoError(t, err)
		assert.Equal(t, want, q.Tokens, "request %d", i)
		assert.Equal(t, hash, q.Hash, "request %d", i)
	}

	var stdout, stderr bytes.Buffer
	assert.Equal(t, 2, run(&stdout, &stderr, append(slices.Clone(base), "-hidden", "16")))
	assert.Contains(t, stderr.String(), "-hidden: the checkpoint (-ckpt "+ck+") sets the MoE layer's shape")
}

// pids reads the ranks' process ids from dir (GOEP_SERVE_PID_DIR).
func pids(dir string, n int) []int {
	var out []int
	for r := 0; r < n; r++ {
		b, err := os.ReadFile(filepath.Join(dir, "rank-"+strconv.Itoa(r)+".pid"))
		if p, perr := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && perr == nil {
			out = append(out, p)
		}
	}
	return out
}

// A rank stopped from outside (kill -STOP, then -CONT) while the others
// serve: with -mask-stalled they mask it and serve on; it rejoins when it
// comes back; the summary says what was lost and the trace records it.
func TestStalledRankIsMasked(t *testing.T) {
	dir := t.TempDir()
	trace := filepath.Join(dir, "serve.h5")
	pidDir := filepath.Join(dir, "pids")
	cmd, out := start(t, 2, 0, []string{"GOEP_SERVE_PID_DIR=" + pidDir},
		args("-requests", "60", "-rate", "25", "-gen", "8:40", "-mask-stalled", "-timeout", "500ms", "-trace", trace)...)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	deadline := time.Now().Add(time.Minute)
	for len(pids(pidDir, 2)) < 2 || !strings.Contains(out.String(), "moe-serve: 2 ranks") {
		require.True(t, time.Now().Before(deadline), "the ranks did not start:\n%s", out.String())
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(400 * time.Millisecond) // serving is under way
	victim := pids(pidDir, 2)[1]
	require.NoError(t, syscall.Kill(victim, syscall.SIGSTOP))
	time.Sleep(1500 * time.Millisecond)
	require.NoError(t, syscall.Kill(victim, syscall.SIGCONT))
	select {
	case err := <-done:
		require.NoError(t, err, "%s", out.String())
	case <-time.After(2 * time.Minute):
		t.Fatalf("mpirun still running 2 minutes after the stall:\n%s", out.String())
	}
	t.Logf("%s", out.String())
	assert.Regexp(t, `moe-serve: rank 1 masked in step \d+: it did not arrive within 500ms; serving goes on without it`, out.String())
	assert.Regexp(t, `moe-serve: rank 1 is back: it rejoins \(SetMask\) in step \d+`, out.String())
	assert.Regexp(t, `masking   rank 1 masked in step \d+, which took [0-9.]+ (ms|s) waiting for it; came back and rejoined \(SetMask\) in step \d+, [0-9.]+ s later; \d+ steps ran without it meanwhile, generating \d+ tokens`, out.String())
	assert.Regexp(t, `lost      \d+ \(token, expert\) pairs dropped in \d+ steps that a rank missed; \d+ of 60 requests lost some`, out.String())

	dump, err := exec.Command("h5dump", "-d", "/masking/rank", "-d", "/masking/masked_at_step", "-d", "/masking/rejoined_at_step", trace).CombinedOutput()
	require.NoError(t, err, "%s", dump)
	t.Logf("%s", dump)
	res, _, err := serve.ReadTrace(trace)
	require.NoError(t, err)
	require.Len(t, res.Masking, 1)
	e := res.Masking[0]
	assert.Equal(t, 1, e.Rank)
	require.Positive(t, e.RejoinedAt)
	assert.GreaterOrEqual(t, res.Steps[e.MaskedAt-1].LatencyUS(), 500e3, "the spike: the step that waited for it")
	for _, q := range res.Requests {
		assert.Len(t, q.Tokens, q.Gen, "request %d served in full", q.ID)
	}
}

func TestBadFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-prefill", "fast"}, `-prefill "fast": want ll or ht`},
		{[]string{"-dtype", "fp8"}, `-dtype "fp8": want f32 or bf16`},
		{[]string{"-act", "relu"}, `-act "relu": want silu or gelu`},
		{[]string{"-hidden", "0"}, `-hidden 0: want a positive integer`},
		{[]string{"-batch", "-2"}, `-batch -2: want a positive integer`},
		{[]string{"-topk", "9"}, `-topk 9: more than the 8 experts`},
		{[]string{"-vocab", "1"}, `-vocab 1: want at least 2`},
		{[]string{"-rate", "-1"}, `-rate -1: want requests per second >= 0`},
		{[]string{"-prompt", "9:3"}, `-prompt "9:3": want MIN:MAX with 1 <= MIN <= MAX`},
		{[]string{"-gen", "ten"}, `-gen "ten": want MIN:MAX`},
		{[]string{"-timeout", "0s"}, `-timeout 0s: want a positive duration`},
		{[]string{"-events", "-1"}, `-events -1: want 0 (all) or a positive number of steps`},
		{[]string{"-mask-stalled", "-prefill", "ht"}, `-mask-stalled needs -prefill ll`},
		{[]string{"-ckpt", "/nonexistent/ckpt.h5"}, `-ckpt /nonexistent/ckpt.h5:`},
		{[]string{"extra"}, `unexpected argument "extra"`},
		{[]string{"-device", "tpu"}, `-device: ep: backend "tpu" is not registered: want one of alltoallv,`},
	} {
		var stdout, stderr bytes.Buffer
		code := run(&stdout, &stderr, tc.args)
		assert.Equal(t, 2, code, "%v", tc.args)
		assert.Contains(t, stderr.String(), tc.want, "%v", tc.args)
	}
	var stdout, stderr bytes.Buffer
	assert.Equal(t, 0, run(&stdout, &stderr, []string{"-h"}))
	assert.Contains(t, stderr.String(), "usage: mpirun -np N moe-serve")
	assert.Contains(t, stderr.String(), "-mask-stalled")
}

// A configuration bad on every rank (experts not a multiple of the ranks)
// is said once, by rank 0, and the job ends normally; a bad
// GOEP_SERVE_STALL is refused, and so is a backend of device memory.
func TestBadConfigUnderMPI(t *testing.T) {
	out, err := mpirun(t, 3, 0, nil, time.Minute, args()...)
	require.Error(t, err, "%s", out)
	assert.Equal(t, 1, strings.Count(out, "experts = 8 is not a multiple of the 3 ranks"), "%s", out)
	assert.NotContains(t, out, "MPI_ABORT")
	out, err = mpirun(t, 2, 0, []string{"GOEP_SERVE_STALL=1:fast:3s"}, time.Minute, args()...)
	require.Error(t, err, "%s", out)
	assert.Contains(t, out, `GOEP_SERVE_STALL="1:fast:3s": want RANK:AFTER:DURATION`)
	out, err = mpirun(t, 2, 0, nil, time.Minute, args("-device", "emulate")...)
	require.Error(t, err, "%s", out)
	assert.Contains(t, out, "backend gpu:emulated keeps its tensors in", "%s", out)
	assert.Contains(t, out, "serves on backends of host memory only")
}
