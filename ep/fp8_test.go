package ep_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goep/goep/ep"
	"github.com/goep/goep/internal/fp8ref"
)

// every bfloat16 bit pattern, as float32
func allBF16() []float32 {
	out := make([]float32, 1<<16)
	for i := range out {
		out[i] = ep.BF16(i).Float32()
	}
	return out
}

// E4M3From rounds every bfloat16 value, and a sweep of float32 values
// around every e4m3 value and tie, exactly as the reference does.
func TestE4M3FromMatchesReference(t *testing.T) {
	check := func(f float32) {
		if got, want := ep.E4M3From(f), fp8ref.Round(float64(f)); uint8(got) != want {
			t.Fatalf("E4M3From(%g = %#08x) = %#x, want %#x", f, math.Float32bits(f), uint8(got), want)
		}
	}
	for _, f := range allBF16() {
		check(f)
	}
	// Around each value and each midpoint: the exact point and 8 float32
	// steps either side (ties, and the values that must not tie).
	for q := 0; q < 0x7f; q++ {
		points := []float64{fp8ref.Decode(uint8(q))}
		if q < 0x7e {
			points = append(points, (points[0]+fp8ref.Decode(uint8(q+1)))/2)
		} else {
			points = append(points, 464, 480, 512) // beyond 448: saturation, and where 0x7F would be
		}
		for _, p := range points {
			f := float32(p)
			require.Equal(t, p, float64(f), "the point %v is a float32", p)
			for i := 0; i < 8; i++ {
				check(f)
				check(-f)
				f = math.Nextafter32(f, float32(math.Inf(1)))
			}
			f = float32(p)
			for i := 0; i < 8; i++ {
				f = math.Nextafter32(f, 0)
				check(f)
				check(-f)
			}
		}
	}
	// A sparse sweep of all float32 bit patterns (every 4099th: a prime
	// stride that visits every mantissa residue).
	for u := uint64(0); u < 1<<32; u += 4099 {
		check(math.Float32frombits(uint32(u)))
	}
}

// The decoded value of every code, against the reference.
func TestE4M3Float32(t *testing.T) {
	for q := 0; q < 256; q++ {
		got, want := float64(ep.E4M3(q).Float32()), fp8ref.Decode(uint8(q))
		if math.IsNaN(want) {
			assert.True(t, math.IsNaN(got), "code %#x", q)
			continue
		}
		assert.Equal(t, want, got, "code %#x", q)
		assert.Equal(t, math.Signbit(want), math.Signbit(got), "sign of code %#x", q)
	}
}

// quantize runs ep.Quantize on float32 or bfloat16 rows.
func quantize[E ep.Element](t *testing.T, x []float32, hidden int, w ep.WireFormat) ([]ep.E4M3, []float32) {
	t.Helper()
	src := make([]E, len(x))
	for i, v := range x {
		src[i] = ep.ElementOf[E](v)
	}
	q := make([]ep.E4M3, len(x))
	s := make([]float32, len(x)/hidden*ep.ScaleGroups(hidden))
	quant := ep.Quantize[E]
	if portableCast {
		quant = ep.QuantizePortable[E]
	}
	require.NoError(t, quant(q, s, src, hidden, w))
	return q, s
}

// portableCast makes this file's quantize use the portable cast (bothCasts).
var portableCast bool

// bothCasts runs test with the fastest cast this CPU has and with the
// portable one: each must agree with the reference.
func bothCasts(t *testing.T, test func(t *testing.T)) {
	t.Run("fastest", test)
	t.Run("portable", func(t *testing.T) {
		portableCast = true
		defer func() { portableCast = false }()
		test(t)
	})
}

// The dispatch kernel's cast, value by value: every bfloat16 value (NaN,
// infinities, subnormals and ties included) in groups whose scale is 1
// (each group holds 448), bit for bit against the reference. The finite
// values come first, in groups of their own: a group with a NaN or an
// infinity may take another path.
func TestQuantizeEveryBF16Value(t *testing.T) { bothCasts(t, testQuantizeEveryBF16Value) }

