package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goep/goep/internal/mpitesting"
)

func TestFlagErrorsNameTheValue(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-mode", "xx"}, `unknown mode "xx"`},
		{[]string{"-dtype", "f16"}, `"f16" is not bf16, f32 or fp8`},
		{[]string{"-tokens", "12,abc"}, `-tokens: "abc"`},
		{[]string{"-iters", "0"}, "-iters 0"},
		{[]string{"extra"}, `unexpected argument "extra"`},
		{[]string{"-device", "gpu"}, `-device: ep: backend "gpu" is not registered: want one of alltoallv, alltoallv-blocking, cpu, cpu-onesided, gpu:cuda, gpu:cuda+ipc, gpu:emulated, gpu:emulated+ipc`},
		{[]string{"-device", "alltoallv,blocking=true"}, `-device: ep: backend "alltoallv,blocking=true": alltoallv does not take option(s) blocking: it takes no options`},
		{[]string{"-layout", "zones"}, `-layout: ep: unknown receive layout "zones"`},
	} {
		var out, errb bytes.Buffer
		code := run(&out, &errb, tc.args)
		assert.Equal(t, 2, code, "%v", tc.args)
		assert.Contains(t, errb.String(), tc.want, "%v", tc.args)
	}
}

// ep-bench under mpirun on small sizes: every configuration prints a JSON
// line with the fields the scaling study reads, checked against the
// alltoallv path, with sane figures.
func TestBenchUnderMpirun(t *testing.T) {
	mpitesting.RequireTool(t, "mpirun")
	bin := benchBinary(t)
	for _, tc := range []struct {
		np      int
		perNode string
		nodes   int
	}{{2, "", 1}, {4, "2", 2}} {
		args := append(mpitesting.MPIRunArgs(tc.np), "-x", "GOEP_RANKS_PER_NODE="+tc.perNode, bin,
			"-json", "-mode", "ll,ht", "-dtype", "bf16,f32,fp8", "-tokens", "0,24", "-hidden", "200", "-topk", "3",
			"-experts", "8", "-iters", "3", "-warmup", "1")
		cmd := exec.Command("mpirun", args...)
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "%s", out)
		results, _ := jsonLines(t, out)
		require.Len(t, results, 2*3*2, "one line per mode x dtype x tokens in:\n%s", out)
		for _, r := range results {
			keys := []string{"mode", "ranks", "nodes", "tokens", "hidden", "topk", "experts", "dtype",
				"dispatch_us", "combine_us", "alltoallv_dispatch_us", "alltoallv_combine_us", "speedup_vs_alltoallv"}
			if r["tokens"].(float64) > 0 { // with no tokens nothing moves: no bandwidths
				keys = append(keys, "dispatch_gbps", "combine_gbps", "memcpy_gbps")
			}
			for _, k := range keys {
				assert.Contains(t, r, k)
			}
			assert.Equal(t, float64(tc.np), r["ranks"])
			assert.Equal(t, float64(tc.nodes), r["nodes"])
			assert.Greater(t, r["dispatch_us"].(float64), 0.0)
			assert.Greater(t, r["combine_us"].(float64), 0.0)
			if r["tokens"].(float64) > 0 {
				assert.Greater(t, r["dispatch_gbps"].(float64), 0.0)
				assert.Greater(t, r["memcpy_gbps"].(float64), 0.0)
			}
			if r["dtype"] == "fp8" { // timed beside bf16: codes and 2 scales of 4 bytes per 200-element row, against 400 bytes
				assert.Greater(t, r["bf16_dispatch_us"].(float64), 0.0)
				assert.Greater(t, r["fp8_dispatch_speedup"].(float64), 0.0)
				if r["tokens"].(float64) > 0 {
					assert.InDelta(t, 208.0/400, r["bytes_per_rank"].(float64)/r["bf16_bytes_per_rank"].(float64), 1e-9)
				}
			} else {
				assert.NotContains(t, r, "bf16_dispatch_us")
			}
		}
	}
}

// The human-readable table names both implementations and the memcpy line.
func TestTableOutput(t *testing.T) {
	mpitesting.RequireTool(t, "mpirun")
	bin := benchBinary(t)
	out, err := exec.Command("mpirun", append(mpitesting.MPIRunArgs(2), bin, "-mode", "ht", "-tokens", "16",
		"-hidden", "32", "-topk", "2", "-experts", "4", "-iters", "2")...).CombinedOutput()
	require.NoError(t, err, "%s", out)
	for _, want := range []string{"ep-bench ht bf16: 2 ranks on 1 node(s)", "ep (goep)", "alltoallv by hand", "speedup over alltoallv", "memcpy of the same bytes"} {
		assert.Contains(t, string(out), want)
	}
}

