// Command moe-serve serves a stream of requests with a small multi-layer
// Mixture-of-Experts decoder over goep's expert-parallel dispatch and
// combine, on every rank of an MPI job (package moe/serve): requests arrive
// at a given rate, rank 0 gives each to a rank, and every step each rank
// runs its requests' next tokens (or the next chunk of their prompts)
// through attention, then the MoE layers, whose experts are spread over
// the ranks. Requests join and leave the batch between steps (continuous
// batching). Each step runs as two micro-batches, one's dispatch or combine
// in flight while the other computes (DeepEP's two-batch overlap), or,
// with -overlap=false, as one. With -mask-stalled a rank that stalls is
// masked and the others serve on; it rejoins when it comes back. Rank 0
// prints what happens, a summary (step latency p50/p90/p99, time to first
// token, tokens per second per rank, what masking cost) and writes an HDF5
// trace.
//
//	go build -tags mpi -o bin/moe-serve ./cmd/moe-serve
//	mpirun -np 4 bin/moe-serve                                 # decode in LL, prompts through LL, overlap on
//	mpirun -np 4 bin/moe-serve -overlap=false                   # the same loop, one micro-batch
//	mpirun -np 4 bin/moe-serve -prefill ht -prompt 512:1024    # long prompts through HT
//	mpirun -np 4 bin/moe-serve -ckpt out/ckpt-006000.h5        # moe-train's layer in every decoder layer
//	mpirun -np 4 bin/moe-serve -mask-stalled -timeout 1s       # then kill -STOP / -CONT a rank
//	bin/ep-plot serve out/serve.h5                             # the latency distribution
//
// Flags:
//
//	-layers N          decoder layers: attention, then a MoE layer (2)
//	-vocab V           token ids (256)
//	-hidden H          model width (64)
//	-ffn F             each expert's inner width (128)
//	-shared-ffn S      the shared expert's inner width (0: none) (0)
//	-experts N         routed experts per layer, a multiple of the ranks (8)
//	-topk K            experts per token (2)
//	-act silu|gelu     the experts' activation (silu)
//	-seed N            the model's parameters (1)
//	-ckpt PATH         a moe-train checkpoint: its MoE layer (gate, experts,
//	                   shared expert) in every decoder layer; it sets -hidden,
//	                   -ffn, -shared-ffn, -experts, -topk and -act
//	-requests N        requests in the stream (64)
//	-rate R            requests per second, Poisson arrivals (0: all at once) (200)
//	-prompt MIN:MAX    prompt lengths, tokens (8:48)
//	-gen MIN:MAX       tokens to generate per request (16:48)
//	-workload-seed N   the requests (1)
//	-batch B           most requests a rank holds at once: its most tokens per decode step (16)
//	-prefill ll|ht     prompts through the decode's LL group (in chunks) or an HT group (ll)
//	-prefill-tokens P  most prompt tokens a rank runs in a prefill step (64)
//	-overlap           two micro-batches per step, overlapped (true)
//	-dtype f32|bf16    element type of the rows on the wire (f32)
//	-mask-stalled      mask a rank that stalls past -timeout; serve on without it (false)
//	-timeout D         how long a rank waits for a peer in ep (2s)
//	-control-timeout D how long a rank waits for rank 0's next instruction,
//	                   and rank 0 for a masked rank to come back (2m)
//	-trace PATH        the HDF5 trace ("" for none) (out/serve.h5)
//	-events N          record every phase of the first N steps in the trace (0: all) (5000)
//
// With the environment variable GOEP_SERVE_PID_DIR set, every rank writes
// its process id to DIR/rank-<r>.pid (to stop one with kill -STOP). A build
// with the faultinject tag (the tests', make test-cluster's) also reads
// GOEP_SERVE_STALL (stall.go), to stop a rank itself at a chosen step.
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
	_ "github.com/goep/goep/ep/backends" // every backend, for -device
	"github.com/goep/goep/moe"
	"github.com/goep/goep/moe/serve"
	"github.com/goep/goep/mpi"
)

func main() { os.Exit(run(os.Stdout, os.Stderr, os.Args[1:])) }

// options are the parsed flags.
type options struct {
	cfg     serve.Config
	w       serve.Workload
	trace   string
	events  int64
	command string
}

