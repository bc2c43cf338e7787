package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/goep/goep/ep"
	"github.com/goep/goep/ep/epgpu"
	"github.com/goep/goep/internal/benchfmt"
	"github.com/goep/goep/mpi"
)

// options are the parsed flags.
type options struct {
	modes                           []ep.Mode
	tokens, hidden, topk, experts   []int
	dtypes                          []string
	iters, warmup                   int
	seed                            uint64
	jsonOut, validate, skipBaseline bool
	floor                           bool // across nodes, time the network floor too
	timeline                        bool // print one round's steps on every rank
	latency                         bool
	planRanks, planNodes            int
	timeout                         time.Duration
	device                          string // cpu, emulate or cuda
}

// devices are the -device values: the backend each measures (nil: ep's
// default, the CPU engine).
var devices = map[string]ep.Backend{"cpu": nil, "emulate": epgpu.Emulated, "cuda": epgpu.CUDA}

// config is one measured combination.
type config struct {
	mode                          ep.Mode
	tokens, hidden, topk, experts int
	dtype                         string
}

// Result is one configuration's figures: the JSON line of -json, in the
// format the scaling study reads.
type Result = benchfmt.Record

func run(stdout, stderr io.Writer, args []string) int {
	opt, err := parseFlags(stderr, args)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintln(stderr, "ep-bench:", err)
		return 2
	}
	if opt.planRanks > 0 {
		return plan(stdout, stderr, opt)
	}
	world, err := mpi.Init()
	if err != nil {
		fmt.Fprintln(stderr, "ep-bench:", err)
		return 1
	}
	var floor float64
	if opt.latency {
		if floor, err = flagRoundTrip(world, 7, 20000); err != nil {
			fmt.Fprintf(stderr, "ep-bench: rank %d: flag round trip: %v\n", world.Rank(), err)
			mpi.Abort(1, err.Error())
		}
	}
	var results []*Result
	for _, cfg := range opt.configs() {
		res, err := measure(world, cfg, opt)
		if err != nil {
			fmt.Fprintf(stderr, "ep-bench: rank %d: %v: %v\n", world.Rank(), cfg, err)
			mpi.Abort(1, err.Error())
		}
		res.FlagRoundTripUS = floor
		results = append(results, res)
		if world.Rank() == 0 {
			if opt.jsonOut {
				b, _ := json.Marshal(res)
				fmt.Fprintln(stdout, string(b))
			} else {
				printTable(stdout, res, !opt.skipBaseline)
			}
		}
	}
	if opt.latency && !opt.jsonOut && world.Rank() == 0 {
		printLatency(stdout, results, floor)
	}
	if err := mpi.Finalize(); err != nil {
		fmt.Fprintln(stderr, "ep-bench:", err)
		return 1
	}
	return 0
}

func parseFlags(stderr io.Writer, args []string) (*options, error) {
	fs := flag.NewFlagSet("ep-bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	modes := fs.String("mode", "ll", "ll, ht, or a list")
	tokens := fs.String("tokens", "128", "tokens per rank")
	hidden := fs.String("hidden", "7168", "elements per token")
	topk := fs.String("topk", "8", "experts per token")
	experts := fs.String("experts", "64", "experts in all (a multiple of the ranks)")
	dtypes := fs.String("dtype", "bf16", "bf16, f32, fp8 (bf16 tokens dispatched in FP8 e4m3 with per-128 scales, "+
		"timed beside the same dispatch in bf16), or a list")
	iters := fs.Int("iters", 30, "timed iterations")
	warmup := fs.Int("warmup", 5, "untimed iterations first")
	seed := fs.Uint64("seed", 1, "seed of the routing and the data")
	jsonOut := fs.Bool("json", false, "print one JSON object per configuration")
	validate := fs.Bool("validate", true, "check ep's results against the alltoallv path once per configuration")
	skip := fs.Bool("no-baseline", false, "do not run the alltoallv baseline")
	timeline := fs.Bool("timeline", false, "after the timed rounds, run one more with the engine's timeline on and print every rank's steps (the CPU engine)")
	floor := fs.Bool("floor", true, "across nodes, also time the network floor: ep's own bytes across nodes (Stats.NetworkSent) moved by two plain MPI_Alltoallv, dispatch then combine")
	timeout := fs.Duration("timeout", time.Minute, "how long a rank waits for a peer")
	device := fs.String("device", "cpu", "cpu (ep's CPU engine), emulate (the GPU backend on an emulated device) or cuda (the GPU backend on each rank's GPU); with a device, the CPU engine runs beside it, checks its results and is timed too")
	planRanks := fs.Int("plan", 0, "print, for this many ranks (no MPI, nothing allocated), each configuration's buffers (ep.BufferPlan) and exit")
	planNodes := fs.Int("plan-nodes", 1, "the nodes -plan spreads the ranks over")
	latency := fs.Bool("latency", false, "LL latency sweep: tokens 1, 2, 4, ... 128 per rank (-tokens sets the sweep's largest), "+
		"with the flag round trip between two ranks of a node measured beside it")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: mpirun -np N ep-bench [flags]   (every numeric flag takes a comma-separated list)")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	o := &options{iters: *iters, warmup: *warmup, seed: *seed, jsonOut: *jsonOut, validate: *validate,
		skipBaseline: *skip, timeout: *timeout, latency: *latency, planRanks: *planRanks, planNodes: *planNodes,
		device: *device, floor: *floor, timeline: *timeline}
	if _, ok := devices[o.device]; !ok {
		return nil, fmt.Errorf("-device: %q is not cpu, emulate or cuda", o.device)
	}
	var err error
	for _, m := range strings.Split(*modes, ",") {
		mode, err := ep.ParseMode(strings.TrimSpace(m))
		if err != nil {
			return nil, fmt.Errorf("-mode: %w", err)
		}
		o.modes = append(o.modes, mode)
	}
	for _, d := range strings.Split(*dtypes, ",") {
		if d = strings.TrimSpace(d); d != "bf16" && d != "f32" && d != "fp8" {
			return nil, fmt.Errorf("-dtype: %q is not bf16, f32 or fp8", d)
		}
		o.dtypes = append(o.dtypes, d)
	}
	if o.tokens, err = intList("-tokens", *tokens, 0); err != nil {
		return nil, err
	}
	if o.hidden, err = intList("-hidden", *hidden, 1); err != nil {
		return nil, err
	}
	if o.topk, err = intList("-topk", *topk, 1); err != nil {
		return nil, err
	}
	if o.experts, err = intList("-experts", *experts, 1); err != nil {
		return nil, err
	}
	if o.latency {
		o.modes = []ep.Mode{ep.LowLatency}
		top := 128
		if fs.Lookup("tokens").Value.String() != "128" {
			top = slices.Max(o.tokens)
		}
		o.tokens = nil
		for t := 1; t <= top; t *= 2 {
			o.tokens = append(o.tokens, t)
		}
	}
	if o.iters < 1 || o.warmup < 0 {
		return nil, fmt.Errorf("-iters %d must be at least 1 and -warmup %d not negative", o.iters, o.warmup)
	}
	return o, nil
}

