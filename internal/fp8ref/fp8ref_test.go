package fp8ref

import (
	"math"
	"testing"
)

// The reference's own anchors, from the format's definition.
func TestDecodeAndRound(t *testing.T) {
	cases := []struct {
		name string
		v    float64
		code uint8
	}{
		{"one", 1, 0x38},
		{"largest finite", 448, 0x7e},
		{"smallest normal", 0x1p-6, 0x08},
		{"smallest subnormal", 0x1p-9, 0x01},
		{"largest subnormal", 7 * 0x1p-9, 0x07},
		{"tie 1+1/16 to even 1", 1.0625, 0x38},
		{"tie 1+3/16 to even 1.25", 1.1875, 0x3a},
		{"tie half the smallest subnormal to 0", 0x1p-10, 0x00},
		{"tie 3/2 of it to even 2^-8", 3 * 0x1p-10, 0x02},
		{"just above a tie", math.Nextafter(1.0625, 2), 0x39},
		{"saturate 464", 464, 0x7e},
		{"saturate 1e6", 1e6, 0x7e},
		{"negative", -3, 0xc4},
		{"negative zero", math.Copysign(0, -1), 0x80},
		{"underflow to negative zero", -1e-9, 0x80},
		{"infinity is NaN", math.Inf(1), 0x7f},
		{"negative infinity is negative NaN", math.Inf(-1), 0xff},
		{"NaN", math.NaN(), 0x7f},
	}
	for _, c := range cases {
		if got := Round(c.v); got != c.code {
			t.Errorf("%s: Round(%v) = %#x, want %#x", c.name, c.v, got, c.code)
		}
	}
	if !math.IsNaN(Decode(0xff)) || Decode(0xfe) != -448 || Decode(0x80) != 0 || !math.Signbit(Decode(0x80)) {
		t.Error("Decode of 0xff, 0xfe, 0x80")
	}
	// Every finite code is its own nearest.
	for q := 0; q < 256; q++ {
		if q&0x7f == 0x7f {
			continue
		}
		if got := Round(Decode(uint8(q))); got != uint8(q) {
			t.Errorf("Round(Decode(%#x)) = %#x", q, got)
		}
	}
}

func TestScale(t *testing.T) {
	cases := []struct {
		amax float32
		pow2 bool
		want float32
	}{
		{448, false, 1},
		{896, false, 2},
		{100, false, 100.0 / 448},
		{100, true, 0.25},              // 0.2232... up to 2^-2
		{448, true, 1},                 // already a power of two
		{0, false, 0x1p-126},           // all-zero group
		{0, true, 0x1p-126},            // the same, already a power of two
		{1e-40, false, 0x1p-126},       // amax/448 below the smallest normal
		{3e38, true, 0x1p120},          // large
		{449, true, 2},                 // just above a power of two
		{0x1p-120, true, 0x1p-128 * 4}, // 2^-120/448 = 2^-128.8 -> below 2^-126 -> 2^-126
	}
	for _, c := range cases {
		if got := Scale(c.amax, c.pow2); got != c.want {
			t.Errorf("Scale(%g, %v) = %g, want %g", c.amax, c.pow2, got, c.want)
		}
	}
}
