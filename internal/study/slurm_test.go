package study

import (
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/goep/goep/moe/runs"
)

// TestSlurmOutputs reads back, with the project's readers, the files that
// make test-slurm's batch jobs wrote (scripts/slurm/test-slurm.sh runs it
// with GOEP_SLURM_OUTPUTS set to its log directory; skipped otherwise):
//
//	train/trace.h5    one run in three jobs of train.sbatch: srun on 2 nodes x 2 ranks
//	                  to step 200, mpirun on 2 x 2 to 300, srun on 1 node x 2 to 400
//	study/study.h5    study.sbatch, srun, layouts on 1 and 2 nodes
//
// GOEP_SLURM_FIRST_NODE names the first node (default n1).
func TestSlurmOutputs(t *testing.T) {
	dir := os.Getenv("GOEP_SLURM_OUTPUTS")
	if dir == "" {
		t.Skip("GOEP_SLURM_OUTPUTS is not set: run by make test-slurm")
	}
	n1 := os.Getenv("GOEP_SLURM_FIRST_NODE") // the first node's name: n1, or goep-h1 on hosts of their own
	if n1 == "" {
		n1 = "n1"
	}
	path := filepath.Join(dir, "train", "trace.h5")
	tr, err := runs.ReadTrace(path)
	if err != nil {
		t.Fatal(err)
	}
	if tr.RunID == "" || len(tr.Step) != 400 || tr.Step[0] != 1 || tr.Step[399] != 400 {
		t.Errorf("%s: run %q, %d steps, want one run of steps 1..400", path, tr.RunID, len(tr.Step))
	}
	for i, want := range []struct {
		start         int64
		ranks, nodes  int
		resumed       string
		command, host string
	}{{0, 4, 2, "", "", n1 + "@"}, {200, 4, 2, "ckpt-000200.h5", "", ""}, {300, 2, 1, "ckpt-000300.h5", "-resume auto", n1 + "@"}} {
		if i >= len(tr.Segments) {
			t.Fatalf("%s: %d segments, want 3", path, len(tr.Segments))
		}
		s := tr.Segments[i]
		if s.StartStep != want.start || s.WorldSize != want.ranks || s.Nodes != want.nodes {
			t.Errorf("%s: segment %d: from step %d on %d ranks, %d nodes; want %d, %d, %d", path, i, s.StartStep, s.WorldSize, s.Nodes, want.start, want.ranks, want.nodes)
		}
		if !strings.HasSuffix(s.Checkpoint, want.resumed) || (want.resumed == "") != (s.Checkpoint == "") {
			t.Errorf("%s: segment %d resumed from %q, want %q", path, i, s.Checkpoint, want.resumed)
		}
		if !strings.Contains(s.Command, want.command) || !strings.HasPrefix(s.Hosts, want.host) {
			t.Errorf("%s: segment %d: command %q, hosts %q", path, i, s.Command, s.Hosts)
		}
	}
	if tr.WorldSize != 2 || tr.Nodes != 1 || tr.RankColumns != 4 {
		t.Errorf("%s: latest segment %d ranks on %d nodes, %d rank columns; want 2, 1, 4", path, tr.WorldSize, tr.Nodes, tr.RankColumns)
	}
	for i, l := range tr.Loss {
		if math.IsNaN(l) || math.IsInf(l, 0) || l < 0 {
			t.Fatalf("%s: loss[%d] = %g", path, i, l)
		}
	}
	if len(tr.DispatchUS) != len(tr.Loss)*tr.RankColumns {
		t.Errorf("%s: %d dispatch times, want steps x rank columns = %d", path, len(tr.DispatchUS), len(tr.Loss)*tr.RankColumns)
	}
	for i := range tr.Step {
		ranks := tr.Segments[tr.SegmentOf(i)].WorldSize
		for r, v := range tr.DispatchUS[i*tr.RankColumns : (i+1)*tr.RankColumns] {
			if (r < ranks) == math.IsNaN(v) {
				t.Fatalf("%s: step %d (%d ranks): dispatch_us of rank column %d is %g", path, tr.Step[i], ranks, r, v)
			}
		}
	}

	path = filepath.Join(dir, "study", "study.h5")
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
