package ep_test

import (
	"math"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/goep/goep/ep"
)

// The conversions against bit patterns worked out by hand: bfloat16 is the
// top half of a float32, rounded to nearest, ties to even.
func TestElementConversions(t *testing.T) {
	for _, tc := range []struct {
		in   float32
		bits uint16  // BF16From(in)
		back float32 // its value
	}{
		{1, 0x3f80, 1},
		{-2.5, 0xc020, -2.5},
		{math.Float32frombits(0x3f808000), 0x3f80, 1},                                // a tie: to the even 0x3f80
		{math.Float32frombits(0x3f818000), 0x3f82, math.Float32frombits(0x3f820000)}, // a tie: to the even 0x3f82
		{math.Float32frombits(0x3f808001), 0x3f81, math.Float32frombits(0x3f810000)}, // above the tie
		{float32(math.Inf(1)), 0x7f80, float32(math.Inf(1))},
	} {
		b := ep.ElementOf[ep.BF16](tc.in)
		assert.Equal(t, ep.BF16(tc.bits), b, "BF16 of %v", tc.in)
		assert.Equal(t, tc.back, ep.Float32Of(b), "back from %#04x", tc.bits)
		assert.Equal(t, tc.in, ep.Float32Of(ep.ElementOf[float32](tc.in)), "float32 is exact")
	}
	nan := ep.ElementOf[ep.BF16](float32(math.NaN()))
	assert.True(t, math.IsNaN(float64(ep.Float32Of(nan))), "NaN stays NaN, not Inf: %#04x", uint16(nan))
}
