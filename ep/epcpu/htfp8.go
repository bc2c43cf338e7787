package epcpu

import (
	"github.com/goep/goep/ep/driver"
	"github.com/goep/goep/ep/internal/hostrows"
)

// htFP8Combine is HT's combine in an FP8 CombineWire. Each rank casts its
// partial outputs once, as Quantize does, to e4m3 codes with a float32
// scale per 128 elements, which its node's ranks read in place. A rail
// peer sums its node's partials of each token forwarded for another node
// (their float32 values, code times scale, in float32, in rank then slot
// order), rounds the sum to the element type and casts it before it
// crosses (also where the node's only partial is the rail peer's own, so
// that the result does not depend on the transport). The token's rank then sums, node by
// node (ranks in local order on its own node), the float32 values of its
// node's partials and of the other nodes' sums, in float32, rounded once
// to the element type. Every row crosses nodes as codes and scales.
type htFP8Combine struct {
	wire     driver.WireFormat
	partials hostrows.RowArea // segment [maxRecv]: this rank's partial outputs, cast
	sumsOut  hostrows.RowArea // segment: the rail sums, cast, row for row with htMode.sumsOut
	sums     hostrows.RowArea // window [nodes][M]: the sums of this rank's tokens from other nodes
	cast     hostrows.CastQueue
	scl      hostrows.AddrTable // the scales of the sources in htMode.src
	add      func(r, row int)   // adds row of node rank r's cast partials to htMode.src, scl and vals2
}

// newHTFP8Combine is the FP8 combine of s's HT groups; nil where s's
// combine moves the element type.
func newHTFP8Combine(s driver.Spec) *htFP8Combine {
	if !s.CombineWire.FP8() {
		return nil
	}
	return &htFP8Combine{wire: s.CombineWire}
}

// takeAreas places its areas beside HT's: rows partials, sumsOut rail sums,
// sums staged ones.
func (f *htFP8Combine) takeAreas(m *htMode, seg, win *hostrows.Arena, rows, sumsOut, sums int) {
	sizes := hostrows.FP8Sizes(m.H)
	f.partials = seg.TakeRows("HT partial outputs in FP8", rows, sizes)
	if sumsOut > 0 {
		f.sumsOut = seg.TakeRows("HT sums for other nodes in FP8", sumsOut, sizes)
	}
	f.sums = win.TakeRows("HT sums from other nodes in FP8", sums, sizes)
	f.cast.Dst.Reserve(max(rows, sumsOut))
	f.cast.Scales.Reserve(max(rows, sumsOut))
	f.cast.SrcOff = make([]int64, 0, max(rows, sumsOut))
	f.add = func(r, row int) {
		t := &m.e.t
		m.src.Add(t.lsa(r, f.partials.Rows.At(row)))
		f.scl.Add(t.lsa(r, f.partials.Side.At(row)))
		m.vals2.Add(t.lsa(r, m.vals.At(row)))
	}
}

// castPartials casts this rank's n partial outputs, rows of the element
// type at off of its segment.
func (f *htFP8Combine) castPartials(m *htMode, off, n int) {
	t := &m.e.t
	for i := 0; i < n; i++ {
		f.cast.Add(t.lsa(t.me, f.partials.Rows.At(i)), t.lsa(t.me, f.partials.Side.At(i)), int64(off+i*m.rowBytes))
	}
	f.cast.Flush(t.segBytes, m.H, m.e.spec.Elem, f.wire)
}

// sendSums casts rows [lo, hi) of the rail sums at sums (in the segment,
// the element type) and exposes them to sender src, at its node's rows.
func (f *htFP8Combine) sendSums(m *htMode, src, slot, sums, lo, hi int) {
	t := &m.e.t
	for i := lo; i < hi; i++ {
		f.cast.Add(t.lsa(t.me, f.sumsOut.Rows.At(slot+i)), t.lsa(t.me, f.sumsOut.Side.At(slot+i)), int64(sums+i*m.rowBytes))
	}
	f.cast.Flush(t.segBytes, m.H, m.e.spec.Elem, f.wire)
	at := m.myNode*m.M + lo
	t.expose(src, f.sumsOut.Rows.At(slot+lo), f.sums.Rows.At(at), f.sumsOut.Rows.Len(hi-lo))
	t.expose(src, f.sumsOut.Side.At(slot+lo), f.sums.Side.At(at), f.sumsOut.Side.Len(hi-lo))
}

// addStaged adds row o of node b's sums of this rank's tokens to the
// sources.
func (f *htFP8Combine) addStaged(m *htMode, b, o int) {
	t := &m.e.t
	m.src.Add(t.staged(f.sums.Rows.At(b*m.M + o)))
	f.scl.Add(t.staged(f.sums.Side.At(b*m.M + o)))
	m.vals2.Add(t.staged(m.svals.At(b*m.M + o)))
}
