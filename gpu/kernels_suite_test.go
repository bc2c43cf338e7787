package gpu

import (
	"bytes"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The kernel suite: every kernel of Kernels against its CPU reference
// (reference_test.go), on random inputs with zero rows, masked (-1)
// entries, out-of-range indices, NaN and infinities. It runs wherever a
// kernelEnv runs it: on the CPU emulator of package kernels in every test
// run (emulate_test.go), on a device in the gpu-tagged tests
// (device_test.go). Every buffer has guard bands, checked after each
// kernel, so a write out of bounds fails the test.

// kernelEnv is memory and a Kernels to run the suite on.
type kernelEnv interface {
	kernels() *Kernels
	stream() Stream
	// alloc returns n bytes, freed when the test ends.
	alloc(t testing.TB, n int) DevicePtr
	write(t testing.TB, p DevicePtr, b []byte)
	read(t testing.TB, b []byte, p DevicePtr)
	// sync waits for the work queued on stream().
	sync(t testing.TB)
}

const guardBytes = 64 // a multiple of 16: buffers stay 16-byte aligned

var guardPattern = bytes.Repeat([]byte{0xa5, 0x5a, 0xc3, 0x3c}, guardBytes/4)

// dbuf is a guarded buffer of device memory.
type dbuf struct {
	env  kernelEnv
	base DevicePtr
	n    int
}

// newBuf allocates a guarded buffer holding data.
func newBuf(t testing.TB, env kernelEnv, data []byte) *dbuf {
	t.Helper()
	b := &dbuf{env: env, base: env.alloc(t, len(data)+2*guardBytes), n: len(data)}
	img := make([]byte, 0, len(data)+2*guardBytes)
	img = append(append(append(img, guardPattern...), data...), guardPattern...)
	env.write(t, b.base, img)
	return b
}

// newBufOf is newBuf for a slice of numbers.
func newBufOf[T Number](t testing.TB, env kernelEnv, s []T) *dbuf {
	t.Helper()
	return newBuf(t, env, append([]byte(nil), bytesOf(s)...))
}

// ptr is the buffer's first data byte.
func (b *dbuf) ptr() DevicePtr { return b.base + guardBytes }

// get waits for the stream, reads the data back and checks the guards.
func (b *dbuf) get(t testing.TB) []byte {
	t.Helper()
	b.env.sync(t)
	img := make([]byte, b.n+2*guardBytes)
	b.env.read(t, img, b.base)
	if !bytes.Equal(img[:guardBytes], guardPattern) {
		t.Errorf("a kernel wrote into the guard band before a buffer of %d bytes", b.n)
	}
	if !bytes.Equal(img[guardBytes+b.n:], guardPattern) {
		t.Errorf("a kernel wrote past the end of a buffer of %d bytes", b.n)
	}
	return img[guardBytes : guardBytes+b.n]
}

// getAs reads the buffer back as a slice of T.
func getAs[T Number](t testing.TB, b *dbuf) []T {
	t.Helper()
	raw := b.get(t)
	var z T
	out := make([]T, len(raw)/int(unsafe.Sizeof(z)))
	copy(bytesOf(out), raw)
	return out
}

// ptrOf is 0 for a nil buffer.
func ptrOf(b *dbuf) DevicePtr {
	if b == nil {
		return 0
	}
	return b.ptr()
}

func runKernelSuite(t *testing.T, env kernelEnv) {
	t.Run("BF16", func(t *testing.T) { testConvert(t, env) })
	t.Run("Layout", func(t *testing.T) { testLayout(t, env) })
	t.Run("LayoutBadInput", func(t *testing.T) { testLayoutBad(t, env) })
	t.Run("CopyRows", func(t *testing.T) { testCopyRows(t, env) })
	t.Run("PackRows", func(t *testing.T) { testPackRows(t, env) })
	t.Run("RowPointers", func(t *testing.T) { testRowPointers(t, env) })
	t.Run("ReduceRows", func(t *testing.T) { testReduceRows(t, env) })
	t.Run("DispatchCombine", func(t *testing.T) { testDispatchCombine(t, env) })
	t.Run("HTMeta", func(t *testing.T) { testHTMeta(t, env) })
	t.Run("CountLocal", func(t *testing.T) { testCountLocal(t, env) })
	t.Run("LLPlace", func(t *testing.T) { testLLPlace(t, env) })
	t.Run("LLPlaceRefusesStaleBlocks", func(t *testing.T) { testLLPlaceStale(t, env) })
}

func newRand(seed uint64) *rand.Rand { return rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15)) }

// specialF32 are the float32 whose bfloat16 rounding is easy to get wrong.
var specialF32 = []uint32{
	0x00000000, 0x80000000, // ±0
	0x3f800000, 0xbf800000, // ±1
	0x00000001, 0x007fffff, 0x00800000, 0x80000001, // denormals, smallest normal
	0x3f808000, 0x3f818000, 0x3f80ffff, 0x3f807fff, 0x3f808001, 0xbf818000, // ties to even, around ties
	0x7f7fffff, 0x7f7f8000, 0x7f7f7fff, 0xff7fffff, // overflow to ±inf, or not
	0x7f800000, 0xff800000, // ±inf
	0x7fc00000, 0xffc00000, 0x7f800001, 0x7fa12345, 0xff80ffff, 0x7fffffff, 0x7f80ffff, // NaNs: quiet, signalling, payloads
}

