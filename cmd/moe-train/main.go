// Command moe-train trains a toy Mixture-of-Experts layer over goep's
// expert-parallel dispatch and combine, on every rank of an MPI job: a
// student MoE learns to reproduce a fixed random teacher MoE on random
// tokens (package moe). Rank 0 shows progress, writes an HDF5 trace of every
// step and, with the other ranks' experts gathered, HDF5 checkpoints.
//
// Build and run it with 4 ranks (make run does this):
//
//	go build -tags mpi -o bin/moe-train ./cmd/moe-train
//	mpirun -np 4 bin/moe-train -steps 2000 -mode ll -dtype f32
//	mpirun -np 4 bin/moe-train -steps 4000 -resume auto              # 2000 more, the same run and trace
//	mpirun -np 2 bin/moe-train -steps 6000 -resume auto -tokens 128  # 2000 more on 2 ranks, the same data
//	mpirun -np 4 bin/moe-train -steps 2000 -fresh                    # a new run; the old one's files are moved aside
//	mpirun -np 4 bin/moe-train -hidden 1024 -shared-ffn 4096 -grad-sync a2sgd -fresh   # a shared expert, A2SGD
//	mpirun -np 4 bin/moe-train -device emulate -fresh                # the GPU engine on the emulated device
//	mpirun -np 4 bin/moe-train -device cuda -resume auto             # on each rank's GPU, from the same run's checkpoint
//	h5ls -r out/trace.h5
//
// A run has an identity (a run id) kept by its resumes. A new run refuses to
// write where another run's trace or checkpoints are (-fresh moves them to
// DIR/moved-aside/<time>/ first); a resume continues the run's own trace,
// keeping its rows up to the checkpoint's step and dropping later ones (it
// says how many), and may use another number of ranks (any that divides the
// experts), mode, element type or device. Keep -tokens x ranks to train on
// the same data as an uninterrupted run; moe-train says when the global
// batch changes.
//
// -device picks the ep backend that moves the tokens, as ep-bench's does:
// cpu, ep's CPU engine (host memory); emulate, the GPU engine (package
// epgpu) on the emulated device of package gpu/emulator, which needs no
// GPU; cuda, the GPU engine on each rank's GPU with NCCL. With a device
// the ranks bootstrap its communicator at start, as NCCL's MPI bootstrap
// does: every rank checks its device and libraries (a rank that lacks them
// makes every rank refuse, naming it and what it lacks, before any file is
// written), rank 0 makes the unique ID (ncclGetUniqueId, or
// emulator.UniqueID) and MPI hands it to every rank; the start-up lines
// show its digest and first bytes. Every step then uploads the tokens to
// device memory and brings the received rows and the results back: the
// summary counts those copies, and the trace records them, with the
// backend and device of each segment. The emulated engine's results equal
// the CPU engine's bit for bit, and so does the whole training. The GPU
// engine has no FP8 dispatch yet: -dtype fp8 is refused there.
//
// Flags:
//
//	-experts N        experts in all, a multiple of the ranks (8)
//	-topk K           experts per token (2)
//	-hidden H         model width (32)
//	-ffn F            width of each expert's inner layer (64)
//	-shared-ffn S     width of the shared expert's inner layer: a dense FFN every
//	                  token passes through, held by every rank (0: none) (0)
//	-tokens T         tokens per rank per step (64)
//	-steps S          the step to end at, counting those before a resume (1000)
//	-mode ll|ht       low-latency or high-throughput dispatch (ll)
//	-dtype f32|bf16|fp8  element type on the wire (f32); fp8: bf16 tokens dispatched as FP8 e4m3, combined in bf16
//	-act silu|gelu    the experts' activation (silu)
//	-seed N           the student's initial parameters and the data (1)
//	-teacher-seed N   the teacher's parameters (2)
//	-lr X             Adam's learning rate (0.01)
//	-aux X            weight of the load-balancing loss (0.01)
//	-grad-sync M      how the gate's and the shared expert's gradient is summed
//	                  over ranks: allreduce (exact), a2sgd (A2SGD: two averages
//	                  per rank) or topk:K (K entries per rank, error feedback)
//	                  (allreduce)
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
//	-device D         the ep backend, by name with options (ep-bench -device
//	                  list prints them): cpu (ep's CPU engine), emulate (the
//	                  GPU engine on an emulated device), cuda (the GPU engine
//	                  on each rank's GPU, with NCCL), alltoallv, ... (cpu)
//
// With the environment variable GOEP_MOE_PID_DIR set, every rank writes its
// process id to DIR/rank-<r>.pid (for tests that kill one rank). With
// GOEP_MOE_STRAGGLER=RANK:DURATION (e.g. 1:5ms), that rank sleeps DURATION
// between each step's forward and backward: a straggler the others wait
// for, for tests of the per-peer waits and the summary's slowest rank.
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
	"github.com/goep/goep/ep/epgpu"
	"github.com/goep/goep/moe"
	"github.com/goep/goep/moe/runs"
	"github.com/goep/goep/mpi"
)