// -device list prints every registered backend with what it declares, and
// -device takes any of them: the alltoallv baseline is measured as a
// device, checked against the CPU engine in the same run.
func TestBenchAnyRegisteredBackend(t *testing.T) {
	var stdout, stderr bytes.Buffer
	require.Equal(t, 0, run(&stdout, &stderr, []string{"-device", "list"}), stderr.String())
	for _, want := range []string{"cpu\n    ep's CPU engine", "gpu:cuda (cuda)\n", "gpu:emulated+ipc (emulate-ipc)\n", "alltoallv-blocking\n",
		"features: FP8 dispatch (Config.Wire); masking stalled ranks"} {
		assert.Contains(t, stdout.String(), want)
	}
	mpitesting.RequireTool(t, "mpirun")
	bin := benchBinary(t)
	out, err := exec.Command("mpirun", append(mpitesting.MPIRunArgs(2), bin, "-device", "alltoallv", "-json", "-mode", "ll,ht", "-tokens", "24",
		"-hidden", "64", "-topk", "3", "-experts", "8", "-iters", "2", "-warmup", "1")...).CombinedOutput()
	require.NoError(t, err, "%s", out)
	rows, _ := jsonLines(t, out)
	for _, r := range rows {
		assert.Equal(t, "alltoallv", r["device"])
		assert.Greater(t, r["cpu_dispatch_us"].(float64), 0.0, "the CPU engine ran beside it")
	}
	assert.Len(t, rows, 2, "one line per mode in:\n%s", out)
}

// -device emulate: the GPU backend on the emulated device, checked against
// the CPU engine in the same run (a difference fails the run), with the CPU
// engine's times and the device copy beside its own.
func TestBenchEmulatedDevice(t *testing.T) {
	mpitesting.RequireTool(t, "mpirun")
	bin := benchBinary(t)
	for _, tc := range []struct {
		np      int
		perNode string
		nodes   int
	}{{2, "", 1}, {4, "2", 2}} {
		args := append(mpitesting.MPIRunArgs(tc.np), "-x", "GOEP_RANKS_PER_NODE="+tc.perNode, bin, "-device", "emulate",
			"-json", "-mode", "ll,ht", "-dtype", "bf16,f32", "-tokens", "0,24", "-hidden", "64", "-topk", "3",
			"-experts", "8", "-iters", "2", "-warmup", "1")
		out, err := exec.Command("mpirun", args...).CombinedOutput()
		require.NoError(t, err, "%s", out)
		rows, _ := jsonLines(t, out)
		for _, r := range rows {
			assert.Equal(t, "emulate", r["device"])
			assert.Equal(t, float64(tc.nodes), r["nodes"])
			assert.Greater(t, r["cpu_dispatch_us"].(float64), 0.0)
			assert.Greater(t, r["cpu_combine_us"].(float64), 0.0)
			if r["tokens"].(float64) > 0 {
				assert.Greater(t, r["device_copy_gbps"].(float64), 0.0)
				assert.Greater(t, r["dispatch_device_copy_frac"].(float64), 0.0)
			}
		}
		assert.Len(t, rows, 2*2*2, "one line per mode x dtype x tokens in:\n%s", out)
	}
	out, err := exec.Command("mpirun", append(mpitesting.MPIRunArgs(2), bin, "-device", "emulate", "-mode", "ll", "-tokens", "16",
		"-hidden", "32", "-topk", "2", "-experts", "4", "-iters", "2")...).CombinedOutput()
	require.NoError(t, err, "%s", out)
	for _, want := range []string{"ep (goep) on emulate", "ep CPU engine", "the CPU engine's time", "emulate copy of the same bytes"} {
		assert.Contains(t, string(out), want)
	}
}

