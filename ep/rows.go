package ep

/*
#include "kernels.h"
*/
import "C"

import (
	"time"
	"unsafe"
)

// The wrappers below are every call into the C kernels of rows.c, layout.c
// and sync.c: one cgo call per batch, never per row. Pointer tables hold
// addresses of MPI window memory only; a caller's (Go) tensor is passed as a
// base with a table of offsets, so no table ever holds a Go pointer.

type ptr = unsafe.Pointer

func ptrs(s []ptr) *ptr {
	if len(s) == 0 {
		return nil
	}
	return &s[0]
}

func i64p(s []int64) *C.int64_t {
	if len(s) == 0 {
		return nil
	}
	return (*C.int64_t)(unsafe.Pointer(&s[0]))
}

// copyRows copies len(dst) rows of rowBytes from src[i] to dst[i].
func copyRows(dst, src []ptr, rowBytes int) {
	if len(dst) == 0 {
		return
	}
	C.ep_copy_rows(ptrs(dst), ptrs(src), nil, C.int64_t(len(dst)), C.int64_t(rowBytes))
}

// copyBlocks copies len(dst) blocks of lens[i] bytes from src[i] to dst[i].
func copyBlocks(dst, src []ptr, lens []int64) {
	if len(dst) == 0 {
		return
	}
	C.ep_copy_rows(ptrs(dst), ptrs(src), i64p(lens), C.int64_t(len(dst)), 0)
}

// scatterBlocks copies len(dst) blocks of lens[i] bytes from base+srcOff[i]
// to dst[i].
func scatterBlocks(dst []ptr, base ptr, srcOff, lens []int64) {
	if len(dst) == 0 {
		return
	}
	C.ep_scatter_rows(ptrs(dst), (*C.char)(base), i64p(srcOff), i64p(lens), C.int64_t(len(dst)), 0)
}

// reduceRows sets output row i (of n) to the sum over j in
// [start[i], start[i+1]) of w[j]*src[j] (w nil: weights 1), in float32.
func reduceRows(out ptr, outType DType, src []ptr, w []float32, start []int32, n, hidden int, inType DType) {
	if n == 0 {
		return
	}
	C.ep_reduce_rows(out, C.int(outType), ptrs(src), f32p(w), i32p(start), C.int64_t(n), C.int64_t(hidden), C.int(inType), nil)
}

// gatherValues sets out[i] = *src[i] (0 where src[i] is nil).
func gatherValues(out []float32, src []ptr) {
	if len(out) == 0 {
		return
	}
	C.ep_gather_values(f32p(out), (**C.float)(unsafe.Pointer(ptrs(src))), C.int64_t(len(out)))
}

// sumValues sets out[i*k+j] = sum over s in [start[i], start[i+1]) of src[s][j].
func sumValues(out []float32, src []ptr, start []int32, n, k int) {
	if n == 0 {
		return
	}
	C.ep_sum_values(f32p(out), (**C.float)(unsafe.Pointer(ptrs(src))), i32p(start), C.int64_t(n), C.int(k))
}

// htMeta writes the metadata a rank d keeps with n received HT rows: each
// row's source token (srcTok[rows[i]], or rows[i] itself when srcTok is nil),
// its top-k ids made local to d (-1 where d does not own the expert) and its
// weights (zeroed there).
func htMeta(tok, topk, w ptr, rows, srcTok, srcTopk []int32, srcW []float32, K, L, d int) {
	if len(rows) == 0 {
		return
	}
	C.ep_ht_meta((*C.int32_t)(tok), (*C.int32_t)(topk), (*C.float)(w), i32p(rows), C.int64_t(len(rows)),
		i32p(srcTok), i32p(srcTopk), f32p(srcW), C.int(K), C.int(L), C.int(d))
}

// countLocal counts, per local expert, the rows whose local top-k ids
// ([n][K], -1 = elsewhere) name it.
func countLocal(topk ptr, n, K int, counts []int32) {
	C.ep_count_local((*C.int32_t)(topk), C.int64_t(n), C.int(K), C.int(len(counts)), i32p(counts))
}

// signal stores v with release order into every flag.
func signal(flags []ptr, v uint64) {
	if len(flags) == 0 {
		return
	}
	C.ep_signal((**C.uint64_t)(unsafe.Pointer(ptrs(flags))), C.int(len(flags)), C.uint64_t(v))
}

// loadFlag reads a flag with acquire order.
func loadFlag(p ptr) uint64 { return uint64(C.ep_load((*C.uint64_t)(p))) }

// waitAll waits until every flag holds at least target, for at most
// timeout; it returns the index of the first flag still short of it, or -1.
func waitAll(flags []ptr, target uint64, timeout time.Duration) int {
	if len(flags) == 0 {
		return -1
	}
	return int(C.ep_wait_all((**C.uint64_t)(unsafe.Pointer(ptrs(flags))), C.int(len(flags)), C.uint64_t(target),
		C.int64_t(timeout.Nanoseconds())))
}
