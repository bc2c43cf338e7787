package main

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/goep/goep/ep"
	"github.com/goep/goep/moe"
	"github.com/goep/goep/moe/runs"
)

// writeTrace writes a trace of steps steps on 2 ranks whose loss halves
// every 10 steps, each step taking stepMS, the sync syncMS and syncBytes.
func writeTrace(t *testing.T, path string, gs moe.GradSync, steps int, stepMS, syncMS float64, syncBytes int64) {
	t.Helper()
	cfg := moe.TrainConfig{Config: moe.Config{Mode: ep.LowLatency, DType: moe.Float32, Experts: 4, TopK: 1, Hidden: 8, FFN: 8,
		Tokens: 4, Act: moe.SiLU, Seed: 1, SharedFFN: 16, GradSync: gs}, TeacherSeed: 2, LR: 0.01}
	start := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	tr, err := runs.CreateTrace(path, runs.TraceInfo{RunID: "r-" + gs.String(), Config: cfg,
		Segment: runs.Segment{WorldSize: 2, Nodes: 1, Steps: int64(steps), Start: start}})
	if err != nil {
		t.Fatal(err)
	}
	for s := 1; s <= steps; s++ {
		st := &moe.StepStats{Step: int64(s), Loss: 4 / float64(int(1)<<(s/10)), TokensPerExpert: []int64{2, 2, 2, 2},
			DispatchUS: []float64{10, 10}, CombineUS: []float64{10, 10}, BytesSent: []int64{100, 300},
			SyncUS: []float64{syncMS * 1e3, syncMS * 1e3}, SyncBytes: []int64{syncBytes, syncBytes},
			WaitUS: []float64{0, 5, 1, 0}, PeerSent: []int64{40, 100, 300, 60}, PeerRecv: []int64{40, 300, 100, 60},
			Elapsed: time.Duration(stepMS * float64(time.Millisecond))}
		if err := tr.Append(st, start.Add(time.Duration(float64(s)*stepMS*float64(time.Millisecond)))); err != nil {
			t.Fatal(err)
		}
	}
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestTraces(t *testing.T) {
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a.h5"), filepath.Join(dir, "b.h5")
	writeTrace(t, a, moe.GradSync{}, 40, 200, 100, 1<<20)
	writeTrace(t, b, moe.GradSync{Method: moe.SyncA2SGD}, 40, 100, 10, 16)
	md := filepath.Join(dir, "table.md")
	code, out, errs := runCmd(t, "traces", "-o", dir, "-md", md, "-skip", "0", "-title", "one machine", a, b)
	if code != 0 {
		t.Fatalf("traces: %d %q %q", code, out, errs)
	}
	for _, want := range []string{
		"| run | ranks | steps | loss: first | last 10% | at 4 s |",
		// The loss is 4, 2, 1, 0.5 for ten steps each (the first nine: 4), then
		// 0.25: the last tenth (steps 37-40) has a mean of 0.4375. a2sgd's 40
		// steps of 100 ms end at 4 s, when allreduce (200 ms per step) has
		// done 20: the steps of the last tenth of those seconds are 19 and
		// 20, losses 2 and 1.
		"| allreduce | 2 | 40 | 4 | 0.4375 | 1.5 | 200.0 ms | 1x | 100.0 ms | 1x | 1.0 MiB | 1x | 200 B | 8 s |",
		"| a2sgd | 2 | 40 | 4 | 0.4375 | 0.4375 | 100.0 ms | 2x | 10.0 ms | 10x | 16 B | 6.55e+04x | 200 B | 4 s |",
		"ep-plot traces: " + filepath.Join(dir, "loss.png"), "cost.png",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("traces output lacks %q:\n%s", want, out)
		}
	}
	if b, err := os.ReadFile(md); err != nil || !strings.HasPrefix(out, string(b)) {
		t.Errorf("the Markdown file is not the table printed: %v", err)
	}
	for _, f := range []string{"loss.png", "cost.png"} {
		checkPNG(t, filepath.Join(dir, f))
	}
	// The written matrices: rank 0 waited 5 us a step for rank 1, rank 1 1
	// us for rank 0; 40 steps are 0.2 and 0.04 ms, under FindStraggler's
	// 1 ms floor.
	code, out, errs = runCmd(t, "waits", "-o", dir, a)
	if code != 0 {
		t.Fatalf("waits: %d %q %q", code, out, errs)
	}
	for _, want := range []string{"r0             0.000     0.200\n", "r1             0.040     0.000\n", "waited for     0.040     0.200\n",
		"no rank stands out: the most waited for was rank 1, 0.200 ms, 83% of all waiting between ranks", "ep-plot waits: " + filepath.Join(dir, "waits.png")} {
		if !strings.Contains(out, want) {
			t.Errorf("waits output lacks %q:\n%s", want, out)
		}
	}
	checkPNG(t, filepath.Join(dir, "waits.png"))
	code, out, errs = runCmd(t, "traces", "-o", dir, "-labels", "exact,two-level", a, b)
	if code != 0 || !strings.Contains(out, "| exact | 2 |") || !strings.Contains(out, "| two-level | 2 |") {
		t.Errorf("traces -labels: %d %q %q", code, out, errs)
	}
	// -busy: samples every second, at half seconds after the runs' start;
	// one saw other work, at 3.5 s. allreduce's steps of 200 ms that began
	// before 4.5 s and ended after 2.5 s (13 to 23) are bracketed by it;
	// a2sgd's file stops at 1.5 s, so only its steps ending by then (1 to 15)
	// are known to be quiet.
	start := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	busyFile := func(name string, last float64) string {
		var lines []string
		for x := -0.5; x <= last; x++ {
			n := 0
			if x == 3.5 {
				n = 2
			}
			lines = append(lines, fmt.Sprintf("%.3f 0.5 %d", float64(start.UnixNano())/1e9+x, n))
		}
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte("# time load others\n"+strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	busyA, busyB := busyFile("busy-a.txt", 8.5), busyFile("busy-b.txt", 1.5)
	code, out, errs = runCmd(t, "traces", "-o", dir, "-skip", "0", "-busy", busyA+","+busyB, a, b)
	for _, want := range []string{
		"| run | quiet steps | step time, quiet (median) | vs allreduce | sync time, quiet (median) | vs allreduce |",
		"| allreduce | 29 of 40 | 200.0 ms | 1x | 100.0 ms | 1x |",
		"| a2sgd | 15 of 40 | 100.0 ms | 2x | 10.0 ms | 10x |",
	} {
		if code != 0 || !strings.Contains(out, want) {
			t.Errorf("traces -busy: exit %d, output lacks %q:\n%s%s", code, want, out, errs)
		}
	}
	code, out, _ = runCmd(t, "traces", "-o", dir, "-skip", "0", "-busy", busyA, a, b) // one file for both
	if want := "| a2sgd | 25 of 40 | 100.0 ms |"; code != 0 || !strings.Contains(out, want) {
		t.Errorf("traces -busy FILE: exit %d, output lacks %q:\n%s", code, want, out)
	}
	bad := filepath.Join(dir, "bad.txt")
	if err := os.WriteFile(bad, []byte("1735689600 0\nyesterday 3\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"traces"}, 2, "want at least one trace file"},
		{[]string{"traces", "-busy", busyA + "," + busyA + "," + busyA, a, b}, 2, "-busy has 3 files for 2 traces"},
		{[]string{"traces", "-o", dir, "-busy", bad, a}, 1, "bad.txt:2: \"yesterday 3\""},
		{[]string{"traces", "-o", dir, "-busy", filepath.Join(dir, "none.txt"), a}, 1, "none.txt"},
		{[]string{"traces", "-labels", "x", a, b}, 2, "-labels has 1 names for 2 traces"},
		{[]string{"traces", "-smooth", "-1", a}, 2, "-smooth -1"},
		{[]string{"traces", filepath.Join(dir, "missing.h5")}, 1, "missing.h5"},
	} {
		code, _, errs := runCmd(t, tc.args...)
		if code != tc.code || !strings.Contains(errs, tc.want) {
			t.Errorf("%q: exit %d, stderr %q; want %d and %q", tc.args, code, errs, tc.code, tc.want)
		}
	}
}

// TestLogTicks: every axis range gets at least three labels where a decade
// step allows, all inside the range, ascending, at 1-2-5 where that is enough.
func TestLogTicks(t *testing.T) {
	for _, c := range []struct {
		lo, hi float64
		want   []float64 // nil: only the general properties
	}{
		{lo: 0.5, hi: 200, want: []float64{0.5, 1, 2, 5, 10, 20, 50, 100, 200}},
		{lo: 1.2, hi: 3.5, want: []float64{1.5, 2, 3}},
		{lo: 1.15, hi: 1.45, want: []float64{1.2, 1.4}}, // narrower than any step: what fits
		{lo: 600, hi: 1400, want: []float64{600, 700, 800, 900, 1000, 1200, 1400}},
		{lo: 300, hi: 3000},
		{lo: 0.01, hi: 0.011, want: []float64{0.01}},
		{lo: 0, hi: 10, want: []float64{}}, // not a log range
		{lo: 5, hi: 5, want: []float64{}},  // empty
		{lo: 5, hi: 2, want: []float64{}},  // reversed
	} {
		var got []float64
		for _, tk := range (logTicks125{}).Ticks(c.lo, c.hi) {
			got = append(got, tk.Value)
			if tk.Label == "" {
				t.Errorf("[%g, %g]: tick %g has no label", c.lo, c.hi, tk.Value)
			}
		}
		for i, v := range got {
			if v < c.lo*0.999 || v > c.hi*1.001 || (i > 0 && v <= got[i-1]) {
				t.Errorf("[%g, %g]: ticks %v: %g is outside the range or out of order", c.lo, c.hi, got, v)
			}
		}
		if c.want == nil {
			if len(got) < 3 {
				t.Errorf("[%g, %g]: ticks %v, want at least 3", c.lo, c.hi, got)
			}
			continue
		}
		if len(got) != len(c.want) {
			t.Errorf("[%g, %g]: ticks %v, want %v", c.lo, c.hi, got, c.want)
			continue
		}
		for i := range got {
			if math.Abs(got[i]-c.want[i]) > 1e-9*c.want[i] {
				t.Errorf("[%g, %g]: ticks %v, want %v", c.lo, c.hi, got, c.want)
				break
			}
		}
	}
}

// TestRunColours: repeats of a configuration ("NAME #K") share a colour and
// one legend entry; other runs get their own, even when a label merely
// contains " #".
func TestRunColours(t *testing.T) {
	labels := []string{"allreduce #1", "a2sgd #1", "allreduce #2", "topk:10", "a2sgd #2", "lr #x", "lr #", "a2sgd"}
	wantGroup := []int{0, 1, 0, 2, 1, 3, 4, 1}
	wantEntry := []string{"allreduce", "a2sgd", "", "topk:10", "", "lr #x", "lr #", ""}
	var runs []*trainRun
	for _, l := range labels {
		runs = append(runs, &trainRun{label: l})
	}
	colours, entries := runColours(runs)
	for i := range labels {
		if colours[i] != palette[wantGroup[i]%len(palette)] {
			t.Errorf("%q: colour %v, want palette[%d]", labels[i], colours[i], wantGroup[i])
		}
		if entries[i] != wantEntry[i] {
			t.Errorf("%q: legend entry %q, want %q", labels[i], entries[i], wantEntry[i])
		}
	}
}
