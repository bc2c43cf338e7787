//go:build amd64 && !purego

package rowsum

import (
	"unsafe"

	"golang.org/x/sys/cpu"
)

// Assembly is whether BF16 runs in assembly on this machine.
var Assembly = cpu.X86.HasAVX2

// sumBF16 is sumBF16Go over the first len(dst) &^ 15 elements in
// assembly (with AVX2), and in Go over the rest.
func sumBF16(dst []uint16, src []unsafe.Pointer, w []float32) {
	n := len(dst) &^ 15
	if !Assembly || n == 0 {
		sumBF16Go(dst, src, w, 0)
		return
	}
	var wp *float32
	if w != nil {
		wp = &w[0]
	}
	sumBF16AVX2(&dst[0], n, &src[0], wp, len(src))
	sumBF16Go(dst, src, w, n)
}

// sumF32 is sumF32Go over the first len(dst) &^ 7 elements in assembly
// (with AVX2), and in Go over the rest.
func sumF32(dst []float32, src []unsafe.Pointer, w []float32) {
	n := len(dst) &^ 7
	if !Assembly || n == 0 {
		sumF32Go(dst, src, w, 0)
		return
	}
	var wp *float32
	if w != nil {
		wp = &w[0]
	}
	sumF32AVX2(&dst[0], n, &src[0], wp, len(src))
	sumF32Go(dst, src, w, n)
}

// sumBF16AVX2 is sumBF16Go over n elements (a multiple of 16, > 0) of
// k >= 1 sources; w nil means weights of 1.
//
//go:noescape
func sumBF16AVX2(dst *uint16, n int, src *unsafe.Pointer, w *float32, k int)

// sumF32AVX2 is sumF32Go over n elements (a multiple of 8, > 0) of k >= 1
// sources; w nil means weights of 1.
//
//go:noescape
func sumF32AVX2(dst *float32, n int, src *unsafe.Pointer, w *float32, k int)
