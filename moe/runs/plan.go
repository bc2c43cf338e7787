package runs

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/goep/goep/internal/h5"
)

// This file decides, before anything is written, what a run does with the
// files already at its trace path and in its checkpoint directory: a run
// never writes over another run's files, and never loses any of its own
// without being asked.

// ResumeAuto as Options.Resume continues the run whose checkpoints are in
// the checkpoint directory, from its newest checkpoint, or starts a new run
// when there are none.
const ResumeAuto = "auto"

// ckptName matches the file names CheckpointPath makes.
var ckptName = regexp.MustCompile(`^ckpt-([0-9]{6,})\.h5$`)

// scanCheckpoints reads the attributes of every checkpoint in dir (files
// named as CheckpointPath names them), sorted by step. A missing directory
// has none; a file of that name that is not a usable checkpoint is an error
// naming it.
func scanCheckpoints(dir string) ([]*CheckpointInfo, error) {
	if dir == "" {
		return nil, nil
	}
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("runs: checkpoint directory: %w", err)
	}
	var out []*CheckpointInfo
	for _, e := range entries {
		if !ckptName.MatchString(e.Name()) || e.IsDir() {
			continue
		}
		info, err := ReadCheckpointInfo(filepath.Join(dir, e.Name()))
		if err != nil {
			return nil, err
		}
		out = append(out, info)
	}
	slices.SortFunc(out, func(a, b *CheckpointInfo) int {
		if a.Step != b.Step {
			return int(a.Step - b.Step)
		}
		return strings.Compare(a.Path, b.Path)
	})
	return out, nil
}

// runFiles are the files of one run (or of files of no known run, id "")
// found where a run is about to write.
type runFiles struct {
	id    string
	trace *TraceData
	ckpts []*CheckpointInfo
}

// describe names the files and what they hold, for messages.
func (r *runFiles) describe() string {
	id := "run " + r.id
	if r.id == "" {
		id = "files with no run id (written before run ids: version 1)"
	}
	var parts []string
	if r.trace != nil {
		p := fmt.Sprintf("trace %s", r.trace.Path)
		if n := len(r.trace.Step); n > 0 {
			p += fmt.Sprintf(" (steps %d..%d, %d segment(s))", r.trace.Step[0], r.trace.Step[n-1], len(r.trace.Segments))
		}
		parts = append(parts, p)
	}
	switch n := len(r.ckpts); {
	case n == 1:
		parts = append(parts, "checkpoint "+r.ckpts[0].Path)
	case n > 1:
		parts = append(parts, fmt.Sprintf("%d checkpoints %s ... %s", n, r.ckpts[0].Path, filepath.Base(r.ckpts[n-1].Path)))
	}
	return id + ": " + strings.Join(parts, ", ")
}

// groupRuns groups checkpoints (and the trace, if any) by run id, in order
// of first appearance by step.
func groupRuns(trace *TraceData, ckpts []*CheckpointInfo) []*runFiles {
	var found []*runFiles
	find := func(id string) *runFiles {
		for _, r := range found {
			if r.id == id {
				return r
			}
		}
		r := &runFiles{id: id}
		found = append(found, r)
		return r
	}
	for _, c := range ckpts {
		r := find(c.RunID)
		r.ckpts = append(r.ckpts, c)
	}
	if trace != nil {
		find(trace.RunID).trace = trace
	}
	return found
}

// move is a file to move aside, and where.
type move struct {
	from, to string
	runID    string
}

// runPlan is what a run does with the files that are there, decided by rank
// 0 before anything changes.
type runPlan struct {
	runID       string          // the run's identity
	resume      *CheckpointInfo // the checkpoint to resume from; nil: from scratch
	nothingToDo bool            // auto-resume found the run done
	trace       *TraceData      // the run's own trace, to continue; nil: create one
	moves       []move
	notes       []string
}

