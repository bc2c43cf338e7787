package hostrows

/*
#include "kernels.h"
*/
import "C"

import (
	"unsafe"

	"github.com/goep/goep/ep/driver"
)

// RowFormat is how a dispatched row travels: its bytes (and side data, the
// FP8 scales, apart from them), and how the caller's token becomes a row in
// a destination, which is a slot in a node peer's receive buffer or a row of
// this rank's outbox for another node: the modes say where each row goes,
// the format writes it, the transport moves the rows and their side data
// together (RowArea). The element type on the wire (nativeRows), FP8 e4m3
// with per-128 scales cast on the way (fp8Rows) and FP8 rows the caller
// quantized, forwarded with its scales as they are (forwardRows), are its
// implementations; a new format is one more.
type RowFormat interface {
	// rowBytes is the bytes of one row, sideBytes of its side data (0:
	// none).
	RowBytes() int
	SideBytes() int
	// put queues the writing of row i of area a, in the memory at base:
	// the caller's token tk.
	Put(base ptr, a RowArea, i int, tk int)
	// Flush writes the queued rows from the caller's tokens x and their
	// side data (the caller's scales, for a forwarded format; nil
	// otherwise), in one kernel call each, and empties the queue.
	Flush(x, side []byte)
	// Reserve makes room in the queue for n rows.
	Reserve(n int)
}

// NewRowFormat is the wire format of s's dispatches (FP8: the fastest cast
// this CPU has, Quantize's, which is tested against the portable one).
func NewRowFormat(s driver.Spec) RowFormat {
	switch {
	case s.Wire.Forward():
		return &forwardRows{bytes: s.WireRowBytes, scales: s.WireSideBytes, stream: Streams(s)}
	case s.Wire.FP8():
		return &fp8Rows{hidden: s.Hidden, elem: s.Elem, wire: s.Wire, bytes: s.WireRowBytes, scales: 4 * driver.ScaleGroups(s.Hidden)}
	}
	return &nativeRows{bytes: s.RowBytes, stream: Streams(s)}
}

// nativeRows: rows travel in the element type, copied as they are.
type nativeRows struct {
	bytes  int
	stream bool // Streams
	dst    AddrTable
	srcOff []int64
}

func (f *nativeRows) RowBytes() int  { return f.bytes }
func (f *nativeRows) SideBytes() int { return 0 }

func (f *nativeRows) Put(base ptr, a RowArea, i int, tk int) {
	f.dst.Add(unsafe.Add(base, a.Rows.At(i)))
	f.srcOff = append(f.srcOff, int64(tk*f.bytes))
}

func (f *nativeRows) Reserve(n int) {
	f.dst.Reserve(n)
	f.srcOff = make([]int64, 0, n)
}

func (f *nativeRows) Flush(x, _ []byte) {
	ScatterRows(&f.dst, x, f.srcOff, f.bytes, f.stream)
	f.dst.Reset()
	f.srcOff = f.srcOff[:0]
}

// fp8Rows: rows travel as FP8 e4m3 codes with one float32 scale per 128
// elements beside them, cast on their way by the kernel that would have
// copied them (QuantRows: a token cast once, then copied to its other
// destinations).
type fp8Rows struct {
	hidden, bytes, scales int
	elem                  driver.DType
	wire                  driver.WireFormat
	q                     CastQueue
}

func (f *fp8Rows) RowBytes() int  { return f.bytes }
func (f *fp8Rows) SideBytes() int { return f.scales }

func (f *fp8Rows) Put(base ptr, a RowArea, i int, tk int) {
	f.q.Add(unsafe.Add(base, a.Rows.At(i)), unsafe.Add(base, a.Side.At(i)), int64(tk*f.hidden*f.elem.Size()))
}

func (f *fp8Rows) Flush(x, _ []byte) { f.q.Flush(x, f.hidden, f.elem, f.wire) }

// forwardRows: the caller quantized the rows (a Forward format): their
// codes and side data travel as they are, copied, with no cast in ep,
// whatever the format.
type forwardRows struct {
	bytes, scales  int
	stream         bool // Streams
	dst, sdst      AddrTable
	srcOff, sclOff []int64
}

func (f *forwardRows) RowBytes() int  { return f.bytes }
func (f *forwardRows) SideBytes() int { return f.scales }

func (f *forwardRows) Put(base ptr, a RowArea, i int, tk int) {
	f.dst.Add(unsafe.Add(base, a.Rows.At(i)))
	f.sdst.Add(unsafe.Add(base, a.Side.At(i)))
	f.srcOff = append(f.srcOff, int64(tk*f.bytes))
	f.sclOff = append(f.sclOff, int64(tk*f.scales))
}

func (f *forwardRows) Reserve(n int) {
	f.dst.Reserve(n)
	f.sdst.Reserve(n)
	f.srcOff = make([]int64, 0, n)
	f.sclOff = make([]int64, 0, n)
}

func (f *forwardRows) Flush(x, side []byte) {
	ScatterRows(&f.dst, x, f.srcOff, f.bytes, f.stream)
	ScatterRows(&f.sdst, side, f.sclOff, f.scales, f.stream)
	f.dst.Reset()
	f.sdst.Reset()
	f.srcOff, f.sclOff = f.srcOff[:0], f.sclOff[:0]
}

// FP8Sizes are the sizes of rows of hidden elements in FP8: e4m3 codes,
// and their float32 scales as side data (for laying out areas).
type FP8Sizes int

func (h FP8Sizes) RowBytes() int  { return int(h) }
func (h FP8Sizes) SideBytes() int { return 4 * driver.ScaleGroups(int(h)) }

func (f *fp8Rows) Reserve(n int) {
	f.q.Dst.Reserve(n)
	f.q.Scales.Reserve(n)
	f.q.SrcOff = make([]int64, 0, n)
}

// ScatterRows copies dst.Len() rows of rowBytes from origin[srcOff[i]:] to
// dst's addresses, with streaming stores where stream says so (Streams).
func ScatterRows(dst *AddrTable, origin []byte, srcOff []int64, rowBytes int, stream bool) {
	n := dst.Len()
	if n <= smallBatch {
		for i := 0; i < n; i++ {
			copy(unsafe.Slice((*byte)(dst.p[i]), rowBytes), origin[srcOff[i]:srcOff[i]+int64(rowBytes)])
		}
		return
	}
	C.ep_scatter_rows(dst.c(), (*C.char)(unsafe.Pointer(unsafe.SliceData(origin))), i64p(srcOff), nil, C.int64_t(n), C.int64_t(rowBytes), C.int(cBool(stream)))
}
