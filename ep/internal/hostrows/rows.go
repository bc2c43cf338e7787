package hostrows

/*
#include <stdlib.h>
#include "kernels.h"
*/
import "C"

import (
	"fmt"
	"unsafe"

	"github.com/goep/goep/ep/driver"
	"github.com/goep/goep/internal/grow"
	"github.com/goep/goep/internal/rowsum"
)

// The wrappers below are every call into the C kernels of rows.c and
// sync.c: one cgo call per batch, never per row. Small batches of copies
// run in Go instead (a cgo call costs more than copying a few rows).

type ptr = unsafe.Pointer

// AddrTable is a table of addresses for a kernel. Go code fills it with
// pointers (of MPI window memory, or of Go memory pinned for the call);
// the kernel gets them as integers, which cgo need not check one by one on
// every call, as it would a table of pointers.
type AddrTable struct {
	p []ptr
	u []uintptr
}

func (a *AddrTable) Reset()           { a.p = a.p[:0] }
func (a *AddrTable) Add(p ptr)        { a.p = append(a.p, p) }
func (a *AddrTable) Len() int         { return len(a.p) }
func (a *AddrTable) Set(i int, p ptr) { a.p[i] = p }

// Reserve makes room for n addresses, so that filling the table up to n
// (and handing it to a kernel) allocates nothing.
func (a *AddrTable) Reserve(n int) {
	a.p, a.u = make([]ptr, 0, n), make([]uintptr, 0, n)
}

// grow makes the table n entries long, all nil.
func (a *AddrTable) Grow(n int) {
	a.p = grow.To(a.p, n)
	clear(a.p)
}

// CTable is an AddrTable's addresses as the kernels take them.
type CTable struct{ p *C.uintptr_t }

// Frozen is the table as the kernels take it, for several kernel calls
// while the table does not change.
func (a *AddrTable) Frozen() CTable { return CTable{a.c()} }

// c is the table as the kernels take it.
func (a *AddrTable) c() *C.uintptr_t {
	if len(a.p) == 0 {
		return nil
	}
	a.u = grow.To(a.u, len(a.p))
	for i, p := range a.p {
		a.u[i] = uintptr(p)
	}
	return (*C.uintptr_t)(unsafe.Pointer(&a.u[0]))
}

// streamBytes is how much a group's call writes per rank (its rows for
// MaxTokensPerRank tokens) from which its row copies and reductions use
// streaming stores: more than the caches hold, so caching the destination's
// lines would only evict what is read next.
const streamBytes = 8 << 20

// Streams says whether the row copies and reductions of s's group, whose
// destinations this core does not read back, write with streaming stores
// (ScatterBlocks, ReduceRowsFrom, RowFormat.Flush).
func Streams(s driver.Spec) bool { return s.MaxTokensPerRank*s.RowBytes >= streamBytes }

// smallBatch is the most blocks copied in Go rather than by a kernel call.
const smallBatch = 8

func i64p(s []int64) *C.int64_t {
	if len(s) == 0 {
		return nil
	}
	return (*C.int64_t)(unsafe.Pointer(&s[0]))
}

// CopyRows copies dst.Len() rows of rowBytes from src's to dst's addresses.
func CopyRows(dst, src *AddrTable, rowBytes int) {
	if dst.Len() == 0 {
		return
	}
	C.ep_copy_rows(dst.c(), src.c(), nil, C.int64_t(dst.Len()), C.int64_t(rowBytes), 0)
}

// MoveBlocks moves dst.Len() blocks of lens[i] bytes from src's to dst's
// addresses, in order, each as memmove does (they may overlap).
func MoveBlocks(dst, src *AddrTable, lens []int64) {
	n := dst.Len()
	if n <= smallBatch {
		for i := 0; i < n; i++ {
			copy(unsafe.Slice((*byte)(dst.p[i]), lens[i]), unsafe.Slice((*byte)(src.p[i]), lens[i]))
		}
		return
	}
	C.ep_move_blocks(dst.c(), src.c(), i64p(lens), C.int64_t(n))
}