// planRun looks at the trace path and the checkpoint directory and decides,
// or refuses with an error naming the file, the field and both values. It
// changes nothing. newID is the identity a new run gets; now names the
// directories files are moved aside to.
func planRun(o Options, ranks int, newID string, now time.Time) (*runPlan, error) {
	trace, err := existingTrace(o.TracePath)
	if err != nil && !o.Fresh {
		return nil, err
	}
	if errors.Is(err, h5.ErrLocked) {
		return nil, err // another process is writing it: even -fresh leaves it alone
	}
	unreadableTrace := err != nil
	ckpts, err := scanCheckpoints(o.CheckpointDir)
	if err != nil {
		return nil, fmt.Errorf("%w (the checkpoint directory %s must hold only this run's checkpoints)", err, o.CheckpointDir)
	}
	p := &runPlan{runID: newID}
	found := groupRuns(trace, ckpts)

	switch o.Resume {
	case "":
		if len(found) == 0 && !unreadableTrace {
			p.notes = append(p.notes, fmt.Sprintf("run %s: from scratch to step %d", newID, o.Steps))
			return p, nil
		}
		if !o.Fresh {
			var what []string
			for _, r := range found {
				what = append(what, r.describe())
			}
			return nil, fmt.Errorf("runs: refusing to start a new run (run_id %s) over another run's files: %s; -resume %s continues that run, -fresh moves its files aside and starts over",
				newID, strings.Join(what, "; "), ResumeAuto)
		}
		var files []move
		if o.TracePath != "" && (trace != nil || unreadableTrace) {
			id := ""
			if trace != nil {
				id = trace.RunID
			}
			files = append(files, move{from: o.TracePath, runID: id})
		}
		for _, c := range ckpts {
			files = append(files, move{from: c.Path, runID: c.RunID})
		}
		p.moves = planMoves(files, now)
		p.notes = append(p.notes, fmt.Sprintf("run %s: from scratch to step %d (-fresh)", newID, o.Steps))
		return p, nil

	case ResumeAuto:
		if o.CheckpointDir == "" {
			return nil, errors.New("runs: -resume auto looks for the run's checkpoints in the checkpoint directory, and none is set (-ckpt-dir)")
		}
		if unreadableTrace {
			return nil, err
		}
		withCkpts := slices.DeleteFunc(slices.Clone(found), func(r *runFiles) bool { return len(r.ckpts) == 0 })
		switch {
		case len(found) == 0:
			p.notes = append(p.notes, fmt.Sprintf("run %s: from scratch to step %d (no checkpoint in %s to resume from)", newID, o.Steps, o.CheckpointDir))
			return p, nil
		case len(found) > 1:
			var what []string
			for _, r := range found {
				what = append(what, r.describe())
			}
			where := o.CheckpointDir
			if o.TracePath != "" {
				where += " and " + o.TracePath
			}
			return nil, fmt.Errorf("runs: cannot resume automatically: %s hold files of %d runs (run_id differs): %s; move the files of the run not to continue out of the way, or start over with -fresh (without -resume), which moves them all aside",
				where, len(found), strings.Join(what, "; "))
		case len(withCkpts) == 0:
			return nil, fmt.Errorf("runs: cannot resume automatically: %s, but %s has no checkpoint of it to resume from; -fresh moves it aside and starts over",
				found[0].describe(), o.CheckpointDir)
		case found[0].id == "":
			return nil, fmt.Errorf("runs: cannot resume automatically: %s; resume one explicitly with -resume PATH and another -ckpt-dir", found[0].describe())
		}
		c := found[0].ckpts
		return planResume(p, o, ranks, c[len(c)-1], trace, ckpts, true, now)

	default:
		if unreadableTrace {
			return nil, err
		}
		info, err := ReadCheckpointInfo(o.Resume)
		if err != nil {
			return nil, err
		}
		return planResume(p, o, ranks, info, trace, ckpts, false, now)
	}
}

