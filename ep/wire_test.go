package ep_test

import (
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goep/goep/ep"
	"github.com/goep/goep/internal/fp8ref"
)

// e2m1Ref is the value of an FP4 e2m1 code from its bits: sign, 2
// exponent bits of bias 1, 1 mantissa bit, a subnormal at exponent 0.
func e2m1Ref(q uint8) float64 {
	sign := 1.0
	if q&8 != 0 {
		sign = -1
	}
	e, m := int(q>>1)&3, float64(q&1)
	if e == 0 {
		return sign * m * 0.5
	}
	return sign * (1 + m/2) * math.Pow(2, float64(e-1))
}

// DecodeRows reads NVFP4 rows by their definition: every code pair and
// scale byte, against a reference written from the bits.
func TestDecodeRowsNVFP4(t *testing.T) {
	const H = 64
	rows, scales := make([]byte, 2*H/2), make([]byte, 2*H/16)
	for i := range rows {
		rows[i] = byte(i * 37)
	}
	for i := range scales {
		scales[i] = []byte{0x38, 0x40, 0x01, 0x7e, 0x30, 0x00, 0x50, 0x39}[i]
	}
	got := make([]float32, 2*H)
	require.NoError(t, ep.DecodeRows(ep.WireNVFP4Forward, got, rows, scales, H))
	for i := range got {
		r, c := i/H, i%H
		q := rows[r*H/2+c/2] >> (4 * (c % 2)) & 15
		want := e2m1Ref(q) * fp8ref.Decode(scales[r*H/16+c/16])
		if float64(got[i]) != want {
			t.Fatalf("element %d (code %#x, scale %#x) = %v, want %v", i, q, scales[r*H/16+c/16], got[i], want)
		}
	}
	// Every code once: the eight magnitudes and their negatives.
	want := []float64{0, 0.5, 1, 1.5, 2, 3, 4, 6}
	for q := uint8(0); q < 16; q++ {
		v := want[q&7]
		if q&8 != 0 {
			v = -v
		}
		assert.Equal(t, v, e2m1Ref(q), "reference of code %#x", q)
	}
}

func TestDecodeRowsRefusesBadShapes(t *testing.T) {
	dst := make([]float32, 48)
	err := ep.DecodeRows(ep.WireNVFP4Forward, dst, make([]byte, 24), make([]byte, 3), 48)
	assert.ErrorIs(t, err, ep.ErrBadInput)
	assert.ErrorContains(t, err, "rows of 48 elements are not whole 16-byte pieces of NVFP4 codes (Hidden must be a multiple of 32)")
	err = ep.DecodeRows(ep.WireNVFP4Forward, make([]float32, 64), make([]byte, 31), make([]byte, 4), 64)
	assert.ErrorContains(t, err, "1 rows of nvfp4-forward take 32 bytes and 4 of scales; got 31 and 4")
	err = ep.DecodeRows(ep.WireNative, dst, nil, nil, 48)
	assert.ErrorContains(t, err, "format native has no definition to decode by")
}

// The FP8 formats decode as Dequantize does.
func TestDecodeRowsFP8MatchesDequantize(t *testing.T) {
	const H = 200
	x := make([]float32, 2*H)
	for i := range x {
		x[i] = float32(math.Sin(float64(i))) * float32(1+i%7)
	}
	codes, sc := make([]ep.E4M3, 2*H), make([]float32, 2*ep.ScaleGroups(H))
	require.NoError(t, ep.Quantize(codes, sc, x, H, ep.WireFP8))
	deq := make([]float32, 2*H)
	require.NoError(t, ep.Dequantize(deq, codes, sc, H))
	got := make([]float32, 2*H)
	require.NoError(t, ep.DecodeRows(ep.WireFP8, got, ep.AsBytes(ep.Host(codes)).Host(), ep.AsBytes(ep.Host(sc)).Host(), H))
	assert.Equal(t, deq, got)
}
