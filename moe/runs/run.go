package runs

import (
	cryptorand "crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/goep/goep/moe"
	"github.com/goep/goep/mpi"
)

// Options describes a training run: the model and task, how long, and
// which files to write.
type Options struct {
	moe.TrainConfig
	// Steps is the step the run ends at, counting the steps of the
	// checkpoint it resumes from: a run of 2N steps, and a run of N steps
	// resumed with Steps 2N, end in the same state.
	Steps int64
	// TracePath is the trace file rank 0 writes ("": none). A run resumed
	// with the trace of its run there continues it (see ContinueTrace).
	TracePath string
	// CheckpointDir is where checkpoints go, as ckpt-<step>.h5 ("": none).
	// It holds the checkpoints of one run.
	CheckpointDir string
	// CheckpointEvery writes a checkpoint every that many steps (0: only
	// at the end). The last step always gets one when CheckpointDir is set.
	CheckpointEvery int64
	// Resume is a checkpoint to continue from; ResumeAuto for the newest
	// checkpoint of the run in CheckpointDir, or a new run if there is none;
	// "" to start a new run.
	Resume string
	// Fresh starts a new run even where another run's trace or checkpoints
	// are: they are moved aside (to DIR/moved-aside/<time>/) first, never
	// deleted. Without it a new run refuses to start there. Not with Resume.
	Fresh bool
	// FlushEvery flushes the trace every that many steps (0: every step).
	FlushEvery int64
	// Nodes and Command are recorded in the trace.
	Nodes   int
	Command string
	// Device describes the device the ep calls run on (Config.Backend),
	// for the trace's segment and the checkpoints; its Backend is filled
	// in from the layer's (moe.Trainer.SetDevice).
	Device moe.Device
	// OnNote, if set, is called on rank 0 with each thing the run has to say
	// before it trains: which run it is, what it resumes from, what changed
	// since the checkpoint, the files it moved aside, the trace rows it
	// dropped (Result.Notes collects them too).
	OnNote func(string)
	// OnStep, if set, is called on every rank after each step (after the
	// step's trace row and checkpoint are written).
	OnStep func(*moe.StepStats)
	// BetweenPasses, if set, is called on this rank between each step's
	// forward and backward (moe.Trainer.SetBetweenPasses).
	BetweenPasses func(step int64)
}

// Result sums up a run; it is the same on every rank except for Files,
// Notes and DroppedRows, which are rank 0's.
type Result struct {
	RunID        string         // the run's identity (new, or the checkpoint's)
	StartStep    int64          // the step it started after (the checkpoint's; 0 from scratch)
	ResumedFrom  string         // the checkpoint it resumed from, or ""
	NothingToDo  bool           // Resume was ResumeAuto and the run was already at Steps
	First, Last  *moe.StepStats // the run's first and last steps (nil if none)
	Steps        int64          // steps run (not counting those before a resume)
	Tokens       int64          // tokens processed over all ranks
	StepTime     time.Duration
	MeanDispatch time.Duration // per step, mean over ranks and steps
	MeanCombine  time.Duration
	MeanSync     time.Duration // per step, mean over ranks and steps: the data-parallel gradient sync
	SyncBytes    int64         // per step, mean over ranks and steps: bytes the sync sent
	// Per step, mean over ranks and steps: the copies between the host and
	// the ep group's memory (moe.CommStats.Copies), their bytes and time.
	Copies    float64
	CopyBytes int64
	MeanCopy  time.Duration
	Device    moe.Device // what the ep calls ran on
	// WaitUS is, [ranks][ranks] row-major, how long rank i waited for rank j
	// in ep calls over the run's steps, in microseconds (NaN where the
	// engine does not measure it); Hosts the host of each rank; Straggler
	// the rank the others waited for most, when one stands out
	// (FindStraggler), or nil.
	WaitUS      []float64
	Hosts       []string
	Straggler   *Straggler
	Files       []string // trace and checkpoints written
	Notes       []string // what OnNote was told
	DroppedRows int64    // trace rows after the checkpoint's step that the resume dropped
}

// TokensPerSecond is the training throughput: tokens over all ranks per
// second of step time (checkpoint writing excluded).
func (r *Result) TokensPerSecond() float64 {
	if r.StepTime <= 0 {
		return 0
	}
	return float64(r.Tokens) / r.StepTime.Seconds()
}

