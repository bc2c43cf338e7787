// Command ep-plot turns ep-bench scaling studies into one HDF5 file, charts
// and a latency-bandwidth model that predicts larger clusters. It needs no
// MPI (build it without the mpi tag); scripts/slurm/study.sbatch runs it.
//
//	ep-plot collect -o out/study.h5 [-new] [-attr name=value]... [-step NAME] [-cmd CMD] [STEP.jsonl...]
//	ep-plot check [-rows N] [-modes ll,ht] [-dtypes f32,bf16] [-nodes 1,2] [-ranks 1,2,4] [-attrs a,b] out/study.h5
//	ep-plot charts [-o DIR] out/study.h5
//	ep-plot model [-holdout-ranks N] [-net 50GB/s] [-ranks-per-node 8] [-write] [-md FILE] [-png FILE] out/study.h5
//	ep-plot traces [-o DIR] [-labels a,b,c] [-md FILE] [-smooth N] [-skip N] [-title T] [-busy F,...] TRACE.h5...
//	ep-plot waits [-o DIR] [-skip N] [-title T] TRACE.h5
//	ep-plot latency [-o FILE] [-target X] SWEEP.jsonl
//	ep-plot serve [-o DIR] [-labels a,b] [-timeline STEP] TRACE.h5...
//
// collect reads the JSON lines of ep-bench -json, one file per job step, and
// appends them to the study file's /results tables, creating it if missing
// (or with -new); -attr sets root attributes (a number or a comma-separated
// list of numbers is stored as such), and Slurm's SLURM_JOB_ID,
// SLURM_JOB_NODELIST, SLURM_JOB_NUM_NODES, SLURM_CLUSTER_NAME and
// SLURM_JOB_PARTITION are recorded when set. A step's command line is -cmd,
// or the file STEP.cmd next to STEP.jsonl. The schema is in package
// internal/study.
//
// check reads the file back with the project's reader, prints a summary and
// fails, naming each problem, if it lacks what the flags ask for.
//
// charts writes PNG charts: ll-latency.png (LL dispatch and combine time
// against tokens per rank) and ht-bandwidth.png (HT bandwidth per rank
// against ranks, one and more nodes), each with ep, the hand-written
// MPI_Alltoallv version and the memcpy bound, one line per element type.
//
// model fits t = f*(a + b*(R-1) + B/shm) + [N>1]*f*(c + d*(R-P) + X/net) +
// (f-1)*(o + B/over) per mode and phase (see docs/scaling.md), prints the
// constants, a table of predicted against measured times with relative
// errors (the largest rank count held out of the fit, then predicted), and
// predictions for 8 to 1024 ranks with the network bandwidth given (-net,
// per node: 50GB/s or 400Gb/s).
//
// traces compares moe-train traces (the grad sync study of
// scripts/slurm/gradsync.sbatch): it prints a Markdown table (per trace its
// loss at the start, at the end and at the wall time where the quickest run
// ended, the median time per step and per sync, the sync's and ep's bytes
// per rank per step, with ratios against the first trace), and writes
// loss.png (the loss against step and against wall time) and cost.png
// (bytes per rank per step, time per step and per sync). With -busy (samples
// of the other work on the machine, as gradsync.sbatch takes them) a second
// table gives the median times of the quiet steps alone: on a shared machine,
// what a step costs when it has the cores to itself.
//
// waits reads a moe-train trace's wait matrix (schema version 4: wait_us,
// how long each rank waited for each other rank in ep calls), sums it over
// the steps, prints it in milliseconds with each rank's total waited for
// and the slowest rank and its host when one stands out (runs.FindStraggler),
// and draws it as a heat map, waits.png: the rank waited for across, the
// waiting rank up.
//
// latency reads an ep-bench -latency -json sweep (tokens per rank 1, 2, 4,
// ... on one group of ranks) and prints, per size, ep's decode round (one
// dispatch+combine back to back, the slowest rank's mean), the hand-written
// MPI_Alltoallv version's and the flag round trip measured in the same run,
// as a Markdown table, and draws them as a chart (ll-round.png) with the
// target, -target times the flag round trip, as a line.
//
// serve reads moe-serve traces (package moe/serve) and prints, per trace,
// what a service owner reads: the decode and prefill steps' latency
// p50/p90/p99, the time to first token, tokens per second in all and per
// rank, the pairs that masking dropped, with ratios against the first
// trace (as a Markdown table); it draws serve-latency.png, the decode
// steps' latency distribution per trace and each step's latency against
// time, where a masked rank's wait shows as a spike. -timeline STEP prints
// the phases of that step of the first trace (attention, dispatch send and
// wait, experts, combine send and wait, per micro-batch) in time order and
// draws them as serve-timeline.png: with the two-batch overlap, one
// micro-batch computes while the other's dispatch or combine is in flight.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/goep/goep/internal/study"
)

