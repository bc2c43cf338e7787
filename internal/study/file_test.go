package study

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/goep/goep/internal/h5"
)

// Two lines as ep-bench -json prints them, with a launcher's noise around.
const sampleJSONL = `srun: job 7 queued
{"mode":"ll","ranks":4,"nodes":2,"tokens":64,"hidden":256,"topk":2,"experts":8,"dtype":"f32","iters":5,"bytes_per_rank":131072,"dispatch_us":523.6,"combine_us":253.5,"dispatch_gbps":0.29,"combine_gbps":0.6,"alltoallv_dispatch_us":900,"alltoallv_combine_us":700,"alltoallv_dispatch_gbps":0.1,"alltoallv_combine_gbps":0.2,"speedup_vs_alltoallv":2.05,"memcpy_gbps":4.3,"dispatch_memcpy_frac":0.07,"combine_memcpy_frac":0.14,"buffer_bytes_per_rank":809984}

{"mode":"ht","ranks":4,"nodes":2,"tokens":64,"hidden":256,"topk":2,"experts":8,"dtype":"bf16","iters":5,"bytes_per_rank":61696,"dispatch_us":400,"combine_us":300,"dispatch_gbps":0.15,"combine_gbps":0.2,"memcpy_gbps":4.0,"dispatch_memcpy_frac":0.04,"combine_memcpy_frac":0.05,"buffer_bytes_per_rank":416768,"a_new_field":1}
`

func TestParseJSONL(t *testing.T) {
	recs, err := ParseJSONL(strings.NewReader(sampleJSONL))
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 2 || recs[0].Mode != "ll" || recs[1].DType != "bf16" || recs[0].AlltoallvCombineUS != 700 ||
		recs[1].Speedup != 0 || recs[0].RanksPerNode() != 2 || recs[1].ElemBytes() != 2 {
		t.Errorf("parsed %+v", recs)
	}
	for _, bad := range []string{
		`{"mode":"xx","ranks":1,"nodes":1,"tokens":1,"hidden":1,"topk":1,"experts":1,"dtype":"f32","iters":1,"dispatch_us":1,"combine_us":1}`,
		`{"mode":"ll","ranks":3,"nodes":4,"tokens":1,"hidden":1,"topk":1,"experts":1,"dtype":"f32","iters":1,"dispatch_us":1,"combine_us":1}`,
		`{"mode":"ll","ranks":1,"nodes":1,"tokens":1,"hidden":1,"topk":1,"experts":1,"dtype":"f32","iters":1,"dispatch_us":0,"combine_us":1}`,
		`{"mode":"ll",`,
	} {
		if _, err := ParseJSONL(strings.NewReader("\n" + bad + "\n")); err == nil || !strings.Contains(err.Error(), "line 2") {
			t.Errorf("%s: error %v, want one naming line 2", bad, err)
		}
	}
}

