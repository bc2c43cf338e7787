package serve_test

import (
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goep/goep/ep"
	"github.com/goep/goep/internal/mpitesting"
	"github.com/goep/goep/moe/serve"
)

// floatBits compares float slices bit for bit (NaN marks a rank that did
// not take part).
func floatBits(v []float64) []uint64 {
	out := make([]uint64, len(v))
	for i, x := range v {
		out[i] = math.Float64bits(x)
	}
	return out
}

// checkTrace writes res's trace, reads it back with ReadTrace and h5dump,
// and checks that nothing was lost.
func checkTrace(t *testing.T, res *serve.Result) string {
	t.Helper()
	mpitesting.RequireTool(t, "h5dump")
	path := filepath.Join(t.TempDir(), "serve.h5")
	start := time.Date(2026, 11, 27, 10, 0, 0, 0, time.UTC)
	require.NoError(t, serve.WriteTrace(path, res, serve.TraceInfo{Command: "moe-serve -test", Start: start, Nodes: 1}))
	got, info, err := serve.ReadTrace(path)
	require.NoError(t, err)
	assert.Equal(t, "moe-serve -test", info.Command)
	assert.True(t, start.Equal(info.Start))
	assert.Equal(t, res.Config, got.Config)
	assert.Equal(t, res.Workload, got.Workload)
	assert.Equal(t, res.Hosts, got.Hosts)
	assert.Equal(t, res.Requests, got.Requests)
	assert.Equal(t, res.Events, got.Events)
	assert.Equal(t, res.Masking, got.Masking)
	require.Len(t, got.Steps, len(res.Steps))
	for i := range res.Steps {
		a, b := res.Steps[i], got.Steps[i]
		assert.Equal(t, floatBits(a.StartUS), floatBits(b.StartUS), "step %d", a.Step)
		assert.Equal(t, floatBits(a.FinishUS), floatBits(b.FinishUS), "step %d", a.Step)
		a.StartUS, a.FinishUS, b.StartUS, b.FinishUS = nil, nil, nil, nil
		assert.Equal(t, a, b)
	}
	assert.Equal(t, res.Figures(), got.Figures())

	dump, err := exec.Command("h5dump", "-A", path).CombinedOutput()
	require.NoError(t, err, "%s", dump)
	for _, s := range []string{`"goep-moe-serve-trace"`, `ATTRIBUTE "decode_p99_us"`, `ATTRIBUTE "ttft_p50_us"`, `ATTRIBUTE "tokens_per_s_per_rank"`,
		`DATASET "latency_us"`, `DATASET "tokens"`, `DATASET "phase"`, `"dispatch_send"`} {
		assert.Contains(t, string(dump), s)
	}
	return path
}

// A run's trace keeps everything: written, read back equal, readable by
// h5dump.
func TestTraceRoundTrip(t *testing.T) {
	world := mpitesting.World
	defer mpitesting.Agree(t, world)
	cfg, w := small()
	cfg.Overlap, cfg.Prefill = true, ep.HighThroughput
	res, err := serve.Serve(world, cfg, serve.Options{Workload: w})
	require.NoError(t, err)
	if world.Rank() == 0 {
		checkTrace(t, res)
	}
}

// EventSteps keeps the phases of the first steps only, every phase of
// every micro-batch of every layer of those.
func TestEventSteps(t *testing.T) {
	world := mpitesting.World
	defer mpitesting.Agree(t, world)
	cfg, w := small()
	cfg.Overlap = true
	res, err := serve.Serve(world, cfg, serve.Options{Workload: w, EventSteps: 3})
	require.NoError(t, err)
	if world.Rank() != 0 {
		return
	}
	require.Greater(t, len(res.Steps), 3)
	n := map[int64]int{}
	for _, e := range res.Events {
		n[e.Step]++
	}
	// per step and rank: 2 micro-batches x (2 layers x 6 phases + the output)
	want := world.Size() * 2 * (cfg.Model.Layers*6 + 1)
	assert.Equal(t, map[int64]int{1: want, 2: want, 3: want}, n)
}

// A file that is not a serving trace is refused, saying why.
func TestReadTraceRefusesOthers(t *testing.T) {
	dir := t.TempDir()
	_, _, err := serve.ReadTrace(filepath.Join(dir, "missing.h5"))
	assert.Error(t, err)
	bad := filepath.Join(dir, "text.h5")
	require.NoError(t, os.WriteFile(bad, []byte("not hdf5"), 0o644))
	_, _, err = serve.ReadTrace(bad)
	assert.ErrorContains(t, err, "not an HDF5 file")
}
