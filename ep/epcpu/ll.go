package epcpu

import (
	"fmt"
	"math"
	"slices"
	"unsafe"

	"github.com/goep/goep/ep/driver"
	"github.com/goep/goep/ep/internal/hostrows"
	"github.com/goep/goep/internal/dtype"
	"github.com/goep/goep/internal/grow"
)

// Low-latency protocols, for a call with sequence number q on buffer set b.
// Two ways to dispatch, chosen per group from its config so that every rank
// takes the same: with a count round (large messages), and with fixed slots
// (small ones, where the count round is most of the time):
//
//	dispatch send, count round: wait until the node's ranks finished reading
//	  set b in the last combine on it; share this rank's per-expert counts
//	  and wait for those of lower ranks, which fix where its rows start in
//	  each expert's block (so the blocks come out packed, by source rank);
//	  post every (token, expert) row with its token index and weight to its
//	  slot at the expert's owner; raise the data flag at every rank.
//	dispatch wait, count round: wait for the counts of higher ranks and
//	  every rank's data flag; settle the rows that came through staging.
//	dispatch send, slots: as above, but with no wait: the rows go to the
//	  source's own slot of each expert's block (source s at row s*M), and the
//	  counts ride on the data flag.
//	dispatch wait, slots: wait for every rank's data flag; read the counts;
//	  compact each expert's block in place (a source's rows move down to
//	  their packed place, in source order) and settle the staged ones; publish
//	  the packed offsets for the node's ranks, who read the outputs in place.
//	combine send: say where the expert outputs are (in place, or copied
//	  into the combine buffer) and expose them to every token's rank; raise
//	  combine-ready, its value carrying where the outputs are.
//	combine wait: wait for every rank's combine-ready; reduce each token's
//	  rows in top-k order, read where each expert rank exposed them; tell
//	  the node's ranks their buffers are free.
//
// Staged positions: rank s's rows for rank d sit in d's staging at
// [s][cap], d's experts in order, each expert's pairs in token order; the
// outputs exposed back to a token's rank sit in its combine staging in its
// own pair order (experts in order, pairs in token order).
//
// Rows are written by the wire format (RowFormat: copied, or cast to FP8
// with their scales beside them) straight into a node peer's slot, or into
// this rank's outbox in the staged order of the receiver on another node,
// from which they leave as one block per receiver (and one of side data),
// straight from the segment (flushInPlace). Side data settles and compacts
// with the rows (RowArea).
type llMode struct {
	e                                *engine
	R, E, L, M, K, H, rowBytes, span int
	slots                            bool // the slot protocol (no count round)
	direct                           bool // dispatches take the direct path (lldirect.go)
	wire                             hostrows.RowFormat

	// Segment areas per buffer set: received rows [L][span] with a token
	// and a weight per row; the combine buffer laid out the same, with
	// values; the outbox, [M*K] rows for the ranks of other nodes, each
	// receiver's rows one block in its staged order (obase, ocnt).
	recv, outbox       [2]hostrows.RowArea
	tok, w, comb, vals [2]hostrows.Region
	obase, ocnt        []int     // per rank of another node: its first row in the outbox, and its rows
	sent               [2]uint64 // per set: the outbox's last put (flushInPlace)
	csent              [2]uint64 // per set: the last combine's put of the expert outputs
	// Staging areas per buffer set: rows from each rank [R][cap] with token
	// and weight; exposed outputs [M*K] with values.
	stage            [2]hostrows.RowArea
	stageTok, stageW [2]hostrows.Region
	cstage, cvals    [2]hostrows.Region
	cwire            llCombineWire // how the expert outputs travel back
	cap              int
	// Per expert: its owner and its block's first row in the owner's
	// receive buffer (tables, not x/L and x%L: a division is tens of cycles,
	// paid per pair).
	ownerOf []int
	blockOf []int

	recvViews [2]driver.Received // views

	meta   []byte                 // packed token and weight words of this rank's pairs, by expert
	spos   []int32                // [E]: stagedPos of this rank's pairs
	tables *hostrows.ReduceTables // combine: the source rows of each token, and their weights (C memory: free)
	vp     hostrows.AddrTable     // slot values: source of each (token, slot)
	where  []uint32               // combine: where each rank's outputs are
}