// ScatterBlocks copies dst.Len() blocks of lens[i] bytes from
// origin[srcOff[i]:] to dst's addresses, with streaming stores where stream
// says so (Streams).
func ScatterBlocks(dst *AddrTable, origin []byte, srcOff, lens []int64, stream bool) {
	n := dst.Len()
	if n <= smallBatch {
		for i := 0; i < n; i++ {
			copy(unsafe.Slice((*byte)(dst.p[i]), lens[i]), origin[srcOff[i]:srcOff[i]+lens[i]])
		}
		return
	}
	C.ep_scatter_rows(dst.c(), (*C.char)(unsafe.Pointer(unsafe.SliceData(origin))), i64p(srcOff), i64p(lens), C.int64_t(n), 0, C.int(cBool(stream)))
}

// ReduceRows sets output row i (of n) to the sum over j in
// [start[i], start[i+1]) of w[j]*src[j] (w nil: weights 1), in float32.
func ReduceRows(out ptr, outType driver.DType, src *AddrTable, w []float32, start []int32, n, hidden int, inType driver.DType) {
	if n == 0 {
		return
	}
	C.ep_reduce_rows(out, C.int(outType), src.c(), f32p(w), i32p(start), C.int64_t(n), C.int64_t(hidden), C.int(inType), 0)
}

// ReduceRowsFrom is ReduceRows with the sources as the kernels take them
// (AddrTable.Frozen: a reduction in chunks converts its table once), with
// streaming stores where stream says so (Streams: the call is a part of a
// reduction larger than the caches).
func ReduceRowsFrom(out ptr, outType driver.DType, src CTable, start []int32, n, hidden int, inType driver.DType, stream bool) {
	if n == 0 {
		return
	}
	C.ep_reduce_rows(out, C.int(outType), src.p, nil, i32p(start), C.int64_t(n), C.int64_t(hidden), C.int(inType), C.int(cBool(stream)))
}

// ReduceFP8RowsFrom is ReduceRowsFrom over rows that travelled as e4m3
// codes, each with its float32 scales (codes[j], scales[j]), weights 1:
// ep_reduce_rows_fp8.
func ReduceFP8RowsFrom(out ptr, outType driver.DType, codes, scales CTable, start []int32, n, hidden int) {
	if n == 0 {
		return
	}
	C.ep_reduce_rows_fp8(out, C.int(outType), codes.p, scales.p, nil, i32p(start), C.int64_t(n), C.int64_t(hidden))
}

// ReduceTables are ReduceRows's tables (sources, weights and each row's
// first source) for up to pairs sources and rows rows, in C memory: a
// reduction that goes to the C kernel (above smallReduce) then passes one
// Go pointer (its output), not four, and cgo checks each Go pointer it is
// passed; smaller ones read the same tables from Go assembly. The sources
// are addresses of shared or window memory, never of Go memory. free
// releases them.
type ReduceTables struct {
	inC   bool // small reductions too call the C kernel (tuning.reduceInC)
	mem   ptr
	Src   []ptr
	Scl   []ptr // with FP8 sources (reduceFP8): each source's scales
	W     []float32
	Start []int32
}

func NewReduceTables(pairs, rows int, inC bool) (*ReduceTables, error) {
	n := 8*pairs + 8*pairs + 4*pairs + 4*(rows+1)
	mem := C.calloc(C.size_t(n), 1)
	if mem == nil {
		return nil, fmt.Errorf("allocating %d bytes for the combine's tables: out of memory", n)
	}
	return &ReduceTables{inC: inC, mem: mem, Src: unsafe.Slice((*ptr)(mem), pairs),
		Scl:   unsafe.Slice((*ptr)(unsafe.Add(mem, 8*pairs)), pairs),
		W:     unsafe.Slice((*float32)(unsafe.Add(mem, 16*pairs)), pairs),
		Start: unsafe.Slice((*int32)(unsafe.Add(mem, 20*pairs)), rows+1)}, nil
}

func (r *ReduceTables) Free() {
	if r != nil && r.mem != nil {
		C.free(r.mem)
		r.mem, r.Src, r.Scl, r.W, r.Start = nil, nil, nil, nil, nil
	}
}

// smallReduce is the most elements of output that ReduceTables.reduce sums
// in Go assembly (package rowsum) rather than with a cgo call to
// ep_reduce_rows: the same result, bit for bit, without the call's cost,
// which is most of a decode step's reduction. Larger outputs go to the C
// kernel, whose prefetches and streaming stores serve them better.
const smallReduce = 1 << 15

