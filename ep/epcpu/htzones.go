package epcpu

import (
	"unsafe"

	"github.com/goep/goep/ep/driver"
	"github.com/goep/goep/ep/internal/hostrows"
	"github.com/goep/goep/internal/grow"
)

// HT's expert-major layout (Config.Layout LayoutExpertMajor in
// HighThroughput): a rank's received rows are zones, one per local expert,
// each zone's rows the (token, expert) pairs of that expert by source rank
// then token, padded with zero rows to a multiple of the alignment. The
// rows are written into their zones by the dispatch itself: the count
// exchange carries every rank's pairs per expert as well as its tokens per
// rank and node, so that every rank knows where each zone starts at every
// rank of its node and where each source's rows start in it (plan);
// a sender writes each pair of a node peer's expert straight into its row
// (sendZones), and a rail peer forwards each staged token into every zone
// of its node that it goes to (planForward), so that a token to two
// experts of a rank is written twice and nothing is permuted afterwards.
//
// A row's metadata is its token, its weight (one: the pair's) and its top-k
// slot, which the combine needs to return row values to their slots
// (rowValues). The combine sums, for each token, its rows in rank order
// and in each rank in slot order: the sources of each own token are listed
// that way (localSources), and the rail peer's plans list a staged token's
// rows that way too.

// htZones is HT's expert-major layout, over the mode.
type htZones struct{ *htMode }

func (m htZones) takeAreas(seg *hostrows.Arena, n int) {
	m.recv = seg.TakeRows("HT received rows (expert-major zones)", n, m.wire)
	m.tok = seg.Take("HT received tokens", n, 4)
	m.slot = seg.Take("HT received top-k slots", n, 4)
	m.w = seg.Take("HT received weights", n, 4)
}

// countWords: a count vector carries each rank's pairs per expert.
func (m htZones) countWords() int { return m.R * m.L }

func (htZones) appendCounts(mine []int32, rt *driver.Routing) []int32 {
	return append(mine, rt.PerExpert...)
}

func (m htZones) rowsFor(st *htState, dst, _ int) int { return m.zoneRows(st, dst) }

func (m htZones) grow(st *htState) {
	st.source = grow.To(st.source, m.R*m.L)
	st.zoneOff = grow.To(st.zoneOff, m.L+1)
	st.at = grow.To(st.at, m.R*m.R*m.L)
}

// landsInPlace: a zone's rows are not in the staged order.
func (htZones) landsInPlace() bool { return false }

// sendLocal zeroes the padding of this node's zones and writes each pair
// into its expert's zone.
func (m htZones) sendLocal(d *driver.Dispatch, st *htState) error {
	m.zeroPadding(st)
	return m.sendZones(d, st)
}

// zoneCounts is where the pairs per expert start in a count vector.
func (m htZones) zoneCounts() int { return m.R + m.nodes }

// pad rounds n up to the zones' alignment.
func (m htZones) pad(n int) int { return (n + m.align - 1) / m.align * m.align }

// zoneRows is the padded total of rank dst's zones, from the count matrix.
func (m htZones) zoneRows(st *htState, dst int) int {
	stride, first := m.stride(), m.zoneCounts()+dst*m.L
	total := 0
	for l := 0; l < m.L; l++ {
		c := 0
		for s := 0; s < m.R; s++ {
			c += int(st.n[s*stride+first+l])
		}
		total += m.pad(c)
	}
	return total
}

// plan sets, from the count matrix, this rank's zones (st.expert,
// st.source, st.zoneOff) and, for every expert x of this node and every
// source s, where s's rows of x start at x's owner (st.at[s*E+x]).
func (m htZones) plan(st *htState) {
	t := &m.e.t
	R, L, E, stride, z := m.R, m.L, m.R*m.L, m.stride(), m.zoneCounts()
	for _, dst := range t.nodeRanks {
		start := 0
		for l := 0; l < L; l++ {
			x := dst*L + l
			at := start
			for s := 0; s < R; s++ {
				st.at[s*E+x] = int32(at)
				at += int(st.n[s*stride+z+x])
			}
			if dst == t.me {
				st.zoneOff[l], st.expert[l] = start, at-start
			}
			start += m.pad(at - start)
		}
		if dst == t.me {
			st.zoneOff[L] = start
		}
	}
	for s := 0; s < R; s++ {
		for l := 0; l < L; l++ {
			st.source[s*L+l] = int(st.n[s*stride+z+t.me*L+l])
		}
	}
}

// zeroPadding clears this rank's padding rows (rows, side data and
// metadata): no sender writes them, and a zone's padding moves from one
// dispatch to the next. The node's readers of this rank's buffers are done
// with the last combine.
func (m htZones) zeroPadding(st *htState) {
	t := &m.e.t
	for l := 0; l < m.L; l++ {
		lo, hi := st.zoneOff[l]+st.expert[l], st.zoneOff[l+1]
		if lo == hi {
			continue
		}
		for _, part := range m.recv.Parts() {
			clear(unsafe.Slice((*byte)(t.lsa(t.me, part.At(lo))), part.Len(hi-lo)))
		}
		tok := unsafe.Slice((*int32)(t.lsa(t.me, m.tok.At(lo))), hi-lo)
		slot := unsafe.Slice((*int32)(t.lsa(t.me, m.slot.At(lo))), hi-lo)
		for i := range tok {
			tok[i], slot[i] = -1, -1
		}
		clear(unsafe.Slice((*float32)(t.lsa(t.me, m.w.At(lo))), hi-lo))
	}
}

