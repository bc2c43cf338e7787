package main

// One configuration set up: the groups measured, the tokens and their routing.

import (
	"fmt"
	"math/rand/v2"
	"os"

	"github.com/goep/goep/ep"
	"github.com/goep/goep/mpi"
)

func measure(world *mpi.Comm, c config, o *options) (*Result, error) {
	if c.dtype == "f32" {
		return measureTyped[float32](world, c, o)
	}
	return measureTyped[ep.BF16](world, c, o) // bf16, and fp8: bf16 tokens, FP8 on the wire
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
	cbytes       float64         // -combine fp8: the bytes of the combine's codes and scales
	flat         *ep.Group[E]    // -layout expert-major in HT: the flat layout, plus the user's permutation
	perm         *permutation[E]
	fout         ep.Tensor[E] // its result
}

func newBench[E ep.Element](world *mpi.Comm, c config, o *options) (b *bench[E], err error) {
	b = &bench[E]{world: world, c: c, o: o}
	made := b // "return nil, err" clears b before the deferred call
	defer func() {
		if err != nil {
			made.close()
		}
	}()
	cfg := c.groupConfig(o)
	if c.wire().FP8() || c.combineFP8 { // the same work in the element type, timed in the same rounds
		native := cfg
		native.Wire = ep.WireNative
		if b.native, err = ep.NewGroup[E](world, native); err != nil {
			return nil, err
		}
		if c.combineFP8 {
			cfg.CombineWire = ep.WireFP8
		}
	}
	if c.permuted(o) {
		flat := cfg
		flat.Layout, flat.ExpertAlignment, flat.MaxRecvTokensPerRank = ep.LayoutFlat, 0, 0
		if b.flat, err = ep.NewGroup[E](world, flat); err != nil {
			return nil, err
		}
		b.perm = newPermutation[E](c.hidden, c.topk, b.flat.LocalExperts(), o.align)
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
		cfg.CombineWire = ep.WireNative // the hand-written program combines in the element type
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
	if b.flat != nil {
		if b.fout, err = ep.Alloc[E](b.flat.Memory(), len(host)); err != nil {
			return nil, err
		}
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
	b.nbytes = b.bytes
	if c.wire().FP8() { // codes and scales
		b.bytes = float64(pairs * (c.hidden + 4*ep.ScaleGroups(c.hidden)))
	}
	if c.combineFP8 {
		b.cbytes = float64(pairs * (c.hidden + 4*ep.ScaleGroups(c.hidden)))
	}
	if b.native != nil {
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
	for _, t := range []ep.Tensor[E]{b.x, b.out, b.nout, b.fout} {
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
	if b.flat != nil {
		_ = b.flat.Close()
	}
	if b.g != nil {
		_ = b.g.Close()
	}
	b.floor.close()
}
