package epcpu

import (
	"unsafe"

	"github.com/goep/goep/ep/driver"
	"github.com/goep/goep/ep/internal/hostrows"
)

// llCombineWire is how LL's combine carries the expert outputs back to
// their token ranks, as RowFormat is how the dispatch carries the rows
// out: the element type as it is (nativeCombine), or FP8 codes with their
// scales, cast once by the expert rank (fp8Combine, Config.CombineWire);
// a new format is one more implementation. The mode says which rows go
// where; the format says what the token ranks read and how they sum it.
type llCombineWire interface {
	// takeAreas lays out the format's own areas of buffer set b: rows of
	// outputs in the segment, staged of those from other nodes.
	takeAreas(seg, win *hostrows.Arena, b int, set string, rows, staged int)
	// encode makes set b's valid rows of area, this rank's outputs,
	// readable by their token ranks, and says where they read them: in
	// this rank's segment, and staged in another node's window.
	encode(m *llMode, b int, st *llState, area hostrows.Region) (out, staged hostrows.RowArea)
	// source points pair n of tab at the output in row of owner's area
	// (at pos of the staged rows, where owner is on another node).
	source(t *transport, tab *hostrows.ReduceTables, n, owner, b int, area hostrows.Region, row, pos int, cstage hostrows.Region)
	// reduce sums each token's pairs of tab into out, [T][H] of elem.
	reduce(tab *hostrows.ReduceTables, out ptr, elem driver.DType, T, H int)
}

// newLLCombineWire is the format of s's LL combines.
func newLLCombineWire(s driver.Spec) llCombineWire {
	switch {
	case s.CombineWire.FP8():
		return &fp8Combine{hidden: s.Hidden, elem: s.Elem, wire: s.CombineWire}
	case s.CombineWire == driver.WireNVFP4:
		return &nvfp4Combine{hidden: s.Hidden, elem: s.Elem, x: make([]float32, s.Hidden), acc: make([]float32, s.Hidden)}
	}
	return nativeCombine{}
}

// nativeCombine: the outputs travel in the element type, read where the
// expert rank wrote them.
type nativeCombine struct{}

func (nativeCombine) takeAreas(*hostrows.Arena, *hostrows.Arena, int, string, int, int) {}

func (nativeCombine) encode(m *llMode, b int, _ *llState, area hostrows.Region) (hostrows.RowArea, hostrows.RowArea) {
	return hostrows.RowArea{Rows: area}, hostrows.RowArea{Rows: m.cstage[b]}
}

func (nativeCombine) source(t *transport, tab *hostrows.ReduceTables, n, owner, _ int, area hostrows.Region, row, pos int, cstage hostrows.Region) {
	tab.Src[n] = t.exposed(owner, area.At(row), cstage.At(pos))
}

func (nativeCombine) reduce(tab *hostrows.ReduceTables, out ptr, elem driver.DType, T, H int) {
	tab.Reduce(out, elem, T, H, elem)
}

// fp8Combine: the expert rank casts each valid output once to e4m3 codes
// with one float32 scale per 128 elements ([L][span] rows in its segment,
// [M*K] staged by other nodes); the token rank sums them dequantized.
type fp8Combine struct {
	hidden        int
	elem          driver.DType
	wire          driver.WireFormat
	codes, staged [2]hostrows.RowArea
	cast          hostrows.CastQueue
}

func (f *fp8Combine) takeAreas(seg, win *hostrows.Arena, b int, set string, rows, staged int) {
	f.codes[b] = seg.TakeRows("LL expert outputs in FP8"+set, rows, hostrows.FP8Sizes(f.hidden))
	f.staged[b] = win.TakeRows("LL expert outputs in FP8 from other nodes"+set, staged, hostrows.FP8Sizes(f.hidden))
}

func (f *fp8Combine) encode(m *llMode, b int, st *llState, area hostrows.Region) (hostrows.RowArea, hostrows.RowArea) {
	t := &m.e.t
	for l, n := range st.expert { // every valid row, once, whoever reads it
		for r := l * m.span; r < l*m.span+n; r++ {
			f.cast.Add(t.lsa(t.me, f.codes[b].Rows.At(r)), t.lsa(t.me, f.codes[b].Side.At(r)), int64(area.At(r)))
		}
	}
	f.cast.Flush(t.segBytes, f.hidden, f.elem, f.wire)
	return f.codes[b], f.staged[b]
}