// llState is what a dispatch keeps between its halves and for its combine.
type llState struct {
	cnt      []int32 // [R][E]: pairs from each rank to each expert
	off      []int32 // [R][E]: where rank s's rows of expert e start in e's block
	pos      []int32 // [E]: where this rank's pairs of expert e start in its own order
	expert   []int   // [L]: rows received per local expert
	source   []int   // [R][L]: rows received per source and local expert
	complete bool    // off holds every rank's row (set at wait)
	dropped  []int32 // pairs (t*K+k) whose owner was masked
}

func newLL(e *engine, seg, win *hostrows.Arena) (*llMode, error) {
	m := layoutLL(e.spec, e.t.size, e.nodes, e.tune, seg, win)
	m.e = e
	m.obase, m.ocnt = make([]int, m.R), make([]int, m.R) // node peers' stay 0: their rows go straight to them
	m.direct = m.canGoDirect()
	var err error
	m.tables, err = hostrows.NewReduceTables(m.M*m.K, m.M, e.tune.reduceInC)
	return m, err
}

// free releases what the mode holds outside Go's memory.
func (m *llMode) free() { m.tables.Free() }

// layoutLL places LL's areas for a group of R ranks on nodes nodes: what
// newLL does but for the engine, which BufferPlan needs too.
// tune says which protocol and which cast the group takes.
func layoutLL(s driver.Spec, R, nodes int, tune tuning, seg, win *hostrows.Arena) *llMode {
	m := &llMode{R: R, E: s.NumExperts, L: s.NumExperts / R, M: s.MaxTokensPerRank, K: s.TopK, H: s.Hidden,
		rowBytes: s.RowBytes, span: R * s.MaxTokensPerRank, wire: hostrows.NewRowFormat(s), cwire: newLLCombineWire(s)}
	rows := m.L * m.span
	m.ownerOf, m.blockOf = make([]int, m.E), make([]int, m.E)
	for x := range m.ownerOf {
		m.ownerOf[x], m.blockOf[x] = x/m.L, x%m.L*m.span
	}
	m.cap = m.M * min(m.K, m.L) // most pairs one rank sends to one rank
	m.slots = m.cap*(m.wire.RowBytes()+m.wire.SideBytes()) <= tune.slotProtocolMax() || s.MaskStalledRanks
	for b := 0; b < 2; b++ {
		set := [2]string{" (set 0)", " (set 1)"}[b]
		m.recv[b] = seg.TakeRows("LL received rows"+set, rows, m.wire)
		m.tok[b] = seg.Take("LL received tokens"+set, rows, 4)
		m.w[b] = seg.Take("LL received weights"+set, rows, 4)
		m.comb[b] = seg.Take("LL combine buffer"+set, rows, m.rowBytes)
		m.vals[b] = seg.Take("LL row values"+set, rows, 4)
		if nodes > 1 {
			m.outbox[b] = seg.TakeRows("LL outbox for other nodes"+set, m.M*m.K, m.wire)
		}
		m.stage[b] = win.TakeRows("LL rows from other nodes"+set, R*m.cap, m.wire)
		m.stageTok[b] = win.Take("LL tokens from other nodes"+set, R*m.cap, 4)
		m.stageW[b] = win.Take("LL weights from other nodes"+set, R*m.cap, 4)
		m.cstage[b] = win.Take("LL expert outputs from other nodes"+set, m.M*m.K, m.rowBytes)
		m.cvals[b] = win.Take("LL row values from other nodes"+set, m.M*m.K, 4)
		m.cwire.takeAreas(seg, win, b, set, rows, m.M*m.K)
	}
	return m
}

// newState is a dispatch's state, sized for any routing (StateMaker).
func (m *llMode) newState() any {
	d := &driver.Dispatch{State: &llState{dropped: make([]int32, 0, m.M*m.K)}}
	return m.state(d)
}

// reserve sizes the mode's scratch for any routing.
func (m *llMode) reserve() {
	m.meta = make([]byte, 0, 8*m.M*m.K)
	m.spos = make([]int32, 0, m.E)
	m.vp.Reserve(m.M * m.K)
	m.where = make([]uint32, 0, m.R)
	m.wire.Reserve(m.M * m.K)
}