// CollectiveError is an error that every rank of the run returned at the
// same point (a bad configuration, a checkpoint that does not fit, a file
// that rank 0 could not write): the job can end normally. Other errors from
// Train may be on one rank only, and the caller should abort the job
// (mpi.Abort) so that the others do not wait for it.
type CollectiveError struct{ Err error }

func (e *CollectiveError) Error() string { return e.Err.Error() }
func (e *CollectiveError) Unwrap() error { return e.Err }

func collective(err error) error {
	if err == nil {
		return nil
	}
	return &CollectiveError{err}
}

// NewID returns a new run identity: the UTC start time and 32 random bits,
// such as "20250812T141502Z-3f9a1c2b". It sorts by start time and is safe in
// file names. Traces and checkpoints record it (Result.RunID), so that files
// of different runs are never mixed up.
func NewID(start time.Time) string {
	var b [4]byte
	if _, err := cryptorand.Read(b[:]); err != nil {
		// crypto/rand does not fail on Linux; the clock's nanoseconds still
		// tell two runs of the same second apart.
		binary.LittleEndian.PutUint32(b[:], uint32(start.UnixNano()))
	}
	return start.UTC().Format("20060102T150405Z") + "-" + hex.EncodeToString(b[:])
}

// CheckpointPath is the name of the checkpoint of step in dir.
func CheckpointPath(dir string, step int64) string {
	return filepath.Join(dir, fmt.Sprintf("ckpt-%06d.h5", step))
}

// Train runs a training run as o says: it builds the trainer, decides what
// to do with the files already at the trace path and in the checkpoint
// directory (a new run refuses another run's files unless o.Fresh; a resume
// continues its own run's trace and refuses any other run's files), resumes
// from o.Resume if set, trains until step o.Steps, and writes the trace and
// the checkpoints. Every refusal happens before any file is changed.
// Collective.
func Train(comm *mpi.Comm, o Options) (_ *Result, err error) {
	if err := checkRun(o, comm.Size()); err != nil {
		return nil, collective(err)
	}
	tr, err := moe.NewTrainer(comm, o.TrainConfig)
	if err != nil {
		return nil, err
	}
	tr.SetBetweenPasses(o.BetweenPasses)
	tr.SetDevice(o.Device)
	defer func() {
		// Close is collective: skip it after an error that may be on this
		// rank alone (the caller aborts the job).
		var ce *CollectiveError
		if err != nil && !errors.As(err, &ce) {
			return
		}
		if cerr := tr.Close(); err == nil && cerr != nil {
			err = cerr
		}
	}()
	hostList, hosts, err := gatherHosts(comm)
	if err != nil {
		return nil, err
	}
	start := time.Now()
	rank0 := comm.Rank() == 0
	res := &Result{Hosts: hostList, Device: tr.Device()}
	note := func(s string) {
		res.Notes = append(res.Notes, s)
		if o.OnNote != nil {
			o.OnNote(s)
		}
	}

	// Rank 0 looks at the files and decides; nothing changes yet.
	var plan *runPlan
	if rank0 {
		plan, err = planRun(o, comm.Size(), NewID(start), start)
	}
	if err := agree(comm, err); err != nil {
		return nil, collective(err)
	}
	resume, nothing, err := sharePlan(comm, plan, res)
	if err != nil {
		return nil, err
	}
	planNotes := func() {
		if rank0 {
			for _, n := range plan.notes {
				note(n)
			}
		}
	}
	if nothing {
		planNotes()
		res.NothingToDo = true
		return res, nil
	}
	if resume != "" {
		if _, err := LoadCheckpoint(tr, resume); err != nil {
			return nil, collective(err)
		}
		res.ResumedFrom = resume
	}
	res.StartStep = tr.StepsDone()

	// Now rank 0 changes files: moves others aside, opens the trace.
	planNotes()
	var trace *Trace
	if rank0 {
		trace, err = openRunFiles(o, plan, tr, res.RunID, comm.Size(), hosts, start, res, note)
	}
	if err := agree(comm, err); err != nil {
		return nil, collective(err)
	}
	if trace != nil {
		defer func() {
			if cerr := trace.Close(); err == nil && cerr != nil {
				err = cerr
			}
		}()
	}
	var sums stepSums
	for tr.StepsDone() < o.Steps {
		st, err := tr.Step()
		if err != nil {
			return nil, err
		}
		sums.add(res, st)
		if err := recordStep(o, tr, res.RunID, trace, st, rank0, res); err != nil {
			return nil, err
		}
		if o.OnStep != nil {
			o.OnStep(st)
		}
	}
	sums.summarize(res, comm.Size())
	return res, nil
}