// flagValues are the flags as given, before they are checked.
type flagValues struct {
	layers, vocab, hidden, ffn, sharedFFN, experts, topk int
	requests, batch, prefillTokens                       int
	seed, workloadSeed                                   uint64
	rate                                                 float64
	act, ckpt, prompt, gen, prefill, dtype, trace        string
	device                                               string
	events                                               int64
	overlap, maskStalled                                 bool
	timeout, controlTimeout                              time.Duration
}

func newFlagSet(stderr io.Writer, quiet bool, v *flagValues) *flag.FlagSet {
	fs := flag.NewFlagSet("moe-serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	if quiet {
		fs.SetOutput(io.Discard)
	}
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: mpirun -np N moe-serve [flags]\n\nServes a stream of requests with a small MoE decoder over goep's expert-parallel dispatch and combine.\n\nFlags:")
		fs.PrintDefaults()
	}
	fs.IntVar(&v.layers, "layers", 2, "decoder layers: attention, then a MoE layer")
	fs.IntVar(&v.vocab, "vocab", 256, "token ids")
	fs.IntVar(&v.hidden, "hidden", 64, "model width")
	fs.IntVar(&v.ffn, "ffn", 128, "each expert's inner width")
	fs.IntVar(&v.sharedFFN, "shared-ffn", 0, "the shared expert's inner width (0: none)")
	fs.IntVar(&v.experts, "experts", 8, "routed experts per layer, a multiple of the number of ranks")
	fs.IntVar(&v.topk, "topk", 2, "experts per token")
	fs.StringVar(&v.act, "act", "silu", "the experts' activation: silu or gelu")
	fs.Uint64Var(&v.seed, "seed", 1, "seed of the model's parameters")
	fs.StringVar(&v.ckpt, "ckpt", "", "a moe-train checkpoint whose MoE layer every decoder layer uses (it sets -hidden, -ffn, -shared-ffn, -experts, -topk, -act)")
	fs.IntVar(&v.requests, "requests", 64, "requests in the stream")
	fs.Float64Var(&v.rate, "rate", 200, "requests per second, Poisson arrivals (0: all at once)")
	fs.StringVar(&v.prompt, "prompt", "8:48", "prompt lengths MIN:MAX, tokens")
	fs.StringVar(&v.gen, "gen", "16:48", "tokens to generate per request, MIN:MAX")
	fs.Uint64Var(&v.workloadSeed, "workload-seed", 1, "seed of the requests")
	fs.IntVar(&v.batch, "batch", 16, "most requests a rank holds at once (its most tokens per decode step)")
	fs.StringVar(&v.prefill, "prefill", "ll", "prompts go through the decode's LL group in chunks (ll) or an HT group (ht)")
	fs.IntVar(&v.prefillTokens, "prefill-tokens", 64, "most prompt tokens a rank runs in a prefill step")
	fs.BoolVar(&v.overlap, "overlap", true, "run each step as two micro-batches, one's dispatch or combine in flight while the other computes")
	fs.StringVar(&v.dtype, "dtype", "f32", "element type of the rows on the wire: f32 or bf16")
	fs.StringVar(&v.device, "device", "cpu", "the ep backend, by name with options (ep-bench -device list): one whose tensors are host memory, such as cpu, cpu-onesided or alltoallv")
	fs.BoolVar(&v.maskStalled, "mask-stalled", false, "mask a rank that stalls past -timeout and serve on without it; it rejoins when back")
	fs.DurationVar(&v.timeout, "timeout", 2*time.Second, "how long a rank waits for a peer in ep (with -mask-stalled: before masking it)")
	fs.DurationVar(&v.controlTimeout, "control-timeout", 2*time.Minute, "how long a rank waits for rank 0's next instruction, and rank 0 for a masked rank to come back")
	fs.StringVar(&v.trace, "trace", "out/serve.h5", "the HDF5 trace (empty: none)")
	fs.Int64Var(&v.events, "events", 5000, "record every phase (attention, dispatch, experts, combine) of the first N steps in the trace (0: all)")
	return fs
}

// parseRange reads MIN:MAX.
func parseRange(flagName, s string) (lo, hi int, err error) {
	a, b, ok := strings.Cut(s, ":")
	if ok {
		lo, err = strconv.Atoi(a)
		if err == nil {
			hi, err = strconv.Atoi(b)
		}
	}
	if !ok || err != nil || lo <= 0 || hi < lo {
		return 0, 0, fmt.Errorf("-%s %q: want MIN:MAX with 1 <= MIN <= MAX", flagName, s)
	}
	return lo, hi, nil
}