func (m *llMode) state(d *driver.Dispatch) *llState {
	st, ok := d.State.(*llState)
	if !ok {
		st = &llState{}
		d.State = st
	}
	st.cnt = grow.To(st.cnt, m.R*m.E)
	st.off = grow.To(st.off, m.R*m.E)
	st.pos = grow.To(st.pos, m.E)
	st.expert = grow.To(st.expert, m.L)
	st.source = grow.To(st.source, m.R*m.L)
	return st
}

// stagedPos sets pos[x], for every expert x, to where rank s's pairs of x
// start among its pairs for x's owner: the owner's earlier experts first.
func (m *llMode) stagedPos(st *llState, s int, pos []int32) {
	cnt := st.cnt[s*m.E : (s+1)*m.E]
	for x0 := 0; x0 < m.E; x0 += m.L {
		var p int32
		for x := x0; x < x0+m.L; x++ {
			pos[x] = p
			p += cnt[x]
		}
	}
}

func (m *llMode) send(d *driver.Dispatch) error {
	e, t := m.e, &m.e.t
	op := e.names.Dispatch
	b, q, me, rt := d.Set, d.Op, t.me, d.Route
	st := m.state(d)
	if err := e.checkMasked(op); err != nil {
		return err
	}
	if !m.e.readersDone(b, m.e.t.liveNode) {
		t0 := t.clock()
		if err := t.awaitReaders(op, b, e.last[b]); err != nil {
			return err
		}
		t.span(q, "wait readers", t.waitedFor, 0, t0)
	}
	if m.directOK() {
		return m.sendDirect(d, st)
	}
	st.dropped = st.dropped[:0]
	if m.slots { // counts ride on the data flag; rows go to this rank's slots
		copy(st.cnt[me*m.E:], rt.PerExpert)
		for x := 0; x < m.E; x++ {
			st.off[me*m.E+x] = int32(me * m.M)
		}
		st.complete = false
	} else if d.From != nil {
		from := d.From.State.(*llState)
		copy(st.cnt, from.cnt)
		copy(st.off, from.off)
		st.complete = true
	} else {
		t0 := t.clock()
		if err := t.shareCounts(b, q, rt.PerExpert); err != nil {
			return err
		}
		copy(st.cnt[me*m.E:], rt.PerExpert)
		if err := m.gatherCounts(op, st, b, q, 0, me); err != nil {
			return err
		}
		t.span(q, "counts of lower ranks", t.waitedFor, 0, t0)
		clear(st.off[me*m.E : (me+1)*m.E])
		for s := 0; s < me; s++ {
			for x := 0; x < m.E; x++ {
				st.off[me*m.E+x] += st.cnt[s*m.E+x]
			}
		}
		st.complete = false
	}
	var p int32
	for x := 0; x < m.E; x++ {
		st.pos[x] = p
		p += st.cnt[me*m.E+x]
	}
	return m.postRows(d, st)
}

// gatherCounts waits for the count vectors of ranks [lo, hi) but this one
// and copies them into st.cnt.
func (m *llMode) gatherCounts(op string, st *llState, b int, q uint64, lo, hi int) error {
	t := &m.e.t
	if err := t.await(op, "its counts", flagCounts, b, t.all[lo:hi], nil, q); err != nil {
		return err
	}
	for s := lo; s < hi; s++ {
		if s != t.me {
			copy(st.cnt[s*m.E:(s+1)*m.E], t.counts(flagCounts, b, s))
		}
	}
	return nil
}