func (f *fp8Combine) source(t *transport, tab *hostrows.ReduceTables, n, owner, b int, _ hostrows.Region, row, pos int, _ hostrows.Region) {
	tab.Src[n] = t.exposed(owner, f.codes[b].Rows.At(row), f.staged[b].Rows.At(pos))
	tab.Scl[n] = t.exposed(owner, f.codes[b].Side.At(row), f.staged[b].Side.At(pos))
}

func (f *fp8Combine) reduce(tab *hostrows.ReduceTables, out ptr, elem driver.DType, T, H int) {
	tab.ReduceFP8(out, elem, T, H)
}

// nvfp4Combine: the expert rank casts each valid output once to NVFP4
// (driver.EncodeNVFP4: e2m1 codes, an e4m3 scale per 16 elements, a
// float32 scale per row; [L][span] rows in its segment, [M*K] staged by
// other nodes); the token rank sums their values (the format's Decode)
// times the weights in float32, in top-k order, rounded once. The cast and
// the sum are Go loops over whole rows.
type nvfp4Combine struct {
	hidden        int
	elem          driver.DType
	codes, staged [2]hostrows.RowArea
	x, acc        []float32 // a row in float32: the one cast, and the one summed
}

// nvfp4Sizes are the sizes of a row of WireNVFP4.
type nvfp4Sizes int

func (h nvfp4Sizes) RowBytes() int  { return int(h) / 2 }
func (h nvfp4Sizes) SideBytes() int { return 4 + int(h)/16 }

func (f *nvfp4Combine) takeAreas(seg, win *hostrows.Arena, b int, set string, rows, staged int) {
	f.codes[b] = seg.TakeRows("LL expert outputs in NVFP4"+set, rows, nvfp4Sizes(f.hidden))
	f.staged[b] = win.TakeRows("LL expert outputs in NVFP4 from other nodes"+set, staged, nvfp4Sizes(f.hidden))
}

func (f *nvfp4Combine) encode(m *llMode, b int, st *llState, area hostrows.Region) (hostrows.RowArea, hostrows.RowArea) {
	t, H, a := &m.e.t, f.hidden, f.codes[b]
	for l, n := range st.expert { // every valid row, once, whoever reads it
		for r := l * m.span; r < l*m.span+n; r++ {
			f.toF32(t.lsa(t.me, area.At(r)))
			driver.EncodeNVFP4(unsafe.Slice((*byte)(t.lsa(t.me, a.Rows.At(r))), H/2), unsafe.Slice((*byte)(t.lsa(t.me, a.Side.At(r))), 4+H/16), f.x)
		}
	}
	return f.codes[b], f.staged[b]
}

// toF32 reads a row of the element type at p into f.x.
func (f *nvfp4Combine) toF32(p ptr) {
	if f.elem == driver.BFloat16 {
		hostrows.BF16ToF32(unsafe.Pointer(unsafe.SliceData(f.x)), p, f.hidden)
		return
	}
	copy(f.x, unsafe.Slice((*float32)(p), f.hidden))
}

func (f *nvfp4Combine) source(t *transport, tab *hostrows.ReduceTables, n, owner, b int, _ hostrows.Region, row, pos int, _ hostrows.Region) {
	tab.Src[n] = t.exposed(owner, f.codes[b].Rows.At(row), f.staged[b].Rows.At(pos))
	tab.Scl[n] = t.exposed(owner, f.codes[b].Side.At(row), f.staged[b].Side.At(pos))
}

func (f *nvfp4Combine) reduce(tab *hostrows.ReduceTables, out ptr, elem driver.DType, T, H int) {
	info, _ := driver.WireNVFP4.Info()
	for i := 0; i < T; i++ {
		clear(f.acc)
		for j := tab.Start[i]; j < tab.Start[i+1]; j++ {
			info.Decode(f.x, unsafe.Slice((*byte)(tab.Src[j]), H/2), unsafe.Slice((*byte)(tab.Scl[j]), 4+H/16))
			w := tab.W[j]
			if j == tab.Start[i] {
				for c, v := range f.x {
					f.acc[c] = float32(w * v)
				}
				continue
			}
			for c, v := range f.x {
				f.acc[c] = f.acc[c] + float32(w*v) // the product rounded: never fused
			}
		}
		o := unsafe.Add(out, i*H*elem.Size())
		if elem == driver.BFloat16 {
			hostrows.F32ToBF16(o, unsafe.Pointer(unsafe.SliceData(f.acc)), H)
		} else {
			copy(unsafe.Slice((*float32)(o), H), f.acc)
		}
	}
}
