package rowsum

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
)

// specialValues are bfloat16 values every input mixes in: signed zeros,
// infinities, quiet and signalling NaNs of both signs, subnormals, the
// largest finite and values next to 1.
var specialValues = []uint16{0x0000, 0x8000, 0x7f80, 0xff80, 0x7fc0, 0xffc1, 0x7f81, 0xff90, 0x0001, 0x807f, 0x7f7f, 0xff7f, 0x3f80, 0x3f81, 0xbf7f}

// randomRow is n bfloat16 of a normal distribution, one in four of them
// replaced by a special value or any bit pattern when specials is set.
func randomRow(rng *rand.Rand, n int, specials bool) []uint16 {
	row := make([]uint16, n)
	for i := range row {
		c := 2
		if specials {
			c = rng.IntN(8)
		}
		switch c {
		case 0:
			row[i] = specialValues[rng.IntN(len(specialValues))]
		case 1:
			row[i] = uint16(rng.Uint32()) // any bit pattern
		default:
			row[i] = toBF16(float32(rng.NormFloat64()))
		}
	}
	return row
}

// randomWeights is k weights in [0, 1), some of them 1, and some huge
// (products that overflow) when huge is set.
func randomWeights(rng *rand.Rand, k int, huge bool) []float32 {
	w := make([]float32, k)
	for j := range w {
		c := rng.IntN(6)
		if !huge && c == 1 {
			c = 2
		}
		switch c {
		case 0:
			w[j] = 1
		case 1:
			w[j] = float32(math.Ldexp(rng.Float64(), 100)) // products that overflow
		default:
			w[j] = rng.Float32()
		}
	}
	return w
}

// sameBits is a == b bit for bit, or both NaN (a NaN's payload may come
// from either of two NaN operands).
func sameBits(a, b uint16) bool {
	nan := func(v uint16) bool { return v&0x7fff > 0x7f80 }
	return a == b || nan(a) && nan(b)
}

// sameF32 is sameBits for float32.
func sameF32(a, b float32) bool {
	return math.Float32bits(a) == math.Float32bits(b) || a != a && b != b
}

// randomF32Row is n float32 of a normal distribution, one in four of them
// replaced by a special value (the bfloat16 specials widened) or any bit
// pattern.
func randomF32Row(rng *rand.Rand, n int) []float32 {
	row := make([]float32, n)
	for i := range row {
		switch rng.IntN(8) {
		case 0:
			row[i] = math.Float32frombits(uint32(specialValues[rng.IntN(len(specialValues))]) << 16)
		case 1:
			row[i] = math.Float32frombits(rng.Uint32())
		default:
			row[i] = float32(rng.NormFloat64())
		}
	}
	return row
}

// kernelCase is one of the package's sums, with what its test needs.
type kernelCase[T uint16 | float32] struct {
	sum       func(dst []T, src []unsafe.Pointer, w []float32)
	reference func(dst []T, src []unsafe.Pointer, w []float32, first int)
	row       func(rng *rand.Rand, n int) []T
	same      func(a, b T) bool
}

// checkKernel sums random rows, special values among them, with the
// kernel the sum runs and with the Go reference loop, and requires the
// same bits, and that nothing outside dst is written: dst sits between
// guard bands.
func checkKernel[T uint16 | float32](t *testing.T, c kernelCase[T]) {
	rng := rand.New(rand.NewPCG(1, 2))
	const guard = 16
	guardValue := T(0xdead)
	for _, n := range []int{0, 1, 7, 8, 15, 16, 17, 32, 100, 128, 130, 7168} {
		for _, k := range []int{0, 1, 2, 3, 8} {
			for _, weights := range []string{"nil", "random", "ones"} {
				t.Run(fmt.Sprintf("n=%d/k=%d/w=%s", n, k, weights), func(t *testing.T) {
					rows := make([][]T, k)
					src := make([]unsafe.Pointer, k)
					for j := range rows {
						rows[j] = c.row(rng, n+1) // one more element, never read: n may be 0
						src[j] = unsafe.Pointer(&rows[j][0])
					}
					var w []float32
					switch weights {
					case "random":
						w = randomWeights(rng, k, true)
					case "ones":
						w = make([]float32, k)
						for j := range w {
							w[j] = 1
						}
					}
					buf := make([]T, n+2*guard)
					for i := range buf {
						buf[i] = guardValue
					}
					dst := buf[guard : guard+n]
					c.sum(dst, src, w)

					want := make([]T, n)
					switch {
					case k == 0: // zeros
					case k == 1 && (w == nil || w[0] == 1):
						copy(want, rows[0])
					default:
						c.reference(want, src, w, 0)
					}
					for e := range want {
						if !c.same(dst[e], want[e]) {
							t.Fatalf("element %d: %v, want %v", e, dst[e], want[e])
						}
					}
					for i := range guard {
						require.Equal(t, guardValue, buf[i], "guard before dst")
						require.Equal(t, guardValue, buf[guard+n+i], "guard after dst")
					}
				})
			}
		}
	}
}