func testQuantizeEveryBF16Value(t *testing.T) {
	var x, special []float32
	for _, f := range allBF16() {
		if a := math.Abs(float64(f)); math.IsNaN(a) || math.IsInf(a, 0) {
			special = append(special, f)
		} else if a <= 448 {
			if len(x)%ep.ScaleGroup == 0 {
				x = append(x, 448)
			}
			x = append(x, f)
		}
	}
	for len(x)%ep.ScaleGroup != 0 {
		x = append(x, 0)
	}
	for _, f := range special {
		if len(x)%ep.ScaleGroup == 0 {
			x = append(x, 448)
		}
		x = append(x, f)
	}
	for len(x)%ep.ScaleGroup != 0 {
		x = append(x, 0)
	}
	for _, w := range []ep.WireFormat{ep.WireFP8, ep.WireFP8UE8M0} {
		for _, typ := range []string{"f32", "bf16"} {
			var q []ep.E4M3
			var s []float32
			if typ == "f32" {
				q, s = quantize[float32](t, x, ep.ScaleGroup, w)
			} else {
				q, s = quantize[ep.BF16](t, x, ep.ScaleGroup, w)
			}
			for g, sc := range s {
				require.Equal(t, float32(1), sc, "%v %s: scale of group %d", w, typ, g)
			}
			for i, v := range x {
				if want := fp8ref.Round(float64(v)); uint8(q[i]) != want {
					t.Fatalf("%v %s: %g (%#08x) became %#x, want %#x", w, typ, v, math.Float32bits(v), uint8(q[i]), want)
				}
			}
		}
	}
}

// The cast of float32 inputs, value by value, in groups of scale 1: the
// float32 values around every e4m3 value and midpoint (ties, and the values
// that must not tie), and a sparse sweep of all float32 patterns up to 448.
func TestQuantizeFloat32Sweep(t *testing.T) { bothCasts(t, testQuantizeFloat32Sweep) }

func testQuantizeFloat32Sweep(t *testing.T) {
	var vals []float32
	for q := 0; q < 0x7e; q++ {
		a, b := fp8ref.Decode(uint8(q)), fp8ref.Decode(uint8(q+1))
		for _, p := range []float32{float32(a), float32((a + b) / 2)} {
			up, down := p, p
			for i := 0; i < 8; i++ {
				vals = append(vals, up, -up, down, -down)
				up, down = math.Nextafter32(up, 1000), math.Nextafter32(down, 0)
			}
		}
	}
	for u := uint64(0); u < 1<<32; u += 4099 {
		if f := math.Float32frombits(uint32(u)); math.Abs(float64(f)) <= 448 {
			vals = append(vals, f)
		}
	}
	var x []float32
	for _, f := range vals {
		if len(x)%ep.ScaleGroup == 0 {
			x = append(x, 448)
		}
		x = append(x, f)
	}
	for len(x)%ep.ScaleGroup != 0 {
		x = append(x, 0)
	}
	for _, w := range []ep.WireFormat{ep.WireFP8, ep.WireFP8UE8M0} {
		q, s := quantize[float32](t, x, ep.ScaleGroup, w)
		for g, sc := range s {
			require.Equal(t, float32(1), sc, "%v: scale of group %d", w, g)
		}
		for i, v := range x {
			if want := fp8ref.Round(float64(v)); uint8(q[i]) != want {
				t.Fatalf("%v: %g (%#08x) became %#x, want %#x", w, v, math.Float32bits(v), uint8(q[i]), want)
			}
		}
	}
}

// randomRow draws values over many magnitudes, with zeros, subnormals,
// and, when special is set, NaN and infinities in one group of four.
func randomRow(rng *rand.Rand, n int, special bool) []float32 {
	x := make([]float32, n)
	group, withSpecial := 0, false
	for i := range x {
		if i%ep.ScaleGroup == 0 {
			group = rng.IntN(6) // each group its own character
			withSpecial = special && rng.IntN(4) == 0
		}
		mag := math.Ldexp(rng.Float64(), rng.IntN(40)-20)
		switch group {
		case 0: // all zero (signed)
			mag = 0
		case 1: // tiny: scales clamped at 2^-126, bfloat16 subnormals
			mag = math.Ldexp(rng.Float64(), -125-rng.IntN(10))
		case 2: // huge
			mag = math.Ldexp(rng.Float64(), 100+rng.IntN(27))
		}
		v := float32(mag)
		if rng.IntN(2) == 0 {
			v = -v
		}
		if withSpecial && rng.IntN(20) == 0 {
			v = []float32{float32(math.NaN()), float32(math.Inf(1)), float32(math.Inf(-1)), -float32(math.NaN())}[rng.IntN(4)]
		}
		x[i] = v
	}
	return x
}

// Whole rows, every group of its own character (all zero, tiny, huge,
// mixed; NaN and infinities here and there), hidden sizes with a partial
// last group, both scale kinds, float32 and bfloat16 inputs: codes and
// scales bit for bit against the reference.
func TestQuantizeRowsMatchReference(t *testing.T) { bothCasts(t, testQuantizeRowsMatchReference) }

func testQuantizeRowsMatchReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(13, 1))
	for _, hidden := range []int{1, 100, 128, 130, 384, 1000, 7168} {
		for _, w := range []ep.WireFormat{ep.WireFP8, ep.WireFP8UE8M0} {
			for _, typ := range []string{"f32", "bf16"} {
				t.Run(fmt.Sprintf("%d/%v/%s", hidden, w, typ), func(t *testing.T) {
					rows := 3
					x := randomRow(rng, rows*hidden, true)
					var q []ep.E4M3
					var s []float32
					if typ == "f32" {
						q, s = quantize[float32](t, x, hidden, w)
					} else {
						q, s = quantize[ep.BF16](t, x, hidden, w)
						for i, v := range x { // the reference sees what the kernel saw
							x[i] = ep.BF16From(v).Float32()
						}
					}
					G := ep.ScaleGroups(hidden)
					for r := 0; r < rows; r++ {
						wq, ws := fp8ref.Quantize(x[r*hidden:(r+1)*hidden], ep.ScaleGroup, w == ep.WireFP8UE8M0)
						require.Equal(t, ws, s[r*G:(r+1)*G], "scales of row %d", r)
						for c := range wq {
							if uint8(q[r*hidden+c]) != wq[c] {
								t.Fatalf("row %d element %d = %g: code %#x, want %#x (scale %g)", r, c, x[r*hidden+c],
									uint8(q[r*hidden+c]), wq[c], s[r*G+c/ep.ScaleGroup])
							}
						}
					}
				})
			}
		}
	}
}

// halfULP is half the distance between e4m3 values around |v| (v in
// [0, 448]): 2^-10 among subnormals, 2^(e-4) in [2^e, 2^(e+1)).
func halfULP(v float64) float64 {
	if v < 0x1p-6 {
		return 0x1p-10
	}
	_, e := math.Frexp(v) // v = f * 2^e, f in [0.5, 1): v in [2^(e-1), 2^e)
	return math.Ldexp(1, e-1-4)
}

// Dequantize is the exact product of code and scale (float32 out), and a
// round trip is within half an e4m3 step of the scaled value times the
// scale, plus the float32 rounding of the scaling (and, for bfloat16 out,
// half a bfloat16 step).
func TestDequantizeRoundTrip(t *testing.T) { bothCasts(t, testDequantizeRoundTrip) }

func testDequantizeRoundTrip(t *testing.T) {
	rng := rand.New(rand.NewPCG(14, 1))
	for _, hidden := range []int{130, 7168} {
		for _, w := range []ep.WireFormat{ep.WireFP8, ep.WireFP8UE8M0} {
			x := randomRow(rng, 4*hidden, false)
			q, s := quantize[float32](t, x, hidden, w)
			G := ep.ScaleGroups(hidden)
			got := make([]float32, len(x))
			require.NoError(t, ep.Dequantize(got, q, s, hidden))
			gotBF := make([]ep.BF16, len(x))
			require.NoError(t, ep.Dequantize(gotBF, q, s, hidden))
			for i, v := range x {
				sc := s[i/hidden*G+i%hidden/ep.ScaleGroup]
				exact := float32(fp8ref.Decode(uint8(q[i]))) * sc
				require.Equal(t, exact, got[i], "%v: element %d: %#x * %g", w, i, uint8(q[i]), sc)
				require.Equal(t, ep.BF16From(exact), gotBF[i], "%v: bfloat16 element %d", w, i)
				scaled := math.Abs(float64(v)) / float64(sc)
				bound := float64(sc)*halfULP(math.Min(scaled, 448))*(1+0x1p-20) + math.Abs(float64(v))*0x1p-22
				if d := math.Abs(float64(got[i]) - float64(v)); d > bound {
					t.Fatalf("%v: element %d: %g came back as %g: error %g > bound %g (scale %g)", w, i, v, got[i], d, bound, sc)
				}
				if d := math.Abs(float64(gotBF[i].Float32()) - float64(v)); d > bound+math.Abs(float64(v))*0x1p-8+0x1p-134 {
					t.Fatalf("%v: bfloat16 element %d: %g came back as %g", w, i, v, gotBF[i].Float32())
				}
				if v == 0 {
					require.Zero(t, got[i], "a zero comes back as a zero")
				}
			}
		}
	}
}

// What the documentation promises for the special cases.
func TestQuantizeDefinedCases(t *testing.T) { bothCasts(t, testQuantizeDefinedCases) }

