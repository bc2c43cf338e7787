package ep

/*
#include <stdlib.h>
#include "kernels.h"
*/
import "C"

import (
	"fmt"
	"unsafe"

	"github.com/goep/goep/internal/rowsum"
)

// The wrappers below are every call into the C kernels of rows.c and
// sync.c: one cgo call per batch, never per row. Small batches of copies
// run in Go instead (a cgo call costs more than copying a few rows).

type ptr = unsafe.Pointer

// addrTable is a table of addresses for a kernel. Go code fills it with
// pointers (of MPI window memory, or of Go memory pinned for the call);
// the kernel gets them as integers, which cgo need not check one by one on
// every call, as it would a table of pointers.
type addrTable struct {
	p []ptr
	u []uintptr
}

func (a *addrTable) reset()           { a.p = a.p[:0] }
func (a *addrTable) add(p ptr)        { a.p = append(a.p, p) }
func (a *addrTable) len() int         { return len(a.p) }
func (a *addrTable) set(i int, p ptr) { a.p[i] = p }

// reserve makes room for n addresses, so that filling the table up to n
// (and handing it to a kernel) allocates nothing.
func (a *addrTable) reserve(n int) {
	a.p, a.u = make([]ptr, 0, n), make([]uintptr, 0, n)
}

// grow makes the table n entries long, all nil.
func (a *addrTable) grow(n int) {
	a.p = growTo(a.p, n)
	clear(a.p)
}

// c is the table as the kernels take it.
func (a *addrTable) c() *C.uintptr_t {
	if len(a.p) == 0 {
		return nil
	}
	a.u = growTo(a.u, len(a.p))
	for i, p := range a.p {
		a.u[i] = uintptr(p)
	}
	return (*C.uintptr_t)(unsafe.Pointer(&a.u[0]))
}

// smallBatch is the most blocks copied in Go rather than by a kernel call.
const smallBatch = 8

func i64p(s []int64) *C.int64_t {
	if len(s) == 0 {
		return nil
	}
	return (*C.int64_t)(unsafe.Pointer(&s[0]))
}

// copyRows copies dst.len() rows of rowBytes from src's to dst's addresses.
func copyRows(dst, src *addrTable, rowBytes int) {
	if dst.len() == 0 {
		return
	}
	C.ep_copy_rows(dst.c(), src.c(), nil, C.int64_t(dst.len()), C.int64_t(rowBytes))
}

// moveBlocks moves dst.len() blocks of lens[i] bytes from src's to dst's
// addresses, in order, each as memmove does (they may overlap).
func moveBlocks(dst, src *addrTable, lens []int64) {
	n := dst.len()
	if n <= smallBatch {
		for i := 0; i < n; i++ {
			copy(unsafe.Slice((*byte)(dst.p[i]), lens[i]), unsafe.Slice((*byte)(src.p[i]), lens[i]))
		}
		return
	}
	C.ep_move_blocks(dst.c(), src.c(), i64p(lens), C.int64_t(n))
}

// scatterBlocks copies dst.len() blocks of lens[i] bytes from
// origin[srcOff[i]:] to dst's addresses.
func scatterBlocks(dst *addrTable, origin []byte, srcOff, lens []int64) {
	n := dst.len()
	if n <= smallBatch {
		for i := 0; i < n; i++ {
			copy(unsafe.Slice((*byte)(dst.p[i]), lens[i]), origin[srcOff[i]:srcOff[i]+lens[i]])
		}
		return
	}
	C.ep_scatter_rows(dst.c(), (*C.char)(unsafe.Pointer(unsafe.SliceData(origin))), i64p(srcOff), i64p(lens), C.int64_t(n), 0)
}

// reduceRows sets output row i (of n) to the sum over j in
// [start[i], start[i+1]) of w[j]*src[j] (w nil: weights 1), in float32.
func reduceRows(out ptr, outType DType, src *addrTable, w []float32, start []int32, n, hidden int, inType DType) {
	if n == 0 {
		return
	}
	C.ep_reduce_rows(out, C.int(outType), src.c(), f32p(w), i32p(start), C.int64_t(n), C.int64_t(hidden), C.int(inType), nil)
}

// reduceRowsFrom is reduceRows with the sources as the kernels take them
// (addrTable.c): a reduction in chunks converts its table once.
func reduceRowsFrom(out ptr, outType DType, src *C.uintptr_t, start []int32, n, hidden int, inType DType) {
	if n == 0 {
		return
	}
	C.ep_reduce_rows(out, C.int(outType), src, nil, i32p(start), C.int64_t(n), C.int64_t(hidden), C.int(inType), nil)
}

// reduceTables are reduceRows's tables (sources, weights and each row's
// first source) for up to pairs sources and rows rows, in C memory: a
// reduction that goes to the C kernel (above smallReduce) then passes one
// Go pointer (its output), not four, and cgo checks each Go pointer it is
// passed; smaller ones read the same tables from Go assembly. The sources
// are addresses of shared or window memory, never of Go memory. free
// releases them.
type reduceTables struct {
	inC   bool // small reductions too call the C kernel (tuning.reduceInC)
	mem   ptr
	src   []ptr
	scl   []ptr // with FP8 sources (reduceFP8): each source's scales
	w     []float32
	start []int32
}

