// Command moe-train trains a toy Mixture-of-Experts layer over goep's
// expert-parallel dispatch and combine, on every rank of an MPI job: a
// student MoE learns to reproduce a fixed random teacher MoE on random
// tokens (package moe). Rank 0 shows progress, writes an HDF5 trace of every
// step and, with the other ranks' experts gathered, HDF5 checkpoints.
//
// Build and run it with 4 ranks (make run does this):
//
//	go build -tags mpi -o bin/moe-train ./examples/moe-train
//	mpirun -np 4 bin/moe-train -steps 2000 -mode ll -dtype f32
//	mpirun -np 4 bin/moe-train -steps 4000 -resume auto              # 2000 more, the same run and trace
//	mpirun -np 2 bin/moe-train -steps 6000 -resume auto -tokens 128  # 2000 more on 2 ranks, the same data
//	mpirun -np 4 bin/moe-train -steps 2000 -fresh                    # a new run; the old one's files are moved aside
//	h5ls -r out/trace.h5
//
// A run has an identity (a run id) kept by its resumes. A new run refuses to
// write where another run's trace or checkpoints are (-fresh moves them to
// DIR/moved-aside/<time>/ first); a resume continues the run's own trace,
// keeping its rows up to the checkpoint's step and dropping later ones (it
// says how many), and may use another number of ranks (any that divides the
// experts), mode or element type. Keep -tokens x ranks to train on the same
// data as an uninterrupted run; moe-train says when the global batch changes.
//
// Flags:
//
//	-experts N        experts in all, a multiple of the ranks (8)
//	-topk K           experts per token (2)
//	-hidden H         model width (32)
//	-ffn F            width of each expert's inner layer (64)
//	-tokens T         tokens per rank per step (64)
//	-steps S          the step to end at, counting those before a resume (1000)
//	-mode ll|ht       low-latency or high-throughput dispatch (ll)
//	-dtype f32|bf16|fp8  element type on the wire (f32); fp8: bf16 tokens dispatched as FP8 e4m3, combined in bf16
//	-act silu|gelu    the experts' activation (silu)
//	-seed N           the student's initial parameters and the data (1)
//	-teacher-seed N   the teacher's parameters (2)
//	-lr X             Adam's learning rate (0.01)
//	-aux X            weight of the load-balancing loss (0.01)
//	-trace PATH       the trace file ("" for none) (out/trace.h5)
//	-ckpt-dir DIR     where checkpoints go ("" for none) (out)
//	-ckpt-every N     a checkpoint every N steps, and one at the end (0: only at the end) (500)
//	-resume PATH      continue from this checkpoint; "auto": from the newest
//	                  checkpoint of the run in -ckpt-dir, or start one if none
//	-fresh            start a new run even where another run's files are:
//	                  they are moved aside to DIR/moved-aside/<time>/
//	-progress-every N on a log, a progress line every N steps (0: none) (100)
//	-progress MODE    auto, bar or lines: auto shows a live bar when the
//	                  output is a terminal, lines otherwise (auto)
//	-timeout D        how long a rank waits for a peer before failing (60s)
//
// With the environment variable GOEP_MOE_PID_DIR set, every rank writes its
// process id to DIR/rank-<r>.pid (for tests that kill one rank).
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/goep/goep/ep"
	"github.com/goep/goep/moe"
	"github.com/goep/goep/mpi"
)

func main() { os.Exit(run(os.Stdout, os.Stderr, os.Args[1:])) }

// options are the parsed flags.
type options struct {
	run           moe.RunOptions
	progressEvery int64
	progress      string
	timeout       time.Duration
}