// postRows sends every (token, expert) row of this rank, then the token and
// weight of each, and raises the data flag.
func (m *llMode) postRows(d *driver.Dispatch, st *llState) error {
	t := &m.e.t
	b, me, rt, K := d.Set, t.me, d.Route, m.K
	// Words: per expert, the pairs' tokens then their weights, at the pairs'
	// places in this rank's order (st.pos), so that each expert's are one
	// block at the owner.
	n := int(st.pos[m.E-1] + st.cnt[me*m.E+m.E-1])
	m.meta = grow.To(m.meta, 8*n)
	m.spos = grow.To(m.spos, m.E)
	m.stagedPos(st, me, m.spos)
	toks := unsafe.Slice((*int32)(unsafe.Pointer(unsafe.SliceData(m.meta))), 2*n)
	m.outboxBases(st)
	t0 := t.clock()
	// The outbox's last rows, and the last combine's outputs on this set,
	// have left before anything here is written.
	if err := t.awaitSent(m.e.names.Dispatch, max(m.sent[b], m.csent[b])); err != nil {
		return err
	}
	t.span(d.Op, "outbox free", -1, 0, t0)
	t0 = t.clock()
	for tk := 0; tk < rt.T; tk++ {
		for k := 0; k < K; k++ {
			x := int(d.TopK[tk*K+k])
			if x < 0 {
				continue
			}
			owner := m.ownerOf[x]
			if t.masked[owner] { // its owner is masked: the pair is dropped
				st.dropped = append(st.dropped, int32(tk*K+k))
				continue
			}
			ord := int(rt.PairOrd[tk*K+k])
			i := int(st.pos[x]) + ord
			toks[i] = int32(tk)
			toks[n+i] = int32(math.Float32bits(d.Weights[tk*K+k]))
			row := m.blockOf[x] + int(st.off[me*m.E+x]) + ord
			t.writeRow(m.wire, owner, m.recv[b], row, m.outbox[b], m.obase[owner]+int(m.spos[x])+ord, tk)
		}
	}
	m.wire.Flush(hostBytes(d.X), hostBytes(d.Scales))
	t.span(d.Op, "rows", -1, int64(n*m.wire.RowBytes()), t0)
	t0 = t.clock()
	across := t.netBytes
	for _, r := range t.liveRemote {
		t.exposeRows(r, m.outbox[b], m.obase[r], m.ocnt[r], m.stage[b], me*m.cap)
	}
	var err error
	if m.sent[b], err = t.flushInPlace(); err != nil {
		return err
	}
	t.span(d.Op, "rows across", -1, t.netBytes-across, t0)
	t0 = t.clock()
	for x := 0; x < m.E; x++ {
		c, owner := int(st.cnt[me*m.E+x]), m.ownerOf[x]
		if c == 0 || t.masked[owner] {
			continue
		}
		row := m.blockOf[x] + int(st.off[me*m.E+x])
		staged := me*m.cap + int(m.spos[x])
		t.post(owner, m.tok[b].At(row), m.stageTok[b].At(staged), int64(4*st.pos[x]), 4*c)
		t.post(owner, m.w[b].At(row), m.stageW[b].At(staged), int64(4*(n+int(st.pos[x]))), 4*c)
	}
	if err := t.flush(m.meta); err != nil {
		return err
	}
	var counts []byte // with slots, the counts ride on the data flag
	if m.slots {
		counts = dtype.Bytes(rt.PerExpert)
	}
	err = t.raise(t.live, flagData, b, me, d.Op, m.e.doneWord(b^1), counts)
	t.span(d.Op, "tokens, weights, flag", -1, 0, t0)
	return err
}

// doneWord is the payload of this rank's data flag on set b^1: the last
// combine on set c = b^1 it finished, so that a node peer's next dispatch
// on c need not wait for flagDone before it writes this rank's buffers: it
// reads it (readersDone). 0 when too large for a payload: the next
// dispatch on c then waits for flagDone.
func (e *engine) doneWord(c int) uint32 {
	if last := e.last[c]; last <= math.MaxUint32 {
		return uint32(last)
	}
	return 0
}

// readersDone says whether every one of peers (node peers) is known to
// have finished reading this rank's buffers of set b in the set's last
// combine, from the payloads of their data flags of the last dispatch on
// the other set (doneWord): they raised them after that combine's
// flagDone, and this rank read them in that dispatch's wait, so a decode
// loop's dispatch need not fetch the flagDone lines from its peers'
// caches. When they do not tell, the dispatch waits for flagDone
// (awaitReaders).
func (e *engine) readersDone(b int, peers []int) bool {
	t := &e.t
	last := e.last[b]
	if last == 0 {
		return true
	}
	if last > math.MaxUint32 {
		return false
	}
	for _, p := range peers {
		if p != t.me && t.flagPayload(flagData, b^1, p, p) < uint32(last) {
			return false
		}
	}
	return true
}