func newReduceTables(pairs, rows int, inC bool) (*reduceTables, error) {
	n := 8*pairs + 8*pairs + 4*pairs + 4*(rows+1)
	mem := C.calloc(C.size_t(n), 1)
	if mem == nil {
		return nil, fmt.Errorf("allocating %d bytes for the combine's tables: out of memory", n)
	}
	return &reduceTables{inC: inC, mem: mem, src: unsafe.Slice((*ptr)(mem), pairs),
		scl:   unsafe.Slice((*ptr)(unsafe.Add(mem, 8*pairs)), pairs),
		w:     unsafe.Slice((*float32)(unsafe.Add(mem, 16*pairs)), pairs),
		start: unsafe.Slice((*int32)(unsafe.Add(mem, 20*pairs)), rows+1)}, nil
}

func (r *reduceTables) free() {
	if r != nil && r.mem != nil {
		C.free(r.mem)
		r.mem, r.src, r.scl, r.w, r.start = nil, nil, nil, nil, nil
	}
}

// smallReduce is the most elements of output that reduceTables.reduce sums
// in Go assembly (package rowsum) rather than with a cgo call to
// ep_reduce_rows: the same result, bit for bit, without the call's cost,
// which is most of a decode step's reduction. Larger outputs go to the C
// kernel, whose prefetches and streaming stores serve them better.
const smallReduce = 1 << 15

// reduce is reduceRows over the tables' first n rows.
func (r *reduceTables) reduce(out ptr, outType DType, n, hidden int, inType DType) {
	if n == 0 {
		return
	}
	if !r.inC && rowsum.Assembly && outType == inType && n*hidden <= smallReduce {
		switch outType {
		case BFloat16:
			reduceEach(r, unsafe.Slice((*uint16)(out), n*hidden), n, hidden, rowsum.BF16)
			return
		case Float32:
			reduceEach(r, unsafe.Slice((*float32)(out), n*hidden), n, hidden, rowsum.F32)
			return
		}
	}
	C.ep_reduce_rows(out, C.int(outType), (*C.uintptr_t)(unsafe.Pointer(unsafe.SliceData(r.src))), (*C.float)(unsafe.Pointer(unsafe.SliceData(r.w))),
		(*C.int32_t)(unsafe.Pointer(unsafe.SliceData(r.start))), C.int64_t(n), C.int64_t(hidden), C.int(inType), nil)
}

// reduceFP8 is reduce over FP8 sources (src: codes, scl: their scales):
// ep_reduce_rows_fp8.
func (r *reduceTables) reduceFP8(out ptr, outType DType, n, hidden int) {
	if n == 0 {
		return
	}
	C.ep_reduce_rows_fp8(out, C.int(outType), (*C.uintptr_t)(unsafe.Pointer(unsafe.SliceData(r.src))),
		(*C.uintptr_t)(unsafe.Pointer(unsafe.SliceData(r.scl))), (*C.float)(unsafe.Pointer(unsafe.SliceData(r.w))),
		(*C.int32_t)(unsafe.Pointer(unsafe.SliceData(r.start))), C.int64_t(n), C.int64_t(hidden))
}

// reduceEach sums each of the tables' first n rows into out with sum.
func reduceEach[T uint16 | float32](r *reduceTables, out []T, n, hidden int, sum func([]T, []ptr, []float32)) {
	for i := range n {
		j0, j1 := r.start[i], r.start[i+1]
		sum(out[i*hidden:(i+1)*hidden], r.src[j0:j1], r.w[j0:j1])
	}
}

// gatherValues sets out[i] = *src[i] (0 where src[i] is nil).
func gatherValues(out []float32, src *addrTable) {
	for i, p := range src.p[:len(out)] {
		out[i] = 0
		if p != nil {
			out[i] = *(*float32)(p)
		}
	}
}

// sumValues sets out[i*k+j] = sum over s in [start[i], start[i+1]) of src[s][j].
func sumValues(out []float32, src *addrTable, start []int32, n, k int) {
	if n == 0 {
		return
	}
	C.ep_sum_values(f32p(out), src.c(), i32p(start), C.int64_t(n), C.int(k))
}

// htMeta writes the metadata a rank d keeps with n received HT rows: each
// row's source token (srcTok[rows[i]], or rows[i] itself when srcTok is nil),
// its top-k ids made local to d, or kept global (-1 where d does not own the
// expert) and its weights (zeroed there).
func htMeta(tok, topk, w ptr, rows, srcTok, srcTopk []int32, srcW []float32, K, L, d int, global bool) {
	if len(rows) == 0 {
		return
	}
	C.ep_ht_meta((*C.int32_t)(tok), (*C.int32_t)(topk), (*C.float)(w), i32p(rows), C.int64_t(len(rows)),
		i32p(srcTok), i32p(srcTopk), f32p(srcW), C.int(K), C.int(L), C.int(d), C.int(cBool(global)))
}

// countLocal counts, per local expert l, the rows whose top-k ids ([n][K],
// -1 = elsewhere) name it as lo+l.
func countLocal(topk ptr, n, K int, lo int32, counts []int32) {
	C.ep_count_local((*C.int32_t)(topk), C.int64_t(n), C.int(K), C.int(len(counts)), C.int32_t(lo), i32p(counts))
}

// onlineCPUs is the machine's online processors, whatever the affinity.
func onlineCPUs() int { return int(C.ep_online_cpus()) }

// cBool is b as a C int.
func cBool(b bool) int {
	if b {
		return 1
	}
	return 0
}
