package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"image/png"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/goep/goep/internal/study"
)

// writeSteps writes one JSONL file per layout of a made-up study (times
// from a latency-bandwidth formula) and returns their paths.
func writeSteps(t *testing.T, dir string) []string {
	t.Helper()
	var paths []string
	for _, l := range [][2]int{{1, 1}, {1, 2}, {1, 4}, {1, 8}, {2, 2}, {2, 4}, {2, 8}} {
		var b bytes.Buffer
		for _, mode := range []string{"ll", "ht"} {
			for _, dt := range []string{"f32", "bf16"} {
				for _, tok := range []int{16, 64, 256} {
					r := study.Record{Mode: mode, DType: dt, Nodes: l[0], Ranks: l[1], Tokens: tok, Hidden: 128, TopK: 2,
						Experts: 8, Iters: 5, MemcpyGBps: 10}
					r.BytesPerRank = study.ShapeOf(&r).ExpectedBytes()
					f := max(1, float64(r.Ranks)/2)
					r.DispatchUS = f*(10+3*float64(r.Ranks-1)+r.BytesPerRank/2e3+float64(l[0]-1)*40) + (f-1)*50
					r.CombineUS = r.DispatchUS * 0.7
					r.AlltoallvDispatchUS, r.AlltoallvCombineUS = 2*r.DispatchUS, 2*r.CombineUS
					r.DispatchGBps, r.CombineGBps = r.BytesPerRank/r.DispatchUS/1e3, r.BytesPerRank/r.CombineUS/1e3
					r.AlltoallvDispatchGBps, r.AlltoallvCombineGBps = r.DispatchGBps/2, r.CombineGBps/2
					line, err := json.Marshal(r)
					if err != nil {
						t.Fatal(err)
					}
					b.Write(append(line, '\n'))
				}
			}
		}
		p := filepath.Join(dir, "steps", fmt.Sprintf("s-%dx%d", l[0], l[1]))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p+".jsonl", b.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p+".cmd", []byte("srun -N x bin/ep-bench -json\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		paths = append(paths, p+".jsonl")
	}
	return paths
}

func runCmd(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := run(&out, &errb, args)
	return code, out.String(), errb.String()
}

func TestCollectCheckChartsModel(t *testing.T) {
	dir := t.TempDir()
	h5 := filepath.Join(dir, "study.h5")
	steps := writeSteps(t, dir)
	t.Setenv("SLURM_JOB_ID", "77")
	t.Setenv("SLURM_JOB_NODELIST", "n[1-2]")
	if code, out, errs := runCmd(t, "collect", "-new", "-o", h5, "-attr", "sweep_tokens_ll=16,64,256", "-attr", "launcher=srun"); code != 0 {
		t.Fatalf("collect -new: %d %s %s", code, out, errs)
	}
	code, out, errs := runCmd(t, append([]string{"collect", "-o", h5}, steps...)...)
	if code != 0 || !strings.Contains(out, "84 row(s) from 7 step(s)") {
		t.Fatalf("collect: %d %q %q", code, out, errs)
	}
	code, out, errs = runCmd(t, "check", "-rows", "84", "-modes", "ll,ht", "-dtypes", "f32,bf16", "-nodes", "1,2",
		"-ranks", "1,2,4,8", "-attrs", "slurm_job_id,slurm_job_nodelist,sweep_tokens_ll", h5)
	if code != 0 || !strings.Contains(out, "ep-plot check: ok") || !strings.Contains(out, "Slurm job 77 on n[1-2]") {
		t.Errorf("check: %d %q %q", code, out, errs)
	}
	code, _, errs = runCmd(t, "check", "-nodes", "4", "-attrs", "nope", h5)
	if code != 1 || !strings.Contains(errs, "no row measured on 4 node(s)") || !strings.Contains(errs, "nope") {
		t.Errorf("check of what is not there: %d %q", code, errs)
	}
	s, err := study.Read(h5)
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Steps) != 7 || s.Steps[0] != "s-1x1" || s.Commands[0] != "srun -N x bin/ep-bench -json" {
		t.Errorf("steps %q, commands %q", s.Steps, s.Commands)
	}

	charts := filepath.Join(dir, "charts")
	code, out, errs = runCmd(t, "charts", "-o", charts, h5)
	if code != 0 {
		t.Fatalf("charts: %d %q %q", code, out, errs)
	}
	for _, name := range []string{"ll-latency.png", "ht-bandwidth.png"} {
		checkPNG(t, filepath.Join(charts, name))
	}
	if code, _, errs = runCmd(t, "charts", "-o", charts, "-ll-layout", "1by2", h5); code != 2 {
		t.Errorf("charts -ll-layout 1by2: %d %q", code, errs)
	}

	md, pngPath := filepath.Join(dir, "model.md"), filepath.Join(dir, "model.png")
	code, out, errs = runCmd(t, "model", "-write", "-md", md, "-png", pngPath, "-net", "400Gb/s", h5)
	if code != 0 {
		t.Fatalf("model: %d %q %q", code, out, errs)
	}
	for _, want := range []string{"## Fitted on every run (84)", "| ll/dispatch |", "1x8 (held out)",
		"held out (8+ ranks), ht: dispatch median", "network 50 GB/s per node (400 Gb/s)", "| 1024 | 128 | 1024 |"} {
		if !strings.Contains(out, want) {
			t.Errorf("model output lacks %q:\n%s", want, out)
		}
	}
	if b, err := os.ReadFile(md); err != nil || string(b) != out {
		t.Errorf("model.md differs from the output: %v", err)
	}
	checkPNG(t, pngPath)
	m, err := study.ReadModel(h5)
	if err != nil {
		t.Fatal(err)
	}
	if p := m.Params["ht/combine"]; !p.HasNet || p.FitRuns != 4*2*3 || m.CPUs != s.AttrInt("host_cpus", 0) {
		t.Errorf("stored model: %+v, cpus %d", p, m.CPUs)
	}
}

