package ep

import (
	"fmt"
	"math"
	"runtime"
	"unsafe"

	"github.com/goep/goep/ep/driver"
	"github.com/goep/goep/ep/internal/hostrows"
)

// E4M3 is an 8-bit floating-point number in the FP8 e4m3 format (OCP's
// E4M3FN): a sign, 4 exponent bits of bias 7 and 3 mantissa bits. It has
// no infinities; 0x7F and 0xFF are NaN; the largest finite value is 448,
// the smallest normal 2^-6, and subnormals reach down to 2^-9.
type E4M3 uint8

// MaxE4M3 is the largest finite E4M3 value.
const MaxE4M3 = 448

// Float32 widens q exactly (NaN for the NaN codes).
func (q E4M3) Float32() float32 { return driver.DecodeE4M3(uint8(q)) }

// E4M3From rounds f to the nearest E4M3, ties to even, saturating at ±448;
// a NaN or an infinity becomes NaN of its sign (e4m3 has no infinity).
func E4M3From(f float32) E4M3 { return E4M3(driver.EncodeE4M3(f)) }

// ScalesFromUE8M0 widens UE8M0 scales (one 8-bit exponent e per scale group,
// the scale 2^(e-127), as DeepEP's and NCCL EP's packed scales hold them) to
// the float32 scales a forwarded dispatch takes (DispatchInput.Scales): dst[i] = 2^(exps[i]-127), exactly.
// Exponent 0 (a scale below float32's normal range) and 255 (not a number in
// UE8M0) are refused, naming the index.
func ScalesFromUE8M0(dst []float32, exps []uint8) error {
	if len(dst) != len(exps) {
		return fmt.Errorf("ep: ScalesFromUE8M0: %d scales for %d exponents", len(dst), len(exps))
	}
	for i, e := range exps {
		if e == 0 || e == 255 {
			return fmt.Errorf("ep: ScalesFromUE8M0: exponent %d at index %d is not a normal float32 scale", e, i)
		}
		dst[i] = math.Float32frombits(uint32(e) << 23)
	}
	return nil
}

// Quantize casts rows of src ([rows][hidden]) to e4m3 in q (the same
// shape) with their scales ([rows][ScaleGroups(hidden)]), exactly as a
// dispatch with wire format w does, in one C call. Per group of ScaleGroup
// consecutive elements of a row:
//
//	amax  = the largest |x| over the group's finite elements (0 if none)
//	s     = max(amax/448, 2^-126)           (float32 division)
//	s     = 2^ceil(log2 s)                  (WireFP8UE8M0 only)
//	q     = e4m3(x * (1/s))                 (float32 product; see E4M3From)
//
// So an all-zero group has scale 2^-126 and codes 0 (its values come back
// as exact zeros), values round to nearest even (into e4m3's subnormals
// too), the group's largest value maps to ±448, and a NaN or an infinity
// becomes NaN without changing the scale of the group's other values.
func Quantize[E Element](q []E4M3, scales []float32, src []E, hidden int, w WireFormat) error {
	return quantize(q, scales, src, hidden, w, hostrows.CastFastest)
}

// quantize is Quantize with the cast impl.
func quantize[E Element](q []E4M3, scales []float32, src []E, hidden int, w WireFormat, impl hostrows.CastImpl) error {
	if err := checkFP8Shapes("Quantize", len(q), len(scales), len(src), hidden); err != nil {
		return err
	}
	if !w.FP8() {
		return fmt.Errorf("ep: Quantize: wire format %v is not an FP8 format", w)
	}
	if w == WireFP8Forward {
		return fmt.Errorf("ep: Quantize: wire format %v forwards what the caller quantized: quantize with WireFP8 or WireFP8UE8M0", w)
	}
	rows := len(src) / max(hidden, 1)
	if rows == 0 {
		return nil
	}
	dst, dsc, off := make([]uintptr, rows), make([]uintptr, rows), make([]int64, rows)
	// The kernel takes tables of addresses, as in a dispatch: pin what they
	// point into for the call.
	var pin runtime.Pinner
	defer pin.Unpin()
	pin.Pin(&q[0])
	pin.Pin(&scales[0])
	qp, sp := uintptr(unsafe.Pointer(&q[0])), uintptr(unsafe.Pointer(&scales[0]))
	rowBytes := hidden * DTypeOf[E]().Size()
	for r := range rows {
		dst[r] = qp + uintptr(r*hidden)
		dsc[r] = sp + uintptr(4*r*ScaleGroups(hidden))
		off[r] = int64(r * rowBytes)
	}
	hostrows.QuantizeAt(dst, dsc, unsafe.Pointer(&src[0]), off, hidden, DTypeOf[E](), w, impl)
	return nil
}

// Dequantize widens e4m3 rows q ([rows][hidden]) and their scales
// ([rows][ScaleGroups(hidden)]) into dst: dst[r][c] = q[r][c] *
// scales[r][c/ScaleGroup] in float32, rounded once to E. It is how the
// rows of an FP8 dispatch (Handle.RecvFP8, Handle.RecvScales) become
// numbers again; one C call.
func Dequantize[E Element](dst []E, q []E4M3, scales []float32, hidden int) error {
	if err := checkFP8Shapes("Dequantize", len(q), len(scales), len(dst), hidden); err != nil {
		return err
	}
	if len(q) == 0 {
		return nil
	}
	hostrows.DequantizeRows(unsafe.Pointer(&dst[0]), DTypeOf[E](), unsafe.Pointer(&q[0]), scales, len(q)/hidden, hidden)
	return nil
}

// checkFP8Shapes checks the lengths of rows of hidden elements, their e4m3
// codes and their scales.
func checkFP8Shapes(op string, codes, scales, elems, hidden int) error {
	switch {
	case hidden <= 0:
		return fmt.Errorf("ep: %s: hidden = %d, want > 0", op, hidden)
	case elems%hidden != 0:
		return fmt.Errorf("ep: %s: %d elements are not whole rows of hidden = %d", op, elems, hidden)
	case codes != elems:
		return fmt.Errorf("ep: %s: %d e4m3 codes for %d elements", op, codes, elems)
	case scales != elems/hidden*ScaleGroups(hidden):
		return fmt.Errorf("ep: %s: %d scales, want rows*ScaleGroups(hidden) = %d*%d = %d", op, scales, elems/hidden,
			ScaleGroups(hidden), elems/hidden*ScaleGroups(hidden))
	}
	return nil
}