func main() { os.Exit(run(os.Stdout, os.Stderr, os.Args[1:])) }

// options are the parsed flags.
type options struct {
	run           runs.Options
	progressEvery int64
	progress      string
	timeout       time.Duration
	device        string              // the backend (ep.OpenBackend's spec)
	boot          *epgpu.Bootstrapped // the device's bootstrap; nil for a backend on host memory
}

// flagValues are the flags as given, before they are checked.
type flagValues struct {
	experts, topk, hidden, ffn, sharedFFN, tokens int
	steps, ckptEvery, progressEvery               int64
	mode, dtype, act, gradSync, progress, device  string
	seed, teacherSeed                             uint64
	lr, aux                                       float64
	trace, ckptDir, resume                        string
	fresh                                         bool
	timeout                                       time.Duration
}

// newFlagSet defines the flags into v.
func newFlagSet(stderr io.Writer, quiet bool, v *flagValues) *flag.FlagSet {
	fs := flag.NewFlagSet("moe-train", flag.ContinueOnError)
	fs.SetOutput(stderr)
	if quiet {
		fs.SetOutput(io.Discard)
	}
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: mpirun -np N moe-train [flags]\n\nTrains a toy MoE layer over goep's expert-parallel dispatch and combine.\n\nFlags:")
		fs.PrintDefaults()
	}
	fs.IntVar(&v.experts, "experts", 8, "experts in all, a multiple of the number of ranks")
	fs.IntVar(&v.topk, "topk", 2, "experts per token")
	fs.IntVar(&v.hidden, "hidden", 32, "model width")
	fs.IntVar(&v.ffn, "ffn", 64, "width of each expert's inner layer")
	fs.IntVar(&v.sharedFFN, "shared-ffn", 0, "width of the shared expert's inner layer, a dense FFN every token passes through (0: none)")
	fs.IntVar(&v.tokens, "tokens", 64, "tokens per rank per step")
	fs.Int64Var(&v.steps, "steps", 1000, "the step to end at, counting the steps before a resume")
	fs.StringVar(&v.mode, "mode", "ll", "dispatch mode: ll (low-latency) or ht (high-throughput)")
	fs.StringVar(&v.dtype, "dtype", "f32", "element type on the wire: f32, bf16, or fp8 (bf16 tokens dispatched as FP8 e4m3 with per-128 scales)")
	fs.StringVar(&v.act, "act", "silu", "the experts' activation: silu or gelu")
	fs.StringVar(&v.gradSync, "grad-sync", "allreduce", "how the gate's and the shared expert's gradient is summed over ranks: allreduce (exact), a2sgd or topk:K")
	fs.Uint64Var(&v.seed, "seed", 1, "seed of the student's initial parameters and of the data")
	fs.Uint64Var(&v.teacherSeed, "teacher-seed", 2, "seed of the teacher's parameters")
	fs.Float64Var(&v.lr, "lr", 0.01, "Adam's learning rate")
	fs.Float64Var(&v.aux, "aux", 0.01, "weight of the load-balancing loss")
	fs.StringVar(&v.trace, "trace", "out/trace.h5", "the trace file (empty: none)")
	fs.StringVar(&v.ckptDir, "ckpt-dir", "out", "directory of the checkpoints (empty: none)")
	fs.Int64Var(&v.ckptEvery, "ckpt-every", 500, "write a checkpoint every N steps, and one at the end (0: only at the end)")
	fs.StringVar(&v.resume, "resume", "", "continue from this checkpoint; \"auto\": from the newest checkpoint of the run in -ckpt-dir, or start one if none")
	fs.BoolVar(&v.fresh, "fresh", false, "start a new run even where another run's trace or checkpoints are: they are moved aside to DIR/moved-aside/<time>/")
	fs.Int64Var(&v.progressEvery, "progress-every", 100, "when the output is not a terminal, a progress line every N steps (0: none)")
	fs.StringVar(&v.progress, "progress", "auto", "progress display: auto, bar or lines")
	fs.DurationVar(&v.timeout, "timeout", time.Minute, "how long a rank waits for a peer before failing")
	fs.StringVar(&v.device, "device", "cpu", "the ep backend, by name with options (ep-bench -device list): cpu (ep's CPU engine), emulate (the GPU engine on an emulated device, no GPU needed), cuda (the GPU engine on each rank's GPU, with NCCL), alltoallv, ...; a device's communicator ID is made on rank 0 and handed to every rank over MPI at start")
	return fs
}