// parse reads the flags. It returns a non-negative exit code when the
// program should stop (-h, or a bad flag, reported on stderr).
func parse(stderr io.Writer, args []string, quiet bool) (*options, int) {
	fs := flag.NewFlagSet("moe-train", flag.ContinueOnError)
	if quiet {
		fs.SetOutput(io.Discard)
	} else {
		fs.SetOutput(stderr)
	}
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: mpirun -np N moe-train [flags]\n\nTrains a toy MoE layer over goep's expert-parallel dispatch and combine.\n\nFlags:")
		fs.PrintDefaults()
	}
	experts := fs.Int("experts", 8, "experts in all, a multiple of the number of ranks")
	topk := fs.Int("topk", 2, "experts per token")
	hidden := fs.Int("hidden", 32, "model width")
	ffn := fs.Int("ffn", 64, "width of each expert's inner layer")
	tokens := fs.Int("tokens", 64, "tokens per rank per step")
	steps := fs.Int64("steps", 1000, "the step to end at, counting the steps before a resume")
	mode := fs.String("mode", "ll", "dispatch mode: ll (low-latency) or ht (high-throughput)")
	dtype := fs.String("dtype", "f32", "element type on the wire: f32, bf16, or fp8 (bf16 tokens dispatched as FP8 e4m3 with per-128 scales)")
	act := fs.String("act", "silu", "the experts' activation: silu or gelu")
	seed := fs.Uint64("seed", 1, "seed of the student's initial parameters and of the data")
	teacherSeed := fs.Uint64("teacher-seed", 2, "seed of the teacher's parameters")
	lr := fs.Float64("lr", 0.01, "Adam's learning rate")
	aux := fs.Float64("aux", 0.01, "weight of the load-balancing loss")
	trace := fs.String("trace", "out/trace.h5", "the trace file (empty: none)")
	ckptDir := fs.String("ckpt-dir", "out", "directory of the checkpoints (empty: none)")
	ckptEvery := fs.Int64("ckpt-every", 500, "write a checkpoint every N steps, and one at the end (0: only at the end)")
	resume := fs.String("resume", "", "continue from this checkpoint; \"auto\": from the newest checkpoint of the run in -ckpt-dir, or start one if none")
	fresh := fs.Bool("fresh", false, "start a new run even where another run's trace or checkpoints are: they are moved aside to DIR/moved-aside/<time>/")
	progressEvery := fs.Int64("progress-every", 100, "when the output is not a terminal, a progress line every N steps (0: none)")
	progress := fs.String("progress", "auto", "progress display: auto, bar or lines")
	timeout := fs.Duration("timeout", time.Minute, "how long a rank waits for a peer before failing")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, 0
		}
		return nil, 2
	}
	bad := func(format string, a ...any) (*options, int) {
		if !quiet {
			fmt.Fprintf(stderr, "moe-train: "+format+"\n", a...)
		}
		return nil, 2
	}
	if fs.NArg() > 0 {
		return bad("unexpected argument %q (flags only; see -h)", fs.Arg(0))
	}
	for _, f := range []struct {
		name string
		v    int
	}{{"experts", *experts}, {"topk", *topk}, {"hidden", *hidden}, {"ffn", *ffn}, {"tokens", *tokens}} {
		if f.v <= 0 {
			return bad("-%s %d: want a positive integer", f.name, f.v)
		}
	}
	if *topk > *experts {
		return bad("-topk %d: more than the %d experts (-experts)", *topk, *experts)
	}
	if *steps <= 0 {
		return bad("-steps %d: want a positive integer", *steps)
	}
	if *ckptEvery < 0 {
		return bad("-ckpt-every %d: want 0 (only at the end) or a positive integer", *ckptEvery)
	}
	if *progressEvery < 0 {
		return bad("-progress-every %d: want 0 (none) or a positive integer", *progressEvery)
	}
	if !(*lr > 0 && *lr <= 1) {
		return bad("-lr %v: want 0 < lr <= 1", *lr)
	}
	if !(*aux >= 0 && *aux <= 1000) {
		return bad("-aux %v: want 0 <= aux <= 1000", *aux)
	}
	if *fresh && *resume != "" {
		return bad("-fresh starts a new run and -resume %q continues one: give one of them", *resume)
	}
	if *resume == moe.ResumeAuto && *ckptDir == "" {
		return bad("-resume auto looks for checkpoints in -ckpt-dir, which is empty")
	}
	if *timeout <= 0 {
		return bad("-timeout %v: want a positive duration", *timeout)
	}
	m, err := ep.ParseMode(*mode)
	if err != nil {
		return bad("-mode %q: want ll or ht", *mode)
	}
	d, err := moe.ParseDType(*dtype)
	if err != nil {
		return bad("-dtype %q: want f32, bf16 or fp8", *dtype)
	}
	a, err := moe.ParseActivation(*act)
	if err != nil {
		return bad("-act %q: want silu or gelu", *act)
	}
	switch *progress {
	case "auto", "bar", "lines":
	default:
		return bad("-progress %q: want auto, bar or lines", *progress)
	}
	o := &options{progressEvery: *progressEvery, progress: *progress, timeout: *timeout}
	o.run = moe.RunOptions{
		TrainConfig: moe.TrainConfig{
			Config: moe.Config{Mode: m, DType: d, Experts: *experts, TopK: *topk, Hidden: *hidden, FFN: *ffn,
				Tokens: *tokens, Act: a, Seed: *seed, Timeout: *timeout},
			TeacherSeed: *teacherSeed, LR: *lr, AuxCoef: *aux,
		},
		Steps: *steps, TracePath: *trace, CheckpointDir: *ckptDir, CheckpointEvery: *ckptEvery, Resume: *resume, Fresh: *fresh,
		Command: strings.Join(append([]string{"moe-train"}, args...), " "),
	}
	return o, -1
}

