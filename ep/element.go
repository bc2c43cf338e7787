package ep

import (
	"fmt"
	"math"
	"unsafe"

	"github.com/goep/goep/ep/internal/hostrows"
)

// BF16 is a bfloat16 number: the top 16 bits of a float32.
type BF16 uint16

// Element is the element types a Group moves.
type Element interface{ float32 | BF16 }

// BF16From rounds f to the nearest bfloat16, ties to even.
func BF16From(f float32) BF16 {
	u := math.Float32bits(f)
	if u&0x7fffffff > 0x7f800000 {
		return BF16(u>>16 | 0x40)
	}
	u += 0x7fff + (u>>16)&1
	return BF16(u >> 16)
}

// Float32 widens b exactly.
func (b BF16) Float32() float32 { return math.Float32frombits(uint32(b) << 16) }

// ToBF16 rounds src into dst (same length), in one C call.
func ToBF16(dst []BF16, src []float32) error {
	if len(dst) != len(src) {
		return fmt.Errorf("ep: ToBF16: len(dst) = %d != len(src) = %d", len(dst), len(src))
	}
	if len(src) > 0 {
		hostrows.F32ToBF16(unsafe.Pointer(&dst[0]), unsafe.Pointer(&src[0]), len(src))
	}
	return nil
}

// FromBF16 widens src into dst (same length), in one C call.
func FromBF16(dst []float32, src []BF16) error {
	if len(dst) != len(src) {
		return fmt.Errorf("ep: FromBF16: len(dst) = %d != len(src) = %d", len(dst), len(src))
	}
	if len(src) > 0 {
		hostrows.BF16ToF32(unsafe.Pointer(&dst[0]), unsafe.Pointer(&src[0]), len(src))
	}
	return nil
}

// DTypeOf is the DType of E.
func DTypeOf[E Element]() DType {
	var z E
	if _, ok := any(z).(float32); ok {
		return Float32
	}
	return BFloat16
}

// ElementOf rounds f to E (exact for float32, nearest-even for BF16).
func ElementOf[E Element](f float32) E {
	var z E
	if _, ok := any(z).(float32); ok {
		return any(f).(E)
	}
	return any(BF16From(f)).(E)
}

// Float32Of widens v to float32, exactly.
func Float32Of[E Element](v E) float32 {
	if f, ok := any(v).(float32); ok {
		return f
	}
	return any(v).(BF16).Float32()
}