// checkRanges refuses numbers out of range and flags that contradict each
// other, naming the flag and its value.
func (v *flagValues) checkRanges() error {
	for _, f := range []struct {
		name string
		v    int
	}{{"experts", v.experts}, {"topk", v.topk}, {"hidden", v.hidden}, {"ffn", v.ffn}, {"tokens", v.tokens}} {
		if f.v <= 0 {
			return fmt.Errorf("-%s %d: want a positive integer", f.name, f.v)
		}
	}
	switch {
	case v.topk > v.experts:
		return fmt.Errorf("-topk %d: more than the %d experts (-experts)", v.topk, v.experts)
	case v.sharedFFN < 0:
		return fmt.Errorf("-shared-ffn %d: want 0 (no shared expert) or a positive integer", v.sharedFFN)
	case v.steps <= 0:
		return fmt.Errorf("-steps %d: want a positive integer", v.steps)
	case v.ckptEvery < 0:
		return fmt.Errorf("-ckpt-every %d: want 0 (only at the end) or a positive integer", v.ckptEvery)
	case v.progressEvery < 0:
		return fmt.Errorf("-progress-every %d: want 0 (none) or a positive integer", v.progressEvery)
	case !(v.lr > 0 && v.lr <= 1):
		return fmt.Errorf("-lr %v: want 0 < lr <= 1", v.lr)
	case !(v.aux >= 0 && v.aux <= 1000):
		return fmt.Errorf("-aux %v: want 0 <= aux <= 1000", v.aux)
	case v.fresh && v.resume != "":
		return fmt.Errorf("-fresh starts a new run and -resume %q continues one: give one of them", v.resume)
	case v.resume == runs.ResumeAuto && v.ckptDir == "":
		return errors.New("-resume auto looks for checkpoints in -ckpt-dir, which is empty")
	case v.timeout <= 0:
		return fmt.Errorf("-timeout %v: want a positive duration", v.timeout)
	}
	if _, err := ep.OpenBackend(v.device); err != nil {
		return fmt.Errorf("-device: %w", err)
	}
	return nil
}

