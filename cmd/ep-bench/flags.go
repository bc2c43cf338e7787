package main

// The command line: flags, their checks, and the configurations they name.

import (
	"flag"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/goep/goep/ep"
	_ "github.com/goep/goep/ep/backends" // every backend, for -device
)

// options are the parsed flags.
type options struct {
	modes                           []ep.Mode
	tokens, hidden, topk, experts   []int
	dtypes                          []string
	combineFP8                      bool // -combine fp8: the low-precision combine, timed beside bf16
	iters, warmup                   int
	seed                            uint64
	jsonOut, validate, skipBaseline bool
	floor                           bool // across nodes, time the network floor too
	timeline                        bool // print one round's steps on every rank
	latency                         bool
	planRanks, planNodes            int
	timeout                         time.Duration
	device                          string     // the -device spec: a registered backend with options, or list
	backend                         ep.Backend // what -device opened; nil for the default, the CPU engine
	layout                          ep.RecvLayout
	align, maxRecv                  int
}

// config is one measured combination.
type config struct {
	mode                          ep.Mode
	tokens, hidden, topk, experts int
	dtype                         string
	combineFP8                    bool
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
	combine := fs.String("combine", "bf16", "how the combine moves the expert outputs: bf16 (the element type) or fp8 (e4m3 with per-128 scales, "+
		"Config.CombineWire; timed beside the same combine in the element type)")
	iters := fs.Int("iters", 30, "timed iterations")
	warmup := fs.Int("warmup", 5, "untimed iterations first")
	seed := fs.Uint64("seed", 1, "seed of the routing and the data")
	jsonOut := fs.Bool("json", false, "print one JSON object per configuration")
	validate := fs.Bool("validate", true, "check ep's results against the alltoallv path once per configuration")
	skip := fs.Bool("no-baseline", false, "do not run the alltoallv baseline")
	timeline := fs.Bool("timeline", false, "after the timed rounds, run one more with the engine's timeline on and print every rank's steps (the CPU engine)")
	floor := fs.Bool("floor", true, "across nodes, also time the network floor: ep's own bytes across nodes (Stats.NetworkSent) moved by two plain MPI_Alltoallv, dispatch then combine")
	timeout := fs.Duration("timeout", time.Minute, "how long a rank waits for a peer")
	device := fs.String("device", "cpu", "the backend measured, by name with options (list: print every registered backend and what it declares): cpu (ep's CPU engine), "+
		"emulate (the GPU backend on an emulated device), cuda (the GPU backend on each rank's GPU), "+
		"emulate-ipc or cuda-ipc (the same with the ranks of a node writing into each other's memory over IPC, several ranks per GPU allowed), alltoallv, ...; "+
		"with another backend than cpu, the CPU engine runs beside it, checks its results and is timed too")
	planRanks := fs.Int("plan", 0, "print, for this many ranks (no MPI, nothing allocated), each configuration's buffers (ep.BufferPlan) and exit")
	planNodes := fs.Int("plan-nodes", 1, "the nodes -plan spreads the ranks over")
	layout := fs.String("layout", "default", "the receive layout: default (the mode's own), expert-major, rank-major (LL) or flat (HT); "+
		"with -mode ht and expert-major, the flat layout plus the permutation a user writes to get the same zones is timed beside it")
	align := fs.Int("align", 0, "with -layout expert-major in HT: each expert's zone padded to a multiple of this many rows (a power of two)")
	maxRecv := fs.Int("max-recv", 0, "ep.Config.MaxRecvTokensPerRank of the measured groups (0: the worst case; HT expert-major's worst case is every pair of every rank)")
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
		device: *device, floor: *floor, timeline: *timeline, align: *align, maxRecv: *maxRecv}
	if o.device != "list" {
		b, err := ep.OpenBackend(o.device)
		if err != nil {
			return nil, fmt.Errorf("-device: %w", err)
		}
		if b.Name() != ep.DefaultBackend {
			o.backend = b
		}
	}
	var err error
	if o.layout, err = ep.ParseRecvLayout(*layout); err != nil {
		return nil, fmt.Errorf("-layout: %w", err)
	}
	for _, m := range strings.Split(*modes, ",") {
		mode, err := ep.ParseMode(strings.TrimSpace(m))
		if err != nil {
			return nil, fmt.Errorf("-mode: %w", err)
		}
		o.modes = append(o.modes, mode)
	}
	switch *combine {
	case "bf16":
	case "fp8":
		o.combineFP8 = true
	default:
		return nil, fmt.Errorf("-combine: %q is not bf16 or fp8", *combine)
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
							out = append(out, config{mode: m, tokens: t, hidden: h, topk: k, experts: e, dtype: d,
								combineFP8: o.combineFP8})
						}
					}
				}
			}
		}
	}
	return out
}

func (c config) String() string {
	combine := ""
	if c.combineFP8 {
		combine = " combine=fp8"
	}
	return fmt.Sprintf("%v %s tokens=%d hidden=%d topk=%d experts=%d%s", c.mode, c.dtype, c.tokens, c.hidden, c.topk, c.experts, combine)
}

// groupConfig is the ep.Config of a configuration's measured groups.
func (c config) groupConfig(o *options) ep.Config {
	return ep.Config{Mode: c.mode, NumExperts: c.experts, MaxTokensPerRank: max(c.tokens, 1), Hidden: c.hidden,
		TopK: c.topk, Timeout: o.timeout, Backend: o.backend, Wire: c.wire(), Layout: o.layout,
		ExpertAlignment: o.align, MaxRecvTokensPerRank: o.maxRecv}
}

// permuted says whether the configuration times HT's flat layout plus a
// user's permutation beside the expert-major layout (in the element type:
// not with -dtype fp8).
func (c config) permuted(o *options) bool {
	return c.mode == ep.HighThroughput && o.layout == ep.LayoutExpertMajor && !c.wire().FP8()
}

// wire is the wire format of a configuration's dispatch.
func (c config) wire() ep.WireFormat {
	if c.dtype == "fp8" {
		return ep.WireFP8
	}
	return ep.WireNative
}
