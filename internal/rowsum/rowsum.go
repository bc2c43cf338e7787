package rowsum

import (
	"fmt"
	"math"
	"unsafe"
)

// BF16 sets dst[e] = bf16(w[0]*x0[e] + w[1]*x1[e] + ...) for e < len(dst),
// where xj is the bfloat16 row of len(dst) elements at src[j] and w nil
// means weights of 1 (see the package doc for the rounding). len(w) must
// be len(src) when w is not nil.
func BF16(dst []uint16, src []unsafe.Pointer, w []float32) { rowSum(dst, src, w, sumBF16) }

// F32 sets dst[e] = w[0]*x0[e] + w[1]*x1[e] + ... for e < len(dst), where
// xj is the float32 row of len(dst) elements at src[j], as BF16 does but
// with no final rounding.
func F32(dst []float32, src []unsafe.Pointer, w []float32) { rowSum(dst, src, w, sumF32) }

// rowSum is BF16 and F32 for rows of T; sum computes a sum of one source
// or more.
func rowSum[T uint16 | float32](dst []T, src []unsafe.Pointer, w []float32, sum func([]T, []unsafe.Pointer, []float32)) {
	if w != nil && len(w) != len(src) {
		panic(fmt.Sprintf("rowsum: %d weights for %d sources", len(w), len(src)))
	}
	switch {
	case len(dst) == 0:
	case len(src) == 0:
		clear(dst)
	case len(src) == 1 && (w == nil || w[0] == 1):
		copy(dst, unsafe.Slice((*T)(src[0]), len(dst)))
	default:
		sum(dst, src, w)
	}
}

// sumF32Go is the reference loop that sumF32 runs in assembly where it
// can, over the elements of dst from first on: len(src) >= 1.
func sumF32Go(dst []float32, src []unsafe.Pointer, w []float32, first int) {
	x := func(j, e int) float32 { return *(*float32)(unsafe.Add(src[j], 4*e)) }
	for e := first; e < len(dst); e++ {
		a := float32(weightOf(w, 0) * x(0, e))
		for j := 1; j < len(src); j++ {
			a += float32(weightOf(w, j) * x(j, e)) // the conversion keeps the product from being fused into the sum
		}
		dst[e] = a
	}
}

func weightOf(w []float32, j int) float32 {
	if w == nil {
		return 1
	}
	return w[j]
}

// sumBF16Go is the reference loop that sumBF16 runs in assembly where it
// can, over the elements of dst from first on: len(src) >= 1.
func sumBF16Go(dst []uint16, src []unsafe.Pointer, w []float32, first int) {
	x := func(j, e int) float32 { return fromBF16(*(*uint16)(unsafe.Add(src[j], 2*e))) }
	for e := first; e < len(dst); e++ {
		a := float32(weightOf(w, 0) * x(0, e))
		for j := 1; j < len(src); j++ {
			a += float32(weightOf(w, j) * x(j, e)) // the conversion keeps the product from being fused into the sum
		}
		dst[e] = toBF16(a)
	}
}

func fromBF16(b uint16) float32 { return math.Float32frombits(uint32(b) << 16) }

// toBF16 rounds f to the nearest bfloat16, ties to even; NaN stays NaN,
// quietened (ep_bf16_bits).
func toBF16(f float32) uint16 {
	u := math.Float32bits(f)
	if u&0x7fffffff > 0x7f800000 {
		return uint16(u>>16 | 0x40)
	}
	return uint16((u + 0x7fff + (u>>16)&1) >> 16)
}
