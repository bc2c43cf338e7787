package epcpu

import (
	"github.com/goep/goep/ep/driver"
	"github.com/goep/goep/ep/internal/hostrows"
	"github.com/goep/goep/internal/grow"
)

// htLayout is how an HT rank's received rows are laid out (Config.Layout):
// flat, one row per (source, token) by source rank then token (htFlat), or
// one zone per local expert of its (token, expert) rows (htZones). The
// protocol is the same for both; the layout says where the rows and their
// metadata go, and where the combine finds each token's partials.
type htLayout interface {
	// takeAreas places the received rows (n of them) and their metadata.
	takeAreas(seg *hostrows.Arena, n int)
	// countWords is the words a count vector carries past the tokens per
	// rank and per node; appendCounts appends this rank's.
	countWords() int
	appendCounts(mine []int32, rt *driver.Routing) []int32
	// rowsFor is the rows rank dst receives, padding included, where its
	// tokens from every source are rows.
	rowsFor(st *htState, dst, rows int) int
	// grow sizes the layout's part of a dispatch's state; plan fills it
	// after the count exchange.
	grow(st *htState)
	plan(st *htState)
	// sendLocal writes this rank's rows for its node's ranks, with their
	// metadata, letting the network progress as it goes (copied).
	sendLocal(d *driver.Dispatch, st *htState) error
	// views sets d.Recv once every row has arrived.
	views(d *driver.Dispatch, st *htState)
	// planForward says, for the n tokens rail sender s staged here (their
	// top-k ids topk), which ranks of this node get each and at which row;
	// forwardMeta writes their metadata there (tok, topk, w: staged).
	planForward(p *fwdPlan, st *htState, s int, topk []int32, n int)
	forwardMeta(p *fwdPlan, st *htState, s int, tok, topk []int32, w []float32)
	// rowValues places a combine's row values where the node's ranks read
	// them.
	rowValues(c *driver.Combine, st *htState)
	// localSources gives add the rows of own token tk on this node's ranks,
	// in the combine's order.
	localSources(d *driver.Dispatch, st *htState, tk int, add func(r, row int))
	// landsInPlace says whether a lone rail peer's rows may land in their
	// final places (the staged order is the received order).
	landsInPlace() bool
}

// newHTLayout is the layout of s's HT groups, over m.
func newHTLayout(s driver.Spec, m *htMode) htLayout {
	if s.HTExpertMajor() {
		return htZones{m}
	}
	return htFlat{m}
}

// htFlat is HT's own layout: a rank's received rows by source rank then
// token, each with its token, its top-k ids (local, or global with
// Config.RecvIDs) and weights.
type htFlat struct{ *htMode }

func (f htFlat) takeAreas(seg *hostrows.Arena, n int) {
	f.recv = seg.TakeRows("HT received rows", n, f.wire)
	f.tok = seg.Take("HT received tokens", n, 4)
	f.topk = seg.Take("HT received top-k ids", n, 4*f.K)
	f.w = seg.Take("HT received weights", n, 4*f.K)
}

func (htFlat) countWords() int                                      { return 0 }
func (htFlat) appendCounts(mine []int32, _ *driver.Routing) []int32 { return mine }
func (htFlat) rowsFor(_ *htState, _, rows int) int                  { return rows }
func (htFlat) grow(*htState)                                        {}
func (htFlat) plan(*htState)                                        {}
func (htFlat) landsInPlace() bool                                   { return true }

// sendLocal writes each token once into every rank of this node that owns
// one of its experts, with its metadata.
func (f htFlat) sendLocal(d *driver.Dispatch, st *htState) error {
	t, rt := &f.e.t, d.Route
	rows := f.listsFor()
	for tk := 0; tk < rt.T; tk++ {
		for _, dst := range t.nodeRanks {
			if o := rt.TokRankOrd[tk*f.R+dst]; o >= 0 {
				f.wire.Put(t.seg[dst], f.recv, st.sendOff[dst]+int(o), tk)
				rows[dst] = append(rows[dst], int32(tk))
			}
		}
		if err := f.copied(d, tk); err != nil {
			return err
		}
	}
	f.wire.Flush(hostBytes(d.X), hostBytes(d.Scales))
	for _, dst := range t.nodeRanks {
		first := st.sendOff[dst]
		hostrows.HTMeta(t.lsa(dst, f.tok.At(first)), t.lsa(dst, f.topk.At(first)), t.lsa(dst, f.w.At(first)),
			rows[dst], nil, d.TopK, d.Weights, f.K, f.L, dst, f.global)
	}
	return nil
}