func checkPNG(t *testing.T, path string) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Error(err)
		return
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Errorf("%s: %v", path, err)
		return
	}
	if b := img.Bounds(); b.Dx() < 500 || b.Dy() < 250 {
		t.Errorf("%s: %v pixels", path, b)
	}
}

func TestUsage(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{nil, 2, "usage: ep-plot"},
		{[]string{"draw"}, 2, `unknown command "draw"`},
		{[]string{"collect"}, 2, "-o is required"},
		{[]string{"collect", "-o", "x.h5", "-step", "a", "f1", "f2"}, 2, "exactly one input file"},
		{[]string{"collect", "-o", "x.h5", "-attr", "novalue"}, 2, `"novalue" is not name=value`},
		{[]string{"check"}, 2, "want one study file"},
		{[]string{"check", "-nodes", "1,x", "f.h5"}, 2, `-nodes: "x"`},
		{[]string{"model", "-net", "fast", "f.h5"}, 2, `"fast" is not a bandwidth`},
		{[]string{"model", "-ll", "1,2,3", "f.h5"}, 2, "tokens,hidden,topk,experts"},
		{[]string{"check", "/nonexistent/study.h5"}, 1, "no such file"},
	} {
		code, _, errs := runCmd(t, tc.args...)
		if code != tc.code || !strings.Contains(errs, tc.want) {
			t.Errorf("%q: exit %d, stderr %q; want %d and %q", tc.args, code, errs, tc.code, tc.want)
		}
	}
}

func TestParseBandwidth(t *testing.T) {
	for in, want := range map[string]float64{"50GB/s": 50, "400Gb/s": 50, "400 Gbit/s": 50, "12.5": 12.5, "0": 0, "100Gbps": 12.5} {
		if got, err := parseBandwidth(in); err != nil || got != want {
			t.Errorf("parseBandwidth(%q) = %g, %v; want %g", in, got, err, want)
		}
	}
	for _, in := range []string{"", "-1GB/s", "fast", "NaN"} {
		if _, err := parseBandwidth(in); err == nil {
			t.Errorf("parseBandwidth(%q): no error", in)
		}
	}
}

// TestCommittedStudies reads the studies in docs/scaling back and refits
// them, as docs/scaling.md says: both ran on one real host (the emulated
// hosts of the net study included), and the model stored in each file is the
// one fitted on every run.
func TestCommittedStudies(t *testing.T) {
	for _, c := range []struct {
		path           string
		runs, emulated int
		llDispatchNet  float64 // net per remote peer (us), as documented
	}{
		{"../../docs/scaling/study.h5", 96, 0, 25.52},
		{"../../docs/scaling/net/study.h5", 108, 4, 331.40},
	} {
		s, err := study.Read(c.path)
		if err != nil {
			t.Fatal(err)
		}
		if len(s.Records) != c.runs || s.AttrInt("alloc_hosts", 0) != 1 || s.AttrInt("emulated_hosts", 0) != c.emulated {
			t.Errorf("%s: %d runs, alloc_hosts %q, emulated_hosts %q; want %d, 1, %d", c.path, len(s.Records),
				s.AttrString("alloc_hosts"), s.AttrString("emulated_hosts"), c.runs, c.emulated)
		}
		code, out, errs := runCmd(t, "model", c.path)
		if code != 0 {
			t.Fatalf("model %s: %d %q", c.path, code, errs)
		}
		if want := "(every node of a run on one host)"; !strings.Contains(out, want) {
			t.Errorf("model %s: output lacks %q", c.path, want)
		}
		stored, err := study.ReadModel(c.path)
		if err != nil {
			t.Fatal(err)
		}
		p := stored.Params["ll/dispatch"]
		if !stored.SharedHost || math.Abs(p.NetPerPeer-c.llDispatchNet) > 0.01 {
			t.Errorf("%s: stored model: shared host %v, ll/dispatch net per peer %.2f us; want true, %.2f",
				c.path, stored.SharedHost, p.NetPerPeer, c.llDispatchNet)
		}
		if !strings.Contains(out, fmt.Sprintf("| %.2f |", c.llDispatchNet)) {
			t.Errorf("model %s: the refit's ll/dispatch lacks net per peer %.2f", c.path, c.llDispatchNet)
		}
	}
}