// checkRun refuses options that no run can follow.
func checkRun(o Options, ranks int) error {
	if err := o.Validate(ranks); err != nil {
		return err
	}
	if o.Steps <= 0 || o.CheckpointEvery < 0 || o.FlushEvery < 0 {
		return fmt.Errorf("runs: invalid run: steps = %d, checkpoint every %d, flush every %d", o.Steps, o.CheckpointEvery, o.FlushEvery)
	}
	if o.Fresh && o.Resume != "" {
		return fmt.Errorf("runs: invalid run: fresh (start a new run) and resume %q (continue one) contradict each other", o.Resume)
	}
	return nil
}

// sharePlan gives every rank what rank 0's plan (nil on the other ranks)
// decided: the run's identity (res.RunID: a new one, or the checkpoint's),
// the checkpoint to resume from ("" for none), and whether the run has
// nothing left to do.
func sharePlan(comm *mpi.Comm, plan *runPlan, res *Result) (resume string, nothing bool, err error) {
	flags := []int64{0}
	if plan != nil {
		res.RunID = plan.runID
		if plan.resume != nil {
			resume = plan.resume.Path
		}
		if plan.nothingToDo {
			flags[0] = 1
		}
	}
	if res.RunID, err = bcastString(comm, res.RunID, 0); err != nil {
		return "", false, err
	}
	if resume, err = bcastString(comm, resume, 0); err != nil {
		return "", false, err
	}
	if err := mpi.BcastSlice(comm, flags, 0); err != nil {
		return "", false, err
	}
	return resume, flags[0] == 1, nil
}

// recordStep writes step st where the options ask: a trace row (rank 0's
// trace, flushed every FlushEvery steps, at a checkpoint and at the end)
// and, every CheckpointEvery steps and at the last, a checkpoint, which
// every rank takes part in.
func recordStep(o Options, tr *moe.Trainer, runID string, trace *Trace, st *moe.StepStats, rank0 bool, res *Result) error {
	ckpt := o.CheckpointDir != "" && (st.Step == o.Steps || (o.CheckpointEvery > 0 && st.Step%o.CheckpointEvery == 0))
	if trace != nil {
		if err := trace.Append(st, time.Now()); err != nil {
			return err
		}
		if st.Step%max(o.FlushEvery, 1) == 0 || ckpt || st.Step == o.Steps {
			if err := trace.Flush(); err != nil {
				return err
			}
		}
	}
	if !ckpt {
		return nil
	}
	path := CheckpointPath(o.CheckpointDir, st.Step)
	if err := SaveCheckpoint(tr, path, runID); err != nil {
		return collective(err)
	}
	if rank0 {
		res.Files = append(res.Files, path)
	}
	return nil
}

// stepSums accumulates, over a run's steps, the per-step means over ranks
// that the result reports as means over steps.
type stepSums struct{ dispatchUS, combineUS, syncUS, syncBytes, copies, copyBytes, copyUS float64 }

// add counts step st into the result and the sums.
func (s *stepSums) add(res *Result, st *moe.StepStats) {
	if res.First == nil {
		res.First = st
	}
	res.Last = st
	res.Steps++
	res.Tokens += int64(st.Tokens)
	res.StepTime += st.Elapsed
	if res.WaitUS == nil {
		res.WaitUS = make([]float64, len(st.WaitUS))
	}
	for i, v := range st.WaitUS {
		res.WaitUS[i] += v
	}
	for r := range st.DispatchUS {
		R := float64(len(st.DispatchUS))
		s.dispatchUS += st.DispatchUS[r] / R
		s.combineUS += st.CombineUS[r] / R
		s.syncUS += st.SyncUS[r] / R
		s.syncBytes += float64(st.SyncBytes[r]) / R
		s.copies += float64(st.Copies[r]) / R
		s.copyBytes += float64(st.CopyBytes[r]) / R
		s.copyUS += st.CopyUS[r] / R
	}
}