func testConvert(t *testing.T, env kernelEnv) {
	k := env.kernels()
	r := newRand(1)
	for _, n := range []int{0, 1, len(specialF32), 255, 256, 257, 5000} {
		src := make([]float32, n)
		for i := range src {
			if i < len(specialF32) {
				src[i] = math.Float32frombits(specialF32[i])
			} else {
				src[i] = math.Float32frombits(r.Uint32())
			}
		}
		want := refToBF16(src)
		in := newBufOf(t, env, src)
		out := newBufOf(t, env, make([]uint16, n))
		require.NoError(t, k.ToBF16(env.stream(), out.ptr(), in.ptr(), n))
		got := getAs[uint16](t, out)
		for i := range want {
			if got[i] != want[i] {
				t.Errorf("ToBF16, n %d: %#08x -> %#04x, want %#04x", n, math.Float32bits(src[i]), got[i], want[i])
			}
		}
		in.get(t)
	}
	// Every bfloat16, widened.
	all := make([]uint16, 1<<16)
	for i := range all {
		all[i] = uint16(i)
	}
	want := refFromBF16(all)
	in := newBufOf(t, env, all)
	out := newBufOf(t, env, make([]float32, len(all)))
	require.NoError(t, k.FromBF16(env.stream(), out.ptr(), in.ptr(), len(all)))
	got := getAs[float32](t, out)
	bad := 0
	for i := range want {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			if bad++; bad < 10 {
				t.Errorf("FromBF16(%#04x) = %#08x, want %#08x", i, math.Float32bits(got[i]), math.Float32bits(want[i]))
			}
		}
	}
	// A length that is not a whole number of 8-element pieces: the tail.
	tail := all[:len(all)-3]
	in = newBufOf(t, env, tail)
	out = newBufOf(t, env, make([]float32, len(tail)))
	require.NoError(t, k.FromBF16(env.stream(), out.ptr(), in.ptr(), len(tail)))
	got = getAs[float32](t, out)
	for i := range tail {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			t.Fatalf("FromBF16 of %d: element %d = %#08x, want %#08x", len(tail), i, math.Float32bits(got[i]), math.Float32bits(want[i]))
		}
	}
	require.NoError(t, k.ToBF16(env.stream(), 0, 0, 0), "n = 0 queues nothing")
}

// layoutShape is one routing configuration of the layout tests.
type layoutShape struct {
	T, K, E, L, R, nodes int
	mask                 float64 // probability of a -1 entry
	skew                 bool    // most tokens pick among the first few experts
}

func (s layoutShape) String() string {
	return fmt.Sprintf("T%d_K%d_E%d_L%d_R%d_N%d_mask%.2f_skew%v", s.T, s.K, s.E, s.L, s.R, s.nodes, s.mask, s.skew)
}

var layoutShapes = []layoutShape{
	{T: 0, K: 2, E: 8, L: 2, R: 4, nodes: 2},
	{T: 1, K: 1, E: 1, L: 1, R: 1, nodes: 1},
	{T: 37, K: 2, E: 8, L: 2, R: 4, nodes: 2, mask: 0.2},
	{T: 200, K: 4, E: 16, L: 4, R: 4, nodes: 1},
	{T: 300, K: 8, E: 64, L: 8, R: 8, nodes: 2, mask: 0.1},
	{T: 150, K: 3, E: 6, L: 2, R: 4, nodes: 4, skew: true}, // the last rank owns no expert
	{T: 120, K: 2, E: 8, L: 1, R: 8, nodes: 8, mask: 1},    // every entry masked
	{T: 2500, K: 6, E: 32, L: 4, R: 8, nodes: 4, mask: 0.05, skew: true},
}

// randomTopK draws K distinct experts per token (-1 where K > E), each
// masked with probability mask.
func randomTopK(r *rand.Rand, s layoutShape) []int32 {
	topk := make([]int32, s.T*s.K)
	for t := 0; t < s.T; t++ {
		var perm []int
		if s.skew && r.IntN(4) != 0 {
			hot := min(s.E, s.K+1)
			perm = r.Perm(hot)
		} else {
			perm = r.Perm(s.E)
		}
		for k := 0; k < s.K; k++ {
			e := int32(-1)
			if k < len(perm) {
				e = int32(perm[k])
			}
			if r.Float64() < s.mask {
				e = -1
			}
			topk[t*s.K+k] = e
		}
	}
	return topk
}

// nodeOfRanks puts R ranks on `nodes` nodes, in contiguous blocks.
func nodeOfRanks(R, nodes int) []int32 {
	out := make([]int32, R)
	for r := range out {
		out[r] = int32(r * nodes / R)
	}
	return out
}

// layoutOut are Layout's outputs on the device.
type layoutOut struct {
	perExpert, perRank, perNode, pairOrd, tokRankOrd, tokNodeOrd, bad *dbuf
}

