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
func quantRows(dst, scales *addrTable, origin []byte, srcOff []int64, hidden int, elem DType, w WireFormat) {
	n := dst.len()
	if n == 0 {
		return
	}
	C.ep_quant_rows(dst.c(), scales.c(), (*C.char)(unsafe.Pointer(unsafe.SliceData(origin))), i64p(srcOff),
		C.int64_t(n), C.int64_t(hidden), C.int(elem), w.scaleMode())
}