// config reads the named choices and makes the run's configuration.
func (v *flagValues) config() (moe.TrainConfig, error) {
	m, err := ep.ParseMode(v.mode)
	if err != nil {
		return moe.TrainConfig{}, fmt.Errorf("-mode %q: want ll or ht", v.mode)
	}
	d, err := moe.ParseDType(v.dtype)
	if err != nil {
		return moe.TrainConfig{}, fmt.Errorf("-dtype %q: want f32, bf16 or fp8", v.dtype)
	}
	a, err := moe.ParseActivation(v.act)
	if err != nil {
		return moe.TrainConfig{}, fmt.Errorf("-act %q: want silu or gelu", v.act)
	}
	gs, err := moe.ParseGradSync(v.gradSync)
	if err != nil {
		return moe.TrainConfig{}, fmt.Errorf("-grad-sync %q: want allreduce, a2sgd or topk:K (K a positive integer)", v.gradSync)
	}
	if b, err := ep.OpenBackend(v.device); err != nil {
		return moe.TrainConfig{}, fmt.Errorf("-device: %w", err)
	} else if d == moe.FP8 && !ep.Supports(b, ep.FeatureFP8Wire) {
		return moe.TrainConfig{}, fmt.Errorf("-dtype fp8 -device %s: backend %s has no FP8 dispatch (ep.FeatureFP8Wire); use -dtype f32 or bf16 there, or -device cpu", v.device, b.Name())
	}
	c := moe.TrainConfig{
		Config: moe.Config{Mode: m, DType: d, Experts: v.experts, TopK: v.topk, Hidden: v.hidden, FFN: v.ffn,
			Tokens: v.tokens, Act: a, Seed: v.seed, Timeout: v.timeout, SharedFFN: v.sharedFFN, GradSync: gs},
		TeacherSeed: v.teacherSeed, LR: v.lr, AuxCoef: v.aux,
	}
	if n := c.DataParallelParams(); gs.Method == moe.SyncTopK && gs.K > n {
		return moe.TrainConfig{}, fmt.Errorf("-grad-sync %s: K = %d is more than the %d data-parallel parameters (gate %dx%d, shared expert of -shared-ffn %d)",
			gs, gs.K, n, v.hidden, v.experts, v.sharedFFN)
	}
	return c, nil
}