// runLayout runs Layout, with the outputs `want` names (all when nil).
func runLayout(t *testing.T, env kernelEnv, s layoutShape, topk []int32, nodeOf []int32, want map[string]bool) layoutOut {
	t.Helper()
	on := func(name string) bool { return want == nil || want[name] }
	buf := func(name string, n int) *dbuf {
		if !on(name) {
			return nil
		}
		b := make([]int32, n)
		for i := range b {
			b[i] = -7 // not a value any output has
		}
		return newBufOf(t, env, b)
	}
	o := layoutOut{
		perExpert: buf("perExpert", s.E), perRank: buf("perRank", s.R), perNode: buf("perNode", s.nodes),
		pairOrd: buf("pairOrd", s.T*s.K), tokRankOrd: buf("tokRankOrd", s.T*s.R), tokNodeOrd: buf("tokNodeOrd", s.T*s.nodes),
	}
	if on("bad") {
		o.bad = newBufOf(t, env, []uint64{12345})
	}
	in := newBufOf(t, env, topk)
	nodes := newBufOf(t, env, nodeOf)
	err := env.kernels().Layout(env.stream(), LayoutArgs{
		TopK: in.ptr(), Tokens: s.T, K: s.K, Experts: s.E, ExpertsPerRank: s.L, Ranks: s.R, NodeOf: nodes.ptr(), Nodes: s.nodes,
		PerExpert: ptrOf(o.perExpert), PerRank: ptrOf(o.perRank), PerNode: ptrOf(o.perNode),
		PairOrd: ptrOf(o.pairOrd), TokRankOrd: ptrOf(o.tokRankOrd), TokNodeOrd: ptrOf(o.tokNodeOrd), Bad: ptrOf(o.bad),
	})
	require.NoError(t, err)
	assert.Equal(t, topk, getAs[int32](t, in), "Layout changed its input")
	return o
}

func checkInt32(t *testing.T, name string, b *dbuf, want []int32) {
	t.Helper()
	if b == nil {
		return
	}
	got := getAs[int32](t, b)
	if !assert.Equal(t, len(want), len(got), name) {
		return
	}
	bad := 0
	for i := range want {
		if got[i] != want[i] {
			if bad++; bad <= 5 {
				t.Errorf("%s[%d] = %d, want %d", name, i, got[i], want[i])
			}
		}
	}
	if bad > 5 {
		t.Errorf("%s: %d entries differ in all", name, bad)
	}
}

func testLayout(t *testing.T, env kernelEnv) {
	r := newRand(2)
	for _, s := range layoutShapes {
		t.Run(s.String(), func(t *testing.T) {
			topk := randomTopK(r, s)
			nodeOf := nodeOfRanks(s.R, s.nodes)
			ref := refLayout(topk, s.T, s.K, s.E, s.L, s.R, nodeOf, s.nodes)
			require.EqualValues(t, -1, ref.bad)
			for _, outputs := range []map[string]bool{nil, {"perExpert": true, "perRank": true, "perNode": true}, {"pairOrd": true}, {"tokNodeOrd": true}} {
				o := runLayout(t, env, s, topk, nodeOf, outputs)
				checkInt32(t, "perExpert", o.perExpert, ref.perExpert)
				checkInt32(t, "perRank", o.perRank, ref.perRank)
				checkInt32(t, "perNode", o.perNode, ref.perNode)
				checkInt32(t, "pairOrd", o.pairOrd, ref.pairOrd)
				checkInt32(t, "tokRankOrd", o.tokRankOrd, ref.tokRankOrd)
				checkInt32(t, "tokNodeOrd", o.tokNodeOrd, ref.tokNodeOrd)
				if o.bad != nil {
					_, _, ok := DecodeBad(getAs[uint64](t, o.bad)[0])
					assert.True(t, ok, "valid ids reported bad")
				}
			}
		})
	}
}

func testLayoutBad(t *testing.T, env kernelEnv) {
	r := newRand(3)
	s := layoutShape{T: 300, K: 4, E: 16, L: 4, R: 4, nodes: 2, mask: 0.1}
	nodeOf := nodeOfRanks(s.R, s.nodes)
	for trial := 0; trial < 12; trial++ {
		topk := randomTopK(r, s)
		// One to three bad entries: out of range (E, -2, large) or repeated.
		for b := 0; b <= trial%3; b++ {
			i := r.IntN(len(topk))
			switch r.IntN(4) {
			case 0:
				topk[i] = int32(s.E)
			case 1:
				topk[i] = -2
			case 2:
				topk[i] = math.MaxInt32
			default:
				if i%s.K == 0 {
					i++
				}
				topk[i] = topk[i-1-r.IntN(i%s.K)]
				if topk[i] == -1 {
					topk[i] = -3
				}
			}
		}
		ref := refLayout(topk, s.T, s.K, s.E, s.L, s.R, nodeOf, s.nodes)
		require.GreaterOrEqual(t, ref.bad, int64(0))
		o := runLayout(t, env, s, topk, nodeOf, map[string]bool{"bad": true, "perExpert": true})
		idx, kind, ok := DecodeBad(getAs[uint64](t, o.bad)[0])
		if assert.False(t, ok, "trial %d: bad input not reported", trial) {
			assert.Equal(t, ref.bad, idx, "trial %d: first bad entry", trial)
			assert.Equal(t, ref.badKind, kind, "trial %d: kind of entry %d (id %d)", trial, idx, topk[ref.bad])
		}
	}
}