// outboxBases places, in the outbox, this rank's rows for each rank of
// another node: one block per rank, in its staged order, so that each goes
// in one put of rows (and one of side data).
func (m *llMode) outboxBases(st *llState) {
	t, me := &m.e.t, m.e.t.me
	next := 0
	for _, d := range t.remote {
		m.obase[d], m.ocnt[d] = next, 0
		for x := d * m.L; x < (d+1)*m.L; x++ {
			m.ocnt[d] += int(st.cnt[me*m.E+x])
		}
		next += m.ocnt[d]
	}
}

func (m *llMode) wait(d *driver.Dispatch) error {
	e, t := m.e, &m.e.t
	op := e.names.Dispatch
	b, q, me := d.Set, d.Op, t.me
	st := d.State.(*llState)
	t0 := t.clock()
	if m.slots {
		if err := t.await(op, "its rows", flagData, b, t.live, nil, q); err != nil {
			return err
		}
		t.span(q, "wait rows", t.waitedFor, 0, t0)
		t0 = t.clock()
		for s := 0; s < m.R; s++ {
			switch {
			case t.masked[s]: // a masked rank sent nothing
				clear(st.cnt[s*m.E : (s+1)*m.E])
			case s != me:
				copy(st.cnt[s*m.E:(s+1)*m.E], t.counts(flagData, b, s))
			}
		}
		m.packOffsets(st)
		if m.directOK() {
			m.compactDirect(b, st)
		} else {
			m.settleRows(b, st)
		}
	} else {
		if !st.complete {
			if err := m.gatherCounts(op, st, b, q, me+1, m.R); err != nil {
				return err
			}
			m.packOffsets(st)
			t.span(q, "counts of higher ranks", t.waitedFor, 0, t0)
			t0 = t.clock()
		}
		if err := t.await(op, "its rows", flagData, b, t.live, nil, q); err != nil {
			return err
		}
		t.span(q, "wait rows", t.waitedFor, 0, t0)
		t0 = t.clock()
		m.settleRows(b, st)
	}
	t.span(q, "settle", -1, 0, t0)
	d.Recv = *m.views(b)
	d.Recv.ExpertCounts, d.Recv.SourceCounts, d.Recv.Dropped = st.expert, st.source, st.dropped
	for _, c := range st.expert {
		d.Recv.NumRecv += c
	}
	return nil
}

// views is what a dispatch on buffer set b receives into, as tensors over
// the segment: made once per set, copied into every dispatch's Received.
func (m *llMode) views(b int) *driver.Received {
	v := &m.recvViews[b]
	if !v.Rows.IsZero() {
		return v
	}
	e, rows := m.e, m.L*m.span
	v.Rows = hostTensor[byte](e, m.recv[b].Rows.Off, m.recv[b].Rows.Len(rows))
	v.Outputs = hostTensor[byte](e, m.comb[b].Off, m.comb[b].Len(rows))
	v.Weights = hostTensor[float32](e, m.w[b].Off, rows)
	v.Tokens = hostTensor[int32](e, m.tok[b].Off, rows)
	if side := m.recv[b].Side; side.Stride > 0 {
		v.Side = hostTensor[byte](e, side.Off, side.Len(rows))
	}
	return v
}

// packOffsets sets, for every source and each of this rank's experts, where
// the source's rows start in the expert's block once packed: after the
// lower sources' rows. (Where this rank's own rows went at the other
// experts is known already, or comes with combine-ready.)
func (m *llMode) packOffsets(st *llState) {
	for x := m.e.t.me * m.L; x < (m.e.t.me+1)*m.L; x++ {
		st.off[x] = 0
		for s := 1; s < m.R; s++ {
			st.off[s*m.E+x] = st.off[(s-1)*m.E+x] + st.cnt[(s-1)*m.E+x]
		}
	}
	st.complete = true
}