func TestBF16MatchesReference(t *testing.T) {
	t.Logf("assembly: %v", Assembly)
	checkKernel(t, kernelCase[uint16]{sum: BF16, reference: sumBF16Go, same: sameBits,
		row: func(rng *rand.Rand, n int) []uint16 { return randomRow(rng, n, true) }})
}

func TestF32MatchesReference(t *testing.T) {
	t.Logf("assembly: %v", Assembly)
	checkKernel(t, kernelCase[float32]{sum: F32, reference: sumF32Go, same: sameF32, row: randomF32Row})
}

// TestReferenceRounding checks the reference loop against sums worked out
// by hand: ties to even, NaN quietened, overflow to infinity, the sign of
// zero and the order of the additions.
func TestReferenceRounding(t *testing.T) {
	one, two := uint16(0x3f80), uint16(0x4000)
	tests := []struct {
		name string
		x    []uint16
		w    []float32
		want uint16
	}{
		{"1*1 + 1*1", []uint16{one, one}, nil, two},
		{"a tie rounds to even (down)", []uint16{one}, []float32{1 + 1.0/256}, 0x3f80}, // half way from 0x3f80 to 0x3f81
		{"a tie rounds to even (up)", []uint16{one}, []float32{1 + 3.0/256}, 0x3f82},   // half way from 0x3f81 to 0x3f82
		{"above the tie rounds up", []uint16{one}, []float32{1 + 1.0/256 + 1.0/65536}, 0x3f81},
		{"NaN is quietened", []uint16{0x7f81, one}, []float32{2, 1}, 0x7fc1},
		{"overflow is infinity", []uint16{0x7f7f, 0x7f7f}, []float32{1, 1}, 0x7f80},
		{"-0 + -0 is -0", []uint16{0x8000, 0x8000}, []float32{1, 1}, 0x8000},
		{"-0 + 0 is +0", []uint16{0x8000, 0x0000}, []float32{1, 1}, 0x0000},
		{"inf - inf is NaN", []uint16{0x7f80, 0xff80}, []float32{1, 1}, 0xffc0},
		// W = 16973822 (float32 0x4b817fff): W + 0.75 rounds back to W, twice, and W
		// rounds down to bfloat16 0x4b81; W + (0.75 + 0.75) would be 0x4b818000,
		// a tie that rounds up to 0x4b82.
		{"in order: (W + 0.75) + 0.75 is W", []uint16{one, 0x3f40, 0x3f40}, []float32{16973822, 1, 1}, 0x4b81},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rows := make([][16]uint16, len(tc.x))
			src := make([]unsafe.Pointer, len(tc.x))
			for j, v := range tc.x {
				for e := range rows[j] {
					rows[j][e] = v
				}
				src[j] = unsafe.Pointer(&rows[j][0])
			}
			got, ref := make([]uint16, 16), make([]uint16, 16)
			BF16(got, src, tc.w)
			sumBF16Go(ref, src, tc.w, 0)
			for e := range got {
				require.True(t, sameBits(ref[e], tc.want), "reference, element %d: %#04x, want %#04x", e, ref[e], tc.want)
				require.True(t, sameBits(got[e], tc.want), "element %d: %#04x, want %#04x", e, got[e], tc.want)
			}
		})
	}
}

func TestRejectsWeightCount(t *testing.T) {
	x := make([]float32, 16)
	src := []unsafe.Pointer{unsafe.Pointer(&x[0]), unsafe.Pointer(&x[0])}
	require.PanicsWithValue(t, "rowsum: 1 weights for 2 sources", func() { BF16(make([]uint16, 16), src, []float32{1}) })
	require.PanicsWithValue(t, "rowsum: 3 weights for 2 sources", func() { F32(make([]float32, 16), src, []float32{1, 2, 3}) })
}

func benchmarkBF16(b *testing.B, n, k int, kernel func([]uint16, []unsafe.Pointer, []float32)) {
	rng := rand.New(rand.NewPCG(3, 4))
	src := make([]unsafe.Pointer, k)
	for j := range src {
		src[j] = unsafe.Pointer(&randomRow(rng, n, false)[0]) // no subnormals: each costs a microcode assist
	}
	w, dst := randomWeights(rng, k, false), make([]uint16, n)
	b.SetBytes(int64(2 * n * (k + 1)))
	for b.Loop() {
		kernel(dst, src, w)
	}
}

// BenchmarkBF16 sums top-2 and top-8 rows of a decode step (hidden 128) and
// of a large model (hidden 7168), with BF16 and with the Go reference loop.
func BenchmarkBF16(b *testing.B) {
	reference := func(dst []uint16, src []unsafe.Pointer, w []float32) { sumBF16Go(dst, src, w, 0) }
	for _, c := range []struct{ n, k int }{{128, 2}, {128, 8}, {7168, 8}} {
		b.Run(fmt.Sprintf("hidden=%d/k=%d/BF16", c.n, c.k), func(b *testing.B) { benchmarkBF16(b, c.n, c.k, BF16) })
		b.Run(fmt.Sprintf("hidden=%d/k=%d/reference", c.n, c.k), func(b *testing.B) { benchmarkBF16(b, c.n, c.k, reference) })
	}
}
