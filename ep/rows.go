package ep

/*
#include "kernels.h"
*/
import "C"

import (
	"time"
	"unsafe"
)

// The wrappers below hand whole tables of rows to the C kernels of rows.c and
// sync.c: one cgo call per batch, never per row. Tables hold pointers into
// MPI window memory (not Go memory) or into caller slices pinned for the call.

func ptrs(s []unsafe.Pointer) *unsafe.Pointer {
	if len(s) == 0 {
		return nil
	}
	return &s[0]
}

// copyRows copies len(dst) rows of rowBytes from src[i] to dst[i].
func copyRows(dst, src []unsafe.Pointer, rowBytes int) {
	if len(dst) == 0 {
		return
	}
	C.ep_copy_rows(ptrs(dst), ptrs(src), nil, C.int64_t(len(dst)), C.int64_t(rowBytes))
}

// copyBlocks copies len(dst) blocks of lens[i] bytes from src[i] to dst[i].
func copyBlocks(dst, src []unsafe.Pointer, lens []int64) {
	if len(dst) == 0 {
		return
	}
	C.ep_copy_rows(ptrs(dst), ptrs(src), (*C.int64_t)(unsafe.Pointer(&lens[0])), C.int64_t(len(dst)), 0)
}

// reduceRows sets output row i (of n) to the sum over j in
// [start[i], start[i+1]) of w[j]*src[j] (w nil: weights 1), in float32.
func reduceRows(out unsafe.Pointer, outDtype int, src []unsafe.Pointer, w []float32, start []int32, n, hidden, dtype int, acc []float32) {
	if n == 0 {
		return
	}
	C.ep_reduce_rows(out, C.int(outDtype), ptrs(src), f32p(w), i32p(start), C.int64_t(n), C.int64_t(hidden), C.int(dtype), f32p(acc))
}

// gatherValues sets out[i] = *src[i] (0 where src[i] is nil).
func gatherValues(out []float32, src []unsafe.Pointer) {
	if len(out) == 0 {
		return
	}
	C.ep_gather_values(f32p(out), (**C.float)(unsafe.Pointer(ptrs(src))), C.int64_t(len(out)))
}

// sumValues sets out[i*K+k] = sum over j in [start[i], start[i+1]) of src[j][k].
func sumValues(out []float32, src []unsafe.Pointer, start []int32, n, k int) {
	if n == 0 {
		return
	}
	C.ep_sum_values(f32p(out), (**C.float)(unsafe.Pointer(ptrs(src))), i32p(start), C.int64_t(n), C.int(k))
}

// signal stores v with release order into every flag.
func signal(flags []unsafe.Pointer, v uint64) {
	if len(flags) == 0 {
		return
	}
	C.ep_signal((**C.uint64_t)(unsafe.Pointer(ptrs(flags))), C.int(len(flags)), C.uint64_t(v))
}

// loadFlag reads a flag with acquire order.
func loadFlag(p unsafe.Pointer) uint64 { return uint64(C.ep_load((*C.uint64_t)(p))) }

// waitAll waits until every flag holds at least target; on timeout it returns
// the index of the first flag short of it, else -1.
func waitAll(flags []unsafe.Pointer, target uint64, timeout time.Duration) int {
	if len(flags) == 0 {
		return -1
	}
	var missing C.int
	if C.ep_wait_all((**C.uint64_t)(unsafe.Pointer(ptrs(flags))), C.int(len(flags)), C.uint64_t(target),
		C.int64_t(timeout.Nanoseconds()), &missing) != 0 {
		return int(missing)
	}
	return -1
}
