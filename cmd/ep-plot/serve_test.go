package main

import (
	"fmt"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/goep/goep/ep"
	"github.com/goep/goep/moe"
	"github.com/goep/goep/moe/serve"
	"github.com/goep/goep/mpi"
)

// serveTrace serves a short stream on this process (one rank) and writes
// its trace.
func serveTrace(t *testing.T, dir string, overlap bool) string {
	t.Helper()
	world, err := mpi.Init()
	if err != nil {
		t.Fatal(err)
	}
	cfg := serve.Config{
		Model: serve.ModelConfig{Layers: 2, Vocab: 32, Hidden: 8, FFN: 12, Experts: 4, TopK: 2, Act: moe.SiLU, Seed: 1},
		DType: moe.Float32, Batch: 3, Prefill: ep.LowLatency, PrefillTokens: 5, Overlap: overlap,
		Timeout: 10 * time.Second, ControlTimeout: time.Minute,
	}
	w := serve.Workload{Requests: 6, PromptMin: 2, PromptMax: 9, GenMin: 2, GenMax: 6, Seed: 3}
	res, err := serve.Serve(world, cfg, serve.Options{Workload: w})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, fmt.Sprintf("overlap-%v.h5", overlap))
	if err := serve.WriteTrace(path, res, serve.TraceInfo{Command: "test", Start: time.Now(), Nodes: 1}); err != nil {
		t.Fatal(err)
	}
	return path
}

// ep-plot serve prints each trace's figures, as serve.Figures computes
// them, with ratios against the first; draws the latency distribution;
// and with -timeline, a step's phases in time order and their chart.
func TestServe(t *testing.T) {
	dir := t.TempDir()
	on, off := serveTrace(t, dir, true), serveTrace(t, dir, false)
	code, out, errs := runCmd(t, "serve", "-o", dir, "-labels", "on,off", "-timeline", "3", on, off)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	for i, path := range []string{on, off} {
		res, _, err := serve.ReadTrace(path)
		if err != nil {
			t.Fatal(err)
		}
		f := res.Figures()
		row := fmt.Sprintf("| %s | %d | %.3g / %.3g / %.3g | %d |", []string{"on", "off"}[i], f.Decode.N,
			f.Decode.P50/1e3, f.Decode.P90/1e3, f.Decode.P99/1e3, f.Prefill.N)
		if !strings.Contains(out, row) {
			t.Errorf("no row starting %q in\n%s", row, out)
		}
		if !strings.Contains(out, fmt.Sprintf("| %.0f | %.0f |", f.TokensPerSecond, f.TokensPerSecond)) {
			t.Errorf("no tokens/s %.0f in\n%s", f.TokensPerSecond, out)
		}
	}
	if !strings.Contains(out, "| 1.00x | 1.00x | ") {
		t.Errorf("the first trace's ratios are not 1.00x:\n%s", out)
	}
	// Where a decode step goes: waits / sends / compute, each a time, the compute not zero.
	if m := regexp.MustCompile(`\| 1\.00x \| 1\.00x \| ([0-9.e+-]+|-) / ([0-9.e+-]+|-) / ([0-9.e+-]+) \|`).FindStringSubmatch(out); m == nil {
		t.Errorf("no waits / sends / compute breakdown in\n%s", out)
	}
	for _, s := range []string{"step 3 (", "| 0 | 0 | 1 | attention |", "| 0 | 1 | 0 | combine_wait |", "| 0 | 1 | 1 | output |"} {
		if !strings.Contains(out, s) {
			t.Errorf("no %q in the timeline:\n%s", s, out)
		}
	}
	checkPNG(t, filepath.Join(dir, "serve-latency.png"))
	checkPNG(t, filepath.Join(dir, "serve-timeline.png"))

	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"serve"}, 2, "want one or more moe-serve traces"},
		{[]string{"serve", "-labels", "a", on, off}, 2, "-labels has 1 labels for 2 traces"},
		{[]string{"serve", "-o", dir, "-timeline", "100000", on}, 2, "-timeline 100000: the first trace has"},
		{[]string{"serve", filepath.Join(dir, "missing.h5")}, 1, "missing.h5"},
	} {
		code, _, errs := runCmd(t, tc.args...)
		if code != tc.code || !strings.Contains(errs, tc.want) {
			t.Errorf("%v: exit %d, %q; want %d and %q", tc.args, code, errs, tc.code, tc.want)
		}
	}
}