// config checks the flags and makes the run's configuration, naming the
// flag and its value when one is bad.
func (v *flagValues) config(set map[string]bool) (serve.Config, serve.Workload, error) {
	var cfg serve.Config
	var w serve.Workload
	for _, f := range []struct {
		name string
		v    int
	}{{"layers", v.layers}, {"hidden", v.hidden}, {"ffn", v.ffn}, {"experts", v.experts}, {"topk", v.topk},
		{"requests", v.requests}, {"batch", v.batch}, {"prefill-tokens", v.prefillTokens}} {
		if f.v <= 0 {
			return cfg, w, fmt.Errorf("-%s %d: want a positive integer", f.name, f.v)
		}
	}
	switch {
	case v.vocab < 2:
		return cfg, w, fmt.Errorf("-vocab %d: want at least 2", v.vocab)
	case v.sharedFFN < 0:
		return cfg, w, fmt.Errorf("-shared-ffn %d: want 0 (none) or a positive integer", v.sharedFFN)
	case v.topk > v.experts:
		return cfg, w, fmt.Errorf("-topk %d: more than the %d experts (-experts)", v.topk, v.experts)
	case !(v.rate >= 0) || math.IsInf(v.rate, 1):
		return cfg, w, fmt.Errorf("-rate %v: want requests per second >= 0 (0: all at once)", v.rate)
	case v.timeout <= 0:
		return cfg, w, fmt.Errorf("-timeout %v: want a positive duration", v.timeout)
	case v.controlTimeout <= 0:
		return cfg, w, fmt.Errorf("-control-timeout %v: want a positive duration", v.controlTimeout)
	case v.events < 0:
		return cfg, w, fmt.Errorf("-events %d: want 0 (all) or a positive number of steps", v.events)
	}
	act, err := moe.ParseActivation(v.act)
	if err != nil {
		return cfg, w, fmt.Errorf("-act %q: want silu or gelu", v.act)
	}
	dtype, err := moe.ParseDType(v.dtype)
	if err != nil || dtype == moe.FP8 {
		return cfg, w, fmt.Errorf("-dtype %q: want f32 or bf16", v.dtype)
	}
	prefill, err := ep.ParseMode(v.prefill)
	if err != nil {
		return cfg, w, fmt.Errorf("-prefill %q: want ll or ht", v.prefill)
	}
	backend, err := ep.OpenBackend(v.device)
	if err != nil {
		return cfg, w, fmt.Errorf("-device: %w", err)
	}
	if backend.Name() == ep.DefaultBackend {
		backend = nil
	}
	if v.maskStalled && prefill != ep.LowLatency {
		return cfg, w, errors.New("-mask-stalled needs -prefill ll: ep masks stalled ranks in LL groups only")
	}
	w = serve.Workload{Requests: v.requests, Rate: v.rate, Seed: v.workloadSeed}
	if w.PromptMin, w.PromptMax, err = parseRange("prompt", v.prompt); err != nil {
		return cfg, w, err
	}
	if w.GenMin, w.GenMax, err = parseRange("gen", v.gen); err != nil {
		return cfg, w, err
	}
	cfg = serve.Config{
		Model: serve.ModelConfig{Layers: v.layers, Vocab: v.vocab, Hidden: v.hidden, FFN: v.ffn, SharedFFN: v.sharedFFN,
			Experts: v.experts, TopK: v.topk, Act: act, Seed: v.seed},
		DType: dtype, Batch: v.batch, Prefill: prefill, PrefillTokens: v.prefillTokens, Overlap: v.overlap,
		MaskStalled: v.maskStalled, Timeout: v.timeout, ControlTimeout: v.controlTimeout, Checkpoint: v.ckpt,
		Backend: backend,
	}
	if v.ckpt != "" {
		for _, name := range []string{"hidden", "ffn", "shared-ffn", "experts", "topk", "act"} {
			if set[name] {
				return cfg, w, fmt.Errorf("-%s: the checkpoint (-ckpt %s) sets the MoE layer's shape; leave -%s out", name, v.ckpt, name)
			}
		}
		if cfg.Model, err = serve.ModelFromCheckpoint(cfg.Model, v.ckpt); err != nil {
			return cfg, w, fmt.Errorf("-ckpt %s: %w", v.ckpt, err)
		}
	}
	return cfg, w, nil
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
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	cfg, w, err := v.config(set)
	if err == nil && fs.NArg() > 0 {
		err = fmt.Errorf("unexpected argument %q (flags only; see -h)", fs.Arg(0))
	}
	if err != nil {
		if !quiet {
			fmt.Fprintln(stderr, "moe-serve:", err)
		}
		return nil, 2
	}
	return &options{cfg: cfg, w: w, trace: v.trace, events: v.events, command: strings.Join(append([]string{"moe-serve"}, args...), " ")}, -1
}