func run(stdout, stderr io.Writer, args []string) int {
	// Before MPI starts, the launcher's rank decides who reports flag errors.
	o, code := parse(stderr, args, mpi.DetectLaunch().Rank > 0)
	if code >= 0 {
		return code
	}
	world, err := mpi.Init()
	if err != nil {
		fmt.Fprintln(stderr, "moe-train:", err)
		return 1
	}
	world.SetTimeout(o.timeout)
	rank := world.Rank()
	if err := train(stdout, world, o); err != nil {
		var ce *moe.CollectiveError
		if errors.As(err, &ce) {
			// Every rank has this error: rank 0 reports it and the job ends normally.
			if rank == 0 {
				fmt.Fprintln(stderr, "moe-train:", err)
			}
			mpi.Finalize()
			return 1
		}
		fmt.Fprintf(stderr, "moe-train: rank %d: %v\n", rank, err)
		mpi.Abort(1, err.Error()) // the other ranks may be waiting for this one
		return 1
	}
	if err := mpi.Finalize(); err != nil {
		fmt.Fprintln(stderr, "moe-train:", err)
		return 1
	}
	return 0
}

func train(stdout io.Writer, world *mpi.Comm, o *options) error {
	if dir := os.Getenv("GOEP_MOE_PID_DIR"); dir != "" {
		if err := writePID(dir, world.Rank()); err != nil {
			return err
		}
	}
	topo, err := world.Topology()
	if err != nil {
		return err
	}
	o.run.Nodes = topo.Nodes
	if err := topo.Free(); err != nil {
		return err
	}
	var p *progress
	if world.Rank() == 0 {
		p = newProgress(stdout, o, world.Size(), o.run.Nodes)
		o.run.OnStep = p.step
		o.run.OnNote = func(s string) { fmt.Fprintln(stdout, "moe-train:", s) }
	}
	res, err := moe.Run(world, o.run)
	if err != nil {
		if p != nil {
			p.abandon()
		}
		return err
	}
	if p != nil && !res.NothingToDo {
		p.summary(res)
	}
	return nil
}

func writePID(dir string, rank int) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, fmt.Sprintf("rank-%d.pid", rank)), []byte(strconv.Itoa(os.Getpid())+"\n"), 0o644)
}

// progress shows rank 0's view of the run: a live bar on a terminal, a line
// every few steps otherwise.
type progress struct {
	w             io.Writer
	bar           bool
	every         int64
	o             *options
	ranks         int
	nodes         int
	start         time.Time
	firstStep     int64 // the step before the run's first
	lastDraw      time.Time
	lastLen       int
	win           window
	drewSomething bool
}

// window accumulates the steps since the last report.
type window struct {
	steps             int64
	tokens            int64
	stepTime          time.Duration
	dispatch, combine float64 // microseconds, mean over ranks, summed over steps
}

func newProgress(w io.Writer, o *options, ranks, nodes int) *progress {
	bar := o.progress == "bar" || (o.progress == "auto" && isTerminal(w))
	p := &progress{w: w, bar: bar, every: o.progressEvery, o: o, ranks: ranks, nodes: nodes, start: time.Now(), firstStep: -1}
	c := o.run
	fmt.Fprintf(w, "moe-train: %d ranks on %d node(s), %s/%s, %d experts top-%d, hidden %d, ffn %d, %d tokens per rank, to step %d\n",
		ranks, nodes, c.Mode, c.DType, c.Experts, c.TopK, c.Hidden, c.FFN, c.Tokens, c.Steps)
	return p
}

func (p *progress) step(st *moe.StepStats) {
	if p.firstStep < 0 {
		p.firstStep = st.Step - 1
		p.start = time.Now().Add(-st.Elapsed)
	}
	p.win.steps++
	p.win.tokens += int64(st.Tokens)
	p.win.stepTime += st.Elapsed
	for r := range st.DispatchUS {
		p.win.dispatch += st.DispatchUS[r] / float64(len(st.DispatchUS))
		p.win.combine += st.CombineUS[r] / float64(len(st.CombineUS))
	}
	last := st.Step == p.o.run.Steps
	now := time.Now()
	if p.bar {
		if !last && now.Sub(p.lastDraw) < 100*time.Millisecond {
			return
		}
		line := p.line(st, now, true)
		pad := ""
		if n := p.lastLen - len(line); n > 0 {
			pad = strings.Repeat(" ", n)
		}
		fmt.Fprint(p.w, "\r"+line+pad)
		p.lastLen, p.lastDraw, p.drewSomething = len(line), now, true
		if last {
			fmt.Fprintln(p.w)
		}
		p.win = window{}
		return
	}
	if p.every > 0 && (st.Step%p.every == 0 || last) {
		fmt.Fprintln(p.w, p.line(st, now, false))
		p.win = window{}
	}
}

