package main

// The timed rounds: ep, the baseline, the floors and the copies, in turn.

import (
	"errors"
	"fmt"
	"math"
	"syscall"
	"time"

	"github.com/goep/goep/ep"
	"github.com/goep/goep/ep/epgpu"
	"github.com/goep/goep/mpi"
)

// samples are each timed round's figures, in microseconds.
type samples struct {
	dispatch, combine, baseDispatch, baseCombine, cpuDispatch, cpuCombine, memcpy, deviceCopy []float64
	nativeDispatch, nativeCombine                                                             []float64    // -dtype fp8: the same in bf16
	flatDispatch, flatCombine, permute, unpermute                                             []float64    // -layout expert-major: the flat layout and the user's permutation, and the latter alone
	floorA2A, floorP2P                                                                        [2][]float64 // across nodes: the network floor's exchanges, dispatch and combine
	epCPU, floorCPU                                                                           []float64    // this rank's processor time in ep's dispatch+combine and in the floor's point-to-point exchanges
	steady, baseSteady                                                                        []float64    // -latency: a round's mean time over each burst
	devDispatch, devCombine                                                                   []float64    // ep on a device: its device time (events)
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
		h, err := g.Dispatch(ep.Tokens(x, topk, weights))
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
		devD, devC, _ := b.g.DeviceTimes()
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
		var d5, c5, p5, u5 time.Duration
		if b.flat != nil {
			if d5, c5, p5, u5, err = b.flatRound(i == 0 && b.o.validate); err != nil {
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
			if err := copyInMemory(b.ddst, b.dsrc); err != nil {
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
			s.flatDispatch, s.flatCombine = append(s.flatDispatch, us(d5)), append(s.flatCombine, us(c5))
			s.permute, s.unpermute = append(s.permute, us(p5)), append(s.unpermute, us(u5))
			s.floorA2A[0], s.floorA2A[1] = append(s.floorA2A[0], us(a2a[0])), append(s.floorA2A[1], us(a2a[1]))
			s.floorP2P[0], s.floorP2P[1] = append(s.floorP2P[0], us(p2p[0])), append(s.floorP2P[1], us(p2p[1]))
			s.epCPU, s.floorCPU = append(s.epCPU, us(epCPU)), append(s.floorCPU, us(floorCPU))
			s.devDispatch, s.devCombine = append(s.devDispatch, us(devD)), append(s.devCombine, us(devC))
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
			func() (err error) { h, err = g.Dispatch(ep.Tokens(x, topk, weights)); return err }, nil,
			func() error { return g.Combine(h, h.Recv(), out, nil) })
	}
	return timeRound(world,
		func() (err error) { h, err = g.Dispatch(ep.Tokens(x, topk, weights)); return err },
		func() error { return dequantizeValid(g, h) },
		func() error { return g.Combine(h, h.CombineBuffer(), out, nil) })
}

// flatRound times what a user of the flat layout does to get the zones of
// the expert-major layout: the flat dispatch and the permutation into
// zones, then (the experts being identity, the zones are their outputs) the
// sums of each row's zone rows back into the flat rows, in the flat
// group's combine buffer, and the flat combine; and the permutation and
// the sums back alone. check compares the zones with the expert-major
// group's, and the results.
func (b *bench[E]) flatRound(check bool) (d, c, perm, unperm time.Duration, err error) {
	var h ep.Handle[E]
	d, c, err = timeRound(b.world,
		func() (err error) {
			if h, err = b.flat.Dispatch(ep.Tokens(b.x, b.topk, b.weights)); err != nil {
				return err
			}
			t0 := time.Now()
			err = b.perm.permute(h)
			perm = time.Since(t0)
			return err
		}, nil,
		func() error {
			t0 := time.Now()
			b.perm.unpermute(h.CombineBuffer().Host(), h.NumRecv())
			unperm = time.Since(t0)
			return b.flat.Combine(h, h.CombineBuffer(), b.fout, nil)
		})
	if err != nil || !check {
		return d, c, perm, unperm, err
	}
	return d, c, perm, unperm, b.checkFlat()
}

// checkFlat compares the user's zones with a dispatch of the expert-major
// group, and their combines.
func (b *bench[E]) checkFlat() error {
	em, err := b.g.Dispatch(ep.Tokens(b.x, b.topk, b.weights))
	if err != nil {
		return err
	}
	if err := b.perm.checkSameZones(em); err != nil {
		return err
	}
	if err := b.g.Combine(em, em.Recv(), b.out, nil); err != nil {
		return err
	}
	got, err := ep.ToHost(b.out)
	if err != nil {
		return err
	}
	want, err := ep.ToHost(b.fout)
	if err != nil {
		return err
	}
	for i := range want { // the flat path rounds each row's sum once more
		x, y := float64(ep.Float32Of(got[i])), float64(ep.Float32Of(want[i]))
		if math.Abs(x-y) > 2e-2*(1+math.Abs(y)) {
			return fmt.Errorf("validation: the expert-major combine differs from the flat one after the permutation at element %d: %v, want %v", i, x, y)
		}
	}
	return nil
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
	blocks := [][2]int{{0, h.NumRecv()}} // HT: the first NumRecv rows
	switch cfg := g.Config(); {
	case cfg.Mode == ep.LowLatency && cfg.Layout == ep.LayoutRankMajor: // the first count rows of each source's block
		blocks = blocks[:0]
		for s, n := range h.SourceCounts() {
			blocks = append(blocks, [2]int{s * cfg.MaxTokensPerRank, s*cfg.MaxTokensPerRank + n})
		}
	case cfg.Mode == ep.LowLatency: // the first count rows of each expert's block
		span := g.Size() * cfg.MaxTokensPerRank
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
	exact := (b.c.mode == ep.LowLatency || b.g.Nodes() == 1) && !b.c.combineFP8
	tol := 1e-2 // bfloat16 rounding of partial sums taken per node
	if b.c.combineFP8 {
		tol = 0.1 // the combine's e4m3 rounding: at most 2^-4 of each output, plus its scale's 2^-10 (docs/ep.md)
		if b.c.mode == ep.HighThroughput {
			tol = 0.2 // HT quantizes a node's sum again before it crosses: 3/16 of each partial (docs/ep.md)
		}
	}
	for i := range want {
		x, y := float64(ep.Float32Of(got[i])), float64(ep.Float32Of(want[i]))
		if exact && got[i] != want[i] || math.Abs(x-y) > tol*(1+math.Abs(y)) {
			return fmt.Errorf("validation: ep's combine (%s) differs from %s at element %d: %v, want %v", b.o.device, ref, i, x, y)
		}
	}
	return nil
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

// copyInMemory copies src to dst inside the memory of the backend measured:
// a device-to-device copy on a GPU, a memcpy in host memory.
func copyInMemory(dst, src ep.Tensor[byte]) error {
	if dst.Memory() == ep.HostMemory && src.Memory() == ep.HostMemory {
		memcpyBytes(dst.Host(), src.Host())
		return nil
	}
	return epgpu.CopyOnDevice(dst, src)
}
