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
	return guard("goepEpBenchGoRounds", func() error {
		if roundUS == nil || iters < 0 {
			return invalidArgf("round_us is NULL or iters = %d is negative", int(iters))
		}
		g, _, err := lookupGroup(group)
		if err != nil {
			return err
		}
		out := make([]float64, int(iters))
		if err := g.bench(x, unsafe.Pointer(topk), unsafe.Pointer(weights), int(tokens), out); err != nil {
			return err
		}
		for i, us := range out {
			unsafe.Slice(roundUS, len(out))[i] = C.double(us)
		}
		return nil
	})
}

func (gi *groupImpl[E]) bench(x, topk, weights unsafe.Pointer, tokens int, roundUS []float64) error {
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
		if err := gi.g.Combine(h, h.Recv(), out, nil); err != nil {
			return err
		}
		roundUS[i] = float64(time.Since(start).Nanoseconds()) / 1e3
	}
	return nil
}