// abandon ends a live bar's line before an error is printed.
func (p *progress) abandon() {
	if p.bar && p.drewSomething {
		fmt.Fprintln(p.w)
	}
}

func (p *progress) line(st *moe.StepStats, now time.Time, bar bool) string {
	total := p.o.run.Steps
	done := st.Step - p.firstStep
	left := total - st.Step
	eta := time.Duration(float64(now.Sub(p.start)) / float64(done) * float64(left))
	tps := 0.0
	if p.win.stepTime > 0 {
		tps = float64(p.win.tokens) / p.win.stepTime.Seconds()
	}
	n := float64(max(p.win.steps, 1))
	width := len(strconv.FormatInt(total, 10))
	var b strings.Builder
	fmt.Fprintf(&b, "step %*d/%d ", width, st.Step, total)
	if bar {
		const cells = 20
		full := int(float64(cells) * float64(st.Step) / float64(total))
		fmt.Fprintf(&b, "[%s%s] ", strings.Repeat("#", full), strings.Repeat(".", cells-full))
	}
	fmt.Fprintf(&b, "loss %.4f aux %.4f | %s tok/s | dispatch %s combine %s | ETA %s",
		st.Loss, st.AuxLoss, si(tps), micro(p.win.dispatch/n), micro(p.win.combine/n), clock(eta))
	return b.String()
}

func (p *progress) summary(r *moe.RunResult) {
	c := p.o.run
	w := p.w
	if r.Steps == 0 {
		return
	}
	ratio := r.First.Loss / r.Last.Loss
	fmt.Fprintf(w, "moe-train: done: run %s, steps %d..%d (%s/%s, %d ranks, %d node(s)) in %s\n",
		r.RunID, r.First.Step, r.Last.Step, c.Mode, c.DType, p.ranks, p.nodes, clock(time.Since(p.start)))
	fmt.Fprintf(w, "  loss      %.4f -> %.4f (%.1fx lower); aux loss %.4f -> %.4f\n", r.First.Loss, r.Last.Loss, ratio, r.First.AuxLoss, r.Last.AuxLoss)
	fmt.Fprintf(w, "  speed     %s tokens/s; per step: dispatch %s, combine %s (mean over ranks and steps)\n",
		si(r.TokensPerSecond()), micro(float64(r.MeanDispatch.Nanoseconds())/1e3), micro(float64(r.MeanCombine.Nanoseconds())/1e3))
	var trace string
	var ckpts []string
	for _, f := range r.Files {
		if f == c.TracePath {
			trace = f
		} else {
			ckpts = append(ckpts, f)
		}
	}
	if trace != "" {
		fmt.Fprintf(w, "  trace     %s (h5ls -r %s; schema: docs/trace-schema.md)\n", trace, trace)
	}
	switch {
	case len(ckpts) == 1:
		fmt.Fprintf(w, "  checkpoint %s\n", ckpts[0])
	case len(ckpts) > 1:
		fmt.Fprintf(w, "  checkpoints %d: %s ... %s\n", len(ckpts), ckpts[0], ckpts[len(ckpts)-1])
	}
}

// si formats a rate with a k/M suffix.
func si(v float64) string {
	switch {
	case v >= 1e6:
		return fmt.Sprintf("%.2fM", v/1e6)
	case v >= 1e3:
		return fmt.Sprintf("%.1fk", v/1e3)
	}
	return fmt.Sprintf("%.0f", v)
}

// micro formats microseconds.
func micro(us float64) string {
	if us >= 1000 {
		return fmt.Sprintf("%.2f ms", us/1000)
	}
	return fmt.Sprintf("%.0f us", us)
}

// clock formats a duration as h:mm:ss or m:ss.
func clock(d time.Duration) string {
	s := int64(math.Round(d.Seconds()))
	if s >= 3600 {
		return fmt.Sprintf("%d:%02d:%02d", s/3600, s/60%60, s%60)
	}
	return fmt.Sprintf("%d:%02d", s/60, s%60)
}
