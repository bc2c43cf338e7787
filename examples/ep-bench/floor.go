package main

/*
#include <stdatomic.h>
#include <stdint.h>
#include <time.h>

// bench_pingpong is the physical floor of a flag exchange between two ranks
// of a node: `iters` round trips of a 64-bit flag through an MPI-3 shared
// window, each a release store into the peer's word and an acquire spin on
// one's own. The first rank starts each trip and returns the mean round trip
// in nanoseconds; the second answers (and returns 0).
static double bench_pingpong(uint64_t *mine, uint64_t *peer, int64_t iters, int first) {
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (int64_t i = 1; i <= iters; i++) {
    if (first) {
      atomic_store_explicit((_Atomic uint64_t *)peer, (uint64_t)i, memory_order_release);
      while (atomic_load_explicit((_Atomic uint64_t *)mine, memory_order_acquire) < (uint64_t)i) {}
    } else {
      while (atomic_load_explicit((_Atomic uint64_t *)mine, memory_order_acquire) < (uint64_t)i) {}
      atomic_store_explicit((_Atomic uint64_t *)peer, (uint64_t)i, memory_order_release);
    }
  }
  clock_gettime(CLOCK_MONOTONIC, &t1);
  if (!first) return 0;
  return ((t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec)) / (double)iters;
}
*/
import "C"

import (
	"unsafe"

	"github.com/goep/goep/mpi"
)

// flagRoundTrip measures the floor of a flag exchange between ranks 0 and 1
// (bench_pingpong), in microseconds, the median of rounds: 0 on every rank
// when there are fewer than 2 ranks or rank 1 is on another node. It is
// collective.
func flagRoundTrip(world *mpi.Comm, rounds, iters int) (float64, error) {
	topo, err := world.Topology()
	if err != nil {
		return 0, err
	}
	defer topo.Free()
	if world.Size() < 2 || topo.NodeOf[1] != topo.NodeOf[0] {
		return 0, nil
	}
	win, err := topo.NodeComm.AllocateShared(128)
	if err != nil {
		return 0, err
	}
	defer win.Free()
	me := world.Rank()
	var samples []float64
	for r := 0; r < rounds; r++ {
		if me <= 1 {
			peer, err := win.Peer(topo.LocalRankOf[1-me])
			if err != nil {
				return 0, err
			}
			clear(win.Local()[:64])
			if err := world.Barrier(); err != nil {
				return 0, err
			}
			ns := C.bench_pingpong((*C.uint64_t)(unsafe.Pointer(&win.Local()[0])), (*C.uint64_t)(unsafe.Pointer(&peer[0])),
				C.int64_t(iters), C.int(1-me))
			samples = append(samples, float64(ns)/1e3)
		} else if err := world.Barrier(); err != nil {
			return 0, err
		}
		if err := world.Barrier(); err != nil {
			return 0, err
		}
	}
	v := []float64{0}
	if me == 0 {
		v[0] = median(samples)
	}
	return v[0], mpi.BcastSlice(world, v, 0)
}