func testQuantizeDefinedCases(t *testing.T) {
	nan, inf := float32(math.NaN()), float32(math.Inf(1))
	row := func(vals ...float32) []float32 {
		x := make([]float32, ep.ScaleGroup)
		copy(x, vals)
		return x
	}
	cases := []struct {
		name   string
		x      []float32
		w      ep.WireFormat
		scale  float32
		codes  []uint8 // of the first elements
		values []float32
	}{
		{"all zero: scale 2^-126, exact zeros", row(), ep.WireFP8, 0x1p-126, []uint8{0, 0}, []float32{0, 0}},
		{"negative zero stays negative", row(float32(math.Copysign(0, -1))), ep.WireFP8, 0x1p-126, []uint8{0x80}, nil},
		{"amax maps to 448", row(7, -3.5), ep.WireFP8, 7.0 / 448, []uint8{0x7e, 0xf6}, []float32{7, -3.5}},
		{"NaN is NaN, the scale ignores it", row(nan, 7), ep.WireFP8, 7.0 / 448, []uint8{0x7f, 0x7e}, nil},
		{"infinity is NaN, the scale ignores it", row(inf, -inf, 7), ep.WireFP8, 7.0 / 448, []uint8{0x7f, 0xff, 0x7e}, nil},
		{"only NaN and zeros: scale 2^-126", row(nan), ep.WireFP8, 0x1p-126, []uint8{0x7f, 0}, nil},
		{"UE8M0: 5/448 up to 2^-6", row(5, 1), ep.WireFP8UE8M0, 0x1p-6, []uint8{0x7a, 0x68}, []float32{5, 1}},
		{"tiny values: 1e-40 below 448*2^-126, scale 2^-126", row(1e-40), ep.WireFP8, 0x1p-126, nil, nil},
		{"subnormal codes beside 448 (scale 1), a tie to even", row(448, 0x1p-15, 0x1p-9, 3*0x1p-10),
			ep.WireFP8, 1, []uint8{0x7e, 0x00, 0x01, 0x02}, []float32{448, 0, 0x1p-9, 0x1p-8}},
	}
	for _, c := range cases {
		q := make([]ep.E4M3, len(c.x))
		s := make([]float32, 1)
		require.NoError(t, ep.Quantize(q, s, c.x, len(c.x), c.w), c.name)
		assert.Equal(t, c.scale, s[0], "%s: scale", c.name)
		for i, want := range c.codes {
			assert.Equal(t, want, uint8(q[i]), "%s: code %d", c.name, i)
		}
		back := make([]float32, len(c.x))
		require.NoError(t, ep.Dequantize(back, q, s, len(c.x)), c.name)
		for i, want := range c.values {
			assert.Equal(t, want, back[i], "%s: value %d", c.name, i)
		}
		for i, v := range back {
			assert.False(t, math.IsInf(float64(v), 0), "%s: value %d is infinite", c.name, i)
		}
	}
}

func TestQuantizeBadInput(t *testing.T) {
	x := make([]float32, 256)
	q := make([]ep.E4M3, 256)
	s := make([]float32, 2)
	cases := []struct {
		name string
		err  error
		want string
	}{
		{"hidden 0", ep.Quantize(q, s, x, 0, ep.WireFP8), "hidden = 0, want > 0"},
		{"not whole rows", ep.Quantize(q, s, x, 100, ep.WireFP8), "256 elements are not whole rows of hidden = 100"},
		{"codes short", ep.Quantize(q[:255], s, x, 128, ep.WireFP8), "255 e4m3 codes for 256 elements"},
		{"scales short", ep.Quantize(q, s[:1], x, 128, ep.WireFP8), "1 scales, want rows*ScaleGroups(hidden) = 2*1 = 2"},
		{"not FP8", ep.Quantize(q, s, x, 128, ep.WireNative), "wire format native is not an FP8 format"},
		{"dequantize scales long", ep.Dequantize(x, q, make([]float32, 3), 128), "3 scales"},
		{"dequantize out short", ep.Dequantize(x[:128], q, s, 128), "256 e4m3 codes for 128 elements"},
	}
	for _, c := range cases {
		if assert.Error(t, c.err, c.name) {
			assert.Contains(t, c.err.Error(), c.want, c.name)
		}
	}
	require.NoError(t, ep.Quantize[float32](nil, nil, nil, 128, ep.WireFP8), "no rows")
}

func TestParseWire(t *testing.T) {
	for _, w := range []ep.WireFormat{ep.WireNative, ep.WireFP8, ep.WireFP8UE8M0} {
		got, err := ep.ParseWire(w.String())
		require.NoError(t, err)
		assert.Equal(t, w, got)
	}
	_, err := ep.ParseWire("fp4")
	assert.ErrorContains(t, err, `unknown wire format "fp4"`)
	assert.Equal(t, 56, ep.ScaleGroups(7168))
	assert.Equal(t, 2, ep.ScaleGroups(130))
}
