//go:build amd64 && !purego

package rowsum

import (
	"unsafe"

	"golang.org/x/sys/cpu"
)

// Assembly is whether BF16 and F32 run in assembly on this machine.
var Assembly = cpu.X86.HasAVX2

func sumBF16(dst []uint16, src []unsafe.Pointer, w []float32) {
	viaAssembly(dst, src, w, 16, sumBF16AVX2, sumBF16Go)
}

func sumF32(dst []float32, src []unsafe.Pointer, w []float32) {
	viaAssembly(dst, src, w, 8, sumF32AVX2, sumF32Go)
}

// viaAssembly runs the kernel asm (with AVX2) over the first elements of
// dst, in blocks of block, and the reference loop ref over the rest (all
// of dst without AVX2).
func viaAssembly[T uint16 | float32](dst []T, src []unsafe.Pointer, w []float32, block int,
	asm func(dst *T, n int, src *unsafe.Pointer, w *float32, k int), ref func([]T, []unsafe.Pointer, []float32, int)) {
	n := len(dst) / block * block
	if !Assembly || n == 0 {
		ref(dst, src, w, 0)
		return
	}
	var wp *float32
	if w != nil {
		wp = &w[0]
	}
	asm(&dst[0], n, &src[0], wp, len(src))
	ref(dst, src, w, n)
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