// parse reads the flags. It returns a non-negative exit code when the
// program should stop (-h, or a bad flag, reported on stderr).
func parse(stderr io.Writer, args []string, quiet bool) (*options, int) {
	var v flagValues
	fs := newFlagSet(stderr, quiet, &v)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, 0
		}
		return nil, 2
	}
	err := v.checkRanges()
	if fs.NArg() > 0 {
		err = fmt.Errorf("unexpected argument %q (flags only; see -h)", fs.Arg(0))
	}
	var c moe.TrainConfig
	if err == nil {
		c, err = v.config()
	}
	if err == nil && v.progress != "auto" && v.progress != "bar" && v.progress != "lines" {
		err = fmt.Errorf("-progress %q: want auto, bar or lines", v.progress)
	}
	if err != nil {
		if !quiet {
			fmt.Fprintln(stderr, "moe-train:", err)
		}
		return nil, 2
	}
	o := &options{progressEvery: v.progressEvery, progress: v.progress, timeout: v.timeout, device: v.device}
	o.run = runs.Options{TrainConfig: c, Steps: v.steps, TracePath: v.trace, CheckpointDir: v.ckptDir,
		CheckpointEvery: v.ckptEvery, Resume: v.resume, Fresh: v.fresh,
		Command: strings.Join(append([]string{"moe-train"}, args...), " ")}
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
		var ce *runs.CollectiveError
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
	if v := os.Getenv("GOEP_MOE_STRAGGLER"); v != "" {
		rank, delay, err := parseStraggler(v)
		if err != nil {
			return err
		}
		if rank == world.Rank() {
			o.run.BetweenPasses = func(int64) { time.Sleep(delay) }
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
	if err := bootstrap(world, o); err != nil {
		return err
	}
	var p *progress
	if world.Rank() == 0 {
		p = newProgress(stdout, o, world.Size(), o.run.Nodes)
		o.run.OnStep = p.step
		o.run.OnNote = func(s string) { fmt.Fprintln(stdout, "moe-train:", s) }
	}
	res, err := runs.Train(world, o.run)
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

// bootstrap prepares the device of -device, before anything is written:
// for emulate and cuda, every rank checks its device and the ranks agree
// (a rank that lacks it, or a library, makes every rank return the same
// error, naming it), then rank 0 makes the communicator's unique ID and
// MPI hands it to every rank (epgpu.Bootstrap). The run then trains on the
// bootstrapped backend and records the device. Collective.
func bootstrap(world *mpi.Comm, o *options) error {
	b, err := ep.OpenBackend(o.device)
	if err != nil {
		return &runs.CollectiveError{Err: fmt.Errorf("-device: %w", err)}
	}
	if !epgpu.Owns(b) {
		if b.Name() != ep.DefaultBackend {
			o.run.Backend = b
		}
		return nil
	}
	boot, err := epgpu.Bootstrap(world, b)
	if err != nil {
		return &runs.CollectiveError{Err: fmt.Errorf("-device %s: %w", o.device, err)}
	}
	o.boot = boot
	o.run.Backend = boot.Backend
	o.run.Device = moe.Device{Name: boot.Device.Name, Driver: boot.Device.Driver, Libraries: boot.Device.Libraries, CommID: boot.ID.Digest()}
	return nil
}

// deviceLine is the start-up line that says what the tokens move on and,
// for a device, how its communicator was bootstrapped.
func deviceLine(o *options) string {
	if o.boot == nil && o.run.Backend == nil {
		return "device cpu: ep's CPU engine, tokens in host memory (shared memory within a node, messages across nodes); no device, no communicator ID"
	}
	if o.boot == nil {
		return fmt.Sprintf("device %s: backend %s, tokens in host memory; no device, no communicator ID", o.device, o.run.Backend.Name())
	}
	b := o.boot
	kind := "communicator"
	if b.Backend.Name() == "gpu:cuda" || b.Backend.Name() == "gpu:cuda+ipc" {
		kind = "NCCL communicator"
	}
	return fmt.Sprintf("device %s: the GPU engine (%s), rank 0 on %s; %s's unique ID made on rank 0 (%s) and handed to the %d ranks over MPI (mpi.BootstrapID): %s (sha256; first bytes % x), the same on every rank",
		o.device, b.Backend.Name(), b.Device, kind, b.Generator, b.Ranks, b.ID.Digest(), b.ID[:8])
}

// parseStraggler reads GOEP_MOE_STRAGGLER's RANK:DURATION.
func parseStraggler(v string) (rank int, delay time.Duration, err error) {
	r, d, ok := strings.Cut(v, ":")
	if ok {
		rank, err = strconv.Atoi(r)
		if err == nil {
			delay, err = time.ParseDuration(d)
		}
	}
	if !ok || err != nil || rank < 0 || delay < 0 {
		return 0, 0, fmt.Errorf("GOEP_MOE_STRAGGLER=%q: want RANK:DURATION, such as 1:5ms", v)
	}
	return rank, delay, nil
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
	sync              float64
}

func newProgress(w io.Writer, o *options, ranks, nodes int) *progress {
	bar := o.progress == "bar" || (o.progress == "auto" && isTerminal(w))
	p := &progress{w: w, bar: bar, every: o.progressEvery, o: o, ranks: ranks, nodes: nodes, start: time.Now(), firstStep: -1}
	c := o.run
	shared := "no shared expert"
	if c.SharedFFN > 0 {
		shared = fmt.Sprintf("shared ffn %d", c.SharedFFN)
	}
	fmt.Fprintf(w, "moe-train: %d ranks on %d node(s), %s/%s, %d experts top-%d, hidden %d, ffn %d, %s, grad sync %v (%d data-parallel parameters), %d tokens per rank, to step %d\n",
		ranks, nodes, c.Mode, c.DType, c.Experts, c.TopK, c.Hidden, c.FFN, shared, c.GradSync, c.DataParallelParams(), c.Tokens, c.Steps)
	fmt.Fprintln(w, "moe-train:", deviceLine(o))
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
		p.win.sync += st.SyncUS[r] / float64(len(st.SyncUS))
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
	fmt.Fprintf(&b, "loss %.4f aux %.4f | %s tok/s | dispatch %s combine %s sync %s | ETA %s",
		st.Loss, st.AuxLoss, si(tps), micro(p.win.dispatch/n), micro(p.win.combine/n), micro(p.win.sync/n), clock(eta))
	return b.String()
}

func (p *progress) summary(r *runs.Result) {
	c := p.o.run
	w := p.w
	if r.Steps == 0 {
		return
	}
	ratio := r.First.Loss / r.Last.Loss
	fmt.Fprintf(w, "moe-train: done: run %s, steps %d..%d (%s/%s, %d ranks, %d node(s), -device %s) in %s\n",
		r.RunID, r.First.Step, r.Last.Step, c.Mode, c.DType, p.ranks, p.nodes, p.o.device, clock(time.Since(p.start)))
	fmt.Fprintf(w, "  loss      %.4f -> %.4f (%.1fx lower); aux loss %.4f -> %.4f\n", r.First.Loss, r.Last.Loss, ratio, r.First.AuxLoss, r.Last.AuxLoss)
	fmt.Fprintf(w, "  last step loss %v, aux loss %v (exactly, to compare runs)\n", r.Last.Loss, r.Last.AuxLoss)
	fmt.Fprintf(w, "  speed     %s tokens/s; per step: dispatch %s, combine %s (mean over ranks and steps)\n",
		si(r.TokensPerSecond()), micro(float64(r.MeanDispatch.Nanoseconds())/1e3), micro(float64(r.MeanCombine.Nanoseconds())/1e3))
	fmt.Fprintf(w, "  sync      %v: %s and %s sent per rank per step (the gate's and shared expert's gradient; mean over ranks and steps)\n",
		c.GradSync, micro(float64(r.MeanSync.Nanoseconds())/1e3), bytesText(r.SyncBytes))
	fmt.Fprintf(w, "  copies    %s\n", copiesLine(r))
	if line := stragglerLine(r); line != "" {
		fmt.Fprintf(w, "  waits     %s\n", line)
	}
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

// bytesText formats a byte count with a binary unit.
func bytesText(n int64) string {
	switch {
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}

// stragglerLine says which rank the others waited for most in ep calls and
// where it ran, when one stands out (runs.FindStraggler), or that none did;
// "" where the waits were not measured.
func stragglerLine(r *runs.Result) string {
	measured := false
	for _, v := range r.WaitUS {
		measured = measured || !math.IsNaN(v)
	}
	if !measured {
		return ""
	}
	if s := r.Straggler; s != nil {
		return fmt.Sprintf("slowest rank %d on host %s: the others waited %s for it, %.0f%% of all waiting between ranks (%.1fx the mean for another rank; see docs/trace-schema.md)",
			s.Rank, s.Host, micro(s.WaitedUS), 100*s.Share, s.WaitedUS/max(s.OthersMeanUS, 1e-9))
	}
	R := len(r.Hosts)
	s, _ := runs.FindStraggler(r.WaitUS, R)
	return fmt.Sprintf("no rank stands out: the most waited for was rank %d, %s, %.0f%% of all waiting between ranks", s.Rank, micro(s.WaitedUS), 100*s.Share)
}

// copiesLine says what the copies between the host and the ep group's
// memory were: none on the CPU engine; on a device, how many per rank per
// step, their bytes and time, which dispatch and combine do not include.
func copiesLine(r *runs.Result) string {
	switch {
	case r.Copies == 0 && r.Device.Backend == ep.DefaultBackend:
		return "none: the CPU engine's tensors are host memory"
	case r.Copies == 0 && r.Device.Name == "":
		return fmt.Sprintf("none: the tensors of backend %s are host memory", r.Device.Backend)
	}
	return fmt.Sprintf("%.1f host<->%s copies per rank per step, %s and %s (the tokens up, the received rows and the results back; mean over ranks and steps; not in dispatch and combine)",
		r.Copies, r.Device.Name, bytesText(r.CopyBytes), micro(float64(r.MeanCopy.Nanoseconds())/1e3))
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
