package main

/*
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
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

// bench_exchange is the floor of a decode round that moves data: `iters`
// rounds between two ranks of a node, each the least an LL dispatch and
// combine of `rows` bfloat16 rows of `hidden` elements can do through an
// MPI-3 shared window. Dispatch: copy the rows into the peer's segment,
// release-store the peer's data flag, acquire-spin on one's own. Combine:
// release-store the peer's ready flag, spin on one's own, then read the
// rows back from the peer (the experts' outputs, in place) and sum them in
// float32 into out, rounded to bfloat16. Both ranks do the same; each
// returns its mean round in nanoseconds. mine and peer are the two
// segments: flags at bytes 0 and 64, rows from 128 (rows*hidden*2 bytes).
static double bench_exchange(char *mine, char *peer, const uint16_t *src, uint16_t *out, float *acc,
                             int64_t iters, int64_t rows, int64_t hidden) {
  _Atomic uint64_t *data_mine = (_Atomic uint64_t *)mine, *data_peer = (_Atomic uint64_t *)peer;
  _Atomic uint64_t *ready_mine = (_Atomic uint64_t *)(mine + 64), *ready_peer = (_Atomic uint64_t *)(peer + 64);
  const uint16_t *back = (const uint16_t *)(peer + 128);
  size_t bytes = (size_t)(rows * hidden * 2);
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (int64_t i = 1; i <= iters; i++) {
    memcpy(peer + 128, src, bytes);
    atomic_store_explicit(data_peer, (uint64_t)i, memory_order_release);
    while (atomic_load_explicit(data_mine, memory_order_acquire) < (uint64_t)i) {}
    atomic_store_explicit(ready_peer, (uint64_t)i, memory_order_release);
    while (atomic_load_explicit(ready_mine, memory_order_acquire) < (uint64_t)i) {}
    for (int64_t h = 0; h < hidden; h++) acc[h] = 0;
    for (int64_t r = 0; r < rows; r++)
      for (int64_t h = 0; h < hidden; h++) {
        uint32_t u = (uint32_t)back[r * hidden + h] << 16;
        float f;
        memcpy(&f, &u, 4);
        acc[h] += f;
      }
    for (int64_t h = 0; h < hidden; h++) {
      uint32_t u;
      memcpy(&u, &acc[h], 4);
      out[h] = (uint16_t)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
    }
  }
  clock_gettime(CLOCK_MONOTONIC, &t1);
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
	samples, err := pairRounds(world, 128, rounds, func(mine, peer []byte) float64 {
		return float64(C.bench_pingpong((*C.uint64_t)(unsafe.Pointer(&mine[0])), (*C.uint64_t)(unsafe.Pointer(&peer[0])),
			C.int64_t(iters), C.int(1-world.Rank())))
	})
	if err != nil || samples == nil {
		return 0, err
	}
	return median(samples), nil
}

// dataRoundTrip measures the floor of a decode round that moves rows
// (bench_exchange) between ranks 0 and 1, rows bfloat16 rows of hidden
// elements from this rank to the other, in microseconds: the median over
// rounds of the slower of the two ranks' means, each mean over a burst of
// about 10 ms. 0 on every rank when rank 1 is absent or on another node.
// It is collective.
func dataRoundTrip(world *mpi.Comm, rows, hidden, rounds int) (float64, error) {
	most := []int32{0} // the peer's rows land in this rank's segment
	if err := mpi.Allreduce(world, mpi.OpMax, []int32{int32(rows)}, most); err != nil {
		return 0, err
	}
	// The two ranks run the same rounds in lockstep: the same count on both.
	iters := max(500, 20000/max(1, int(most[0])*hidden*2/1024))
	src, out, acc := make([]uint16, max(1, rows)*hidden), make([]uint16, hidden), make([]float32, hidden)
	for i := range src {
		src[i] = uint16(0x3f80 + i%64) // bfloat16 values near 1
	}
	samples, err := pairRounds(world, 128+2*int(most[0])*hidden, rounds, func(mine, peer []byte) float64 {
		return float64(C.bench_exchange((*C.char)(unsafe.Pointer(&mine[0])), (*C.char)(unsafe.Pointer(&peer[0])),
			(*C.uint16_t)(&src[0]), (*C.uint16_t)(&out[0]), (*C.float)(&acc[0]), C.int64_t(iters), C.int64_t(rows), C.int64_t(hidden)))
	})
	if err != nil || samples == nil {
		return 0, err
	}
	return median(samples), nil
}

// pairRounds runs rounds timed samples between ranks 0 and 1 of a node over
// a shared window of size bytes per rank, whose first 128 bytes hold the
// flags: each round clears this rank's flags, meets every rank at a
// barrier, and on ranks 0 and 1 runs sample on this rank's window and the
// other's, which returns nanoseconds. It returns, on every rank, the
// slower of the two ranks' times per round in microseconds; nil when there
// are fewer than 2 ranks or rank 1 is on another node. It is collective.
func pairRounds(world *mpi.Comm, size, rounds int, sample func(mine, peer []byte) float64) ([]float64, error) {
	topo, err := world.Topology()
	if err != nil {
		return nil, err
	}
	defer topo.Free()
	if world.Size() < 2 || topo.NodeOf[1] != topo.NodeOf[0] {
		return nil, nil
	}
	win, err := topo.NodeComm.AllocateShared(size)
	if err != nil {
		return nil, err
	}
	defer win.Free()
	me := world.Rank()
	samples := make([]float64, rounds)
	for r := range samples {
		ns := []float64{0}
		if me <= 1 {
			peer, err := win.Peer(topo.LocalRankOf[1-me])
			if err != nil {
				return nil, err
			}
			clear(win.Local()[:128])
			if err := world.Barrier(); err != nil {
				return nil, err
			}
			ns[0] = sample(win.Local(), peer)
		} else if err := world.Barrier(); err != nil {
			return nil, err
		}
		slowest := []float64{0} // also keeps a rank from clearing its flags while the other still reads them
		if err := mpi.Allreduce(world, mpi.OpMax, ns, slowest); err != nil {
			return nil, err
		}
		samples[r] = slowest[0] / 1e3
	}
	return samples, nil
}