// -latency sweeps 1, 2, 4 ... tokens up to -tokens, with the flag round
// trip and the data round trip of the same rows measured beside: every
// configuration's line carries them, ep's and the baseline's time per
// round back to back, and the barrier-timed halves; the table says how
// many of each floor a round is.
func TestLatencySweep(t *testing.T) {
	mpitesting.RequireTool(t, "mpirun")
	bin := benchBinary(t)
	args := append(mpitesting.MPIRunArgs(2), bin, "-latency", "-tokens", "4", "-hidden", "32", "-topk", "2",
		"-experts", "4", "-iters", "3", "-warmup", "1")
	out, err := exec.Command("mpirun", append(args, "-json")...).CombinedOutput()
	require.NoError(t, err, "%s", out)
	var tokens []float64
	rows, lines := jsonLines(t, out)
	for i, r := range rows {
		line := lines[i]
		assert.Equal(t, "ll", r["mode"], line)
		tokens = append(tokens, r["tokens"].(float64))
		for _, k := range []string{"flag_round_trip_us", "data_round_trip_us", "steady_round_us", "alltoallv_steady_round_us", "dispatch_us", "combine_us"} {
			require.Contains(t, r, k, line)
			assert.Greater(t, r[k].(float64), 0.0, "%s in %s", k, line)
		}
	}
	assert.Equal(t, []float64{1, 2, 4}, tokens, "the sweep's token counts in:\n%s", out)
	out, err = exec.Command("mpirun", args...).CombinedOutput()
	require.NoError(t, err, "%s", out)
	for _, want := range []string{"flag round trip between two ranks of a node", "round us", "x flag", "data us", "x data", "alltoallv"} {
		assert.Contains(t, string(out), want)
	}
}

// -layout expert-major in HT: ep's expert-major layout timed beside the
// flat layout plus the user's permutation into the same zones, which the
// run checks against ep's (zone offsets, rows and weights bit for bit, and
// the combines), on one node and on simulated nodes; LL's rank-major
// layout runs too.
func TestBenchLayouts(t *testing.T) {
	mpitesting.RequireTool(t, "mpirun")
	bin := benchBinary(t)
	for _, tc := range []struct {
		np      int
		perNode string
	}{{2, ""}, {4, "2"}} {
		args := append(mpitesting.MPIRunArgs(tc.np), "-x", "GOEP_RANKS_PER_NODE="+tc.perNode, bin, "-json", "-mode", "ht",
			"-layout", "expert-major", "-align", "8", "-dtype", "bf16,f32", "-tokens", "0,24", "-hidden", "64", "-topk", "3",
			"-experts", "8", "-iters", "2", "-warmup", "1")
		out, err := exec.Command("mpirun", args...).CombinedOutput()
		require.NoError(t, err, "%s", out)
		rows, lines := jsonLines(t, out)
		for i, r := range rows {
			line := lines[i]
			assert.Equal(t, "expert-major", r["layout"], line)
			assert.Equal(t, 8.0, r["expert_alignment"], line)
			for _, k := range []string{"flat_permute_dispatch_us", "flat_permute_combine_us", "expert_major_speedup"} {
				require.Contains(t, r, k, line)
				assert.Greater(t, r[k].(float64), 0.0, "%s in %s", k, line)
			}
		}
		assert.Len(t, rows, 2*2, "one line per dtype x tokens in:\n%s", out)
	}
	out, err := exec.Command("mpirun", append(mpitesting.MPIRunArgs(2), bin, "-mode", "ll", "-layout", "rank-major", "-tokens", "16",
		"-hidden", "32", "-topk", "2", "-experts", "4", "-iters", "2")...).CombinedOutput()
	require.NoError(t, err, "%s", out)
	assert.Contains(t, string(out), "receive layout: rank-major")
}

// benchBinary is ep-bench built with MPI, once for every test that runs it.
func benchBinary(t *testing.T) string {
	t.Helper()
	benchBuild.Do(func() {
		dir, err := os.MkdirTemp("", "ep-bench-test")
		if err != nil {
			benchBuild.err = err
			return
		}
		benchBuild.bin = filepath.Join(dir, "ep-bench")
		if out, err := exec.Command("go", "build", "-tags", "mpi", "-o", benchBuild.bin, ".").CombinedOutput(); err != nil {
			benchBuild.err = fmt.Errorf("go build: %w\n%s", err, out)
		}
	})
	require.NoError(t, benchBuild.err)
	return benchBuild.bin
}

var benchBuild struct {
	sync.Once
	bin string
	err error
}

// jsonLines is every JSON line of ep-bench's output out, parsed, with the
// line itself for messages.
func jsonLines(t *testing.T, out []byte) (rows []map[string]any, lines []string) {
	t.Helper()
	for _, line := range strings.Split(string(out), "\n") {
		if line = strings.TrimSpace(line); !strings.HasPrefix(line, "{") {
			continue
		}
		var r map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &r), line)
		rows, lines = append(rows, r), append(lines, line)
	}
	return rows, lines
}

func TestMain(m *testing.M) {
	code := m.Run()
	if benchBuild.bin != "" {
		os.RemoveAll(filepath.Dir(benchBuild.bin))
	}
	os.Exit(code)
}
