package main

/*
#include <string.h>

// bench_memcpy is the reference the bandwidths are compared with: glibc's
// memcpy, the routine ep's C kernels copy rows with.
static void bench_memcpy(void *dst, const void *src, size_t n) { memcpy(dst, src, n); }
*/
import "C"

import "unsafe"

// memcpyBytes copies src into dst (same length) with glibc's memcpy. (Go's
// copy uses non-temporal stores for large blocks, which is a different and,
// on machines with a large cache, slower reference.)
func memcpyBytes(dst, src []byte) {
	if len(src) == 0 {
		return
	}
	C.bench_memcpy(unsafe.Pointer(&dst[0]), unsafe.Pointer(&src[0]), C.size_t(len(src)))
}
