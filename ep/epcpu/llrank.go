package epcpu

import (
	"unsafe"

	"github.com/goep/goep/ep/driver"
	"github.com/goep/goep/ep/internal/hostrows"
	"github.com/goep/goep/internal/dtype"
	"github.com/goep/goep/internal/grow"
)

// LowLatency's rank-major layout (Config.Layout LayoutRankMajor), for a call
// with sequence number q on buffer set b. Each source has a fixed block of
// MaxTokensPerRank rows at every rank, so no count round is needed and no
// row moves after it lands:
//
//	dispatch send: wait until the node's ranks are done with set b (the
//	  payloads of their last data flags say so, else flagDone); write each
//	  token once per rank that owns one of its experts, into row
//	  me*M + (its place among the tokens to that rank) of that rank's
//	  block, with its token index, top-k ids as the receiver keeps them
//	  (local or global, -1 elsewhere) and weights (0 elsewhere): straight
//	  into a node peer's segment, or through the outbox into another
//	  node's staging; raise the data flag everywhere, the tokens per rank
//	  riding on it.
//	dispatch wait: wait for every data flag; read the rows per source from
//	  them; settle the rows staged by other nodes into their blocks.
//	combine send: say where the outputs are (in place, or copied into the
//	  combine buffer) and expose each source of another node its block;
//	  raise combine-ready, its payload saying where.
//	combine wait: wait for every combine-ready; sum each token's rows,
//	  ranks in order, unweighted (the expert side applied the weights);
//	  tell the node's ranks their buffers are free.
type llRankMode struct {
	e                        *engine
	R, L, M, K, H, rowBytes  int
	global                   bool
	wire                     hostrows.RowFormat
	recv, outbox             [2]hostrows.RowArea // [R*M] rows; [M*min(K,R)] rows for other nodes
	tok, topk, w, comb, vals [2]hostrows.Region
	stage                    [2]hostrows.RowArea // [R*M]: source s at s*M
	stok, stopk, sw          [2]hostrows.Region
	cstage, cvals            [2]hostrows.Region // [R*M]: expert rank r's outputs of this rank's tokens at r*M
	obase                    []int              // per rank of another node: its first row in the outbox
	sent                     [2]uint64          // per set: the outbox's last put (flushInPlace)
	csent                    [2]uint64          // per set: the last combine's put of the expert outputs
	lists                    [][]int32          // per rank: the tokens it gets, in order
	meta                     []byte             // metadata of the rows for other nodes, packed
	tables                   *hostrows.ReduceTables
	where                    []uint32
	vp                       hostrows.AddrTable
	views                    [2]driver.Received
}

// llRankState is what a rank-major dispatch keeps for its wait and combine.
type llRankState struct {
	source []int // [R]: rows from each source
	expert []int // [L]: rows whose top-k names each local expert
}

func newLLRank(e *engine, seg, win *hostrows.Arena) (*llRankMode, error) {
	m := layoutLLRank(e.spec, e.t.size, seg, win)
	m.e = e
	m.obase = make([]int, m.R)
	m.lists = make([][]int32, m.R)
	var err error
	m.tables, err = hostrows.NewReduceTables(m.M*min(m.K, m.R), m.M, e.tune.reduceInC)
	return m, err
}

// free releases what the mode holds outside Go's memory.
func (m *llRankMode) free() { m.tables.Free() }