func intList(name, s string, least int) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < least {
			return nil, fmt.Errorf("%s: %q is not a whole number >= %d", name, f, least)
		}
		out = append(out, n)
	}
	return out, nil
}

func (o *options) configs() []config {
	var out []config
	for _, m := range o.modes {
		for _, d := range o.dtypes {
			for _, e := range o.experts {
				for _, k := range o.topk {
					for _, h := range o.hidden {
						for _, t := range o.tokens {
							out = append(out, config{mode: m, tokens: t, hidden: h, topk: k, experts: e, dtype: d})
						}
					}
				}
			}
		}
	}
	return out
}

func (c config) String() string {
	return fmt.Sprintf("%v %s tokens=%d hidden=%d topk=%d experts=%d", c.mode, c.dtype, c.tokens, c.hidden, c.topk, c.experts)
}

func measure(world *mpi.Comm, c config, o *options) (*Result, error) {
	if c.dtype == "f32" {
		return measureTyped[float32](world, c, o)
	}
	return measureTyped[ep.BF16](world, c, o) // bf16, and fp8: bf16 tokens, FP8 on the wire
}

// wire is the wire format of a configuration's dispatch.
func (c config) wire() ep.WireFormat {
	if c.dtype == "fp8" {
		return ep.WireFP8
	}
	return ep.WireNative
}

// routing draws each token's top-k experts uniformly (distinct) and its
// weights, from the seed and the rank.
func routing(seed uint64, rank, T, K, E int) ([]int32, []float32) {
	rng := rand.New(rand.NewPCG(seed, uint64(rank)))
	topk := make([]int32, T*K)
	w := make([]float32, T*K)
	for t := 0; t < T; t++ {
		for k, e := range rng.Perm(E)[:K] {
			topk[t*K+k] = int32(e)
			w[t*K+k] = rng.Float32()
		}
	}
	return topk, w
}

func measureTyped[E ep.Element](world *mpi.Comm, c config, o *options) (*Result, error) {
	b, err := newBench[E](world, c, o)
	if err != nil {
		return nil, err
	}
	defer b.close()
	s, err := b.rounds()
	if err != nil {
		return nil, err
	}
	if o.latency {
		if err := b.steadyRounds(s); err != nil {
			return nil, err
		}
	}
	res, err := b.summarize(s)
	if err == nil && o.timeline {
		var tl string
		if tl, err = timelineOf(b); err == nil && world.Rank() == 0 {
			fmt.Fprintf(os.Stderr, "timeline of one %v round, every rank:\n%s", c, tl)
		}
	}
	if err != nil || !o.latency || c.dtype != "bf16" {
		return res, err
	}
	// The floor of moving the same rows: this rank's rows for the other of
	// ranks 0 and 1.
	res.DataRoundTripUS, err = dataRoundTrip(world, b.peerRows, c.hidden, 7)
	return res, err
}