// summarize sets the result's means over steps and its straggler.
func (s *stepSums) summarize(res *Result, ranks int) {
	n := float64(res.Steps)
	res.MeanDispatch = time.Duration(s.dispatchUS / n * 1e3)
	res.MeanCombine = time.Duration(s.combineUS / n * 1e3)
	res.MeanSync = time.Duration(s.syncUS / n * 1e3)
	res.SyncBytes = int64(math.Round(s.syncBytes / n))
	res.Copies = s.copies / n
	res.CopyBytes = int64(math.Round(s.copyBytes / n))
	res.MeanCopy = time.Duration(s.copyUS / n * 1e3)
	if st, ok := FindStraggler(res.WaitUS, ranks); ok {
		st.Host = res.Hosts[st.Rank]
		res.Straggler = &st
	}
}

// openRunFiles carries out rank 0's plan: it creates the directories, moves
// files aside, and creates or continues the trace.
func openRunFiles(o Options, plan *runPlan, tr *moe.Trainer, runID string, ranks int, hosts string, start time.Time, res *Result, note func(string)) (*Trace, error) {
	if err := prepareFiles(o); err != nil {
		return nil, err
	}
	why := "another run was there (-fresh)"
	if plan.resume != nil {
		why = fmt.Sprintf("checkpoints after step %d, of the branch this resume abandons", plan.resume.Step)
	}
	notes, err := moveAside(plan.moves, why)
	for _, n := range notes {
		note(n)
	}
	if err != nil || o.TracePath == "" {
		return nil, err
	}
	info := TraceInfo{RunID: runID, Config: o.TrainConfig, Segment: Segment{StartStep: tr.StepsDone(), Checkpoint: res.ResumedFrom,
		Steps: o.Steps, WorldSize: ranks, Nodes: o.Nodes, Hosts: hosts, Command: o.Command, Start: start, Device: tr.Device()}}
	var trace *Trace
	if plan.trace != nil {
		trace, res.DroppedRows, err = ContinueTrace(o.TracePath, info)
		if err == nil {
			segs := len(plan.trace.Segments) + 1
			kept := plan.trace.RowsUpTo(tr.StepsDone())
			if res.DroppedRows > 0 {
				d := plan.trace.Step[kept:]
				note(fmt.Sprintf("trace %s continues as segment %d: kept the %d rows up to step %d, dropped %d rows of steps %d..%d (work after the checkpoint, lost)",
					o.TracePath, segs, kept, tr.StepsDone(), res.DroppedRows, d[0], d[len(d)-1]))
			} else {
				note(fmt.Sprintf("trace %s continues as segment %d: kept its %d rows, dropped none", o.TracePath, segs, kept))
			}
		}
	} else {
		trace, err = CreateTrace(o.TracePath, info)
	}
	if err != nil {
		return nil, err
	}
	res.Files = append(res.Files, o.TracePath)
	return trace, nil
}

// gatherHosts names the host of every rank, in rank order and as
// "host:ranks,host:ranks"; under Slurm a host is SLURMD_NODENAME@host, since
// one machine may run several Slurm nodes. Collective.
func gatherHosts(comm *mpi.Comm) ([]string, string, error) {
	host, err := mpi.ProcessorName()
	if err != nil {
		return nil, "", err
	}
	if s := os.Getenv("SLURMD_NODENAME"); s != "" {
		host = s + "@" + host
	}
	all, err := gatherStrings(comm, host, 256)
	if err != nil {
		return nil, "", fmt.Errorf("runs: gathering host names: %w", err)
	}
	var parts []string
	for i := 0; i < len(all); {
		j := i
		for j < len(all) && all[j] == all[i] {
			j++
		}
		parts = append(parts, fmt.Sprintf("%s:%d", all[i], j-i))
		i = j
	}
	return all, strings.Join(parts, ","), nil
}

// prepareFiles creates the directories of the run's files.
func prepareFiles(o Options) error {
	var errs []error
	if o.CheckpointDir != "" {
		errs = append(errs, os.MkdirAll(o.CheckpointDir, 0o755))
	}
	if o.TracePath != "" {
		errs = append(errs, os.MkdirAll(filepath.Dir(o.TracePath), 0o755))
	}
	return errors.Join(errs...)
}
