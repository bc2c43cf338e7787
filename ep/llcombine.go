package ep

// llCombineWire is how LL's combine carries the expert outputs back to
// their token ranks, as rowFormat is how the dispatch carries the rows
// out: the element type as it is (nativeCombine), or FP8 codes with their
// scales, cast once by the expert rank (fp8Combine, Config.CombineWire);
// a new format is one more implementation. The mode says which rows go
// where; the format says what the token ranks read and how they sum it.
type llCombineWire interface {
	// takeAreas lays out the format's own areas of buffer set b: rows of
	// outputs in the segment, staged of those from other nodes.
	takeAreas(seg, win *arena, b int, set string, rows, staged int)
	// encode makes set b's valid rows of area, this rank's outputs,
	// readable by their token ranks, and says where they read them: in
	// this rank's segment, and staged in another node's window.
	encode(m *llMode, b int, st *llState, area region) (out, staged rowArea)
	// source points pair n of tab at the output in row of owner's area
	// (at pos of the staged rows, where owner is on another node).
	source(t *transport, tab *reduceTables, n, owner, b int, area region, row, pos int, cstage region)
	// reduce sums each token's pairs of tab into out, [T][H] of elem.
	reduce(tab *reduceTables, out ptr, elem DType, T, H int)
}

// newLLCombineWire is the format of s's LL combines.
func newLLCombineWire(s Spec) llCombineWire {
	if s.CombineWire.FP8() {
		return &fp8Combine{hidden: s.Hidden, elem: s.Elem, wire: s.CombineWire}
	}
	return nativeCombine{}
}

// nativeCombine: the outputs travel in the element type, read where the
// expert rank wrote them.
type nativeCombine struct{}

func (nativeCombine) takeAreas(*arena, *arena, int, string, int, int) {}

func (nativeCombine) encode(m *llMode, b int, _ *llState, area region) (rowArea, rowArea) {
	return rowArea{rows: area}, rowArea{rows: m.cstage[b]}
}

func (nativeCombine) source(t *transport, tab *reduceTables, n, owner, _ int, area region, row, pos int, cstage region) {
	tab.src[n] = t.exposed(owner, area.at(row), cstage.at(pos))
}

func (nativeCombine) reduce(tab *reduceTables, out ptr, elem DType, T, H int) {
	tab.reduce(out, elem, T, H, elem)
}

// fp8Combine: the expert rank casts each valid output once to e4m3 codes
// with one float32 scale per 128 elements ([L][span] rows in its segment,
// [M*K] staged by other nodes); the token rank sums them dequantized.
type fp8Combine struct {
	hidden        int
	elem          DType
	wire          WireFormat
	codes, staged [2]rowArea
	cast          castQueue
}

func (f *fp8Combine) takeAreas(seg, win *arena, b int, set string, rows, staged int) {
	f.codes[b] = seg.takeRows("LL expert outputs in FP8"+set, rows, fp8Sizes(f.hidden))
	f.staged[b] = win.takeRows("LL expert outputs in FP8 from other nodes"+set, staged, fp8Sizes(f.hidden))
}

func (f *fp8Combine) encode(m *llMode, b int, st *llState, area region) (rowArea, rowArea) {
	t := &m.e.t
	for l, n := range st.expert { // every valid row, once, whoever reads it
		for r := l * m.span; r < l*m.span+n; r++ {
			f.cast.add(t.lsa(t.me, f.codes[b].rows.at(r)), t.lsa(t.me, f.codes[b].side.at(r)), int64(area.at(r)))
		}
	}
	f.cast.flush(t.segBytes, f.hidden, f.elem, f.wire)
	return f.codes[b], f.staged[b]
}

func (f *fp8Combine) source(t *transport, tab *reduceTables, n, owner, b int, _ region, row, pos int, _ region) {
	tab.src[n] = t.exposed(owner, f.codes[b].rows.at(row), f.staged[b].rows.at(pos))
	tab.scl[n] = t.exposed(owner, f.codes[b].side.at(row), f.staged[b].side.at(pos))
}

func (f *fp8Combine) reduce(tab *reduceTables, out ptr, elem DType, T, H int) {
	tab.reduceFP8(out, elem, T, H)
}
