package study

import (
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/goep/goep/moe"
)

// TestSlurmOutputs reads back, with the project's readers, the files that
// make test-slurm's batch jobs wrote (scripts/slurm/test-slurm.sh runs it
// with GOEP_SLURM_OUTPUTS set to its log directory; skipped otherwise):
//
//	train/trace.h5              train.sbatch, srun, 2 nodes x 2 ranks, 200 steps
//	train/trace-from-000200.h5  train.sbatch again, mpirun, resumed to step 300
//	study/study.h5              study.sbatch, srun, layouts on 1 and 2 nodes
func TestSlurmOutputs(t *testing.T) {
	dir := os.Getenv("GOEP_SLURM_OUTPUTS")
	if dir == "" {
		t.Skip("GOEP_SLURM_OUTPUTS is not set: run by make test-slurm")
	}
	for _, tc := range []struct {
		file       string
		start, end int64
		resumed    string
	}{
		{"trace.h5", 0, 200, ""},
		{"trace-from-000200.h5", 200, 300, "ckpt-000200.h5"},
	} {
		path := filepath.Join(dir, "train", tc.file)
		tr, err := moe.ReadTrace(path)
		if err != nil {
			t.Fatal(err)
		}
		if tr.Nodes != 2 || tr.WorldSize != 4 {
			t.Errorf("%s: %d ranks on %d nodes, want 4 on 2 (srun -N 2 --ntasks-per-node=2)", path, tr.WorldSize, tr.Nodes)
		}
		if n := int64(len(tr.Loss)); n != tc.end-tc.start || tr.StartStep != tc.start ||
			len(tr.Step) == 0 || tr.Step[len(tr.Step)-1] != tc.end {
			t.Errorf("%s: %d steps from %d, want %d..%d", path, n, tr.StartStep, tc.start+1, tc.end)
		}
		if !strings.HasSuffix(tr.ResumedFrom, tc.resumed) || (tc.resumed == "") != (tr.ResumedFrom == "") {
			t.Errorf("%s: resumed from %q, want %q", path, tr.ResumedFrom, tc.resumed)
		}
		for i, l := range tr.Loss {
			if math.IsNaN(l) || math.IsInf(l, 0) || l < 0 {
				t.Fatalf("%s: loss[%d] = %g", path, i, l)
			}
		}
		if len(tr.DispatchUS) != len(tr.Loss)*tr.WorldSize {
			t.Errorf("%s: %d dispatch times, want steps x ranks = %d", path, len(tr.DispatchUS), len(tr.Loss)*tr.WorldSize)
		}
	}

	path := filepath.Join(dir, "study", "study.h5")
	s, err := Read(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Check(Want{MinRows: 2, Modes: []string{"ll", "ht"}, DTypes: []string{"f32", "bf16"}, Nodes: []int{1, 2},
		Attrs: []string{"slurm_job_id", "slurm_job_nodelist", "slurm_job_num_nodes", "date", "sweep_layouts", "launcher"}}); err != nil {
		t.Error(err)
	}
	// Every row of a step launched on 2 Slurm nodes says 2 nodes, and only those.
	for i := range s.Records {
		r := &s.Records[i]
		step := s.Steps[r.Step]
		if want := map[bool]int{true: 2, false: 1}[strings.Contains(step, "-2x")]; r.Nodes != want {
			t.Errorf("row %d (step %s): %d nodes, want %d", i, step, r.Nodes, want)
		}
		if !strings.Contains(s.Commands[r.Step], "srun") {
			t.Errorf("step %s: command %q is not an srun", step, s.Commands[r.Step])
		}
	}
	m, err := ReadModel(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"ll/dispatch", "ll/combine", "ht/dispatch", "ht/combine"} {
		if p, ok := m.Params[key]; !ok || !p.HasNet || p.FitRuns == 0 {
			t.Errorf("model %s: %+v, want fitted with net terms", key, p)
		}
	}
}