// rowData is n rows of random bytes.
func rowData(r *rand.Rand, n, rowBytes int) []byte {
	b := make([]byte, n*rowBytes)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// randomIndex draws n indices in [-1, rows+1], distinct among those in
// range when distinct is set (destinations).
func randomIndex(r *rand.Rand, n, rows int, distinct bool) []int32 {
	idx := make([]int32, n)
	perm := r.Perm(max(rows, n))
	for i := range idx {
		switch {
		case r.IntN(10) == 0:
			idx[i] = -1
		case r.IntN(20) == 0:
			idx[i] = int32(rows + r.IntN(2)) // past the end: skipped
		case distinct:
			idx[i] = int32(perm[i])
			if int(idx[i]) >= rows {
				idx[i] = -1
			}
		default:
			idx[i] = int32(r.IntN(max(rows, 1)))
		}
	}
	return idx
}

func testCopyRows(t *testing.T, env kernelEnv) {
	r := newRand(4)
	k := env.kernels()
	for _, rowBytes := range []int{16, 48, 4, 12, 7, 1, 1040} {
		for _, off := range []int{0, 4, 1} { // offset of both rows from a 16-byte boundary
			for _, mode := range []string{"identity", "gather", "scatter", "both"} {
				name := fmt.Sprintf("row%d_off%d_%s", rowBytes, off, mode)
				srcRows, dstRows, n := 1+r.IntN(80), 1+r.IntN(80), r.IntN(90)
				if mode == "identity" {
					n = min(srcRows, dstRows)
				}
				var srcIdx, dstIdx []int32
				if mode == "gather" || mode == "both" {
					srcIdx = randomIndex(r, n, srcRows, false)
				}
				if mode == "scatter" || mode == "both" {
					n = min(n, dstRows)
					dstIdx = randomIndex(r, n, dstRows, true)
				}
				src := rowData(r, srcRows*rowBytes+off, 1)
				dst := rowData(r, dstRows*rowBytes+off, 1)
				want := append([]byte(nil), dst...)
				refCopyRows(want[off:], dstIdx, dstRows, src[off:], srcIdx, srcRows, n, rowBytes)

				sb, db := newBuf(t, env, src), newBuf(t, env, dst)
				var si, di *dbuf
				if srcIdx != nil {
					si = newBufOf(t, env, srcIdx)
				}
				if dstIdx != nil {
					di = newBufOf(t, env, dstIdx)
				}
				require.NoError(t, k.CopyRows(env.stream(), CopyRowsArgs{
					Dst: db.ptr().Add(off), DstIdx: ptrOf(di), DstRows: dstRows,
					Src: sb.ptr().Add(off), SrcIdx: ptrOf(si), SrcRows: srcRows, N: n, RowBytes: rowBytes}), name)
				if got := db.get(t); !bytes.Equal(want, got) {
					t.Errorf("%s: destination differs from the reference", name)
				}
				assert.Equal(t, src, sb.get(t), "%s: source changed", name)
			}
		}
	}
}

func exclusiveSum(counts []int32, pad int) ([]int32, int) {
	base := make([]int32, len(counts))
	s := 0
	for i, c := range counts {
		base[i] = int32(s)
		s += int(c) + pad
	}
	return base, s
}

func testPackRows(t *testing.T, env kernelEnv) {
	r := newRand(5)
	k := env.kernels()
	for _, s := range layoutShapes {
		for _, rowBytes := range []int{32, 12, 5} {
			t.Run(fmt.Sprintf("%v_row%d", s, rowBytes), func(t *testing.T) {
				topk := randomTopK(r, s)
				nodeOf := nodeOfRanks(s.R, s.nodes)
				ref := refLayout(topk, s.T, s.K, s.E, s.L, s.R, nodeOf, s.nodes)
				x := rowData(r, s.T, rowBytes)
				xb := newBuf(t, env, x)

				// LL, expert-major: expert e's rows from base[e], padded by 3 rows.
				base, total := exclusiveSum(ref.perExpert, 3)
				dst := rowData(r, total, rowBytes)
				want := append([]byte(nil), dst...)
				refPackRows(want, total, x, ref.pairOrd, topk, base, s.E, s.T, s.K, rowBytes)
				// Independently of refPackRows: expert e's rows are its tokens, in token order.
				for e := 0; e < s.E; e++ {
					row := int(base[e])
					for tok := 0; tok < s.T; tok++ {
						for kk := 0; kk < s.K; kk++ {
							if topk[tok*s.K+kk] == int32(e) {
								require.Equal(t, x[tok*rowBytes:(tok+1)*rowBytes], want[row*rowBytes:(row+1)*rowBytes])
								row++
							}
						}
					}
				}
				db := newBuf(t, env, dst)
				ord, grp, bb := newBufOf(t, env, ref.pairOrd), newBufOf(t, env, topk), newBufOf(t, env, base)
				require.NoError(t, k.PackRows(env.stream(), PackRowsArgs{Dst: db.ptr(), DstRows: total, Src: xb.ptr(),
					Ord: ord.ptr(), Group: grp.ptr(), Base: bb.ptr(), Groups: s.E, Tokens: s.T, Width: s.K, RowBytes: rowBytes}))
				assert.True(t, bytes.Equal(want, db.get(t)), "LL expert-major rows differ from the reference")

				// HT, rank-grouped: rank r's rows from base[r]; a destination cut
				// short, so that rows past its end are skipped.
				base, total = exclusiveSum(ref.perRank, 0)
				rows := total - total/5
				dst = rowData(r, rows, rowBytes)
				want = append([]byte(nil), dst...)
				refPackRows(want, rows, x, ref.tokRankOrd, nil, base, s.R, s.T, s.R, rowBytes)
				db = newBuf(t, env, dst)
				ord, bb = newBufOf(t, env, ref.tokRankOrd), newBufOf(t, env, base)
				require.NoError(t, k.PackRows(env.stream(), PackRowsArgs{Dst: db.ptr(), DstRows: rows, Src: xb.ptr(),
					Ord: ord.ptr(), Base: bb.ptr(), Tokens: s.T, Width: s.R, RowBytes: rowBytes}))
				assert.True(t, bytes.Equal(want, db.get(t)), "HT rank-grouped rows differ from the reference")
				assert.Equal(t, x, xb.get(t), "source changed")
			})
		}
	}
	// Groups out of range and no base: arbitrary group arrays, and distinct
	// ordinals (two items must not write one row) from -2 to past the end.
	T, W, rowBytes, groups, rows := 50, 3, 8, 4, 40
	ordv, grpv := make([]int32, T*W), make([]int32, T*W)
	perm := r.Perm(T*W + 4)
	for i := range ordv {
		ordv[i] = int32(perm[i] - 2)
		grpv[i] = int32(r.IntN(groups+3) - 1)
	}
	x, dst := rowData(r, T, rowBytes), rowData(r, rows, rowBytes)
	want := append([]byte(nil), dst...)
	refPackRows(want, rows, x, ordv, grpv, nil, groups, T, W, rowBytes)
	xb, db := newBuf(t, env, x), newBuf(t, env, dst)
	ob, gb := newBufOf(t, env, ordv), newBufOf(t, env, grpv)
	require.NoError(t, k.PackRows(env.stream(), PackRowsArgs{Dst: db.ptr(), DstRows: rows, Src: xb.ptr(), Ord: ob.ptr(),
		Group: gb.ptr(), Groups: groups, Tokens: T, Width: W, RowBytes: rowBytes}))
	assert.True(t, bytes.Equal(want, db.get(t)), "rows with groups out of range, no base")
}

func testRowPointers(t *testing.T, env kernelEnv) {
	r := newRand(6)
	k := env.kernels()
	const base = 0x7f12_3456_0000
	for _, n := range []int{1, 255, 1000} {
		for _, withIdx := range []bool{false, true} {
			var idx []int32
			var ib *dbuf
			if withIdx {
				idx = randomIndex(r, n, 5000, false)
				ib = newBufOf(t, env, idx)
			}
			want := refRowPtrs(base, idx, n, 96)
			out := newBufOf(t, env, make([]uint64, n))
			require.NoError(t, k.RowPointers(env.stream(), out.ptr(), base, ptrOf(ib), n, 96))
			assert.Equal(t, want, getAs[uint64](t, out), "n %d, index %v", n, withIdx)
		}
	}
}

// reduceCase is one ReduceRows configuration.
type reduceCase struct {
	in, out     DType
	n, hidden   int
	maxSrc      int  // sources per output row: 0 to maxSrc
	weights     bool // else nil (all ones)
	specials    bool // NaN, infinities and signed zeros among the inputs
	nullSources bool // some source addresses 0 (skipped)
}

func testReduceRows(t *testing.T, env kernelEnv) {
	var cases []reduceCase
	for _, in := range []DType{F32, BF16} {
		for _, out := range []DType{F32, BF16} {
			cases = append(cases,
				reduceCase{in: in, out: out, n: 40, hidden: 33, maxSrc: 4, weights: true},
				reduceCase{in: in, out: out, n: 25, hidden: 300, maxSrc: 9, weights: false},
				reduceCase{in: in, out: out, n: 30, hidden: 7, maxSrc: 3, weights: true, specials: true, nullSources: true},
				reduceCase{in: in, out: out, n: 3, hidden: 1030, maxSrc: 2, weights: true},
				// Rows of whole 16-byte pieces: the vector path.
				reduceCase{in: in, out: out, n: 30, hidden: 136, maxSrc: 9, weights: true, specials: true, nullSources: true},
				reduceCase{in: in, out: out, n: 12, hidden: 2048, maxSrc: 8, weights: false},
			)
		}
	}
	r := newRand(7)
	for _, c := range cases {
		name := fmt.Sprintf("%v_to_%v_n%d_h%d_src%d_w%v_special%v_null%v", c.in, c.out, c.n, c.hidden, c.maxSrc, c.weights, c.specials, c.nullSources)
		t.Run(name, func(t *testing.T) { checkReduce(t, env, r, c) })
	}
}

func checkReduce(t *testing.T, env kernelEnv, r *rand.Rand, c reduceCase) {
	k := env.kernels()
	// Source rows: a pool of random rows, each source of each output row
	// pointing at one (repeats allowed).
	pool := 2*c.n + 1
	vals := make([]float32, pool*c.hidden)
	for i := range vals {
		vals[i] = float32(r.NormFloat64())
		if c.specials && r.IntN(50) == 0 {
			vals[i] = []float32{float32(math.NaN()), float32(math.Inf(1)), float32(math.Inf(-1)), float32(math.Copysign(0, -1))}[r.IntN(4)]
		}
	}
	var poolBytes []byte
	var widened []float32 // the values as the kernel reads them
	if c.in == F32 {
		poolBytes, widened = append([]byte(nil), bytesOf(vals)...), vals
	} else {
		h := refToBF16(vals)
		poolBytes, widened = append([]byte(nil), bytesOf(h)...), refFromBF16(h)
	}
	pb := newBuf(t, env, poolBytes)
	rowBytes := c.hidden * c.in.Size()

	start := make([]int32, c.n+1)
	var addrs []uint64
	var srcRows [][]float32
	var w []float32
	for i := 0; i < c.n; i++ {
		m := r.IntN(c.maxSrc + 1)
		if i%7 == 0 {
			m = 0 // rows with no source: zero
		} else if i%7 == 1 {
			m = 1 // one source: a copy when its weight is 1
		}
		for j := 0; j < m; j++ {
			p := r.IntN(pool)
			if c.nullSources && r.IntN(6) == 0 {
				addrs, srcRows = append(addrs, 0), append(srcRows, nil)
			} else {
				addrs = append(addrs, uint64(pb.ptr())+uint64(p*rowBytes))
				srcRows = append(srcRows, widened[p*c.hidden:(p+1)*c.hidden])
			}
			switch r.IntN(5) {
			case 0:
				w = append(w, 1)
			case 1:
				w = append(w, 0)
			default:
				w = append(w, float32(r.NormFloat64()))
			}
		}
		start[i+1] = int32(len(addrs))
	}
	if !c.weights {
		w = nil
	}
	ref := refReduceRows(srcRows, w, start, c.n, c.hidden)

	var wb *dbuf
	if w != nil {
		wb = newBufOf(t, env, w)
	}
	ab := newBufOf(t, env, append(addrs, 0)) // never empty
	sb := newBufOf(t, env, start)
	ob := newBuf(t, env, rowData(r, c.n*c.hidden*c.out.Size(), 1))
	require.NoError(t, k.ReduceRows(env.stream(), ReduceArgs{Out: ob.ptr(), OutType: c.out, Src: ab.ptr(), Weights: ptrOf(wb),
		Start: sb.ptr(), N: c.n, Hidden: c.hidden, InType: c.in}))
	bad := 0
	if c.out == F32 {
		got := getAs[float32](t, ob)
		for i := range ref {
			if !sameF32(got[i], ref[i]) {
				if bad++; bad <= 5 {
					t.Errorf("out[%d][%d] = %v (%#08x), want %v (%#08x)", i/c.hidden, i%c.hidden, got[i], math.Float32bits(got[i]), ref[i], math.Float32bits(ref[i]))
				}
			}
		}
	} else {
		got := getAs[uint16](t, ob)
		want := refToBF16(ref)
		for i := range want {
			if !sameBF16(got[i], want[i]) {
				if bad++; bad <= 5 {
					t.Errorf("out[%d][%d] = %#04x, want %#04x", i/c.hidden, i%c.hidden, got[i], want[i])
				}
			}
		}
	}
	if bad > 5 {
		t.Errorf("%d elements differ in all", bad)
	}
	assert.Equal(t, poolBytes, pb.get(t), "sources changed")
}

// testDispatchCombine chains the kernels as a low-latency dispatch and
// combine on one rank would, all on the device: Layout, PackRows into
// expert-major rows, identity experts, RowPointers to each (token, slot)'s
// row, then ReduceRows with the top-k weights. Every token comes back as
// the weighted sum of its copies, bit for bit as the reference computes it.
func testDispatchCombine(t *testing.T, env kernelEnv) {
	r := newRand(8)
	k := env.kernels()
	s := layoutShape{T: 96, K: 4, E: 16, L: 4, R: 4, nodes: 2, mask: 0.15}
	const hidden = 64
	topk := randomTopK(r, s)
	nodeOf := nodeOfRanks(s.R, s.nodes)
	ref := refLayout(topk, s.T, s.K, s.E, s.L, s.R, nodeOf, s.nodes)
	x := make([]float32, s.T*hidden)
	for i := range x {
		x[i] = float32(r.NormFloat64())
	}
	w := make([]float32, s.T*s.K)
	for i := range w {
		w[i] = r.Float32()
	}

	// Layout on the device; the expert bases from its counts (on the host,
	// as the host would size the receive buffers).
	o := runLayout(t, env, s, topk, nodeOf, map[string]bool{"perExpert": true, "pairOrd": true})
	perExpert := getAs[int32](t, o.perExpert)
	base, total := exclusiveSum(perExpert, 0)
	xb, tb, bb := newBufOf(t, env, x), newBufOf(t, env, topk), newBufOf(t, env, base)
	recv := newBufOf(t, env, make([]float32, max(total, 1)*hidden))
	require.NoError(t, k.PackRows(env.stream(), PackRowsArgs{Dst: recv.ptr(), DstRows: total, Src: xb.ptr(), Ord: o.pairOrd.ptr(),
		Group: tb.ptr(), Base: bb.ptr(), Groups: s.E, Tokens: s.T, Width: s.K, RowBytes: hidden * 4}))

	// Combine: source j = t*K+k is row base[e]+pairOrd of the expert output.
	idx := make([]int32, s.T*s.K)
	start := make([]int32, s.T+1)
	var srcRows [][]float32
	for j := range idx {
		idx[j] = -1
		if e := topk[j]; e >= 0 {
			idx[j] = base[e] + ref.pairOrd[j]
		}
		if idx[j] >= 0 {
			tok := j / s.K
			srcRows = append(srcRows, x[tok*hidden:(tok+1)*hidden])
		} else {
			srcRows = append(srcRows, nil)
		}
	}
	for tok := range start {
		start[tok] = int32(tok * s.K)
	}
	ib := newBufOf(t, env, idx)
	ptrs := newBufOf(t, env, make([]uint64, len(idx)))
	require.NoError(t, k.RowPointers(env.stream(), ptrs.ptr(), recv.ptr(), ib.ptr(), len(idx), hidden*4))
	wb, sb := newBufOf(t, env, w), newBufOf(t, env, start)
	out := newBufOf(t, env, make([]float32, s.T*hidden))
	require.NoError(t, k.ReduceRows(env.stream(), ReduceArgs{Out: out.ptr(), OutType: F32, Src: ptrs.ptr(), Weights: wb.ptr(),
		Start: sb.ptr(), N: s.T, Hidden: hidden, InType: F32}))
	want := refReduceRows(srcRows, w, start, s.T, hidden)
	got := getAs[float32](t, out)
	for i := range want {
		if !sameF32(got[i], want[i]) {
			t.Fatalf("token %d, element %d: %v, want %v", i/hidden, i%hidden, got[i], want[i])
		}
	}
	// And, to within rounding, x times the sum of the token's weights.
	for tok := 0; tok < s.T; tok++ {
		var sw float64
		for kk := 0; kk < s.K; kk++ {
			if topk[tok*s.K+kk] >= 0 {
				sw += float64(w[tok*s.K+kk])
			}
		}
		for h := 0; h < hidden; h++ {
			assert.InDelta(t, sw*float64(x[tok*hidden+h]), float64(got[tok*hidden+h]), 1e-5*(1+math.Abs(sw*float64(x[tok*hidden+h]))))
		}
	}
}

func testHTMeta(t *testing.T, env kernelEnv) {
	r := newRand(9)
	k := env.kernels()
	for _, c := range []struct {
		n, srcRows, K, L, R int
		rows, srcTok        bool
	}{
		{n: 0, srcRows: 4, K: 2, L: 2, R: 2},
		{n: 1, srcRows: 1, K: 1, L: 1, R: 1},
		{n: 57, srcRows: 57, K: 3, L: 2, R: 4, srcTok: true},
		{n: 40, srcRows: 90, K: 4, L: 4, R: 3, rows: true},
		{n: 300, srcRows: 500, K: 8, L: 8, R: 8, rows: true, srcTok: true},
	} {
		for d := 0; d < c.R; d++ {
			name := fmt.Sprintf("n%d_src%d_K%d_L%d_rank%d_of%d_rows%v_tok%v", c.n, c.srcRows, c.K, c.L, d, c.R, c.rows, c.srcTok)
			s := layoutShape{T: c.srcRows, K: c.K, E: c.L * c.R, L: c.L, R: c.R, nodes: 1, mask: 0.2}
			srcTopK := randomTopK(r, s)
			srcW := make([]float32, len(srcTopK))
			for i := range srcW {
				srcW[i] = r.Float32() + 0.5 // never zero: a zeroed weight is the kernel's
			}
			var rows, srcTok []int32
			if c.rows {
				rows = make([]int32, c.n)
				for i := range rows {
					rows[i] = int32(r.IntN(c.srcRows))
				}
			}
			if c.srcTok {
				srcTok = make([]int32, c.srcRows)
				for i := range srcTok {
					srcTok[i] = int32(r.IntN(1000))
				}
			}
			wantTok, wantTopK, wantW := refHTMeta(rows, c.n, srcTok, srcTopK, srcW, c.K, c.L, d)
			n1 := max(c.n, 1)
			tokB, topkB := newBufOf(t, env, make([]int32, n1)), newBufOf(t, env, make([]int32, n1*c.K))
			wB := newBufOf(t, env, make([]float32, n1*c.K))
			var rowsB, srcTokB *dbuf
			if rows != nil {
				rowsB = newBufOf(t, env, rows)
			}
			if srcTok != nil {
				srcTokB = newBufOf(t, env, srcTok)
			}
			stB, swB := newBufOf(t, env, srcTopK), newBufOf(t, env, srcW)
			require.NoError(t, k.HTMeta(env.stream(), HTMetaArgs{TokOut: tokB.ptr(), TopKOut: topkB.ptr(), WOut: wB.ptr(),
				Rows: ptrOf(rowsB), N: c.n, SrcTok: ptrOf(srcTokB), SrcTopK: stB.ptr(), SrcW: swB.ptr(), K: c.K, L: c.L, Rank: d}), name)
			if c.n == 0 {
				continue
			}
			checkInt32(t, name+" tok", tokB, wantTok)
			checkInt32(t, name+" topk", topkB, wantTopK)
			assert.Equal(t, wantW, getAs[float32](t, wB), name+" weights")
			assert.Equal(t, srcTopK, getAs[int32](t, stB), name+": source changed")
		}
	}
}

func testCountLocal(t *testing.T, env kernelEnv) {
	r := newRand(10)
	k := env.kernels()
	for _, c := range []struct{ n, K, L int }{{0, 3, 4}, {1, 1, 1}, {77, 3, 4}, {2000, 8, 16}} {
		topk := make([]int32, c.n*c.K)
		for i := range topk {
			topk[i] = int32(r.IntN(c.L+3) - 2) // -2 .. L: out-of-range entries are not counted
		}
		counts := make([]int32, c.L)
		for i := range counts {
			counts[i] = 99 // the kernel zeroes them first
		}
		cb := newBufOf(t, env, counts)
		tb := newBufOf(t, env, append(topk, 0))
		require.NoError(t, k.CountLocal(env.stream(), cb.ptr(), tb.ptr(), c.n, c.K, c.L))
		checkInt32(t, fmt.Sprintf("counts n%d K%d L%d", c.n, c.K, c.L), cb, refCountLocal(topk, c.L))
	}
}

// llBlocks draws what R sources send to one rank of L experts: each source
// t0 tokens at most, each to up to min(K, L) of the rank's experts.
func llBlocks(r *rand.Rand, R, L, K, M int, op uint32) ([]llBlock, int) {
	cap := M * min(K, L)
	blocks := make([]llBlock, R)
	for s := range blocks {
		b := llBlock{op: op, counts: make([]int32, L)}
		T := r.IntN(M + 1)
		if s%3 == 1 {
			T = 0
		}
		perExpert := make([][]int32, L)
		for tok := 0; tok < T; tok++ {
			for _, l := range r.Perm(L)[:r.IntN(min(K, L)+1)] {
				perExpert[l] = append(perExpert[l], int32(tok))
			}
		}
		for l, toks := range perExpert {
			b.counts[l] = int32(len(toks))
			for _, tok := range toks {
				b.tok = append(b.tok, tok)
				b.w = append(b.w, float32(tok)/8+float32(l))
			}
		}
		blocks[s] = b
	}
	return blocks, cap
}

func runLLPlace(t *testing.T, env kernelEnv, blocks []llBlock, cap, M int, op uint32) (dst, tok, w *dbuf, counts []int32, bad uint64) {
	t.Helper()
	R, L := len(blocks), len(blocks[0].counts)
	mw := LLMetaWords(L, cap)
	var meta []int32
	for _, b := range blocks {
		meta = append(meta, b.words(mw, cap)...)
	}
	span := R * M
	mb := newBufOf(t, env, meta)
	dst = newBufOf(t, env, make([]int32, R*cap))
	tok, w = newBufOf(t, env, make([]int32, L*span)), newBufOf(t, env, make([]float32, L*span))
	cb := newBufOf(t, env, make([]int32, R*L))
	bb := newBufOf(t, env, []uint64{0})
	require.NoError(t, env.kernels().LLPlace(env.stream(), LLPlaceArgs{Meta: mb.ptr(), R: R, L: L, Cap: cap, MetaWords: mw, Span: span,
		Op: op, DstRow: dst.ptr(), TokOut: tok.ptr(), WOut: w.ptr(), Counts: cb.ptr(), Bad: bb.ptr()}))
	assert.Equal(t, meta, getAs[int32](t, mb), "LLPlace changed its input")
	return dst, tok, w, getAs[int32](t, cb), getAs[uint64](t, bb)[0]
}

func testLLPlace(t *testing.T, env kernelEnv) {
	r := newRand(11)
	for _, c := range []struct{ R, L, K, M int }{{1, 1, 1, 1}, {2, 3, 2, 16}, {4, 2, 3, 9}, {8, 4, 8, 24}, {3, 5, 1, 40}} {
		name := fmt.Sprintf("R%d_L%d_K%d_M%d", c.R, c.L, c.K, c.M)
		op := uint32(7 + c.R)
		blocks, cap := llBlocks(r, c.R, c.L, c.K, c.M, op)
		wantDst, wantTok, wantW, wantCounts := refLLPlace(blocks, cap, c.R*c.M)
		dst, tok, w, counts, bad := runLLPlace(t, env, blocks, cap, c.M, op)
		assert.Equal(t, ^uint64(0), bad, name+": current blocks reported stale")
		checkInt32(t, name+" dstRow", dst, wantDst)
		checkInt32(t, name+" tok", tok, wantTok)
		assert.Equal(t, wantW, getAs[float32](t, w), name+" weights")
		assert.Equal(t, wantCounts, counts, name+" counts")
	}
}

// A block of another call, or whose counts do not fit, is reported (the
// lowest such source) and none of its rows is placed.
func testLLPlaceStale(t *testing.T, env kernelEnv) {
	r := newRand(12)
	const R, L, K, M, op = 5, 3, 2, 8, 41
	for _, c := range []struct {
		name string
		edit func(b []llBlock)
		want uint64
	}{
		{"older call", func(b []llBlock) { b[3].op = op - 2 }, 3},
		{"two stale", func(b []llBlock) { b[4].op, b[2].op = 0, op+1 }, 2},
		{"negative count", func(b []llBlock) { b[1].counts[2] = -1 }, 1},
		{"counts over capacity", func(b []llBlock) { b[0].counts[0] = M*min(K, L) + 1 }, 0},
	} {
		blocks, cap := llBlocks(r, R, L, K, M, op)
		c.edit(blocks)
		dst, _, _, _, bad := runLLPlace(t, env, blocks, cap, M, op)
		assert.Equal(t, c.want, bad, c.name)
		rows := getAs[int32](t, dst)
		for p := 0; p < cap; p++ {
			assert.Equal(t, int32(-1), rows[int(c.want)*cap+p], "%s: a row of the bad block was placed", c.name)
		}
	}
}