// Reduce is ReduceRows over the tables' first n rows.
func (r *ReduceTables) Reduce(out ptr, outType driver.DType, n, hidden int, inType driver.DType) {
	if n == 0 {
		return
	}
	if !r.inC && rowsum.Assembly && outType == inType && n*hidden <= smallReduce {
		switch outType {
		case driver.BFloat16:
			reduceEach(r, unsafe.Slice((*uint16)(out), n*hidden), n, hidden, rowsum.BF16)
			return
		case driver.Float32:
			reduceEach(r, unsafe.Slice((*float32)(out), n*hidden), n, hidden, rowsum.F32)
			return
		}
	}
	C.ep_reduce_rows(out, C.int(outType), (*C.uintptr_t)(unsafe.Pointer(unsafe.SliceData(r.Src))), (*C.float)(unsafe.Pointer(unsafe.SliceData(r.W))),
		(*C.int32_t)(unsafe.Pointer(unsafe.SliceData(r.Start))), C.int64_t(n), C.int64_t(hidden), C.int(inType), 0)
}

// reduceFP8 is reduce over FP8 sources (src: codes, scl: their scales):
// ep_reduce_rows_fp8.
func (r *ReduceTables) ReduceFP8(out ptr, outType driver.DType, n, hidden int) {
	if n == 0 {
		return
	}
	C.ep_reduce_rows_fp8(out, C.int(outType), (*C.uintptr_t)(unsafe.Pointer(unsafe.SliceData(r.Src))),
		(*C.uintptr_t)(unsafe.Pointer(unsafe.SliceData(r.Scl))), (*C.float)(unsafe.Pointer(unsafe.SliceData(r.W))),
		(*C.int32_t)(unsafe.Pointer(unsafe.SliceData(r.Start))), C.int64_t(n), C.int64_t(hidden))
}

// reduceEach sums each of the tables' first n rows into out with sum.
func reduceEach[T uint16 | float32](r *ReduceTables, out []T, n, hidden int, sum func([]T, []ptr, []float32)) {
	for i := range n {
		j0, j1 := r.Start[i], r.Start[i+1]
		sum(out[i*hidden:(i+1)*hidden], r.Src[j0:j1], r.W[j0:j1])
	}
}

// GatherValues sets out[i] = *src[i] (0 where src[i] is nil).
func GatherValues(out []float32, src *AddrTable) {
	for i, p := range src.p[:len(out)] {
		out[i] = 0
		if p != nil {
			out[i] = *(*float32)(p)
		}
	}
}

// SumValues sets out[i*k+j] = sum over s in [start[i], start[i+1]) of src[s][j].
func SumValues(out []float32, src *AddrTable, start []int32, n, k int) {
	if n == 0 {
		return
	}
	C.ep_sum_values(f32p(out), src.c(), i32p(start), C.int64_t(n), C.int(k))
}

// HTMeta writes the metadata a rank d keeps with n received HT rows: each
// row's source token (srcTok[rows[i]], or rows[i] itself when srcTok is nil),
// its top-k ids made local to d, or kept global (-1 where d does not own the
// expert) and its weights (zeroed there).
func HTMeta(tok, topk, w ptr, rows, srcTok, srcTopk []int32, srcW []float32, K, L, d int, global bool) {
	if len(rows) == 0 {
		return
	}
	C.ep_ht_meta((*C.int32_t)(tok), (*C.int32_t)(topk), (*C.float)(w), i32p(rows), C.int64_t(len(rows)),
		i32p(srcTok), i32p(srcTopk), f32p(srcW), C.int(K), C.int(L), C.int(d), C.int(cBool(global)))
}

// CountLocal counts, per local expert l, the rows whose top-k ids ([n][K],
// -1 = elsewhere) name it as lo+l.
func CountLocal(topk ptr, n, K int, lo int32, counts []int32) {
	C.ep_count_local((*C.int32_t)(topk), C.int64_t(n), C.int(K), C.int(len(counts)), C.int32_t(lo), i32p(counts))
}

// OnlineCPUs is the machine's online processors, whatever the affinity.
func OnlineCPUs() int { return int(C.ep_online_cpus()) }

// cBool is b as a C int.
func cBool(b bool) int {
	if b {
		return 1
	}
	return 0
}