func (f htFlat) views(d *driver.Dispatch, st *htState) {
	e, t, K, me := f.e, &f.e.t, f.K, f.e.t.me
	n := st.recvOff[f.R]
	f.counts = grow.To(f.counts, f.L)
	lo := int32(0) // the id of local expert 0 in the received top-k ids
	if f.global {
		lo = int32(me * f.L)
	}
	hostrows.CountLocal(t.lsa(me, f.topk.Off), n, K, lo, f.counts)
	for l, c := range f.counts {
		st.expert[l] = int(c)
	}
	for s := 0; s < f.R; s++ {
		st.source[s] = st.recvOff[s+1] - st.recvOff[s]
	}
	d.Recv = driver.Received{
		Rows:         hostTensor[byte](e, f.recv.Rows.Off, f.recv.Rows.Len(n)),
		Outputs:      hostTensor[byte](e, f.comb.Off, f.comb.Len(n)),
		Weights:      hostTensor[float32](e, f.w.Off, n*K),
		TopK:         hostTensor[int32](e, f.topk.Off, n*K),
		Tokens:       hostTensor[int32](e, f.tok.Off, n),
		ExpertCounts: st.expert,
		SourceCounts: st.source,
		NumRecv:      n,
		Dropped:      st.dropped,
	}
	if side := f.recv.Side; side.Stride > 0 {
		d.Recv.Side = hostTensor[byte](e, side.Off, side.Len(n))
	}
}

// planForward gives each staged token one row at every rank of this node
// that owns one of its experts, in the order the sender sent them.
func (f htFlat) planForward(p *fwdPlan, st *htState, s int, topk []int32, n int) {
	t := &f.e.t
	p.src, p.rows = s, n
	p.start, p.dst, p.row = grow.To(p.start, n+1), p.dst[:0], p.row[:0]
	next := grow.To(f.area, 2*f.R) // reused: the next row at each destination, and its end
	f.area = next
	end := next[f.R:]
	for _, dst := range t.nodeRanks {
		next[dst] = st.recvOffAt(s, dst, f.stride(), f.R)
		end[dst] = next[dst] + int(st.n[s*f.stride()+dst]) // its rows from s that fit (Config.Overflow)
	}
	for j := 0; j < n; j++ {
		p.start[j] = int32(len(p.dst))
		for _, dst := range t.nodeRanks {
			if next[dst] == end[dst] { // the sender dropped its later tokens to dst
				continue
			}
			for k := 0; k < f.K; k++ {
				if x := int(topk[j*f.K+k]); x >= 0 && x/f.L == dst {
					p.dst = append(p.dst, int32(dst))
					p.row = append(p.row, int32(next[dst]))
					next[dst]++
					break
				}
			}
		}
	}
	p.start[n] = int32(len(p.dst))
}

// forwardMeta writes, at each rank of this node, the metadata of the rows
// forwarded to it, one kernel call per rank.
func (f htFlat) forwardMeta(p *fwdPlan, st *htState, s int, tok, topk []int32, w []float32) {
	t := &f.e.t
	perDst := f.listsFor()
	for j := 0; j < p.rows; j++ {
		for x := p.start[j]; x < p.start[j+1]; x++ {
			perDst[p.dst[x]] = append(perDst[p.dst[x]], int32(j))
		}
	}
	for _, dst := range t.nodeRanks {
		first := st.recvOffAt(s, dst, f.stride(), f.R)
		hostrows.HTMeta(t.lsa(dst, f.tok.At(first)), t.lsa(dst, f.topk.At(first)), t.lsa(dst, f.w.At(first)),
			perDst[dst], tok, topk, w, f.K, f.L, dst, f.global)
	}
}

func (f htFlat) rowValues(c *driver.Combine, _ *htState) {
	copy(hostTensor[float32](f.e, f.vals.Off, c.RowValues.Len()).Host(), c.RowValues.Host())
}

// localSources lists token tk's row at each rank of this node that got it,
// in local rank order.
func (f htFlat) localSources(d *driver.Dispatch, st *htState, tk int, add func(r, row int)) {
	rt := d.Route
	for _, r := range f.e.t.nodeRanks {
		if o := rt.TokRankOrd[tk*f.R+r]; o >= 0 {
			add(r, st.sendOff[r]+int(o))
		}
	}
}
