package epcpu

import (
	"unsafe"

	"github.com/goep/goep/ep/driver"
	"github.com/goep/goep/internal/dtype"
)

// The direct path: LL's slot protocol when every rank is on this node, the
// wire is the element type and no rank is masked, which is a decode step on
// one node. It is the same protocol as llMode.send and llMode.wait (the
// same slots, flags and payloads, so ranks may take either), done with
// stores instead of queued transfers: a pair's row, token and weight go
// straight to the owner's slot, and the wait, once it has the counts as
// the general path does, compacts the blocks in place.
// A decode round is short enough that the queueing of the general path, its
// per-expert passes and its tables were a good part of it.

// directOK says whether a dispatch on this rank can take the direct path:
// set once, at newLL, from what a group cannot change.
func (m *llMode) directOK() bool { return m.direct }

// canGoDirect is directOK's value for the group.
func (m *llMode) canGoDirect() bool {
	t := &m.e.t
	return !m.e.tune.generalLL && m.slots && m.wire.SideBytes() == 0 && !t.spansNodes() && !t.maskStalled
}

// sendDirect is send's slot protocol by stores: each pair's row, token and
// weight into its slot at the expert's owner, then the data flag, carrying
// the counts, at every rank. st.pos, the pairs' order in the staging of
// other nodes, stays unset: there are none.
func (m *llMode) sendDirect(d *driver.Dispatch, st *llState) error {
	t := &m.e.t
	b, me, rt, K, rb := d.Set, t.me, d.Route, m.K, m.rowBytes
	st.dropped, st.complete = st.dropped[:0], false
	copy(st.cnt[me*m.E:(me+1)*m.E], rt.PerExpert)
	x := hostBytes(d.X)
	recv, tok, w, base := m.recv[b].Rows, m.tok[b], m.w[b], me*m.M
	for tk := 0; tk < rt.T; tk++ {
		row := x[tk*rb : (tk+1)*rb]
		for k := tk * K; k < (tk+1)*K; k++ {
			id := d.TopK[k]
			if id < 0 {
				continue
			}
			seg, slot := t.seg[m.ownerOf[id]], m.blockOf[id]+base+int(rt.PairOrd[k])
			copy(unsafe.Slice((*byte)(unsafe.Add(seg, recv.At(slot))), rb), row)
			*(*int32)(unsafe.Add(seg, tok.At(slot))) = int32(tk)
			*(*float32)(unsafe.Add(seg, w.At(slot))) = d.Weights[k]
		}
	}
	return t.raise(t.live, flagData, b, me, d.Op, m.e.doneWord(b^1), dtype.Bytes(rt.PerExpert))
}

// compactDirect is wait's slot protocol on one node, once the counts are
// in: each local expert's block compacted in place, sources in order (a
// source's rows move down, over no block not yet moved).
func (m *llMode) compactDirect(b int, st *llState) {
	seg, me, E, L := m.e.t.seg[m.e.t.me], m.e.t.me, m.E, m.L
	recv, tok, w := m.recv[b].Rows, m.tok[b], m.w[b]
	clear(st.expert)
	for l := 0; l < L; l++ {
		x := me*L + l
		for s := 0; s < m.R; s++ {
			c := int(st.cnt[s*E+x])
			st.source[s*L+l] = c
			st.expert[l] += c
			row, slot := l*m.span+int(st.off[s*E+x]), l*m.span+s*m.M
			if c == 0 || row == slot {
				continue
			}
			moveWithin(seg, recv.At(row), recv.At(slot), recv.Len(c))
			moveWithin(seg, tok.At(row), tok.At(slot), tok.Len(c))
			moveWithin(seg, w.At(row), w.At(slot), w.Len(c))
		}
	}
}

// moveWithin moves n bytes at src of memory seg to dst, as memmove does.
func moveWithin(seg ptr, dst, src, n int) {
	copy(unsafe.Slice((*byte)(unsafe.Add(seg, dst)), n), unsafe.Slice((*byte)(unsafe.Add(seg, src)), n))
}