// planResume plans the continuation of the run of checkpoint info.
func planResume(p *runPlan, o Options, ranks int, info *CheckpointInfo, trace *TraceData, ckpts []*CheckpointInfo, auto bool, now time.Time) (*runPlan, error) {
	if err := info.Compatible(o.TrainConfig, ranks); err != nil {
		return nil, err
	}
	if info.RunID != "" {
		p.runID = info.RunID
	}
	if info.Step >= o.Steps {
		if auto {
			p.nothingToDo = true
			p.notes = append(p.notes, fmt.Sprintf("run %s: the newest checkpoint, %s, is at step %d and the run asks for %d: nothing to do", info.RunID, info.Path, info.Step, o.Steps))
			return p, nil
		}
		return nil, fmt.Errorf("runs: the checkpoint %s is at step %d: nothing to do for a run to step %d (steps counts from the start of the first run)", info.Path, info.Step, o.Steps)
	}
	p.resume = info
	how := "resuming"
	if auto {
		how = "resuming (newest checkpoint)"
	}
	p.notes = append(p.notes, fmt.Sprintf("run %s: %s from %s at step %d, to step %d", p.runID, how, info.Path, info.Step, o.Steps))
	if info.RunID == "" {
		p.notes = append(p.notes, fmt.Sprintf("%s has no run id (checkpoint version 1, written by an older moe-train, whose data stream was drawn per (step, rank)): it continues as run %s, on this program's data stream", info.Path, p.runID))
	}
	p.notes = append(p.notes, info.Changes(o.TrainConfig, ranks)...)
	var superseded []move
	for _, c := range ckpts {
		if c.RunID != p.runID {
			return nil, fmt.Errorf("runs: refusing to write run %s's checkpoints into %s: %s belongs to another run: run_id = %q in that checkpoint, %q in this run (resumed from %s); use another -ckpt-dir, or move that run's files away",
				p.runID, o.CheckpointDir, c.Path, c.RunID, p.runID, info.Path)
		}
		if c.Step > info.Step {
			superseded = append(superseded, move{from: c.Path, runID: c.RunID})
		}
	}
	if len(superseded) > 0 {
		p.moves = planMoves(superseded, now)
	}
	if trace != nil {
		if err := trace.continuableBy(p.runID, o.TrainConfig); err != nil {
			return nil, err
		}
		p.trace = trace
		if n := len(trace.Step); n > 0 && trace.Step[n-1] < info.Step {
			p.notes = append(p.notes, fmt.Sprintf("the trace %s ends at step %d, before the checkpoint's %d: it will have no rows for steps %d..%d",
				trace.Path, trace.Step[n-1], info.Step, trace.Step[n-1]+1, info.Step))
		}
	} else if o.TracePath != "" && info.Step > 0 {
		p.notes = append(p.notes, fmt.Sprintf("no trace at %s: a new trace of run %s starts at step %d", o.TracePath, p.runID, info.Step+1))
	}
	return p, nil
}

// existingTrace reads the trace at path, or returns nil if there is none.
// A file there that is not a readable trace is an error naming it.
func existingTrace(path string) (*TraceData, error) {
	if path == "" {
		return nil, nil
	}
	if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	d, err := ReadTrace(path)
	if err != nil {
		if errors.Is(err, h5.ErrLocked) {
			return nil, fmt.Errorf("runs: %s is open for writing by another process (a run still going?): %w", path, err)
		}
		return nil, fmt.Errorf("runs: %s is there and is not a trace this run can continue or replace unasked (%w); -fresh moves it aside", path, err)
	}
	return d, nil
}

// asideDir is the directory files of dir are moved aside to: a new
// directory dir/moved-aside/<time>, never one that exists.
func asideDir(dir string, now time.Time) string {
	base := filepath.Join(dir, "moved-aside", now.UTC().Format("20060102T150405Z"))
	d := base
	for i := 2; ; i++ {
		if _, err := os.Lstat(d); errors.Is(err, fs.ErrNotExist) {
			return d
		}
		d = base + "-" + strconv.Itoa(i)
	}
}

// planMoves gives each file its place in the aside directory of its own
// directory.
func planMoves(files []move, now time.Time) []move {
	dirs := map[string]string{}
	for i := range files {
		dir := filepath.Dir(files[i].from)
		if dirs[dir] == "" {
			dirs[dir] = asideDir(dir, now)
		}
		files[i].to = filepath.Join(dirs[dir], filepath.Base(files[i].from))
	}
	return files
}

// moveAside moves the files and returns a sentence per aside directory
// saying what went there.
func moveAside(moves []move, why string) ([]string, error) {
	type group struct {
		dir   string
		names []string
		runs  []string
	}
	var groups []*group
	for _, m := range moves {
		dir := filepath.Dir(m.to)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, fmt.Errorf("runs: moving %s aside: %w", m.from, err)
		}
		if err := os.Rename(m.from, m.to); err != nil {
			return nil, fmt.Errorf("runs: moving %s aside: %w", m.from, err)
		}
		i := slices.IndexFunc(groups, func(g *group) bool { return g.dir == dir })
		if i < 0 {
			groups = append(groups, &group{dir: dir})
			i = len(groups) - 1
		}
		g := groups[i]
		g.names = append(g.names, filepath.Base(m.from))
		id := m.runID
		if id == "" {
			id = "none"
		}
		if !slices.Contains(g.runs, id) {
			g.runs = append(g.runs, id)
		}
	}
	var notes []string
	for _, g := range groups {
		notes = append(notes, fmt.Sprintf("%s: moved %d file(s) of run %s to %s/: %s", why, len(g.names), strings.Join(g.runs, ", "), g.dir, strings.Join(g.names, " ")))
	}
	return notes, nil
}