// bench is one configuration set up: ep's group on the device measured,
// the hand-written baseline (nil with -no-baseline), the CPU engine beside
// a device (nil with -device cpu), the tokens and their routing.
type bench[E ep.Element] struct {
	world        *mpi.Comm
	c            config
	o            *options
	g, base, cpu *ep.Group[E]
	x, out       ep.Tensor[E] // in g's memory
	bx, bout     ep.Tensor[E] // in base's (host) memory
	cx, cout     ep.Tensor[E] // in cpu's (host) memory
	topk         []int32
	weights      []float32
	bytes        float64         // bytes of the rows this rank sends
	peerRows     int             // LL: the rows this rank sends to the other of ranks 0 and 1 (-latency's data floor)
	src, dst     []byte          // memcpy of the same bytes
	dsrc, ddst   ep.Tensor[byte] // device copy of the same bytes (with a device)
	native       *ep.Group[E]    // -dtype fp8: the same dispatch in bf16, timed in the same rounds
	floor        *netFloor       // across nodes: ep's own traffic moved by plain MPI (nil on one node)
	nout         ep.Tensor[E]    // its result
	nbytes       float64         // the bytes of its rows
}

func newBench[E ep.Element](world *mpi.Comm, c config, o *options) (b *bench[E], err error) {
	b = &bench[E]{world: world, c: c, o: o}
	made := b // "return nil, err" clears b before the deferred call
	defer func() {
		if err != nil {
			made.close()
		}
	}()
	cfg := ep.Config{Mode: c.mode, NumExperts: c.experts, MaxTokensPerRank: max(c.tokens, 1), Hidden: c.hidden,
		TopK: c.topk, Timeout: o.timeout, Backend: devices[o.device]}
	if c.wire().FP8() {
		if b.native, err = ep.NewGroup[E](world, cfg); err != nil {
			return nil, err
		}
		cfg.Wire = c.wire()
	}
	if b.g, err = ep.NewGroup[E](world, cfg); err != nil {
		return nil, err
	}
	if cfg.Backend != nil {
		cfg.Backend = ep.CPU
		if b.cpu, err = ep.NewGroup[E](world, cfg); err != nil {
			return nil, err
		}
	}
	if !o.skipBaseline {
		cfg.Backend = ep.AlltoallvBlocking
		if b.base, err = ep.NewGroup[E](world, cfg); err != nil {
			return nil, err
		}
	}
	b.topk, b.weights = routing(o.seed, world.Rank(), c.tokens, c.topk, c.experts)
	rng := rand.New(rand.NewPCG(o.seed+1, uint64(world.Rank())))
	host := make([]E, c.tokens*c.hidden)
	for i := range host {
		host[i] = ep.ElementOf[E](rng.Float32()*2 - 1)
	}
	if b.x, b.out, err = tensors(b.g, host); err != nil {
		return nil, err
	}
	if b.base != nil {
		b.bx, b.bout = ep.Host(host), ep.Host(make([]E, len(host)))
	}
	if b.cpu != nil {
		b.cx, b.cout = ep.Host(host), ep.Host(make([]E, len(host)))
	}
	layout, err := b.g.Layout(b.topk)
	if err != nil {
		return nil, err
	}
	pairs := 0 // rows this rank sends: (token, expert) pairs or (token, rank) pairs
	per := layout.TokensPerRank
	if c.mode == ep.LowLatency {
		per = layout.TokensPerExpert
	}
	for _, n := range per {
		pairs += n
	}
	if peer := 1 - world.Rank(); c.mode == ep.LowLatency && peer >= 0 && peer < world.Size() {
		L := c.experts / world.Size()
		for _, n := range layout.TokensPerExpert[peer*L : (peer+1)*L] {
			b.peerRows += n
		}
	}
	b.bytes = float64(pairs * c.hidden * ep.DTypeOf[E]().Size())
	if c.wire().FP8() { // codes and scales
		b.nbytes = b.bytes
		b.bytes = float64(pairs * (c.hidden + 4*ep.ScaleGroups(c.hidden)))
		if b.nout, err = ep.Alloc[E](b.g.Memory(), c.tokens*c.hidden); err != nil {
			return nil, err
		}
	}
	b.src, b.dst = make([]byte, int(b.bytes)), make([]byte, int(b.bytes))
	for i := range b.src {
		b.src[i] = byte(i)
	}
	if b.cpu != nil {
		if b.dsrc, err = ep.Alloc[byte](b.g.Memory(), int(b.bytes)); err != nil {
			return nil, err
		}
		if err = ep.Upload(b.dsrc, b.src); err != nil {
			return nil, err
		}
		if b.ddst, err = ep.Alloc[byte](b.g.Memory(), int(b.bytes)); err != nil {
			return nil, err
		}
	}
	return b, nil
}

// tensors puts the tokens, and a result tensor, in g's memory.
func tensors[E ep.Element](g *ep.Group[E], host []E) (x, out ep.Tensor[E], err error) {
	if x, err = ep.Alloc[E](g.Memory(), len(host)); err != nil {
		return
	}
	if err = ep.Upload(x, host); err != nil {
		return
	}
	out, err = ep.Alloc[E](g.Memory(), len(host))
	return
}

func (b *bench[E]) close() {
	for _, t := range []ep.Tensor[E]{b.x, b.out, b.nout} {
		_ = ep.Free(t)
	}
	for _, t := range []ep.Tensor[byte]{b.dsrc, b.ddst} {
		_ = ep.Free(t)
	}
	if b.base != nil {
		_ = b.base.Close()
	}
	if b.cpu != nil {
		_ = b.cpu.Close()
	}
	if b.native != nil {
		_ = b.native.Close()
	}
	if b.g != nil {
		_ = b.g.Close()
	}
	b.floor.close()
}