// layoutLLRank places the rank-major areas of a group of R ranks (what
// BufferPlan lists too).
func layoutLLRank(s driver.Spec, R int, seg, win *hostrows.Arena) *llRankMode {
	m := &llRankMode{R: R, L: s.NumExperts / R, M: s.MaxTokensPerRank, K: s.TopK, H: s.Hidden,
		rowBytes: s.RowBytes, global: s.RecvIDs == driver.GlobalExpertIDs, wire: hostrows.NewRowFormat(s)}
	rows, K := R*m.M, m.K
	for b := 0; b < 2; b++ {
		set := [2]string{" (set 0)", " (set 1)"}[b]
		m.recv[b] = seg.TakeRows("LL rank-major received rows"+set, rows, m.wire)
		m.tok[b] = seg.Take("LL rank-major received tokens"+set, rows, 4)
		m.topk[b] = seg.Take("LL rank-major received top-k ids"+set, rows, 4*K)
		m.w[b] = seg.Take("LL rank-major received weights"+set, rows, 4*K)
		m.comb[b] = seg.Take("LL rank-major combine buffer"+set, rows, m.rowBytes)
		m.vals[b] = seg.Take("LL rank-major row values"+set, rows, 4*K)
		m.outbox[b] = seg.TakeRows("LL rank-major outbox for other nodes"+set, m.M*min(K, R), m.wire)
		m.stage[b] = win.TakeRows("LL rank-major rows from other nodes"+set, rows, m.wire)
		m.stok[b] = win.Take("LL rank-major tokens from other nodes"+set, rows, 4)
		m.stopk[b] = win.Take("LL rank-major top-k ids from other nodes"+set, rows, 4*K)
		m.sw[b] = win.Take("LL rank-major weights from other nodes"+set, rows, 4*K)
		m.cstage[b] = win.Take("LL rank-major expert outputs from other nodes"+set, rows, m.rowBytes)
		m.cvals[b] = win.Take("LL rank-major row values from other nodes"+set, rows, 4*K)
	}
	return m
}

// newState is a dispatch's state, sized for any routing (StateMaker).
func (m *llRankMode) newState() any { return m.state(&driver.Dispatch{}) }

// reserve sizes the mode's scratch for any routing.
func (m *llRankMode) reserve() {
	n := m.M * min(m.K, m.R) // rows this rank sends in one dispatch
	for r := range m.lists {
		m.lists[r] = make([]int32, 0, m.M)
	}
	m.meta = make([]byte, 0, 4*n*(1+2*m.K))
	m.where = make([]uint32, 0, m.R)
	m.vp.Reserve(n)
	m.wire.Reserve(n)
}

func (m *llRankMode) state(d *driver.Dispatch) *llRankState {
	st, ok := d.State.(*llRankState)
	if !ok {
		st = &llRankState{}
		d.State = st
	}
	st.source = grow.To(st.source, m.R)
	st.expert = grow.To(st.expert, m.L)
	return st
}

func (m *llRankMode) send(d *driver.Dispatch) error {
	e, t := m.e, &m.e.t
	op := e.names.Dispatch
	b, me, rt, K, M := d.Set, t.me, d.Route, m.K, m.M
	m.state(d)
	if !m.e.readersDone(b, m.e.t.nodeRanks) {
		if err := t.awaitReaders(op, b, e.last[b]); err != nil {
			return err
		}
	}
	// The outbox's last rows, and the last combine's outputs on this set,
	// have left before anything here is written.
	if err := t.awaitSent(op, max(m.sent[b], m.csent[b])); err != nil {
		return err
	}
	next := 0
	for _, r := range t.remote {
		m.obase[r] = next
		next += int(rt.PerRank[r])
	}
	for r := range m.lists {
		m.lists[r] = m.lists[r][:0]
	}
	for tk := 0; tk < rt.T; tk++ {
		for r := 0; r < m.R; r++ {
			if o := int(rt.TokRankOrd[tk*m.R+r]); o >= 0 {
				t.writeRow(m.wire, r, m.recv[b], me*M+o, m.outbox[b], m.obase[r]+o, tk)
				m.lists[r] = append(m.lists[r], int32(tk))
			}
		}
	}
	m.wire.Flush(hostBytes(d.X), hostBytes(d.Scales))
	for _, r := range t.remote {
		t.exposeRows(r, m.outbox[b], m.obase[r], int(rt.PerRank[r]), m.stage[b], me*M)
	}
	var err error
	if m.sent[b], err = t.flushInPlace(); err != nil {
		return err
	}
	// The metadata: into node peers' blocks, and packed for other nodes'.
	m.meta = grow.To(m.meta, 4*next*(1+2*K))
	base := unsafe.Pointer(unsafe.SliceData(m.meta))
	for r := 0; r < m.R; r++ {
		n := len(m.lists[r])
		if n == 0 {
			continue
		}
		if t.local[r] {
			row := me * M
			hostrows.HTMeta(t.lsa(r, m.tok[b].At(row)), t.lsa(r, m.topk[b].At(row)), t.lsa(r, m.w[b].At(row)),
				m.lists[r], nil, d.TopK, d.Weights, K, m.L, r, m.global)
			continue
		}
		tok, ids, w := 4*m.obase[r], 4*(next+m.obase[r]*K), 4*(next*(1+K)+m.obase[r]*K)
		hostrows.HTMeta(unsafe.Add(base, tok), unsafe.Add(base, ids), unsafe.Add(base, w),
			m.lists[r], nil, d.TopK, d.Weights, K, m.L, r, m.global)
		t.post(r, -1, m.stok[b].At(me*M), int64(tok), 4*n)
		t.post(r, -1, m.stopk[b].At(me*M), int64(ids), 4*n*K)
		t.post(r, -1, m.sw[b].At(me*M), int64(w), 4*n*K)
	}
	if err := t.flush(m.meta); err != nil {
		return err
	}
	return t.raise(t.all, flagData, b, me, d.Op, m.e.doneWord(b^1), dtype.Bytes(rt.PerRank))
}