func TestCollectReadCheck(t *testing.T) {
	path := filepath.Join(t.TempDir(), "study.h5")
	recs, err := ParseJSONL(strings.NewReader(sampleJSONL))
	if err != nil {
		t.Fatal(err)
	}
	attrs := map[string]any{"slurm_job_id": "42", "sweep_tokens_ll": ParseAttr("16,64"), "sweep_modes": ParseAttr("ll,ht"),
		"launcher": "srun"}
	// An empty study first, as the study script starts, then a step at a time.
	if err := Collect(path, true, attrs); err != nil {
		t.Fatal(err)
	}
	if s, err := Read(path); err != nil || len(s.Records) != 0 || len(s.Steps) != 0 {
		t.Fatalf("empty study: %v, %v", s, err)
	}
	if err := Collect(path, false, nil, Step{Name: "000-2x4-ll", Command: "srun -N 2 -n 4 bin/ep-bench", Records: recs[:1]}); err != nil {
		t.Fatal(err)
	}
	if err := Collect(path, false, map[string]any{"launcher": "mpirun"}, Step{Command: "mpirun -np 4", Records: recs[1:]}); err != nil {
		t.Fatal(err)
	}
	s, err := Read(path)
	if err != nil {
		t.Fatal(err)
	}
	recs[1].Step = 1
	if !reflect.DeepEqual(s.Records, recs) {
		t.Errorf("read back\n%+v\nwant\n%+v", s.Records, recs)
	}
	if !reflect.DeepEqual(s.Steps, []string{"000-2x4-ll", "step-1"}) ||
		!reflect.DeepEqual(s.Commands, []string{"srun -N 2 -n 4 bin/ep-bench", "mpirun -np 4"}) {
		t.Errorf("steps %q, commands %q", s.Steps, s.Commands)
	}
	if s.AttrString("launcher") != "mpirun" || s.AttrString("slurm_job_id") != "42" || s.AttrInt("slurm_job_id", 0) != 42 ||
		!reflect.DeepEqual(s.Attrs["sweep_tokens_ll"], []int64{16, 64}) || s.AttrString("sweep_modes") != "ll ht" ||
		s.AttrString("format") != Format || s.AttrInt("host_cpus", 0) < 1 {
		t.Errorf("attributes %v", s.Attrs)
	}
	if err := s.Check(Want{MinRows: 2, Modes: []string{"ll", "ht"}, DTypes: []string{"f32", "bf16"}, Nodes: []int{2},
		Ranks: []int{4}, Attrs: []string{"slurm_job_id"}}); err != nil {
		t.Error(err)
	}
	err = s.Check(Want{MinRows: 3, Nodes: []int{1}, Ranks: []int{8}, Attrs: []string{"slurm_job_nodelist"}})
	for _, want := range []string{"2 rows, want at least 3", "no row measured on 1 node(s) (nodes seen: [2])", "8 rank(s)", "slurm_job_nodelist"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Check error %v, want %q in it", err, want)
		}
	}
	var sum strings.Builder
	s.Summary(&sum)
	for _, want := range []string{"2 rows from 2 job steps", "Slurm job 42", "nodes x ranks 2x4", "modes ll,ht"} {
		if !strings.Contains(sum.String(), want) {
			t.Errorf("summary %q lacks %q", sum.String(), want)
		}
	}

	// The model goes into the same file and comes back.
	m := &Model{Params: knownParams, CPUs: 2, SharedHost: true}
	if err := WriteModel(path, m, map[string]any{"fit_note": "synthetic"}); err != nil {
		t.Fatal(err)
	}
	m2, err := ReadModel(path)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(m, m2) {
		t.Errorf("model read back %+v, want %+v", m2, m)
	}
	if _, err := Read(path); err != nil {
		t.Errorf("study with a model: %v", err)
	}

	// h5dump, HDF5's own reader, sees the tables and attributes.
	if _, err := exec.LookPath("h5dump"); err != nil {
		if os.Getenv("GOEP_REQUIRE_TOOLS") == "1" {
			t.Fatal("h5dump is required (GOEP_REQUIRE_TOOLS=1) but missing: apt-get install hdf5-tools")
		}
		t.Skip("no h5dump")
	}
	var out []byte
	for _, args := range [][]string{{"-d", "/results/dispatch_us", path}, {"-A", path}} {
		o, err := exec.Command("h5dump", args...).CombinedOutput()
		if err != nil {
			t.Fatalf("h5dump %q: %v\n%s", args, err, o)
		}
		out = append(out, o...)
	}
	for _, want := range []string{`DATASET "/results/dispatch_us"`, "(0): 523.6, 400", `"goep-ep-study"`, `ATTRIBUTE "step_commands"`} {
		if !strings.Contains(string(out), want) {
			t.Errorf("h5dump output lacks %q:\n%s", want, out)
		}
	}
}

func TestCollectErrors(t *testing.T) {
	dir := t.TempDir()
	other := filepath.Join(dir, "other.h5")
	f, err := h5.Create(other)
	if err != nil {
		t.Fatal(err)
	}
	f.SetAttr("", "format", "goep-moe-trace")
	f.Close()
	if err := Collect(other, false, nil); err == nil || !strings.Contains(err.Error(), `format "goep-moe-trace"`) {
		t.Errorf("Collect into a trace: %v", err)
	}
	if _, err := Read(other); err == nil {
		t.Error("Read of a trace: no error")
	}
	if _, err := Read(filepath.Join(dir, "missing.h5")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Read of a missing file: %v", err)
	}
}

func TestParseAttr(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want any
	}{
		{"12", int64(12)}, {"1.5", 1.5}, {"n[1-2]", "n[1-2]"}, {"1,2, 4", []int64{1, 2, 4}},
		{"0.5,1", []float64{0.5, 1}}, {"ll,ht", []string{"ll", "ht"}}, {"1x1 2x4", "1x1 2x4"}, {"", ""},
	} {
		if got := ParseAttr(tc.in); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("ParseAttr(%q) = %#v, want %#v", tc.in, got, tc.want)
		}
	}
}