// samples are each timed round's figures, in microseconds.
type samples struct {
	dispatch, combine, baseDispatch, baseCombine, cpuDispatch, cpuCombine, memcpy, deviceCopy []float64
	nativeDispatch, nativeCombine                                                             []float64    // -dtype fp8: the same in bf16
	floorA2A, floorP2P                                                                        [2][]float64 // across nodes: the network floor's exchanges, dispatch and combine
	epCPU, floorCPU                                                                           []float64    // this rank's processor time in ep's dispatch+combine and in the floor's point-to-point exchanges
	steady, baseSteady                                                                        []float64    // -latency: a round's mean time over each burst
}

// burst is how many rounds -latency runs back to back per timed sample.
const burst = 50

// steadyRounds times, for -latency, bursts of rounds back to back (ep's,
// then the baseline's), each after a barrier: a decode loop's steady state,
// where a rank starts a call as soon as its last one returned, measured as
// the flag round trip is.
func (b *bench[E]) steadyRounds(s *samples) error {
	for i := 0; i < b.o.warmup+b.o.iters; i++ {
		t, err := steadyBurst(b.world, b.g, b.x, b.out, b.topk, b.weights)
		if err != nil {
			return err
		}
		var tb float64
		if b.base != nil {
			if tb, err = steadyBurst(b.world, b.base, b.bx, b.bout, b.topk, b.weights); err != nil {
				return err
			}
		}
		if i >= b.o.warmup {
			s.steady, s.baseSteady = append(s.steady, t), append(s.baseSteady, tb)
		}
	}
	return nil
}

// steadyBurst runs burst dispatch+combine rounds back to back after a
// barrier and returns the mean time of one, in microseconds.
func steadyBurst[E ep.Element](world *mpi.Comm, g *ep.Group[E], x, out ep.Tensor[E], topk []int32, weights []float32) (float64, error) {
	if err := world.Barrier(); err != nil {
		return 0, err
	}
	t0 := time.Now()
	for r := 0; r < burst; r++ {
		h, err := g.Dispatch(x, topk, weights)
		if err != nil {
			return 0, err
		}
		if err := g.Combine(h, h.Recv(), out, nil); err != nil {
			return 0, err
		}
	}
	return us(time.Since(t0)) / burst, nil
}

// rounds runs the warm-up and timed rounds: ep, the baseline, the CPU engine
// beside a device, memcpy and the device copy in turn, so that all see the
// same machine; the first round also checks ep's result against the CPU
// engine's (with a device) or the baseline's.
func (b *bench[E]) rounds() (*samples, error) {
	var s samples
	for i := 0; i < b.o.warmup+b.o.iters; i++ {
		if i == b.o.warmup && b.o.floor { // ep's traffic, once warm
			var err error
			if b.floor, err = newNetFloor(b); err != nil {
				return nil, fmt.Errorf("the network floor: %w", err)
			}
		}
		d, cmb, err := round(b.world, b.g, b.x, b.out, b.topk, b.weights)
		if err != nil {
			return nil, err
		}
		epCPU := lastCPU
		var a2a, p2p [2]time.Duration
		var floorCPU time.Duration
		if b.floor != nil {
			if a2a, p2p, floorCPU, err = b.floor.exchange(); err != nil {
				return nil, err
			}
		}
		var d2, c2, d3, c3, dc, d4, c4 time.Duration
		if b.native != nil {
			if d4, c4, err = round(b.world, b.native, b.x, b.nout, b.topk, b.weights); err != nil {
				return nil, err
			}
		}
		if b.base != nil {
			if d2, c2, err = round(b.world, b.base, b.bx, b.bout, b.topk, b.weights); err != nil {
				return nil, err
			}
		}
		if b.cpu != nil {
			if d3, c3, err = round(b.world, b.cpu, b.cx, b.cout, b.topk, b.weights); err != nil {
				return nil, err
			}
		}
		if i == 0 && b.o.validate {
			if err := b.validate(); err != nil {
				return nil, err
			}
		}
		if err := b.world.Barrier(); err != nil {
			return nil, err
		}
		t0 := time.Now()
		memcpyBytes(b.dst, b.src)
		m := time.Since(t0)
		if b.cpu != nil {
			if err := b.world.Barrier(); err != nil {
				return nil, err
			}
			t0 = time.Now()
			if err := epgpu.CopyOnDevice(b.ddst, b.dsrc); err != nil {
				return nil, err
			}
			dc = time.Since(t0)
		}
		if i >= b.o.warmup {
			s.dispatch, s.combine = append(s.dispatch, us(d)), append(s.combine, us(cmb))
			s.baseDispatch, s.baseCombine = append(s.baseDispatch, us(d2)), append(s.baseCombine, us(c2))
			s.cpuDispatch, s.cpuCombine = append(s.cpuDispatch, us(d3)), append(s.cpuCombine, us(c3))
			s.memcpy, s.deviceCopy = append(s.memcpy, us(m)), append(s.deviceCopy, us(dc))
			s.nativeDispatch, s.nativeCombine = append(s.nativeDispatch, us(d4)), append(s.nativeCombine, us(c4))
			s.floorA2A[0], s.floorA2A[1] = append(s.floorA2A[0], us(a2a[0])), append(s.floorA2A[1], us(a2a[1]))
			s.floorP2P[0], s.floorP2P[1] = append(s.floorP2P[0], us(p2p[0])), append(s.floorP2P[1], us(p2p[1]))
			s.epCPU, s.floorCPU = append(s.epCPU, us(epCPU)), append(s.floorCPU, us(floorCPU))
		}
	}
	return &s, nil
}