func (m *llRankMode) wait(d *driver.Dispatch) error {
	e, t := m.e, &m.e.t
	op := e.names.Dispatch
	b, me, K, M := d.Set, t.me, m.K, m.M
	st := d.State.(*llRankState)
	if err := t.await(op, "its rows", flagData, b, t.all, nil, d.Op); err != nil {
		return err
	}
	total := 0
	for s := 0; s < m.R; s++ {
		if s == me {
			st.source[s] = int(d.Route.PerRank[me])
		} else {
			st.source[s] = int(t.counts(flagData, b, s)[me])
		}
		c := st.source[s]
		total += c
		t.settleRows(s, m.stage[b], s*M, m.recv[b], s*M, s*M, c)
		t.settle(s, m.stok[b].At(s*M), m.tok[b].At(s*M), m.tok[b].At(s*M), 4*c)
		t.settle(s, m.stopk[b].At(s*M), m.topk[b].At(s*M), m.topk[b].At(s*M), 4*c*K)
		t.settle(s, m.sw[b].At(s*M), m.w[b].At(s*M), m.w[b].At(s*M), 4*c*K)
	}
	t.flushLands()
	lo := int32(0) // the id of local expert 0 among the received ids
	if m.global {
		lo = int32(me * m.L)
	}
	ids := unsafe.Slice((*int32)(t.lsa(me, m.topk[b].Off)), m.R*M*K)
	clear(st.expert)
	for s, c := range st.source {
		for _, id := range ids[s*M*K : (s*M+c)*K] {
			if id >= 0 {
				st.expert[id-lo]++
			}
		}
	}
	d.Recv = *m.viewsOf(b)
	d.Recv.ExpertCounts, d.Recv.SourceCounts, d.Recv.NumRecv = st.expert, st.source, total
	return nil
}

// viewsOf is what a dispatch on set b receives into, made once per set.
func (m *llRankMode) viewsOf(b int) *driver.Received {
	v := &m.views[b]
	if !v.Rows.IsZero() {
		return v
	}
	e, rows, K := m.e, m.R*m.M, m.K
	v.Rows = hostTensor[byte](e, m.recv[b].Rows.Off, m.recv[b].Rows.Len(rows))
	v.Outputs = hostTensor[byte](e, m.comb[b].Off, m.comb[b].Len(rows))
	v.Weights = hostTensor[float32](e, m.w[b].Off, rows*K)
	v.TopK = hostTensor[int32](e, m.topk[b].Off, rows*K)
	v.Tokens = hostTensor[int32](e, m.tok[b].Off, rows)
	if side := m.recv[b].Side; side.Stride > 0 {
		v.Side = hostTensor[byte](e, side.Off, side.Len(rows))
	}
	return v
}