// settleRows puts every received row in its packed place: rows staged by
// other nodes land there; with slots, a node peer's rows move down from
// their slot (in source order, so no block overwrites one not yet moved).
func (m *llMode) settleRows(b int, st *llState) {
	t, me := &m.e.t, m.e.t.me
	clear(st.expert)
	for s := 0; s < m.R; s++ {
		staged := s * m.cap // rank s's pairs for this rank, this rank's experts in order
		for l := 0; l < m.L; l++ {
			x := me*m.L + l
			c := int(st.cnt[s*m.E+x])
			st.source[s*m.L+l] = c
			st.expert[l] += c
			row, slot := l*m.span+int(st.off[s*m.E+x]), l*m.span+s*m.M
			if !m.slots {
				slot = row
			}
			t.settleRows(s, m.stage[b], staged, m.recv[b], slot, row, c)
			t.settle(s, m.stageTok[b].At(staged), m.tok[b].At(slot), m.tok[b].At(row), 4*c)
			t.settle(s, m.stageW[b].At(staged), m.w[b].At(slot), m.w[b].At(row), 4*c)
			staged += c
		}
	}
	t.flushLands()
}

// Where a rank's expert outputs are: the payload of its combine-ready flag.
const (
	ySrcRecv    = 1 // the receive buffer
	ySrcComb    = 2 // the combine buffer
	ySrcValues  = 4 // bit: row values were passed
	ySrcRelease = 8 // the rank releases the dispatch (Combine.Release): no outputs
)

// checkRelease, once every combine-ready flag of c has come, fails the
// call where some ranks release the dispatch and others combine it: the
// rank that does other than this one is named (*SequenceError), before
// anything is read.
func checkRelease(t *transport, op string, c *driver.Combine, b int, ranks []int) error {
	for _, r := range ranks {
		if r == t.me || t.masked[r] {
			continue
		}
		if released := t.flagPayload(flagReady, b, r, r)&ySrcRelease != 0; released != c.Release {
			theirs := callKindOf(t.callOf(c.Op)) // what this rank does; the other does the other
			other := callCombine
			if theirs == callCombine {
				other = callRelease
			}
			return t.sequenceError(op, c.Op, r, fmt.Sprintf("at call %d, %v", c.Op, other))
		}
	}
	return nil
}

func (m *llMode) combineSend(c *driver.Combine) error {
	e, t := m.e, &m.e.t
	d := c.Dispatch
	b, me := d.Set, t.me
	st := d.State.(*llState)
	if err := e.checkMasked(e.names.Combine); err != nil {
		return err
	}
	if c.Release { // nothing to read: combine-ready says so
		return t.raise(t.live, flagReady, b, me, c.Op, ySrcRelease, nil)
	}
	// No wait for the node's readers of set b: this dispatch's send waited
	// for them, and a set holds one dispatch at a time, so the set's last
	// combine is the same one.
	t0 := t.clock()
	ysrc, area := ySrcComb, m.comb[b]
	switch c.YIn {
	case driver.YInRows:
		ysrc, area = ySrcRecv, m.recv[b].Rows
	case driver.YElsewhere: // copy the valid rows into the combine buffer
		y, comb := hostBytes(c.Y), hostBytes(d.Recv.Outputs)
		for l, n := range st.expert {
			lo, hi := l*m.span*m.rowBytes, (l*m.span+n)*m.rowBytes
			copy(comb[lo:hi], y[lo:hi])
		}
	}
	if !c.RowValues.IsZero() {
		copy(hostTensor[float32](e, m.vals[b].Off, m.L*m.span).Host(), c.RowValues.Host())
		ysrc |= ySrcValues
	}
	// What the token ranks read: the outputs, or their FP8 codes and scales.
	out, staged := m.cwire.encode(m, b, st, area)
	// Expose each token rank of another node its rows, in its own pair
	// order (node peers read them in place).
	across := t.netBytes
	for _, s := range t.liveRemote {
		pos := 0 // where s's pairs of this rank's experts start among all its pairs
		for x := 0; x < me*m.L; x++ {
			pos += int(st.cnt[s*m.E+x])
		}
		for l := 0; l < m.L; l++ {
			x := me*m.L + l
			n := int(st.cnt[s*m.E+x])
			if n > 0 {
				first := l*m.span + int(st.off[s*m.E+x])
				t.exposeRows(s, out, first, n, staged, pos)
				if ysrc&ySrcValues != 0 {
					t.expose(s, m.vals[b].At(first), m.cvals[b].At(pos), 4*n)
				}
			}
			pos += n
		}
	}
	// Straight from where they are, as the dispatch sends its rows: no copy
	// into a message at either end, and every receiver's blocks in flight
	// at once. They stay as they are until sent (combineWait, before it
	// releases the buffers).
	var err error
	if m.csent[b], err = t.flushInPlace(); err != nil {
		return err
	}
	t.span(c.Op, "outputs across", -1, t.netBytes-across, t0)
	if !m.slots {
		return t.raise(t.live, flagReady, b, me, c.Op, uint32(ysrc), nil)
	}
	// With slots, each token rank's combine-ready carries where this rank
	// packed its rows of each local expert.
	for _, s := range t.live {
		packed := st.off[s*m.E+me*m.L : s*m.E+(me+1)*m.L]
		if err := t.raise(t.just(s), flagReady, b, me, c.Op, uint32(ysrc), dtype.Bytes(packed)); err != nil {
			return err
		}
	}
	return nil
}