// round times a dispatch and then a combine with identity experts, in
// place, each started right after a barrier so that no rank's lateness is
// counted. In FP8 the identity experts dequantize the valid rows into the
// combine buffer, untimed.
func round[E ep.Element](world *mpi.Comm, g *ep.Group[E], x, out ep.Tensor[E], topk []int32, weights []float32) (time.Duration, time.Duration, error) {
	var h ep.Handle[E]
	if !g.Config().Wire.FP8() {
		return timeRound(world,
			func() (err error) { h, err = g.Dispatch(x, topk, weights); return err }, nil,
			func() error { return g.Combine(h, h.Recv(), out, nil) })
	}
	return timeRound(world,
		func() (err error) { h, err = g.Dispatch(x, topk, weights); return err },
		func() error { return dequantizeValid(g, h) },
		func() error { return g.Combine(h, h.CombineBuffer(), out, nil) })
}

// dequantizeValid writes the valid received rows of an FP8 dispatch,
// dequantized, into its combine buffer (host memory).
func dequantizeValid[E ep.Element](g *ep.Group[E], h ep.Handle[E]) error {
	H := g.Config().Hidden
	G := ep.ScaleGroups(H)
	codes, scales, y := h.RecvFP8().Host(), h.RecvScales().Host(), h.CombineBuffer().Host()
	if codes == nil || y == nil {
		return errors.New("ep-bench: -dtype fp8 needs a backend on host memory")
	}
	blocks := [][2]int{{0, h.NumRecv()}}  // HT: the first NumRecv rows
	if g.Config().Mode == ep.LowLatency { // LL: the first count rows of each expert's block
		span := g.Size() * g.Config().MaxTokensPerRank
		blocks = blocks[:0]
		for l, n := range h.ExpertCounts() {
			blocks = append(blocks, [2]int{l * span, l*span + n})
		}
	}
	for _, bl := range blocks {
		if err := ep.Dequantize(y[bl[0]*H:bl[1]*H], codes[bl[0]*H:bl[1]*H], scales[bl[0]*G:bl[1]*G], H); err != nil {
			return err
		}
	}
	return nil
}

// validate compares ep's last result with the CPU engine's (with a device)
// or the baseline's: bit for bit in LL mode and on one node (they sum in
// the same order), within bfloat16 rounding in HT mode across nodes (the
// CPU engine sums per node first).
func (b *bench[E]) validate() error {
	want, ref := b.bout.Host(), "the alltoallv path"
	if b.cpu != nil {
		want, ref = b.cout.Host(), "the CPU engine"
	}
	if want == nil {
		return nil // -no-baseline on the CPU: nothing to compare with
	}
	got, err := ep.ToHost(b.out)
	if err != nil {
		return err
	}
	exact := b.c.mode == ep.LowLatency || b.g.Nodes() == 1
	for i := range want {
		x, y := float64(ep.Float32Of(got[i])), float64(ep.Float32Of(want[i]))
		if exact && got[i] != want[i] || math.Abs(x-y) > 1e-2*(1+math.Abs(y)) {
			return fmt.Errorf("validation: ep's combine (%s) differs from %s at element %d: %v, want %v", b.o.device, ref, i, x, y)
		}
	}
	return nil
}

