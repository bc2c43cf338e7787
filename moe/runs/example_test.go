package runs_test

import (
	"fmt"
	"log"
	"os"
	"path/filepath"
	"time"

	"github.com/goep/goep/ep"
	"github.com/goep/goep/moe"
	"github.com/goep/goep/moe/runs"
	"github.com/goep/goep/mpi"
)

// exampleConfig is a tiny model for the examples: two experts per rank.
func exampleConfig(ranks int) moe.TrainConfig {
	return moe.TrainConfig{Config: moe.Config{Mode: ep.LowLatency, DType: moe.Float32, Experts: 2 * ranks, TopK: 2,
		Hidden: 8, FFN: 16, Tokens: 16, Act: moe.SiLU, Seed: 1}, TeacherSeed: 2, LR: 0.01}
}

// A run of 4 steps with a checkpoint every 2, and then the same run
// continued to step 6 from its newest checkpoint, on every rank of the job
// (under mpirun, or on one rank alone). Rank 0 writes the files; the other
// ranks' paths are not used.
func ExampleTrain() {
	world, err := mpi.Init()
	if err != nil {
		log.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "runs-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	o := runs.Options{TrainConfig: exampleConfig(world.Size()), Steps: 4,
		TracePath: filepath.Join(dir, "trace.h5"), CheckpointDir: dir, CheckpointEvery: 2}
	first, err := runs.Train(world, o)
	if err != nil {
		log.Fatal(err)
	}
	o.Steps, o.Resume = 6, runs.ResumeAuto
	again, err := runs.Train(world, o)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("first: %d steps; again: from step %d (%s), %d steps, the same run: %v\n",
		first.Steps, again.StartStep, filepath.Base(again.ResumedFrom), again.Steps, again.RunID == first.RunID)
	// Output: first: 4 steps; again: from step 4 (ckpt-000004.h5), 2 steps, the same run: true
}

// A trainer's state saved to a checkpoint and restored into a new trainer,
// which goes on from the same step, in the same run.
func ExampleSaveCheckpoint() {
	world, err := mpi.Init()
	if err != nil {
		log.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "runs-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	cfg := exampleConfig(world.Size())
	tr, err := moe.NewTrainer(world, cfg)
	if err != nil {
		log.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		if _, err := tr.Step(); err != nil {
			log.Fatal(err)
		}
	}
	path := runs.CheckpointPath(dir, tr.StepsDone())
	if err := runs.SaveCheckpoint(tr, path, "20250812T141502Z-3f9a1c2b"); err != nil {
		log.Fatal(err)
	}
	if err := tr.Close(); err != nil {
		log.Fatal(err)
	}

	resumed, err := moe.NewTrainer(world, cfg)
	if err != nil {
		log.Fatal(err)
	}
	defer resumed.Close()
	id, err := runs.LoadCheckpoint(resumed, path)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(filepath.Base(path), "of run", id, "at step", resumed.StepsDone())
	// Output: ckpt-000003.h5 of run 20250812T141502Z-3f9a1c2b at step 3
}

// A trace written by hand, one process, one rank: a segment and two rows,
// read back.
func ExampleCreateTrace() {
	dir, err := os.MkdirTemp("", "runs-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "trace.h5")
	cfg := exampleConfig(1)
	start := time.Now()
	tr, err := runs.CreateTrace(path, runs.TraceInfo{RunID: runs.NewID(start), Config: cfg,
		Segment: runs.Segment{WorldSize: 1, Nodes: 1, Steps: 2, Start: start}})
	if err != nil {
		log.Fatal(err)
	}
	for step, loss := range []float64{0.9, 0.7} {
		st := &moe.StepStats{Step: int64(step + 1), Loss: loss, TokensPerExpert: []int64{10, 6},
			DispatchUS: []float64{12}, CombineUS: []float64{15}, BytesSent: []int64{0}, SyncUS: []float64{1}, SyncBytes: []int64{0},
			WaitUS: []float64{0}, PeerSent: []int64{512}, PeerRecv: []int64{512}}
		if err := tr.Append(st, time.Now()); err != nil {
			log.Fatal(err)
		}
	}
	if err := tr.Close(); err != nil {
		log.Fatal(err)
	}
	d, err := runs.ReadTrace(path)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("schema", d.Version, "steps", d.Step, "loss", d.Loss, "segments", len(d.Segments), "backend", d.Device.Backend)
	// Output: schema 5 steps [1 2] loss [0.9 0.7] segments 1 backend cpu
}

// What a resume changes, as the run says when it starts: here a checkpoint
// of 4 ranks of 16 tokens resumed on 2 ranks of 32, the same global batch.
func ExampleCheckpointInfo_Changes() {
	cfg := exampleConfig(4)
	cfg.Tokens = 16
	ck := runs.CheckpointInfo{Step: 100, WorldSize: 4, Config: cfg}
	now := cfg
	now.Tokens = 32
	if err := ck.Compatible(now, 2); err != nil {
		log.Fatal(err)
	}
	for _, s := range ck.Changes(now, 2) {
		fmt.Println(s)
	}
	// Output:
	// world size = 4 ranks in the checkpoint, 2 in this run: its 8 experts are resharded, 4 per rank
	// tokens per rank = 16 in the checkpoint, 32 in this run; the global batch is 64 tokens per step in both
}

// A run's wait matrix (microseconds rank i waited for rank j, summed over
// the steps): ranks 0, 1 and 3 each waited about 4 ms for rank 2, which is
// the one that stands out.
func ExampleFindStraggler() {
	waits := []float64{
		0, 300, 4000, 200,
		250, 0, 4200, 100,
		150, 200, 0, 300,
		100, 150, 3900, 0,
	}
	if s, ok := runs.FindStraggler(waits, 4); ok {
		fmt.Printf("rank %d: the others waited %.1f ms for it, %.0f%% of all waiting\n", s.Rank, s.WaitedUS/1e3, 100*s.Share)
	}
	// Output: rank 2: the others waited 12.1 ms for it, 87% of all waiting
}
