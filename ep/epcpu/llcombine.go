package epcpu

import (
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
	if s.CombineWire.FP8() {
		return &fp8Combine{hidden: s.Hidden, elem: s.Elem, wire: s.CombineWire}
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
