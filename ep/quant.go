package ep

/*
#include "kernels.h"
*/
import "C"

import "unsafe"

// quantRows casts n = dst.len() rows to e4m3 with their scales: row i from
// origin[srcOff[i]:] (hidden elements of elem) to dst's and scales' i-th
// addresses, in one C call (ep_quant_rows). Consecutive rows with the same
// source are cast once and copied.
func quantRows(dst, scales *addrTable, origin []byte, srcOff []int64, hidden int, elem DType, w WireFormat, impl castImpl) {
	n := dst.len()
	if n == 0 {
		return
	}
	C.ep_quant_rows(dst.c(), scales.c(), (*C.char)(unsafe.Pointer(unsafe.SliceData(origin))), i64p(srcOff),
		C.int64_t(n), C.int64_t(hidden), C.int(elem), scaleMode(w), C.int(impl))
}

// castImpl picks the cast: the fastest this CPU has, or the portable one
// (which the tests also run, through Quantize's twin and tuned groups:
// both must agree with the reference).
type castImpl int

const (
	castFastest  castImpl = 0
	castPortable castImpl = 1
)

// castQueue collects the rows a dispatch casts to FP8 on their way, for one
// kernel call: each row's destination (a node peer's receive buffer, or this
// rank's outbox for another node), where its scales go, and where it starts
// in the tokens.
type castQueue struct {
	dst, scales addrTable
	srcOff      []int64
	impl        castImpl
}

func (q *castQueue) add(dst, scales ptr, srcOff int64) {
	q.dst.add(dst)
	q.scales.add(scales)
	q.srcOff = append(q.srcOff, srcOff)
}

// flush casts the queued rows of origin and empties the queue.
func (q *castQueue) flush(origin []byte, hidden int, elem DType, w WireFormat) {
	quantRows(&q.dst, &q.scales, origin, q.srcOff, hidden, elem, w, q.impl)
	q.dst.reset()
	q.scales.reset()
	q.srcOff = q.srcOff[:0]
}
