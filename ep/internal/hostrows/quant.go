package hostrows

/*
#include "kernels.h"
*/
import "C"

import (
	"unsafe"

	"github.com/goep/goep/ep/driver"
)

// QuantRows casts n = dst.Len() rows to e4m3 with their scales: row i from
// origin[srcOff[i]:] (hidden elements of elem) to dst's and scales' i-th
// addresses, in one C call (ep_quant_rows). Consecutive rows with the same
// source are cast once and copied.
func QuantRows(dst, scales *AddrTable, origin []byte, srcOff []int64, hidden int, elem driver.DType, w driver.WireFormat, impl CastImpl) {
	n := dst.Len()
	if n == 0 {
		return
	}
	C.ep_quant_rows(dst.c(), scales.c(), (*C.char)(unsafe.Pointer(unsafe.SliceData(origin))), i64p(srcOff),
		C.int64_t(n), C.int64_t(hidden), C.int(elem), scaleMode(w), C.int(impl))
}

// CastImpl picks the cast: the fastest this CPU has, or the portable one
// (which the tests also run, through Quantize's twin and tuned groups:
// both must agree with the reference).
type CastImpl int

const (
	CastFastest  CastImpl = 0
	CastPortable CastImpl = 1
)

// CastQueue collects the rows a dispatch casts to FP8 on their way, for one
// kernel call: each row's destination (a node peer's receive buffer, or this
// rank's outbox for another node), where its scales go, and where it starts
// in the tokens.
type CastQueue struct {
	Dst, Scales AddrTable
	SrcOff      []int64
	Impl        CastImpl
}

func (q *CastQueue) Add(dst, scales ptr, srcOff int64) {
	q.Dst.Add(dst)
	q.Scales.Add(scales)
	q.SrcOff = append(q.SrcOff, srcOff)
}

// Flush casts the queued rows of origin and empties the queue.
func (q *CastQueue) Flush(origin []byte, hidden int, elem driver.DType, w driver.WireFormat) {
	QuantRows(&q.Dst, &q.Scales, origin, q.SrcOff, hidden, elem, w, q.Impl)
	q.Dst.Reset()
	q.Scales.Reset()
	q.SrcOff = q.SrcOff[:0]
}