func run(stdout, stderr io.Writer, args []string) int {
	// Before MPI starts, the launcher's rank decides who reports flag errors.
	o, code := parse(stderr, args, mpi.DetectLaunch().Rank > 0)
	if code >= 0 {
		return code
	}
	world, err := mpi.Init()
	if err != nil {
		fmt.Fprintln(stderr, "moe-serve:", err)
		return 1
	}
	world.SetTimeout(o.cfg.ControlTimeout)
	rank := world.Rank()
	// The same on every rank: rank 0 says it, and the job ends normally.
	if err := o.cfg.Validate(world.Size()); err != nil {
		if rank == 0 {
			fmt.Fprintf(stderr, "moe-serve: %v (on %d ranks)\n", err, world.Size())
		}
		mpi.Finalize()
		return 2
	}
	if err := serveAll(stdout, world, o); err != nil {
		fmt.Fprintf(stderr, "moe-serve: rank %d: %v\n", rank, err)
		mpi.Abort(1, err.Error()) // the other ranks may be waiting for this one
		return 1
	}
	if err := mpi.Finalize(); err != nil {
		fmt.Fprintln(stderr, "moe-serve:", err)
		return 1
	}
	return 0
}

func serveAll(stdout io.Writer, world *mpi.Comm, o *options) error {
	rank := world.Rank()
	if dir := os.Getenv("GOEP_SERVE_PID_DIR"); dir != "" {
		if err := writePID(dir, rank); err != nil {
			return err
		}
	}
	opt := serve.Options{Workload: o.w, EventSteps: o.events}
	var err error
	if opt.BeforeStep, err = faultInjection(rank); err != nil {
		return err
	}
	topo, err := world.Topology()
	if err != nil {
		return err
	}
	nodes := topo.Nodes
	if err := topo.Free(); err != nil {
		return err
	}
	start := time.Now()
	if rank == 0 {
		c := o.cfg
		m := c.Model
		model := fmt.Sprintf("%d layers, hidden %d, %d experts top-%d, ffn %d", m.Layers, m.Hidden, m.Experts, m.TopK, m.FFN)
		if m.SharedFFN > 0 {
			model += fmt.Sprintf(", shared ffn %d", m.SharedFFN)
		}
		if c.Checkpoint != "" {
			model += ", MoE layers from " + c.Checkpoint
		}
		rate := "all at once"
		if o.w.Rate > 0 {
			rate = fmt.Sprintf("%g/s", o.w.Rate)
		}
		fmt.Fprintf(stdout, "moe-serve: %d ranks on %d node(s), %s, %v on the wire; %d requests (%s), prompts %d-%d, %d-%d tokens each; batch %d per rank, prefill %v (%d tokens per rank and step), overlap %v, mask stalled %v\n",
			world.Size(), nodes, model, c.DType, o.w.Requests, rate, o.w.PromptMin, o.w.PromptMax, o.w.GenMin, o.w.GenMax,
			c.Batch, c.Prefill, c.PrefillTokens, onOff(c.Overlap), onOff(c.MaskStalled))
		opt.OnNote = func(s string) { fmt.Fprintf(stdout, "moe-serve: %s (%.2f s)\n", s, time.Since(start).Seconds()) }
	}
	res, err := serve.Serve(world, o.cfg, opt)
	if err != nil {
		return err
	}
	if rank != 0 {
		return nil
	}
	if o.trace != "" {
		if dir := filepath.Dir(o.trace); dir != "" {
			if err := os.MkdirAll(dir, 0o755); err != nil {
				return err
			}
		}
		if err := serve.WriteTrace(o.trace, res, serve.TraceInfo{Command: o.command, Start: start, Nodes: nodes}); err != nil {
			return err
		}
	}
	summary(stdout, res, nodes, o.trace)
	return nil
}

