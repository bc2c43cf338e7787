//go:build mpi

package main

/*
#include "capi_internal.h"
*/
import "C"

import (
	"time"
	"unsafe"

	"github.com/goep/goep/ep"
)

// goepEpBenchGoRounds (goep_ep_bench.h) times the benchmark's round in Go
// on the group, as a program written in Go would run it.
//
//export goepEpBenchGoRounds
func goepEpBenchGoRounds(group C.goepEpGroup_t, x unsafe.Pointer, topk *C.int32_t, weights *C.float, tokens, iters C.int,
	roundUS *C.double) C.goepEpResult_t {
	return benchGoRounds("goepEpBenchGoRounds", group, x, topk, weights, tokens, iters, roundUS, false)
}

// goepEpBenchGoCopiedRounds (goep_ep_bench.h) times the round in Go with the
// two copies a caller's own arrays cost: the rows received copied out of
// the receive buffer, and the expert outputs combined from that copy.
//
//export goepEpBenchGoCopiedRounds
func goepEpBenchGoCopiedRounds(group C.goepEpGroup_t, x unsafe.Pointer, topk *C.int32_t, weights *C.float, tokens, iters C.int,
	roundUS *C.double) C.goepEpResult_t {
	return benchGoRounds("goepEpBenchGoCopiedRounds", group, x, topk, weights, tokens, iters, roundUS, true)
}

func benchGoRounds(name string, group C.goepEpGroup_t, x unsafe.Pointer, topk *C.int32_t, weights *C.float, tokens, iters C.int,
	roundUS *C.double, copied bool) C.goepEpResult_t {
	return guard(name, func() error {
		if roundUS == nil || iters < 0 {
			return invalidArgf("round_us is NULL or iters = %d is negative", int(iters))
		}
		g, _, err := lookupGroup(group)
		if err != nil {
			return err
		}
		out := make([]float64, int(iters))
		if err := g.bench(x, unsafe.Pointer(topk), unsafe.Pointer(weights), int(tokens), out, copied); err != nil {
			return err
		}
		for i, us := range out {
			unsafe.Slice(roundUS, len(out))[i] = C.double(us)
		}
		return nil
	})
}

func (gi *groupImpl[E]) bench(x, topk, weights unsafe.Pointer, tokens int, roundUS []float64, copied bool) error {
	if err := gi.lock(); err != nil {
		return err
	}
	defer gi.mu.Unlock()
	if err := gi.open(0, gi.defaultLayout(), 0, "goepEpBenchGoRounds"); err != nil {
		return err
	}
	H, K := gi.gc.cfg.Hidden, gi.gc.cfg.TopK
	if tokens < 0 || tokens > gi.gc.cfg.MaxTokensPerRank {
		return invalidArgf("tokens = %d, want 0..%d", tokens, gi.gc.cfg.MaxTokensPerRank)
	}
	if tokens > 0 && (x == nil || topk == nil || weights == nil) {
		return invalidArgf("x, topk or weights is NULL")
	}
	xs := ep.Host(unsafe.Slice((*E)(x), tokens*H))
	tk := unsafe.Slice((*int32)(topk), tokens*K)
	w := unsafe.Slice((*float32)(weights), tokens*K)
	if len(gi.benchOut) != tokens*H {
		gi.benchOut = make([]E, tokens*H)
	}
	out := ep.Host(gi.benchOut)
	for i := range roundUS {
		if err := gi.comm.Barrier(); err != nil {
			return err
		}
		start := time.Now()
		gi.dispatches++
		h, err := gi.g.Dispatch(ep.Tokens(xs, tk, w))
		if err != nil {
			return err
		}
		y := h.Recv()
		if copied {
			y = gi.copyRecv(h)
		}
		if err := gi.g.Combine(h, y, out, nil); err != nil {
			return err
		}
		roundUS[i] = float64(time.Since(start).Nanoseconds()) / 1e3
	}
	return nil
}

// copyRecv copies the rows h received (LL: each expert's valid rows; HT: the
// first NumRecv) into a buffer of the benchmark's, as a dispatch into a
// caller's array does, and gives that buffer.
func (gi *groupImpl[E]) copyRecv(h ep.Handle[E]) ep.Tensor[E] {
	recv, H := h.Recv().Host(), gi.gc.cfg.Hidden
	if len(gi.benchRecv) != len(recv) {
		gi.benchRecv = make([]E, len(recv))
	}
	if gi.gc.cfg.Mode == ep.LowLatency {
		span := gi.g.Size() * gi.gc.cfg.MaxTokensPerRank * H
		for l, k := range h.ExpertCounts() {
			copy(gi.benchRecv[l*span:l*span+k*H], recv[l*span:])
		}
	} else {
		n := h.NumRecv() * H
		copy(gi.benchRecv[:n], recv[:n])
	}
	return ep.Host(gi.benchRecv)
}