// summarize gathers every rank's medians: times are the slowest rank's,
// bandwidths the mean over ranks of bytes over time.
func (b *bench[E]) summarize(s *samples) (_ *Result, err error) {
	R := b.world.Size()
	mine := []float64{median(s.dispatch), median(s.combine), median(s.baseDispatch), median(s.baseCombine), median(s.memcpy), b.bytes,
		median(s.cpuDispatch), median(s.cpuCombine), median(s.deviceCopy), median(s.nativeDispatch), median(s.nativeCombine), b.nbytes,
		median(s.steady), median(s.baseSteady), median(s.floorA2A[0]), median(s.floorA2A[1]), b.floorBytes(),
		median(s.floorP2P[0]), median(s.floorP2P[1]), median(s.epCPU), median(s.floorCPU)}
	all := make([]float64, len(mine)*R)
	if err := mpi.AllgatherSlice(b.world, mine, all); err != nil {
		return nil, err
	}
	col := func(i int) []float64 {
		v := make([]float64, R)
		for r := 0; r < R; r++ {
			v[r] = all[r*len(mine)+i]
		}
		return v
	}
	bwOf := func(i, bytes int) float64 { // mean over ranks of bytes/us -> GB/s
		var sum float64
		for r := 0; r < R; r++ {
			if t := all[r*len(mine)+i]; t > 0 {
				sum += all[r*len(mine)+bytes] / t / 1e3
			}
		}
		return sum / float64(R)
	}
	bw := func(i int) float64 { return bwOf(i, 5) }
	combineBytes := 5 // the rows a combine moves: in fp8, the bf16 rows
	if b.native != nil {
		combineBytes = 11
	}
	c := b.c
	res := &Result{Mode: c.mode.String(), Ranks: R, Nodes: b.g.Nodes(), Tokens: c.tokens, Hidden: c.hidden, TopK: c.topk,
		Experts: c.experts, DType: c.dtype, Iters: b.o.iters, BytesPerRank: mean(col(5)),
		DispatchUS: slices.Max(col(0)), CombineUS: slices.Max(col(1)), DispatchGBps: bw(0), CombineGBps: bwOf(1, combineBytes),
		MemcpyGBps: bw(4), BufferBytesPerRank: b.g.BufferBytes()}
	if b.base != nil {
		res.AlltoallvDispatchUS, res.AlltoallvCombineUS = slices.Max(col(2)), slices.Max(col(3))
		res.AlltoallvDispatchGBps, res.AlltoallvCombineGBps = bw(2), bwOf(3, combineBytes)
		res.Speedup = (res.AlltoallvDispatchUS + res.AlltoallvCombineUS) / (res.DispatchUS + res.CombineUS)
	}
	if b.o.latency {
		res.SteadyRoundUS = slices.Max(col(12))
		if b.base != nil {
			res.AlltoallvSteadyRoundUS = slices.Max(col(13))
		}
	}
	if b.floor != nil {
		// The faster exchange of each half is its floor.
		res.FloorAlltoallvUS = slices.Max(col(14)) + slices.Max(col(15))
		res.FloorP2PUS = slices.Max(col(17)) + slices.Max(col(18))
		res.FloorDispatchUS = min(slices.Max(col(14)), slices.Max(col(17)))
		res.FloorCombineUS = min(slices.Max(col(15)), slices.Max(col(18)))
		res.FloorBytesPerCall = mean(col(16)) * float64(R)
		res.CPUPerRoundUS, res.FloorCPUPerRoundUS = mean(col(19)), mean(col(20))
		if res.XFloor, res.AlltoallvXFloor, err = b.pairedRatios(s); err != nil {
			return nil, err
		}
	}
	if b.base != nil && res.Nodes > 1 {
		if res.NetworkBytesPerCall, res.FlatNetworkBytesPerCall, err = b.networkBytes(); err != nil {
			return nil, err
		}
	}
	if b.native != nil {
		res.BF16DispatchUS, res.BF16CombineUS, res.BF16BytesPerRank = slices.Max(col(9)), slices.Max(col(10)), mean(col(11))
		res.FP8DispatchSpeedup = res.BF16DispatchUS / res.DispatchUS
	}
	if res.MemcpyGBps > 0 {
		res.DispatchOfMemcpy, res.CombineOfMemcpy = res.DispatchGBps/res.MemcpyGBps, res.CombineGBps/res.MemcpyGBps
	}
	if b.cpu != nil {
		res.Device = b.o.device
		res.CPUDispatchUS, res.CPUCombineUS = slices.Max(col(6)), slices.Max(col(7))
		if res.DeviceCopyGBps = bw(8); res.DeviceCopyGBps > 0 {
			res.DispatchOfDeviceCopy, res.CombineOfDeviceCopy = res.DispatchGBps/res.DeviceCopyGBps, res.CombineGBps/res.DeviceCopyGBps
		}
	}
	return res, nil
}

// pairedRatios are ep's and the baseline's times over the floor's, each the
// median over the timed rounds of the round's ratio (the slowest rank's
// dispatch+combine over the slowest rank's floor, each half of the floor
// the faster of its two exchanges): a ratio within one round, so that the
// machine's drift between rounds, which moves both, cancels.
func (b *bench[E]) pairedRatios(s *samples) (ep, base float64, err error) {
	n := len(s.dispatch)
	mine := make([]float64, 3*n)
	for i := 0; i < n; i++ {
		mine[3*i] = s.dispatch[i] + s.combine[i]
		mine[3*i+1] = s.baseDispatch[i] + s.baseCombine[i]
		mine[3*i+2] = min(s.floorA2A[0][i], s.floorP2P[0][i]) + min(s.floorA2A[1][i], s.floorP2P[1][i])
	}
	R := b.world.Size()
	all := make([]float64, len(mine)*R)
	if err := mpi.AllgatherSlice(b.world, mine, all); err != nil {
		return 0, 0, err
	}
	var re, rb []float64
	for i := 0; i < n; i++ {
		var e, bl, f float64
		for r := 0; r < R; r++ {
			e, bl, f = max(e, all[r*len(mine)+3*i]), max(bl, all[r*len(mine)+3*i+1]), max(f, all[r*len(mine)+3*i+2])
		}
		re, rb = append(re, e/f), append(rb, bl/f)
	}
	if b.base == nil {
		return median(re), 0, nil
	}
	return median(re), median(rb), nil
}

// floorBytes is what this rank sends across nodes in the floor's exchange.
func (b *bench[E]) floorBytes() float64 {
	if b.floor == nil {
		return 0
	}
	return float64(b.floor.halves[0].bytes + b.floor.halves[1].bytes)
}

