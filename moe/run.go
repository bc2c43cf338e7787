package moe

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/goep/goep/mpi"
)

// RunOptions describes a training run: the model and task, how long, and
// which files to write.
type RunOptions struct {
	TrainConfig
	// Steps is the step the run ends at, counting the steps of the
	// checkpoint it resumes from: a run of 2N steps, and a run of N steps
	// resumed with Steps 2N, end in the same state.
	Steps int64
	// TracePath is the trace file rank 0 writes ("": none).
	TracePath string
	// CheckpointDir is where checkpoints go, as ckpt-<step>.h5 ("": none).
	CheckpointDir string
	// CheckpointEvery writes a checkpoint every that many steps (0: only
	// at the end). The last step always gets one when CheckpointDir is set.
	CheckpointEvery int64
	// Resume is a checkpoint to continue from ("": start from scratch).
	Resume string
	// FlushEvery flushes the trace every that many steps (0: every step).
	FlushEvery int64
	// Nodes and Command are recorded in the trace.
	Nodes   int
	Command string
	// OnStep, if set, is called on every rank after each step (after the
	// step's trace row and checkpoint are written).
	OnStep func(*StepStats)
}

// RunResult sums up a run; it is the same on every rank except for Files,
// which lists what rank 0 wrote.
type RunResult struct {
	First, Last  *StepStats // the run's first and last steps
	Steps        int64      // steps run (not counting those before a resume)
	Tokens       int64      // tokens processed over all ranks
	StepTime     time.Duration
	MeanDispatch time.Duration // per step, mean over ranks and steps
	MeanCombine  time.Duration
	Files        []string // trace and checkpoints written
}

// TokensPerSecond is the training throughput: tokens over all ranks per
// second of step time (checkpoint writing excluded).
func (r *RunResult) TokensPerSecond() float64 {
	if r.StepTime <= 0 {
		return 0
	}
	return float64(r.Tokens) / r.StepTime.Seconds()
}

// CollectiveError is an error that every rank of the run returned at the
// same point (a bad configuration, a checkpoint that does not fit, a file
// that rank 0 could not write): the job can end normally. Other errors from
// Run may be on one rank only, and the caller should abort the job
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

// CheckpointPath is the name of the checkpoint of step in dir.
func CheckpointPath(dir string, step int64) string {
	return filepath.Join(dir, fmt.Sprintf("ckpt-%06d.h5", step))
}

// Run trains as o says: it builds the trainer, resumes from o.Resume if set,
// runs until step o.Steps, and writes the trace and the checkpoints.
// Collective.
func Run(comm *mpi.Comm, o RunOptions) (_ *RunResult, err error) {
	if err := o.Validate(comm.Size()); err != nil {
		return nil, collective(err)
	}
	if o.Steps <= 0 || o.CheckpointEvery < 0 || o.FlushEvery < 0 {
		return nil, collective(fmt.Errorf("moe: invalid run: steps = %d, checkpoint every %d, flush every %d", o.Steps, o.CheckpointEvery, o.FlushEvery))
	}
	tr, err := NewTrainer(comm, o.TrainConfig)
	if err != nil {
		return nil, err
	}
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
	if o.Resume != "" {
		if err := tr.LoadCheckpoint(o.Resume); err != nil {
			return nil, collective(err)
		}
		if tr.StepsDone() >= o.Steps {
			return nil, collective(fmt.Errorf("moe: the checkpoint %s is at step %d: nothing to do for a run to step %d (steps counts from the start of the first run)", o.Resume, tr.StepsDone(), o.Steps))
		}
	}
	start := time.Now()
	res := &RunResult{}
	rank0 := comm.Rank() == 0
	var trace *Trace
	if rank0 {
		err = prepareFiles(o)
		if err == nil && o.TracePath != "" {
			trace, err = CreateTrace(o.TracePath, TraceInfo{Config: o.TrainConfig, WorldSize: comm.Size(), Nodes: o.Nodes,
				Steps: o.Steps, StartStep: tr.StepsDone(), ResumedFrom: o.Resume, Command: o.Command, Start: start})
		}
		if err == nil && trace != nil {
			res.Files = append(res.Files, o.TracePath)
		}
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
	flushEvery := max(o.FlushEvery, 1)
	var dispatchUS, combineUS float64
	for tr.StepsDone() < o.Steps {
		st, err := tr.Step()
		if err != nil {
			return nil, err
		}
		if res.First == nil {
			res.First = st
		}
		res.Last = st
		res.Steps++
		res.Tokens += int64(st.Tokens)
		res.StepTime += st.Elapsed
		for r := range st.DispatchUS {
			dispatchUS += st.DispatchUS[r] / float64(len(st.DispatchUS))
			combineUS += st.CombineUS[r] / float64(len(st.CombineUS))
		}
		ckpt := o.CheckpointDir != "" && (st.Step == o.Steps || (o.CheckpointEvery > 0 && st.Step%o.CheckpointEvery == 0))
		if trace != nil {
			if err := trace.Append(st, time.Now()); err != nil {
				return nil, err
			}
			if st.Step%flushEvery == 0 || ckpt || st.Step == o.Steps {
				if err := trace.Flush(); err != nil {
					return nil, err
				}
			}
		}
		if ckpt {
			path := CheckpointPath(o.CheckpointDir, st.Step)
			if err := tr.SaveCheckpoint(path); err != nil {
				return nil, collective(err)
			}
			if rank0 {
				res.Files = append(res.Files, path)
			}
		}
		if o.OnStep != nil {
			o.OnStep(st)
		}
	}
	res.MeanDispatch = time.Duration(dispatchUS / float64(res.Steps) * 1e3)
	res.MeanCombine = time.Duration(combineUS / float64(res.Steps) * 1e3)
	return res, nil
}

// prepareFiles creates the directories of the run's files.
func prepareFiles(o RunOptions) error {
	var errs []error
	if o.CheckpointDir != "" {
		errs = append(errs, os.MkdirAll(o.CheckpointDir, 0o755))
	}
	if o.TracePath != "" {
		errs = append(errs, os.MkdirAll(filepath.Dir(o.TracePath), 0o755))
	}
	return errors.Join(errs...)
}