func main() { os.Exit(run(os.Stdout, os.Stderr, os.Args[1:])) }

const usage = `usage: ep-plot collect|check|charts|model [flags] STUDY.h5 ...
       ep-plot traces [flags] TRACE.h5 ...
       ep-plot waits [flags] TRACE.h5
       ep-plot latency [flags] SWEEP.jsonl
       ep-plot serve [flags] TRACE.h5...
  collect  add ep-bench -json output (one file per job step) to a study file
  check    read a study file back, summarise it, check what it holds
  charts   write PNG charts of a study
  model    fit the latency-bandwidth model, validate it, predict larger clusters
  traces   compare moe-train traces: loss against step and wall time, bytes and time per step
  waits    a moe-train trace's wait matrix (who waited for whom in ep calls) as a table and a heat map
  latency  an ep-bench -latency sweep: the LL decode round against tokens per rank, beside the flag round trip
  serve    moe-serve traces: step latency p50/p90/p99, time to first token, tokens/s; the latency distribution
ep-plot CMD -h shows a command's flags.`

func run(stdout, stderr io.Writer, args []string) int {
	if len(args) == 0 {
		fmt.Fprintln(stderr, usage)
		return 2
	}
	var err error
	switch args[0] {
	case "collect":
		err = collect(stdout, stderr, args[1:])
	case "check":
		err = check(stdout, stderr, args[1:])
	case "charts":
		err = charts(stdout, stderr, args[1:])
	case "model":
		err = model(stdout, stderr, args[1:])
	case "traces":
		err = traces(stdout, stderr, args[1:])
	case "waits":
		err = waits(stdout, stderr, args[1:])
	case "latency":
		err = latency(stdout, stderr, args[1:])
	case "serve":
		err = serveTraces(stdout, stderr, args[1:])
	case "-h", "-help", "--help", "help":
		fmt.Fprintln(stdout, usage)
		return 0
	default:
		fmt.Fprintf(stderr, "ep-plot: unknown command %q\n%s\n", args[0], usage)
		return 2
	}
	var ue usageError
	switch {
	case err == nil:
		return 0
	case errors.Is(err, flag.ErrHelp):
		return 0
	case errors.As(err, &ue):
		fmt.Fprintln(stderr, "ep-plot "+args[0]+":", err)
		return 2
	default:
		fmt.Fprintln(stderr, "ep-plot "+args[0]+":", err)
		return 1
	}
}

// usageError is a bad command line (exit status 2).
type usageError struct{ error }

func usagef(format string, a ...any) error { return usageError{fmt.Errorf(format, a...)} }

func newFlags(name string, stderr io.Writer, synopsis string) *flag.FlagSet {
	fs := flag.NewFlagSet("ep-plot "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: ep-plot "+name+" "+synopsis)
		fs.PrintDefaults()
	}
	return fs
}

func parse(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return usageError{err}
	}
	return nil
}

// attrFlags collects repeated -attr name=value flags.
type attrFlags map[string]any

func (a attrFlags) String() string { return "" }
func (a attrFlags) Set(s string) error {
	name, value, ok := strings.Cut(s, "=")
	if !ok || name == "" || strings.ContainsAny(name, "/ ") {
		return fmt.Errorf("%q is not name=value", s)
	}
	a[name] = study.ParseAttr(value)
	return nil
}