// networkBytes is, per dispatch and combine and over all ranks, the bytes
// ep put across nodes and those the baseline sent to and received from
// ranks of other nodes (a flat exchange's), from the groups' Stats.
func (b *bench[E]) networkBytes() (ep, flat float64, err error) {
	st, base := b.g.Stats(), b.base.Stats()
	if st.Dispatches == 0 || base.Dispatches == 0 {
		return 0, 0, nil
	}
	var cross int64
	for p, n := range base.SentBytes {
		if b.g.NodeOf(p) != b.g.Node() {
			cross += n
		}
	}
	mine := []float64{float64(st.NetworkBytes) / float64(st.Dispatches), float64(cross) / float64(base.Dispatches)}
	sum := make([]float64, 2)
	if err := mpi.Allreduce(b.world, mpi.OpSum, mine, sum); err != nil {
		return 0, 0, err
	}
	return sum[0], sum[1], nil
}

// timeRound times a dispatch and then a combine, each started right after a
// barrier so that no rank's lateness is counted; experts (nil: none) runs
// untimed between them.
func timeRound(world *mpi.Comm, dispatch, experts, combine func() error) (time.Duration, time.Duration, error) {
	if err := world.Barrier(); err != nil {
		return 0, 0, err
	}
	c0, t0 := cpuTime(), time.Now()
	if err := dispatch(); err != nil {
		return 0, 0, err
	}
	d := time.Since(t0)
	lastCPU = cpuTime() - c0
	if experts != nil {
		if err := experts(); err != nil {
			return 0, 0, err
		}
	}
	if err := world.Barrier(); err != nil {
		return 0, 0, err
	}
	c0, t1 := cpuTime(), time.Now()
	if err := combine(); err != nil {
		return 0, 0, err
	}
	c := time.Since(t1)
	lastCPU += cpuTime() - c0
	return d, c, nil
}

// lastCPU is the processor time this rank used in the last timeRound's
// dispatch and combine (user and system, the process's threads all).
var lastCPU time.Duration

// cpuTime is the processor time this process has used.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func printTable(w io.Writer, r *Result, baseline bool) {
	fmt.Fprintf(w, "ep-bench %s %s: %d ranks on %d node(s), %d tokens/rank, hidden %d, top-%d, %d experts; %.1f MB/rank per call; median of %d, slowest rank\n",
		r.Mode, r.DType, r.Ranks, r.Nodes, r.Tokens, r.Hidden, r.TopK, r.Experts, r.BytesPerRank/1e6, r.Iters)
	fmt.Fprintf(w, "  buffers: %.1f MB per rank\n", float64(r.BufferBytesPerRank)/1e6)
	fmt.Fprintf(w, "  %-22s %12s %10s %12s %10s %12s\n", "", "dispatch us", "GB/s", "combine us", "GB/s", "total us")
	name := "ep (goep)"
	if r.Device != "" {
		name = "ep (goep) on " + r.Device
	}
	fmt.Fprintf(w, "  %-22s %12.1f %10.2f %12.1f %10.2f %12.1f\n", name, r.DispatchUS, r.DispatchGBps, r.CombineUS, r.CombineGBps, r.DispatchUS+r.CombineUS)
	if r.Device != "" {
		bw := func(us float64) float64 { // the CPU engine's, from the same bytes
			if us <= 0 {
				return 0
			}
			return r.BytesPerRank / us / 1e3
		}
		fmt.Fprintf(w, "  %-22s %12.1f %10.2f %12.1f %10.2f %12.1f\n", "ep CPU engine", r.CPUDispatchUS, bw(r.CPUDispatchUS),
			r.CPUCombineUS, bw(r.CPUCombineUS), r.CPUDispatchUS+r.CPUCombineUS)
		fmt.Fprintf(w, "  %s takes %.2fx the CPU engine's time (dispatch+combine), results checked against it\n", r.Device,
			(r.DispatchUS+r.CombineUS)/(r.CPUDispatchUS+r.CPUCombineUS))
	}
	if baseline {
		fmt.Fprintf(w, "  %-22s %12.1f %10.2f %12.1f %10.2f %12.1f\n", "alltoallv by hand", r.AlltoallvDispatchUS, r.AlltoallvDispatchGBps,
			r.AlltoallvCombineUS, r.AlltoallvCombineGBps, r.AlltoallvDispatchUS+r.AlltoallvCombineUS)
		fmt.Fprintf(w, "  speedup over alltoallv: %.2fx\n", r.Speedup)
	}
	if r.XFloor > 0 {
		fmt.Fprintf(w, "  %-22s %12.1f %10s %12.1f %10s %12.1f\n", "network floor", r.FloorDispatchUS, "", r.FloorCombineUS, "",
			r.FloorDispatchUS+r.FloorCombineUS)
		fmt.Fprintf(w, "  x floor (median of each round's ratio): ep %.2fx", r.XFloor)
		if r.AlltoallvXFloor > 0 {
			fmt.Fprintf(w, ", alltoallv %.2fx", r.AlltoallvXFloor)
		}
		fmt.Fprintf(w, " (floor: ep's own %.1f MB across nodes, all ranks, each half by the faster of MPI_Alltoallv, %.1f us in all, and every MPI_Isend/Irecv at once, %.1f us)\n",
			r.FloorBytesPerCall/1e6, r.FloorAlltoallvUS, r.FloorP2PUS)
		fmt.Fprintf(w, "  processor time per rank and round (mean over ranks): ep %.1f ms, the floor's exchange %.1f ms (%.2fx)\n",
			r.CPUPerRoundUS/1e3, r.FloorCPUPerRoundUS/1e3, r.CPUPerRoundUS/r.FloorCPUPerRoundUS)
	}
	if r.FlatNetworkBytesPerCall > 0 {
		fmt.Fprintf(w, "  across nodes per dispatch+combine, all ranks: ep %.1f MB, a flat exchange (alltoallv) %.1f MB (%.2fx)\n",
			r.NetworkBytesPerCall/1e6, r.FlatNetworkBytesPerCall/1e6, r.NetworkBytesPerCall/r.FlatNetworkBytesPerCall)
	}
	if r.BF16DispatchUS > 0 {
		fmt.Fprintf(w, "  %-22s %12.1f %10.2f %12.1f %10.2f %12.1f\n", "ep, bf16 on the wire", r.BF16DispatchUS,
			r.BF16BytesPerRank/r.BF16DispatchUS/1e3, r.BF16CombineUS, r.BF16BytesPerRank/r.BF16CombineUS/1e3, r.BF16DispatchUS+r.BF16CombineUS)
		fmt.Fprintf(w, "  fp8 dispatch: %.2f MB/rank per call (bf16: %.2f MB, %.2fx the bytes), %.2fx the speed of bf16\n",
			r.BytesPerRank/1e6, r.BF16BytesPerRank/1e6, r.BytesPerRank/r.BF16BytesPerRank, r.FP8DispatchSpeedup)
	}
	fmt.Fprintf(w, "  memcpy of the same bytes: %.2f GB/s per rank; dispatch %.0f%%, combine %.0f%% of it\n",
		r.MemcpyGBps, 100*r.DispatchOfMemcpy, 100*r.CombineOfMemcpy)
	if r.Device != "" {
		fmt.Fprintf(w, "  %s copy of the same bytes in device memory: %.2f GB/s per rank; dispatch %.0f%%, combine %.0f%% of it\n",
			r.Device, r.DeviceCopyGBps, 100*r.DispatchOfDeviceCopy, 100*r.CombineOfDeviceCopy)
	}
	fmt.Fprintln(w)
}