func (m *llRankMode) combineSend(c *driver.Combine) error {
	e, t := m.e, &m.e.t
	d := c.Dispatch
	b, me, M, K := d.Set, t.me, m.M, m.K
	st := d.State.(*llRankState)
	if c.Release { // nothing to read: combine-ready says so
		return t.raise(t.all, flagReady, b, me, c.Op, ySrcRelease, nil)
	}
	ysrc, area := ySrcComb, m.comb[b]
	switch c.YIn {
	case driver.YInRows:
		ysrc, area = ySrcRecv, m.recv[b].Rows
	case driver.YElsewhere: // the valid rows into the combine buffer
		y, comb := hostBytes(c.Y), hostBytes(d.Recv.Outputs)
		for s, n := range st.source {
			lo, hi := s*M*m.rowBytes, (s*M+n)*m.rowBytes
			copy(comb[lo:hi], y[lo:hi])
		}
	}
	if !c.RowValues.IsZero() {
		copy(hostTensor[float32](e, m.vals[b].Off, c.RowValues.Len()).Host(), c.RowValues.Host())
		ysrc |= ySrcValues
	}
	for _, s := range t.remote {
		if n := st.source[s]; n > 0 {
			t.expose(s, area.At(s*M), m.cstage[b].At(me*M), area.Len(n))
			if ysrc&ySrcValues != 0 {
				t.expose(s, m.vals[b].At(s*M), m.cvals[b].At(me*M), 4*n*K)
			}
		}
	}
	// Straight from where they are (no copy into a message at either end);
	// they stay as they are until sent (combineWait).
	var err error
	if m.csent[b], err = t.flushInPlace(); err != nil {
		return err
	}
	return t.raise(t.all, flagReady, b, me, c.Op, uint32(ysrc), nil)
}

func (m *llRankMode) combineWait(c *driver.Combine) error {
	e, t := m.e, &m.e.t
	op := e.names.Combine
	d := c.Dispatch
	b, me, rt, M, K := d.Set, t.me, d.Route, m.M, m.K
	if err := t.await(op, "its expert outputs", flagReady, b, t.all, nil, c.Op); err != nil {
		return err
	}
	if err := checkRelease(t, op, c, b, t.all); err != nil {
		return err
	}
	if c.Release {
		return t.releaseReaders(b, c.Op)
	}
	m.where = grow.To(m.where, m.R)
	missing := -1
	for r := range m.where {
		m.where[r] = t.flagPayload(flagReady, b, r, r)
		if !c.SlotValues.IsZero() && m.where[r]&ySrcValues == 0 && missing < 0 {
			missing = r
		}
	}
	withValues := !c.SlotValues.IsZero() && missing < 0
	tab, n := m.tables, 0
	m.vp.Reset()
	for tk := 0; tk < rt.T; tk++ {
		tab.Start[tk] = int32(n)
		for r := 0; r < m.R; r++ {
			o := int(rt.TokRankOrd[tk*m.R+r])
			if o < 0 {
				continue
			}
			area := m.comb[b]
			if m.where[r]&ySrcComb == 0 {
				area = m.recv[b].Rows
			}
			tab.Src[n], tab.W[n] = t.exposed(r, area.At(me*M+o), m.cstage[b].At(r*M+o)), 1
			n++
			if withValues {
				m.vp.Add(t.exposed(r, m.vals[b].At(me*M+o), m.cvals[b].At(r*M+o)))
			}
		}
	}
	tab.Start[rt.T] = int32(n)
	tab.Reduce(unsafe.Pointer(unsafe.SliceData(hostBytes(c.Out))), e.spec.Elem, rt.T, m.H, e.spec.Elem)
	if withValues {
		hostrows.SumValues(c.SlotValues.Host(), &m.vp, tab.Start[:rt.T+1], rt.T, K)
	}
	// The outputs this rank sent in place leave before the node's ranks
	// may write its buffers of set b again.
	if err := t.awaitSent(op, m.csent[b]); err != nil {
		return err
	}
	if err := t.releaseReaders(b, c.Op); err != nil {
		return err
	}
	if missing >= 0 {
		return driver.InputErrorf(op, "SlotValues asked for, but rank %d passed no RowValues (set both on every rank, or neither)", missing)
	}
	return nil
}