func (m *llMode) combineWait(c *driver.Combine) error {
	e, t := m.e, &m.e.t
	op := e.names.Combine
	d := c.Dispatch
	b, me, rt, K, L := d.Set, t.me, d.Route, m.K, m.L
	st := d.State.(*llState)
	t0 := t.clock()
	if err := t.await(op, "its expert outputs", flagReady, b, t.live, nil, c.Op); err != nil {
		return err
	}
	t.span(c.Op, "wait outputs", t.waitedFor, 0, t0)
	if err := checkRelease(t, op, c, b, t.live); err != nil {
		return err
	}
	if c.Release {
		return t.releaseReaders(b, c.Op)
	}
	t0 = t.clock()
	withValues := !c.SlotValues.IsZero()
	missing := -1
	m.where = grow.To(m.where, m.R)
	for r := range m.where {
		if t.masked[r] {
			continue
		}
		m.where[r] = t.flagPayload(flagReady, b, r, r)
		if m.slots { // where this rank's rows ended up in r's blocks: r packed them
			packed := unsafe.Slice((*int32)(t.attached(flagReady, b, r, r)), L)
			copy(st.off[me*m.E+r*L:me*m.E+(r+1)*L], packed)
		}
	}
	tab, n := m.tables, 0
	if withValues {
		m.vp.Grow(rt.T * K)
	}
	for tk := 0; tk < rt.T; tk++ {
		tab.Start[tk] = int32(n)
		for k := 0; k < K; k++ {
			x := int(d.TopK[tk*K+k])
			if x < 0 {
				continue
			}
			owner, ord := m.ownerOf[x], rt.PairOrd[tk*K+k]
			if t.masked[owner] { // its outputs never came: the pair contributes nothing
				if !slices.Contains(st.dropped, int32(tk*K+k)) {
					st.dropped = append(st.dropped, int32(tk*K+k))
				}
				continue
			}
			where := m.where[owner]
			area := m.comb[b]
			if where&ySrcComb == 0 {
				area = m.recv[b].Rows
			}
			row := m.blockOf[x] + int(st.off[me*m.E+x]+ord)
			pos := int(st.pos[x] + ord)
			m.cwire.source(t, tab, n, owner, b, area, row, pos, m.cstage[b])
			tab.W[n] = c.Weights[tk*K+k]
			n++
			if withValues {
				if where&ySrcValues == 0 {
					missing = owner
				}
				m.vp.Set(tk*K+k, t.exposed(owner, m.vals[b].At(row), m.cvals[b].At(pos)))
			}
		}
	}
	tab.Start[rt.T] = int32(n)
	m.cwire.reduce(tab, unsafe.Pointer(unsafe.SliceData(hostBytes(c.Out))), e.spec.Elem, rt.T, m.H)
	if withValues && missing < 0 {
		hostrows.GatherValues(c.SlotValues.Host(), &m.vp)
	}
	t.span(c.Op, "reduce", -1, 0, t0)
	d.Recv.Dropped = st.dropped
	// The outputs this rank sent in place leave before the node's ranks
	// may write its buffers of set b again.
	t0 = t.clock()
	if err := t.awaitSent(op, m.csent[b]); err != nil {
		return err
	}
	t.span(c.Op, "outputs sent", -1, 0, t0)
	if err := t.releaseReaders(b, c.Op); err != nil {
		return err
	}
	if missing >= 0 {
		return driver.InputErrorf(op, "SlotValues asked for, but rank %d passed no RowValues (set both on every rank, or neither)", missing)
	}
	return nil
}