func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}

// summary prints the figures a service owner reads.
func summary(w io.Writer, r *serve.Result, nodes int, trace string) {
	f := r.Figures()
	c := r.Config
	fmt.Fprintf(w, "moe-serve: done: %d requests, %d tokens generated (%d prompt tokens) on %d ranks, %d node(s), overlap %s, in %.2f s\n",
		f.Requests, f.Tokens, f.PromptTokens, r.Ranks, nodes, onOff(c.Overlap), f.Elapsed.Seconds())
	fmt.Fprintf(w, "  decode    %s (%d steps, LL; the slowest rank's time per step)\n", dist(f.Decode), f.Decode.N)
	fmt.Fprintf(w, "  prefill   %s (%d steps, %v, up to %d prompt tokens per rank)\n", dist(f.Prefill), f.Prefill.N, c.Prefill, c.PrefillTokens)
	fmt.Fprintf(w, "  TTFT      %s (time to first token: arrival to the end of the step that gave it)\n", dist(f.TTFT))
	per := make([]string, len(f.TokensPerSecondPerRank))
	for i, v := range f.TokensPerSecondPerRank {
		per[i] = fmt.Sprintf("%.0f", v)
	}
	fmt.Fprintf(w, "  tokens/s  %.0f in all, %.0f per rank (ranks: %s)\n", f.TokensPerSecond, f.TokensPerSecond/float64(r.Ranks), strings.Join(per, ", "))
	for _, e := range r.Masking {
		fmt.Fprintf(w, "  masking   %s\n", maskLine(r, e))
	}
	if len(r.Masking) > 0 || f.DroppedPairs > 0 {
		fmt.Fprintf(w, "  lost      %d (token, expert) pairs dropped in %d steps that a rank missed; %d of %d requests lost some (their tokens from the first drop on may differ from an unmasked run); every request was served in full\n",
			f.DroppedPairs, f.StepsShort, f.DegradedRequests, f.Requests)
	}
	if trace != "" {
		fmt.Fprintf(w, "  trace     %s (h5dump -A %s; ep-plot serve %s; schema: docs/serve.md)\n", trace, trace, trace)
	}
}

// maskLine says what one masked rank cost.
func maskLine(r *serve.Result, e serve.MaskEpisode) string {
	spike := math.NaN()
	if e.MaskedAt >= 1 && int(e.MaskedAt) <= len(r.Steps) {
		spike = r.Steps[e.MaskedAt-1].LatencyUS()
	}
	last := int64(len(r.Steps))
	if e.RejoinedAt > 0 {
		last = e.RejoinedAt - 1
	}
	steps, tokens := 0, 0
	for i := e.MaskedAt; i < last; i++ { // the steps after the one that masked it, until it rejoined
		s := &r.Steps[i]
		steps++
		for rk, n := range s.Rows {
			if n >= 0 {
				tokens += s.Emitted[rk]
			}
		}
	}
	back := "did not come back"
	if e.RejoinedAt > 0 {
		back = fmt.Sprintf("came back and rejoined (SetMask) in step %d, %.2f s later", e.RejoinedAt, (e.RejoinedAtUS-e.MaskedAtUS)/1e6)
	}
	return fmt.Sprintf("rank %d masked in step %d, which took %s waiting for it; %s; %d steps ran without it meanwhile, generating %d tokens",
		e.Rank, e.MaskedAt, micro(spike), back, steps, tokens)
}

// dist formats percentiles.
func dist(p serve.Percentiles) string {
	if p.N == 0 {
		return "none"
	}
	return fmt.Sprintf("p50 %s  p90 %s  p99 %s  max %s", micro(p.P50), micro(p.P90), micro(p.P99), micro(p.Max))
}

// micro formats microseconds.
func micro(us float64) string {
	switch {
	case math.IsNaN(us):
		return "?"
	case us >= 1e6:
		return fmt.Sprintf("%.2f s", us/1e6)
	case us >= 1000:
		return fmt.Sprintf("%.2f ms", us/1000)
	}
	return fmt.Sprintf("%.0f us", us)
}

func writePID(dir string, rank int) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, fmt.Sprintf("rank-%d.pid", rank)), []byte(strconv.Itoa(os.Getpid())+"\n"), 0o644)
}