// printLatency is the -latency sweep as one table: ep's LL dispatch and
// combine against the two floors measured in the same run, the flag round
// trip and the data round trip of the same rows. "round" is a
// dispatch+combine back to back with the others (a decode loop), which is
// how the floors are measured too, and what "x flag" and "x data" compare;
// the dispatch and combine columns are each timed from a barrier.
func printLatency(w io.Writer, results []*Result, floor float64) {
	fmt.Fprintf(w, "LL latency, flag round trip between two ranks of a node: %.2f us\n", floor)
	fmt.Fprintf(w, "  %8s %8s %10s %8s %10s %8s %10s | %12s %11s | %14s %10s\n", "tokens", "hidden", "round us", "x flag",
		"data us", "x data", "alltoallv", "dispatch us", "combine us", "alltoallv d+c", "speedup")
	ratio := func(a, b float64) float64 {
		if b > 0 {
			return a / b
		}
		return 0
	}
	for _, r := range results {
		fmt.Fprintf(w, "  %8d %8d %10.2f %8.2f %10.2f %8.2f %10.2f | %12.2f %11.2f | %14.2f %9.2fx\n", r.Tokens, r.Hidden,
			r.SteadyRoundUS, ratio(r.SteadyRoundUS, floor), r.DataRoundTripUS, ratio(r.SteadyRoundUS, r.DataRoundTripUS),
			r.AlltoallvSteadyRoundUS, r.DispatchUS, r.CombineUS, r.AlltoallvDispatchUS+r.AlltoallvCombineUS,
			ratio(r.AlltoallvSteadyRoundUS, r.SteadyRoundUS))
	}
	fmt.Fprintf(w, "  round: one dispatch+combine back to back (a decode loop), the slowest rank's mean over %d;\n", burst)
	fmt.Fprintln(w, "  x flag = round / flag round trip; data: the same rows moved and summed by the least code that can (C), x data = round / data;")
	fmt.Fprintln(w, "  dispatch, combine: each from a barrier, medians, slowest rank; speedup = alltoallv's round / ep's")
}

// plan prints each configuration's buffers for -plan ranks on -plan-nodes
// nodes, as the CPU backend will hold them: a size hint for a job not yet
// launched (NewGroup refuses what a node cannot give, before allocating).
func plan(stdout, stderr io.Writer, o *options) int {
	for _, c := range o.configs() {
		cfg := ep.Config{Mode: c.mode, NumExperts: c.experts, MaxTokensPerRank: max(c.tokens, 1), Hidden: c.hidden, TopK: c.topk,
			Wire: c.wire()}
		elem := ep.BFloat16
		if c.dtype == "f32" {
			elem = ep.Float32
		}
		f, err := ep.BufferPlan(cfg, elem, o.planRanks, o.planNodes)
		if err != nil {
			fmt.Fprintf(stderr, "ep-bench: -plan: %v: %v\n", c, err)
			return 2
		}
		fmt.Fprintf(stdout, "%v: %d ranks on %d nodes: %v\n", c, o.planRanks, o.planNodes, f)
		if err := f.WriteLayout(stdout); err != nil {
			fmt.Fprintf(stderr, "ep-bench: -plan: %v\n", err)
			return 1
		}
	}
	return 0
}

func us(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func mean(v []float64) float64 {
	var s float64
	for _, x := range v {
		s += x
	}
	return s / float64(len(v))
}