// slurmAttrs are the Slurm variables collect records.
var slurmAttrs = []string{"SLURM_JOB_ID", "SLURM_JOB_NODELIST", "SLURM_JOB_NUM_NODES", "SLURM_CLUSTER_NAME", "SLURM_JOB_PARTITION"}

func collect(stdout, stderr io.Writer, args []string) error {
	fs := newFlags("collect", stderr, "-o STUDY.h5 [-new] [-attr name=value]... [-step NAME] [-cmd CMD] [STEP.jsonl...]")
	out := fs.String("o", "", "the study file (required)")
	fresh := fs.Bool("new", false, "start the file afresh, even if it exists")
	attrs := attrFlags{}
	fs.Var(attrs, "attr", "name=value: a root attribute (repeatable)")
	stepName := fs.String("step", "", "the step's name (one input file only; default: the file's name)")
	cmd := fs.String("cmd", "", "the step's command line (one input file only; default: STEP.cmd if present)")
	env := fs.Bool("slurm-env", true, "record "+strings.Join(slurmAttrs, ", ")+" when set")
	if err := parse(fs, args); err != nil {
		return err
	}
	if *out == "" {
		return usagef("-o is required")
	}
	if fs.NArg() != 1 && (*stepName != "" || *cmd != "") {
		return usagef("-step and -cmd need exactly one input file, not %d", fs.NArg())
	}
	if *env {
		for _, v := range slurmAttrs {
			if val := os.Getenv(v); val != "" {
				if _, set := attrs[strings.ToLower(v)]; !set {
					attrs[strings.ToLower(v)] = val // as text: a job id is a name
				}
			}
		}
	}
	var steps []study.Step
	for _, path := range fs.Args() {
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		recs, err := study.ParseJSONL(f)
		f.Close()
		if err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		s := study.Step{Name: *stepName, Command: *cmd, Records: recs}
		if s.Name == "" {
			s.Name = strings.TrimSuffix(filepath.Base(path), filepath.Ext(path))
		}
		if s.Command == "" {
			if b, err := os.ReadFile(strings.TrimSuffix(path, filepath.Ext(path)) + ".cmd"); err == nil {
				s.Command = strings.TrimSpace(string(b))
			}
		}
		steps = append(steps, s)
	}
	if err := study.Collect(*out, *fresh, attrs, steps...); err != nil {
		return err
	}
	n := 0
	for _, s := range steps {
		n += len(s.Records)
	}
	fmt.Fprintf(stdout, "ep-plot collect: %s: %d row(s) from %d step(s) added\n", *out, n, len(steps))
	return nil
}

func intList(name, s string) ([]int, error) {
	if s == "" {
		return nil, nil
	}
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil {
			return nil, usagef("-%s: %q is not a whole number", name, f)
		}
		out = append(out, n)
	}
	return out, nil
}

func strList(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(s, ",")
}

func check(stdout, stderr io.Writer, args []string) error {
	fs := newFlags("check", stderr, "[flags] STUDY.h5")
	rows := fs.Int("rows", 1, "at least this many rows")
	modes := fs.String("modes", "", "modes that must occur (comma-separated)")
	dtypes := fs.String("dtypes", "", "element types that must occur")
	nodes := fs.String("nodes", "", "node counts that must occur")
	ranks := fs.String("ranks", "", "rank counts that must occur")
	attrs := fs.String("attrs", "", "root attributes that must be present")
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return usagef("want one study file, got %d arguments", fs.NArg())
	}
	w := study.Want{MinRows: *rows, Modes: strList(*modes), DTypes: strList(*dtypes), Attrs: strList(*attrs)}
	var err error
	if w.Nodes, err = intList("nodes", *nodes); err != nil {
		return err
	}
	if w.Ranks, err = intList("ranks", *ranks); err != nil {
		return err
	}
	s, err := study.Read(fs.Arg(0))
	if err != nil {
		return err
	}
	s.Summary(stdout)
	if err := s.Check(w); err != nil {
		return err
	}
	fmt.Fprintln(stdout, "ep-plot check: ok")
	return nil
}