// putZoneMeta writes the metadata of row `row` at node rank dst: its token,
// weight and top-k slot.
func (m htZones) putZoneMeta(dst, row int, tok int32, w float32, slot int) {
	t := &m.e.t
	*(*int32)(t.lsa(dst, m.tok.At(row))) = tok
	*(*float32)(t.lsa(dst, m.w.At(row))) = w
	*(*int32)(t.lsa(dst, m.slot.At(row))) = int32(slot)
}

// sendZones writes each pair of this rank's tokens whose expert is on this
// node into its row of the expert's zone, with its metadata.
func (m htZones) sendZones(d *driver.Dispatch, st *htState) error {
	t, rt := &m.e.t, d.Route
	K, L, E, me := m.K, m.L, m.R*m.L, t.me
	for tk := 0; tk < rt.T; tk++ {
		for k := 0; k < K; k++ {
			x := int(d.TopK[tk*K+k])
			if x < 0 || !t.local[x/L] {
				continue
			}
			dst, row := x/L, int(st.at[me*E+x]+rt.PairOrd[tk*K+k])
			m.wire.Put(t.seg[dst], m.recv, row, tk)
			m.putZoneMeta(dst, row, int32(tk), d.Weights[tk*K+k], k)
		}
		if err := m.copied(d, tk); err != nil {
			return err
		}
	}
	m.wire.Flush(hostBytes(d.X), hostBytes(d.Scales))
	return nil
}

// planForward, for zones: for each of the n tokens rail
// sender s staged here (in its token order, with their global top-k ids),
// the row of each of its pairs with an expert of this node, node ranks in
// order and each rank's pairs in slot order (the combine's order).
func (m htZones) planForward(p *fwdPlan, st *htState, s int, topk []int32, n int) {
	t := &m.e.t
	K, L, E := m.K, m.L, m.R*m.L
	p.src, p.rows = s, n
	p.start, p.dst, p.row, p.slot = grow.To(p.start, n+1), p.dst[:0], p.row[:0], p.slot[:0]
	next := grow.To(st.next, E) // the next row of s at each expert's owner
	st.next = next
	for _, dst := range t.nodeRanks {
		copy(next[dst*L:(dst+1)*L], st.at[s*E+dst*L:s*E+(dst+1)*L])
	}
	for j := 0; j < n; j++ {
		p.start[j] = int32(len(p.dst))
		for _, dst := range t.nodeRanks {
			for k := 0; k < K; k++ {
				if x := int(topk[j*K+k]); x >= 0 && x/L == dst {
					p.dst = append(p.dst, int32(dst))
					p.row = append(p.row, next[x])
					p.slot = append(p.slot, int32(k))
					next[x]++
				}
			}
		}
	}
	p.start[n] = int32(len(p.dst))
}

// forwardMeta writes the metadata of the rows forwarded for plan p,
// from the staged tokens and weights.
func (m htZones) forwardMeta(p *fwdPlan, _ *htState, _ int, tok, _ []int32, w []float32) {
	for j := 0; j < p.rows; j++ {
		for i := p.start[j]; i < p.start[j+1]; i++ {
			k := int(p.slot[i])
			m.putZoneMeta(int(p.dst[i]), int(p.row[i]), tok[j], w[j*m.K+k], k)
		}
	}
}

// views is what a dispatch received in zones.
func (m htZones) views(d *driver.Dispatch, st *htState) {
	e := m.e
	n := st.zoneOff[m.L]
	d.Recv = driver.Received{
		Rows:          hostTensor[byte](e, m.recv.Rows.Off, m.recv.Rows.Len(n)),
		Outputs:       hostTensor[byte](e, m.comb.Off, m.comb.Len(n)),
		Weights:       hostTensor[float32](e, m.w.Off, n),
		Tokens:        hostTensor[int32](e, m.tok.Off, n),
		ExpertCounts:  st.expert,
		ExpertOffsets: st.zoneOff,
		SourceCounts:  st.source,
		NumRecv:       n,
	}
	if side := m.recv.Side; side.Stride > 0 {
		d.Recv.Side = hostTensor[byte](e, side.Off, side.Len(n))
	}
}

// rowValues lays the combine's row values (one per row) out as the
// combine sums them, [rows][TopK] with each row's value at its slot and
// zeros elsewhere: summed over a token's rows, they give each slot its
// row's value.
func (m htZones) rowValues(c *driver.Combine, st *htState) {
	t, K := &m.e.t, m.K
	in := c.RowValues.Host()
	out := hostTensor[float32](m.e, m.vals.Off, len(in)*K).Host()
	clear(out)
	slot := unsafe.Slice((*int32)(t.lsa(t.me, m.slot.Off)), len(in))
	for l := 0; l < m.L; l++ {
		for row := st.zoneOff[l]; row < st.zoneOff[l]+st.expert[l]; row++ {
			out[row*K+int(slot[row])] = in[row]
		}
	}
}

// localSources gives add the rows of own token tk on this node's ranks, in
// rank then slot order: the combine's sources.
func (m htZones) localSources(d *driver.Dispatch, st *htState, tk int, add func(r, row int)) {
	t, rt := &m.e.t, d.Route
	K, L, E, me := m.K, m.L, m.R*m.L, t.me
	for _, r := range t.nodeRanks {
		if rt.TokRankOrd[tk*m.R+r] < 0 {
			continue
		}
		for k := 0; k < K; k++ {
			if x := int(d.TopK[tk*K+k]); x >= 0 && x/L == r {
				add(r, int(st.at[me*E+x]+rt.PairOrd[tk*K+k]))
			}
		}
	}
}
