package ep

/*
#include "kernels.h"
*/
import "C"

import "unsafe"

// rowFormat is how a dispatched row travels: its bytes (and side data, the
// FP8 scales, apart from them), and how the caller's token becomes a row in
// a destination, which is a slot in a node peer's receive buffer or a row of
// this rank's outbox for another node: the modes say where each row goes,
// the format writes it, the transport moves the rows and their side data
// together (rowArea). The element type on the wire (nativeRows), FP8 e4m3
// with per-128 scales cast on the way (fp8Rows) and FP8 rows the caller
// quantized, forwarded with its scales as they are (fp8Forward), are its
// implementations; a new format is one more.
type rowFormat interface {
	// rowBytes is the bytes of one row, sideBytes of its side data (0:
	// none).
	rowBytes() int
	sideBytes() int
	// put queues the writing of row i of area a, in the memory at base:
	// the caller's token tk.
	put(base ptr, a rowArea, i int, tk int)
	// flush writes the queued rows from the caller's tokens x and their
	// side data (the caller's scales, for a forwarded format; nil
	// otherwise), in one kernel call each, and empties the queue.
	flush(x, side []byte)
	// reserve makes room in the queue for n rows.
	reserve(n int)
}

// newRowFormat is the wire format of s's dispatches (FP8: the fastest cast
// this CPU has, Quantize's, which is tested against the portable one).
func newRowFormat(s Spec) rowFormat {
	switch {
	case s.Wire == WireFP8Forward:
		return &fp8Forward{bytes: s.Hidden, scales: 4 * ScaleGroups(s.Hidden)}
	case s.Wire.FP8():
		return &fp8Rows{hidden: s.Hidden, elem: s.Elem, wire: s.Wire, bytes: s.WireRowBytes, scales: 4 * ScaleGroups(s.Hidden)}
	}
	return &nativeRows{bytes: s.RowBytes}
}

// nativeRows: rows travel in the element type, copied as they are.
type nativeRows struct {
	bytes  int
	dst    addrTable
	srcOff []int64
}

func (f *nativeRows) rowBytes() int  { return f.bytes }
func (f *nativeRows) sideBytes() int { return 0 }

func (f *nativeRows) put(base ptr, a rowArea, i int, tk int) {
	f.dst.add(unsafe.Add(base, a.rows.at(i)))
	f.srcOff = append(f.srcOff, int64(tk*f.bytes))
}

func (f *nativeRows) reserve(n int) {
	f.dst.reserve(n)
	f.srcOff = make([]int64, 0, n)
}

func (f *nativeRows) flush(x, _ []byte) {
	scatterRows(&f.dst, x, f.srcOff, f.bytes)
	f.dst.reset()
	f.srcOff = f.srcOff[:0]
}

// fp8Rows: rows travel as FP8 e4m3 codes with one float32 scale per 128
// elements beside them, cast on their way by the kernel that would have
// copied them (quantRows: a token cast once, then copied to its other
// destinations).
type fp8Rows struct {
	hidden, bytes, scales int
	elem                  DType
	wire                  WireFormat
	q                     castQueue
}

func (f *fp8Rows) rowBytes() int  { return f.bytes }
func (f *fp8Rows) sideBytes() int { return f.scales }

func (f *fp8Rows) put(base ptr, a rowArea, i int, tk int) {
	f.q.add(unsafe.Add(base, a.rows.at(i)), unsafe.Add(base, a.side.at(i)), int64(tk*f.hidden*f.elem.Size()))
}

func (f *fp8Rows) flush(x, _ []byte) { f.q.flush(x, f.hidden, f.elem, f.wire) }

// fp8Forward: the caller quantized the rows (DispatchFP8): their e4m3 codes
// and float32 scales travel as they are, copied, with no cast in ep.
type fp8Forward struct {
	bytes, scales  int
	dst, sdst      addrTable
	srcOff, sclOff []int64
}

func (f *fp8Forward) rowBytes() int  { return f.bytes }
func (f *fp8Forward) sideBytes() int { return f.scales }

func (f *fp8Forward) put(base ptr, a rowArea, i int, tk int) {
	f.dst.add(unsafe.Add(base, a.rows.at(i)))
	f.sdst.add(unsafe.Add(base, a.side.at(i)))
	f.srcOff = append(f.srcOff, int64(tk*f.bytes))
	f.sclOff = append(f.sclOff, int64(tk*f.scales))
}

func (f *fp8Forward) reserve(n int) {
	f.dst.reserve(n)
	f.sdst.reserve(n)
	f.srcOff = make([]int64, 0, n)
	f.sclOff = make([]int64, 0, n)
}

func (f *fp8Forward) flush(x, side []byte) {
	scatterRows(&f.dst, x, f.srcOff, f.bytes)
	scatterRows(&f.sdst, side, f.sclOff, f.scales)
	f.dst.reset()
	f.sdst.reset()
	f.srcOff, f.sclOff = f.srcOff[:0], f.sclOff[:0]
}

// fp8Sizes are the sizes of rows of hidden elements in FP8: e4m3 codes,
// and their float32 scales as side data (for laying out areas).
type fp8Sizes int

func (h fp8Sizes) rowBytes() int  { return int(h) }
func (h fp8Sizes) sideBytes() int { return 4 * ScaleGroups(int(h)) }

func (f *fp8Rows) reserve(n int) {
	f.q.dst.reserve(n)
	f.q.scales.reserve(n)
	f.q.srcOff = make([]int64, 0, n)
}

// scatterRows copies dst.len() rows of rowBytes from origin[srcOff[i]:] to
// dst's addresses.
func scatterRows(dst *addrTable, origin []byte, srcOff []int64, rowBytes int) {
	n := dst.len()
	if n <= smallBatch {
		for i := 0; i < n; i++ {
			copy(unsafe.Slice((*byte)(dst.p[i]), rowBytes), origin[srcOff[i]:srcOff[i]+int64(rowBytes)])
		}
		return
	}
	C.ep_scatter_rows(dst.c(), (*C.char)(unsafe.Pointer(unsafe.SliceData(origin))), i64p(srcOff), nil, C.int64_t(n), C.int64_t(rowBytes))
}
