// Package fp8ref is an independent reference for goep's FP8 wire format,
// written from the definitions and nothing else, for tests: the e4m3 values
// of all 256 codes, rounding to nearest (ties to even) by searching them
// for the exact real value, and the per-group scales of ep.Quantize. It is
// slow and obvious on purpose; ep's kernels must agree with it bit for bit.
package fp8ref

import "math"

// Max is the largest finite e4m3 value.
const Max = 448

// NaN is the positive e4m3 NaN code (S.1111.111).
const NaN = 0x7f

// Decode is the exact value of e4m3 code q (NaN for 0x7F and 0xFF): sign,
// 4 exponent bits of bias 7, 3 mantissa bits, subnormals at exponent 0.
func Decode(q uint8) float64 {
	sign := 1.0
	if q&0x80 != 0 {
		sign = -1
	}
	e, m := int(q>>3)&15, float64(q&7)
	switch {
	case e == 15 && q&7 == 7:
		return math.NaN()
	case e == 0:
		return sign * m / 8 * math.Pow(2, -6)
	}
	return sign * (1 + m/8) * math.Pow(2, float64(e-7))
}

// values is Decode of every code.
var values = func() (v [256]float64) {
	for q := range v {
		v[q] = Decode(uint8(q))
	}
	return v
}()

// Round is the e4m3 code nearest to v: the finite code whose value is
// closest to v's exact value, the one with an even mantissa on a tie;
// values beyond ±448 saturate to ±448; NaN and ±Inf give NaN (e4m3 has no
// infinity), with v's sign.
func Round(v float64) uint8 {
	var sign uint8
	if math.Signbit(v) {
		sign = 0x80
	}
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return sign | NaN
	}
	a := math.Abs(v)
	best := uint8(0)
	for q := uint8(1); q < NaN; q++ {
		d, db := math.Abs(values[q]-a), math.Abs(values[best]-a)
		if d < db || d == db && q&1 == 0 {
			best = q
		}
	}
	return sign | best
}

// Scale is the scale of a group whose largest finite magnitude is amax:
// amax/448 in float32, at least 2^-126 (the smallest normal float32, so
// that an all-zero group has a defined scale), and with pow2 rounded up to
// a power of two.
func Scale(amax float32, pow2 bool) float32 {
	s := amax / Max
	if s < math.SmallestNonzeroFloat32*(1<<23) { // 2^-126
		s = math.Float32frombits(0x00800000)
	}
	if pow2 {
		frac, exp := math.Frexp(float64(s)) // s = frac * 2^exp, frac in [0.5, 1)
		if frac != 0.5 {
			exp++
		}
		s = float32(math.Ldexp(0.5, exp))
	}
	return s
}

// Quantize quantizes a row: per group of group consecutive elements (the
// last one shorter when len(x) is not a multiple), the scale of its
// largest finite magnitude, and each element's code Round(x * (1/scale))
// with the product and the inverse taken in float32.
func Quantize(x []float32, group int, pow2 bool) (codes []uint8, scales []float32) {
	codes = make([]uint8, len(x))
	for g := 0; g < len(x); g += group {
		end := min(g+group, len(x))
		var amax float32
		for _, v := range x[g:end] {
			if a := float32(math.Abs(float64(v))); !math.IsNaN(float64(v)) && !math.IsInf(float64(v), 0) && a > amax {
				amax = a
			}
		}
		s := Scale(amax, pow2)
		inv := 1 / s
		for c := g; c < end; c++ {
			codes[c] = Round(float64(x[c] * inv))
		}
		scales = append(scales, s)
	}
	return codes, scales
}
