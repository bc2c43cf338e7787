package epcpu

import (
	"slices"
	"unsafe"

	"github.com/goep/goep/ep/driver"
	"github.com/goep/goep/ep/internal/hostrows"
	"github.com/goep/goep/internal/dtype"
	"github.com/goep/goep/internal/grow"
)

// High-throughput protocol, for a call with sequence number q (one buffer
// set):
//
//	dispatch send: share every rank's tokens per rank and per node (the row
//	  offsets follow from them); wait until the node's ranks finished reading
//	  this rank's buffers; write each token once into every rank of this
//	  node that owns one of its experts, with its metadata, and raise their
//	  data flags; write each token once per other node into the outbox, in
//	  the staged order of its rail peer there (the rank whose local rank is
//	  this rank's modulo the node's size: the same local rank when nodes are
//	  equal), and send the outbox to every rail peer at once, chunk by chunk
//	  as it fills (htChunk tokens), straight from the segment; then the
//	  tokens' global top-k ids and weights, and raise the staged flag.
//	dispatch wait: as a rail peer, wait for each other node's staged tokens
//	  and forward them into the ranks of this node that own their experts,
//	  raising those ranks' data flags on behalf of the original sender; then
//	  wait for every source's data flag.
//	combine send: say where the partial outputs are and raise combine-ready
//	  at this node's ranks, which read them in place.
//	combine wait: wait for this node's combine-ready; as a rail peer, sum
//	  this node's partials of each forwarded token into the segment and
//	  send the sums back to the sender straight from there, chunk by chunk;
//	  then sum, for each own token, the partials of this node's ranks (in
//	  place) and the sums of other nodes (staged), node by node in a fixed
//	  order, in token order as the sums arrive; tell the node's ranks their
//	  buffers are free.
//
// Rows are written by the wire format (RowFormat) and move with their side
// data (RowArea), as in LL.
type htMode struct {
	e                              *engine
	R, L, M, K, H, rowBytes, nodes int
	myNode                         int
	maxRecv                        int
	global                         bool // the received top-k ids are global (Config.RecvIDs)
	lay                            htLayout
	align                          int // their alignment, in rows
	wire                           hostrows.RowFormat
	fp8                            *htFP8Combine // an FP8 CombineWire (nil: the combine moves the element type)
	forwarder                      []int         // per rank: the rank of this node that forwards its tokens here
	rails                          []int         // per node: this rank's rail peer there (itself on its own node)
	slots                          []int         // per node: this rank's staging slot at its rail peer there
	myRails                        []int         // the rail peers on other nodes, in node order
	senders                        []railSender  // the ranks of other nodes whose rail peer on this node is this rank
	senderRanks                    []int         // their ranks

	// Segment: received rows [maxRecv], each with its token, local top-k
	// ids and weights; the combine buffer and row values laid out the
	// same; the outbox, [M*(nodes-1)] rows for other nodes, node by node;
	// the sums this rank sends back as a rail peer, [senders][M] rows.
	recv, outbox hostrows.RowArea
	tok, topk, w hostrows.Region
	slot         hostrows.Region // expert-major: each row's top-k slot
	comb, vals   hostrows.Region
	sumsOut      hostrows.Region
	// Staging: tokens from each rail sender [slots][M] with their tokens,
	// global top-k ids and weights; each node's sums of this rank's tokens,
	// [nodes][M], with their values.
	stage           hostrows.RowArea
	stok, stopk, sw hostrows.Region
	sums, svals     hostrows.Region
	sent, sentSums  uint64 // the in-place puts of the outbox and of the sums (awaitSent)
	lastCombine     uint64 // the op of this group's last combine (its senders raise flagDone for it)

	mine       []int32
	lists      [][]int32 // per rank of this node: the tokens (or staged rows) it gets
	meta       []byte
	vsum       []float32
	start      []int32
	src, vals2 hostrows.AddrTable
	area       []int
	addPartial func(r, row int) // adds row of node rank r's partials to src and vals2, from area
	counts     []int32
	nodeFirst  []int  // per other node: its first row in the outbox
	chunkNodes []int  // the other nodes that get rows of an outbox chunk
	alone      []bool // per node: it has one rank, its rail peer (rows may land in place)
	maxSend    int    // the most ranks of one node that one rail peer serves: staging slots per node
}

// htState is what a dispatch keeps between its halves and for its combine.
type htState struct {
	n       []int32 // [R][R+nodes]: tokens from s to each rank, then to each node
	recvOff []int   // [R+1]: where each source's rows start among this rank's
	sendOff []int   // [R]: where this rank's rows start at each destination
	fwd     []fwdPlan
	cached  bool    // the forwarding plans came with a cached dispatch
	expert  []int   // [L]
	source  []int   // [R]; expert-major [R][L]
	dropped []int32 // Config.Overflow drop: this rank's (token, slot) pairs that did not fit
	// Expert-major: where each zone of this rank starts ([L+1], the last
	// the padded total); where each source's rows of each expert of this
	// node start at its owner ([R][E]); the next row of a forwarded sender
	// at each expert (planning scratch).
	zoneOff []int
	at      []int32
	next    []int32
}

// railSender is a rank of another node whose rail peer on this node is this
// rank: it stages its tokens for this node here, at slot.
type railSender struct{ rank, node, slot int }

// fwdPlan is what a rail peer forwards inside its node for one of its
// senders: for each staged row j, the ranks and rows it goes to, CSR-style.
type fwdPlan struct {
	src   int     // the sender
	rows  int     // rows staged
	start []int32 // [rows+1]
	dst   []int32 // destination rank
	row   []int32 // row at the destination
	slot  []int32 // expert-major: the pair's top-k slot
}

func newHT(e *engine, seg, win *hostrows.Arena) *htMode {
	m := htDims(e.spec, e.t.size, e.nodes, e.tune)
	m.e, m.myNode = e, e.node
	m.takeAreas(m.placeRails(), seg, win)
	m.lists = make([][]int32, m.R)
	m.alone = make([]bool, m.nodes)
	for n := range m.alone {
		m.alone[n] = len(e.topo.RanksOnNode(n)) == 1
	}
	return m
}

// inPlace says whether this rank's rows for node n (another node, or this
// node when n is the receiver's) land straight in their final place at the
// rail peer there, with no forwarding copy: where the rail peer is the only
// rank of its node (its rows from a sender are its staged rows, in the same
// order), the network reaches segments, and the dispatch is not cached (a
// fresh one's count round tells that the rail peer has started this call,
// so that its rows of the last one are no longer read).
func (m *htMode) inPlace(n int, st *htState) bool {
	return m.alone[n] && m.e.t.landsFinal && !st.cached && m.lay.landsInPlace()
}

// htDims is an htMode of R ranks on nodes nodes with its sizes only.
func htDims(s driver.Spec, R, nodes int, tune tuning) *htMode {
	m := &htMode{R: R, L: s.NumExperts / R, M: s.MaxTokensPerRank, K: s.TopK, H: s.Hidden,
		rowBytes: s.RowBytes, nodes: nodes, maxRecv: s.MaxRecv(R), wire: hostrows.NewRowFormat(s), global: s.RecvIDs == driver.GlobalExpertIDs,
		align: s.Alignment(), fp8: newHTFP8Combine(s)}
	m.lay = newHTLayout(s, m)
	return m
}

// takeAreas places HT's areas, with slots staging slots (placeRails).
func (m *htMode) takeAreas(slots int, seg, win *hostrows.Arena) {
	n, K, M := m.maxRecv, m.K, m.M
	m.lay.takeAreas(seg, n)
	m.comb = seg.Take("HT combine buffer", n, m.rowBytes)
	m.vals = seg.Take("HT row values", n, 4*K)
	if m.nodes > 1 {
		m.outbox = seg.TakeRows("HT outbox for other nodes", M*(m.nodes-1), m.wire)
		// By the sender's slot, less this node's own (slots/nodes of them).
		m.sumsOut = seg.Take("HT sums for other nodes", (slots-slots/m.nodes)*M, m.rowBytes)
	}
	m.stage = win.TakeRows("HT rows from other nodes", slots*M, m.wire)
	m.stok = win.Take("HT tokens from other nodes", slots*M, 4)
	m.stopk = win.Take("HT top-k ids from other nodes", slots*M, 4*K)
	m.sw = win.Take("HT weights from other nodes", slots*M, 4*K)
	m.sums = win.Take("HT sums from other nodes", m.nodes*M, m.rowBytes)
	m.svals = win.Take("HT row values from other nodes", m.nodes*M, 4*K)
	if m.fp8 != nil {
		sumsOut := 0
		if m.nodes > 1 {
			sumsOut = (slots - slots/m.nodes) * M
		}
		m.fp8.takeAreas(m, seg, win, n, sumsOut, m.nodes*M)
	}
}

// sumsSlot is where the sums for sender r start in sumsOut, in rows of M:
// its staging slot, past which this node's own slots are left out.
func (m *htMode) sumsSlot(r railSender) int {
	if r.node > m.myNode {
		return r.slot - m.maxSend
	}
	return r.slot
}

// placeRails pairs the ranks across nodes. A rank with local rank i sends
// its tokens for node b to b's rank with local rank i mod |b| (with equal
// nodes: the same local rank); that rank forwards them inside b. A rail
// peer may so serve several ranks of one node, which stage at distinct
// slots: node a's sender with local rank i at slot a*maxSend + i/|b|. It
// returns the number of slots.
func (m *htMode) placeRails() int {
	e, t := m.e, &m.e.t
	size := func(n int) int { return len(e.topo.RanksOnNode(n)) }
	maxSend := 1
	for a := 0; a < m.nodes; a++ {
		for b := 0; b < m.nodes; b++ {
			maxSend = max(maxSend, (size(a)+size(b)-1)/size(b))
		}
	}
	me, local := t.me, e.localRank
	m.rails, m.slots = make([]int, m.nodes), make([]int, m.nodes)
	for b := 0; b < m.nodes; b++ {
		m.rails[b] = e.topo.RanksOnNode(b)[local%size(b)]
		m.slots[b] = e.node*maxSend + local/size(b)
		if b != m.myNode {
			m.myRails = append(m.myRails, m.rails[b])
		}
	}
	mine := size(m.myNode)
	m.forwarder = make([]int, m.R)
	for r := 0; r < m.R; r++ {
		m.forwarder[r] = r
		if !t.local[r] {
			lr := e.topo.LocalRankOf[r]
			m.forwarder[r] = t.nodeRanks[lr%mine]
			if m.forwarder[r] == me {
				a := e.nodeOf[r]
				m.senders = append(m.senders, railSender{rank: r, node: a, slot: a*maxSend + lr/mine})
				m.senderRanks = append(m.senderRanks, r)
			}
		}
	}
	m.maxSend = maxSend
	return m.nodes * maxSend
}

// stride is the length of a count vector: tokens per rank and per node,
// then, with expert-major zones, pairs per expert.
func (m *htMode) stride() int { return m.R + m.nodes + m.lay.countWords() }

func (m *htMode) state(d *driver.Dispatch) *htState {
	st, ok := d.State.(*htState)
	if !ok {
		st = &htState{}
		d.State = st
	}
	st.n = grow.To(st.n, m.R*m.stride())
	st.recvOff = grow.To(st.recvOff, m.R+1)
	st.sendOff = grow.To(st.sendOff, m.R)
	st.expert = grow.To(st.expert, m.L)
	st.source = grow.To(st.source, m.R)
	m.lay.grow(st)
	for len(st.fwd) < len(m.senders) { // a staged row goes to at most TopK rows
		M, K := m.M, m.K
		st.fwd = append(st.fwd, fwdPlan{start: make([]int32, 0, M+1), dst: make([]int32, 0, M*K),
			row: make([]int32, 0, M*K), slot: make([]int32, 0, M*K)})
	}
	return st
}

// newState is a dispatch's state, sized for any routing (StateMaker).
func (m *htMode) newState() any {
	d := &driver.Dispatch{}
	st := m.state(d)
	st.next = make([]int32, m.R*m.L)
	return st
}

// reserve sizes the mode's scratch for any routing.
func (m *htMode) reserve() {
	M, K, R, N := m.M, m.K, m.R, m.nodes
	for i := range m.lists {
		m.lists[i] = make([]int32, 0, M)
	}
	m.mine = make([]int32, 0, m.stride())
	m.meta = make([]byte, 0, 4*M*(N-1)*(1+2*K))
	m.start = make([]int32, 0, M+1)
	m.src.Reserve(M * (K + N)) // a token's sources: its ranks or pairs here, a sum per other node
	m.vals2.Reserve(M * (K + N))
	m.vsum = make([]float32, 0, M*K)
	m.counts = make([]int32, 0, m.L)
	m.area = make([]int, 0, R)
	m.nodeFirst = make([]int, 0, N)
	m.chunkNodes = make([]int, 0, N)
	m.wire.Reserve(M * K)
}

// listsFor returns empty per-rank lists, keeping their storage.
func (m *htMode) listsFor() [][]int32 {
	for i := range m.lists {
		m.lists[i] = m.lists[i][:0]
	}
	return m.lists
}

func (m *htMode) send(d *driver.Dispatch) error {
	e, t := m.e, &m.e.t
	op := e.names.Dispatch
	q, me, rt := d.Op, t.me, d.Route
	st := m.state(d)
	st.cached = d.From != nil
	t0 := t.clock()
	if st.cached {
		// A cached dispatch right after a dispatch (no combine between,
		// whose flags would have told that every rank finished it) meets
		// every rank first: the count round, whose counts it does not
		// need. Without it a rank could write this call's rows into the
		// one receive buffer of a node peer, or the staging of a rail
		// peer, that is still reading the last call's.
		if e.prevDispatch > e.last[0] {
			if err := t.shareCounts(0, q, m.mine); err != nil {
				return err
			}
			if err := t.await(op, "its counts", flagCounts, 0, t.all, nil, q); err != nil {
				return err
			}
		}
		st.copyFrom(d.From.State.(*htState))
	} else if err := m.exchangeCounts(op, st, q, rt, d.TopK); err != nil {
		return err
	}
	t.span(q, "counts", -1, 0, t0)
	// The last combine's sums may have left from the receive or combine
	// buffer (alone on a node): they have, before either is written.
	if err := t.awaitSent(op, m.sentSums); err != nil {
		return err
	}
	// Other nodes first, so that the wire is busy while this node's rows
	// are copied: the rail peers' staging is free (they forwarded the last
	// dispatch's rows before they sent its combine's sums, which this rank
	// received).
	if err := m.sendAcross(d); err != nil {
		return err
	}
	t0 = t.clock()
	if err := t.awaitReaders(op, 0, e.last[0]); err != nil {
		return err
	}
	if err := m.lay.sendLocal(d, st); err != nil {
		return err
	}
	err := t.raise(t.nodeRanks, flagData, 0, me, q, 0, nil)
	t.span(q, "this node", -1, 0, t0)
	return err
}

// exchangeCounts shares this rank's tokens per rank and per node, gathers
// every rank's, and derives the row offsets.
func (m *htMode) exchangeCounts(op string, st *htState, q uint64, rt *driver.Routing, topk []int32) error {
	t := &m.e.t
	me, R, stride := t.me, m.R, m.stride()
	m.mine = m.lay.appendCounts(append(append(m.mine[:0], rt.PerRank...), rt.PerNode...), rt)
	if err := t.shareCounts(0, q, m.mine); err != nil {
		return err
	}
	if err := t.await(op, "its counts", flagCounts, 0, t.all, nil, q); err != nil {
		return err
	}
	for s := 0; s < R; s++ {
		if s == me {
			copy(st.n[s*stride:(s+1)*stride], m.mine)
		} else {
			copy(st.n[s*stride:(s+1)*stride], t.counts(flagCounts, 0, s))
		}
	}
	st.dropped = st.dropped[:0]
	for dst := 0; dst < R; dst++ {
		total := 0
		for s := 0; s < R; s++ {
			total += int(st.n[s*stride+dst])
		}
		total = m.lay.rowsFor(st, dst, total)
		if total <= m.maxRecv {
			continue
		}
		if m.e.spec.Overflow != driver.OverflowDrop {
			// Every rank sees the same matrix and fails the same way,
			// before anything is written.
			return driver.InputErrorf(op, "rank %d would receive %d rows, more than MaxRecvTokensPerRank = %d", dst, total, m.maxRecv)
		}
		// Keep dst's rows source by source, each source's first ones,
		// until it is full: every rank caps the same counts alike.
		left := m.maxRecv
		for s := 0; s < R; s++ {
			kept := min(int(st.n[s*stride+dst]), left)
			if s == me && kept < int(st.n[s*stride+dst]) {
				m.drop(st, rt, topk, dst, kept)
			}
			st.n[s*stride+dst] = int32(kept)
			left -= kept
		}
	}
	if len(st.dropped) > 0 {
		m.renumberNodes(rt)
	}
	st.recvOff[0] = 0
	for s := 0; s < R; s++ {
		st.recvOff[s+1] = st.recvOff[s] + int(st.n[s*stride+me])
	}
	for dst := 0; dst < R; dst++ {
		off := 0
		for s := 0; s < me; s++ {
			off += int(st.n[s*stride+dst])
		}
		st.sendOff[dst] = off
	}
	m.lay.plan(st)
	return nil
}

// htProgressRows is how many rows a rail peer sums between two calls into
// the network's progress. Over TCP a large message moves only while both of
// its ends call into MPI: a rank that summed a whole chunk (milliseconds)
// between calls would leave its sends and receives idle meanwhile.
const htProgressRows = 32

// sumRows sums rows [lo, hi) of a sender's forwarded tokens (their sources
// in tab, from start) into the sums area from sums, htProgressRows at a
// time, letting the network progress between.
func (m *htMode) sumRows(sums int, tab hostrows.CTable, start []int32, lo, hi int) error {
	t := &m.e.t
	for a := lo; a < hi; a += htProgressRows {
		b := min(a+htProgressRows, hi)
		hostrows.ReduceRowsFrom(t.lsa(t.me, sums+m.sumsOut.Len(a)), m.e.spec.Elem, tab, start[a:b+1], b-a, m.H, m.e.spec.Elem, t.stream)
		if err := t.progress(); err != nil {
			return err
		}
	}
	return nil
}

// copied is called by a copy inside the node after each token tk it queued
// (wire.Put): in a group that spans nodes it writes the queued rows every
// htProgressRows tokens and lets the network progress, so that this rank's
// transfers across nodes, both ways, go on while it copies.
func (m *htMode) copied(d *driver.Dispatch, tk int) error {
	if tk%htProgressRows != htProgressRows-1 || !m.e.t.spansNodes() {
		return nil
	}
	m.wire.Flush(hostBytes(d.X), hostBytes(d.Scales))
	return m.e.t.progress()
}

// htChunk is how many of its tokens a rank writes into the outbox before
// it sends what they filled: the wire starts on the first chunk while the
// next ones are written, and every rail peer gets its part of each chunk at
// once. A rail peer sends its sums, and a rank reduces its tokens as their
// sums arrive, in chunks of as many. 128 tokens (1.8 MB of bfloat16 rows
// at hidden 7168) started the combine's wire sooner than 256 and cost fewer
// messages than 64: across 2 emulated hosts of 2 ranks, HT 4096 tokens,
// rounds of 334-385 ms against 339-396 ms with 256 (9 alternated runs each).
const htChunk = 128

// sendAcross sends each rail peer, first, the tokens, global top-k ids and
// weights of this rank's tokens for its node (so that it plans its
// forwarding while the rows travel) and raises its staged flag; then
// writes each token once per other node into the outbox (in the staged
// order of the rail peer there: the token order) and sends each rail peer
// its rows chunk by chunk, saying after each chunk how many rows it has
// sent (flagStagedRows).
func (m *htMode) sendAcross(d *driver.Dispatch) error {
	t := &m.e.t
	op := m.e.names.Dispatch
	rt, M := d.Route, m.M
	st := d.State.(*htState)
	t0 := t.clock()
	if err := t.awaitSent(op, m.sent); err != nil { // the outbox's last rows have left
		return err
	}
	m.nodeFirst = grow.To(m.nodeFirst, m.nodes)
	total := 0
	for n := 0; n < m.nodes; n++ {
		if n != m.myNode {
			m.nodeFirst[n] = total
			total += int(rt.PerNode[n])
		}
	}
	if err := m.sendStagedMeta(d, total); err != nil {
		return err
	}
	// The rows, chunk by chunk: a chunk's rows of each node are consecutive
	// in the outbox (the staged order is the token order).
	x := hostBytes(d.X)
	next := m.area[:0] // per node: its rows written so far
	next = grow.To(next, m.nodes)
	clear(next)
	m.area = next
	for lo := 0; lo < rt.T; lo += htChunk {
		hi := min(lo+htChunk, rt.T)
		for tk := lo; tk < hi; tk++ {
			for n := 0; n < m.nodes; n++ {
				if o := int(rt.TokNodeOrd[tk*m.nodes+n]); o >= 0 && n != m.myNode {
					m.wire.Put(t.seg[t.me], m.outbox, m.nodeFirst[n]+o, tk)
				}
			}
		}
		m.wire.Flush(x, hostBytes(d.Scales))
		sent := m.chunkNodes[:0] // the nodes that get rows of this chunk
		for n := 0; n < m.nodes; n++ {
			if n == m.myNode {
				continue
			}
			done := int(rt.TokNodeOrd[(hi-1)*m.nodes+n]) // this node's rows so far, from the last token that has one
			for tk := hi - 1; done < 0 && tk >= lo; tk-- {
				done = int(rt.TokNodeOrd[tk*m.nodes+n])
			}
			if done++; done > next[n] {
				r := m.rails[n]
				if m.inPlace(n, st) { // straight into its rows from this rank
					t.exposeRowsFinal(r, m.outbox, m.nodeFirst[n]+next[n], done-next[n], m.recv, st.recvOffAt(t.me, r, m.stride(), m.R)+next[n])
				} else {
					t.exposeRows(r, m.outbox, m.nodeFirst[n]+next[n], done-next[n], m.stage, m.slots[n]*M+next[n])
				}
				next[n] = done
				sent = append(sent, n)
			}
		}
		m.chunkNodes = sent
		var err error
		if m.sent, err = t.flushInPlace(); err != nil {
			return err
		}
		for _, n := range sent {
			if err := t.raise(t.just(m.rails[n]), flagStagedRows, 0, t.me, d.Op, uint32(next[n]), nil); err != nil {
				return err
			}
		}
		if err := t.progress(); err != nil { // the handshakes of the sends start
			return err
		}
	}
	t.span(d.Op, "rows across", -1, int64(total*m.wire.RowBytes()), t0)
	return nil
}

// sendStagedMeta sends each rail peer the tokens, global top-k ids and
// weights of this rank's tokens for its node (total: for all other nodes),
// packed per node, and raises its staged flag, which carries how many rows
// it gets (its count in the exchange, less what did not fit anywhere
// there).
func (m *htMode) sendStagedMeta(d *driver.Dispatch, total int) error {
	t := &m.e.t
	rt, K, M := d.Route, m.K, m.M
	m.meta = grow.To(m.meta, 4*total*(1+2*K))
	base := unsafe.Pointer(unsafe.SliceData(m.meta))
	words := unsafe.Slice((*int32)(base), total*(1+K))
	tok, ids := words[:total], words[total:]
	wts := unsafe.Slice((*float32)(unsafe.Add(base, 4*total*(1+K))), total*K)
	for tk := 0; tk < rt.T; tk++ {
		for n := 0; n < m.nodes; n++ {
			if o := int(rt.TokNodeOrd[tk*m.nodes+n]); o >= 0 && n != m.myNode {
				i := m.nodeFirst[n] + o
				tok[i] = int32(tk)
				copy(ids[i*K:], d.TopK[tk*K:(tk+1)*K])
				copy(wts[i*K:], d.Weights[tk*K:(tk+1)*K])
			}
		}
	}
	for n := 0; n < m.nodes; n++ {
		if n == m.myNode || rt.PerNode[n] == 0 {
			continue
		}
		r, slot, c, first := m.rails[n], m.slots[n], int(rt.PerNode[n]), m.nodeFirst[n]
		t.post(r, -1, m.stok.At(slot*M), int64(4*first), 4*c)
		t.post(r, -1, m.stopk.At(slot*M), int64(4*(total+first*K)), 4*c*K)
		t.post(r, -1, m.sw.At(slot*M), int64(4*(total*(1+K)+first*K)), 4*c*K)
	}
	if err := t.flush(m.meta); err != nil {
		return err
	}
	for n := 0; n < m.nodes; n++ {
		if n != m.myNode {
			if err := t.raise(t.just(m.rails[n]), flagStaged, 0, t.me, d.Op, uint32(rt.PerNode[n]), nil); err != nil {
				return err
			}
		}
	}
	return nil
}

func (m *htMode) wait(d *driver.Dispatch) error {
	e, t := m.e, &m.e.t
	op := e.names.Dispatch
	q := d.Op
	st := d.State.(*htState)
	for i := range m.senders {
		if err := m.forward(op, d, st, i); err != nil {
			return err
		}
	}
	t0 := t.clock()
	if err := t.await(op, "rows it sends or forwards", flagData, 0, t.all, m.forwarder, q); err != nil {
		return err
	}
	t.span(q, "wait data flags", -1, 0, t0)
	m.lay.views(d, st)
	return nil
}

// forward waits, as a rail peer, for the tokens its i-th sender staged
// here and forwards their rows, as they arrive, into the ranks of this
// node that own their experts, raising their data flags on the sender's
// behalf once all are there.
func (m *htMode) forward(op string, d *driver.Dispatch, st *htState, i int) error {
	t := &m.e.t
	K, M := m.K, m.M
	s, slot := m.senders[i].rank, m.senders[i].slot
	t0 := t.clock()
	if err := t.await(op, "its tokens for this node", flagStaged, 0, t.all[s:s+1], nil, d.Op); err != nil {
		return err
	}
	t.span(d.Op, "wait staged", s, 0, t0)
	t0 = t.clock()
	n := int(t.flagPayload(flagStaged, 0, s, s)) // the rows s stages here
	tok := unsafe.Slice((*int32)(t.staged(m.stok.At(slot*M))), n)
	topk := unsafe.Slice((*int32)(t.staged(m.stopk.At(slot*M))), n*K)
	w := unsafe.Slice((*float32)(t.staged(m.sw.At(slot*M))), n*K)
	if !st.cached {
		m.lay.planForward(&st.fwd[i], st, s, topk, n)
	}
	p := &st.fwd[i]
	copies := n                  // the rows to copy out of the staging
	if m.inPlace(m.myNode, st) { // they land in place: wait for all
		if n > 0 { // (a sender with no rows here raises no rows flag)
			if err := m.awaitStaged(op, d.Op, s, n); err != nil {
				return err
			}
		}
		copies = 0
	}
	for lo := 0; lo < copies; { // copy what has arrived, then wait for more
		if err := m.awaitStaged(op, d.Op, s, lo+1); err != nil {
			return err
		}
		hi := min(int(t.flagPayload(flagStagedRows, 0, s, s)), copies)
		for j := lo; j < hi; j++ {
			for x := p.start[j]; x < p.start[j+1]; x++ {
				dst, row := int(p.dst[x]), int(p.row[x])
				t.post(dst, m.recv.Rows.At(row), -1, int64(m.stage.Rows.At(slot*M+j)), m.stage.Rows.Stride)
				if side := m.recv.Side; side.Stride > 0 {
					t.post(dst, side.At(row), -1, int64(m.stage.Side.At(slot*M+j)), side.Stride)
				}
			}
			if j%htProgressRows == htProgressRows-1 || j == hi-1 { // copy what is queued; let the network progress
				if err := t.flushStaged(); err != nil {
					return err
				}
				if err := t.progress(); err != nil {
					return err
				}
			}
		}
		lo = hi
	}
	m.lay.forwardMeta(p, st, s, tok, topk, w)
	t.span(d.Op, "forward as rows arrive", s, 0, t0)
	return t.raise(t.nodeRanks, flagData, 0, s, d.Op, 0, nil)
}

// awaitStaged waits until rail sender s has staged at least rows rows of
// call q here.
func (m *htMode) awaitStaged(op string, q uint64, s, rows int) error {
	return m.e.t.awaitPayload(op, "its rows for this node", flagStagedRows, m.e.t.all[s:s+1], q, uint32(rows))
}

// drop takes this rank's tokens to rank dst after its first kept ones out
// of the routing (they are not sent), listing their slots whose experts
// dst owns as dropped.
func (m *htMode) drop(st *htState, rt *driver.Routing, topk []int32, dst, kept int) {
	for tk := 0; tk < rt.T; tk++ {
		o := &rt.TokRankOrd[tk*m.R+dst]
		if int(*o) < kept {
			continue
		}
		*o = -1
		for k := 0; k < m.K; k++ {
			if x := int(topk[tk*m.K+k]); x >= 0 && x/m.L == dst {
				st.dropped = append(st.dropped, int32(tk*m.K+k))
			}
		}
	}
	rt.PerRank[dst] = int32(kept)
	slices.Sort(st.dropped)
}

// renumberNodes recomputes, after drops, which tokens go to each node (those
// that some rank there still gets) and their places there.
func (m *htMode) renumberNodes(rt *driver.Routing) {
	clear(rt.PerNode)
	for tk := 0; tk < rt.T; tk++ {
		for n := 0; n < m.nodes; n++ {
			rt.TokNodeOrd[tk*m.nodes+n] = -1
		}
		for r := 0; r < m.R; r++ {
			if n := m.e.nodeOf[r]; rt.TokRankOrd[tk*m.R+r] >= 0 && rt.TokNodeOrd[tk*m.nodes+n] < 0 {
				rt.TokNodeOrd[tk*m.nodes+n] = rt.PerNode[n]
				rt.PerNode[n]++
			}
		}
	}
}

// recvOffAt is where rows from source s start among rank dst's rows.
func (st *htState) recvOffAt(s, dst, stride, R int) int {
	off := 0
	for p := 0; p < s; p++ {
		off += int(st.n[p*stride+dst])
	}
	return off
}

// copyFrom makes st a copy of src (a cached dispatch reuses its routing).
func (st *htState) copyFrom(src *htState) {
	if st == src {
		return
	}
	copy(st.n, src.n)
	copy(st.recvOff, src.recvOff)
	copy(st.sendOff, src.sendOff)
	st.dropped = append(st.dropped[:0], src.dropped...)
	copy(st.expert, src.expert) // expert-major: from the counts (flat: recounted at wait)
	copy(st.source, src.source)
	copy(st.zoneOff, src.zoneOff)
	copy(st.at, src.at)
	for i := range src.fwd {
		f, g := &st.fwd[i], &src.fwd[i]
		f.src, f.rows = g.src, g.rows
		f.start = append(f.start[:0], g.start...)
		f.dst = append(f.dst[:0], g.dst...)
		f.row = append(f.row[:0], g.row...)
		f.slot = append(f.slot[:0], g.slot...)
	}
}

func (m *htMode) combineSend(c *driver.Combine) error {
	e, t := m.e, &m.e.t
	d := c.Dispatch
	if err := t.awaitReaders(e.names.Combine, 0, e.last[0]); err != nil {
		return err
	}
	// The last combine's sums may still be leaving from these buffers.
	if err := t.awaitSent(e.names.Combine, m.sentSums); err != nil {
		return err
	}
	ysrc := ySrcComb
	switch c.YIn {
	case driver.YInRows:
		ysrc = ySrcRecv
	case driver.YElsewhere:
		copy(hostBytes(d.Recv.Outputs), hostBytes(c.Y))
	}
	if m.fp8 != nil { // cast once, read by this node's ranks
		off := m.comb.Off
		if ysrc == ySrcRecv {
			off = m.recv.Rows.Off
		}
		m.fp8.castPartials(m, off, d.Recv.Outputs.Len()/m.rowBytes)
	}
	if !c.RowValues.IsZero() {
		m.lay.rowValues(c, d.State.(*htState))
		ysrc |= ySrcValues
	}
	return t.raise(t.nodeRanks, flagReady, 0, t.me, c.Op, uint32(ysrc), nil)
}

func (m *htMode) combineWait(c *driver.Combine) error {
	e, t := m.e, &m.e.t
	op := e.names.Combine
	d := c.Dispatch
	st := d.State.(*htState)
	rt, R, K, M := d.Route, m.R, m.K, m.M
	t0 := t.clock()
	if err := t.await(op, "its partial outputs", flagReady, 0, t.nodeRanks, nil, c.Op); err != nil {
		return err
	}
	t.span(c.Op, "wait node ready", -1, 0, t0)
	area := grow.To(m.area, R) // where each rank of this node keeps its partials
	m.area = area
	missing := -1
	for _, r := range t.nodeRanks {
		where := t.flagPayload(flagReady, 0, r, r)
		area[r] = m.comb.Off
		if where&ySrcComb == 0 {
			area[r] = m.recv.Rows.Off
		}
		if !c.SlotValues.IsZero() && where&ySrcValues == 0 {
			missing = r
		}
	}
	withValues := !c.SlotValues.IsZero() && missing < 0
	if err := m.returnSums(op, c, st, area, withValues); err != nil {
		return err
	}
	// This rank's tokens: node by node, ranks in local order inside this node.
	start, src, vals := grow.To(m.start, rt.T+1), &m.src, &m.vals2
	src.Reset()
	vals.Reset()
	add := m.addPartial
	if m.fp8 != nil {
		m.fp8.scl.Reset()
		add = m.fp8.add
	}
	if add == nil { // once: a method value allocates
		m.addPartial = func(r, row int) {
			m.src.Add(m.e.t.lsa(r, m.area[r]+row*m.rowBytes))
			m.vals2.Add(m.e.t.lsa(r, m.vals.At(row)))
		}
		add = m.addPartial
	}
	for tk := 0; tk < rt.T; tk++ {
		start[tk] = int32(src.Len())
		for b := 0; b < m.nodes; b++ {
			if b == m.myNode {
				m.lay.localSources(d, st, tk, add)
			} else if o := rt.TokNodeOrd[tk*m.nodes+b]; o >= 0 && m.fp8 != nil {
				m.fp8.addStaged(m, b, int(o))
			} else if o >= 0 {
				src.Add(t.staged(m.sums.At(b*M + int(o))))
				vals.Add(t.staged(m.svals.At(b*M + int(o))))
			}
		}
	}
	start[rt.T] = int32(src.Len())
	m.start = start
	// Reduce the tokens as the other nodes' sums of them arrive, in token
	// order (each node's sums come in its staged order, the token order):
	// the reduction of the first tokens overlaps the transfer of the last
	// sums.
	t0 = t.clock()
	out := unsafe.Pointer(unsafe.SliceData(hostBytes(c.Out)))
	tab := src.Frozen()
	var scl hostrows.CTable
	if m.fp8 != nil {
		scl = m.fp8.scl.Frozen()
	}
	for lo := 0; lo < rt.T; {
		hi, err := m.sumsArrived(op, c.Op, rt, lo)
		if err != nil {
			return err
		}
		at := unsafe.Add(out, lo*e.spec.RowBytes)
		if m.fp8 != nil {
			hostrows.ReduceFP8RowsFrom(at, e.spec.Elem, tab, scl, start[lo:hi+1], hi-lo, m.H)
		} else {
			hostrows.ReduceRowsFrom(at, e.spec.Elem, tab, start[lo:hi+1], hi-lo, m.H, e.spec.Elem, t.stream)
		}
		lo = hi
	}
	t.span(c.Op, "reduce as sums arrive", -1, 0, t0)
	// Every sum, and the sums' values, are in.
	t0 = t.clock()
	if err := t.await(op, "the sums of its node", flagSums, 0, m.myRails, nil, c.Op); err != nil {
		return err
	}
	t.span(c.Op, "wait sums", -1, 0, t0)
	if withValues {
		hostrows.SumValues(c.SlotValues.Host(), vals, start, rt.T, K)
	}
	if err := t.releaseReaders(0, c.Op); err != nil {
		return err
	}
	// Its rails may now send the next combine's sums into the staging this
	// rank just reduced from (returnSums waits for this).
	if err := t.raise(m.myRails, flagDone, 0, t.me, c.Op, 0, nil); err != nil {
		return err
	}
	m.lastCombine = c.Op
	if missing >= 0 {
		return driver.InputErrorf(op, "SlotValues asked for, but rank %d passed no RowValues (set both on every rank, or neither)", missing)
	}
	return nil
}

// returnSums does the rail duty of a combine: for each other node's sender,
// sum this node's partials of the tokens forwarded for it into the
// segment and send the sums back from there, chunk by chunk, saying after
// each how many rows have gone (flagSumRows), and at the end that all have
// (flagSums, after the sums' values).
func (m *htMode) returnSums(op string, c *driver.Combine, st *htState, area []int, withValues bool) error {
	t := &m.e.t
	K, M := m.K, m.M
	if err := t.awaitSent(op, m.sentSums); err != nil { // the last sums have left
		return err
	}
	// The senders have reduced the last combine's sums: this one's go to
	// the same staging. (A dispatch since then has waited for them anyway.)
	if m.lastCombine > 0 {
		if err := t.await(op, "the end of its last combine", flagDone, 0, m.senderRanks, nil, m.lastCombine); err != nil {
			return err
		}
	}
	for i := range m.senders {
		p := &st.fwd[i]
		if p.rows == 0 {
			continue
		}
		t0 := t.clock()
		src, vals := &m.src, &m.vals2
		src.Reset()
		vals.Reset()
		if m.fp8 != nil {
			m.fp8.scl.Reset()
		}
		for i := range p.dst {
			r, row := int(p.dst[i]), int(p.row[i])
			if m.fp8 != nil {
				m.fp8.add(r, row)
				continue
			}
			src.Add(t.lsa(r, area[r]+row*m.rowBytes))
			vals.Add(t.lsa(r, m.vals.At(row)))
		}
		// Alone on its node, this rank's partials are the sums: its rows from
		// the sender, in the staged order, one block (an FP8 combine casts
		// every node's sums alike). Sent in 128-token chunks instead, so that
		// the sender's reduction follows their arrival, HT's combine across 4
		// emulated hosts of one rank was slower in 4 of 5 alternated runs
		// (403-500 ms against 441-502 ms).
		whole := m.alone[m.myNode] && t.inPlace && m.lay.landsInPlace() && m.fp8 == nil
		if whole {
			t.expose(p.src, area[t.me]+int(p.row[0])*m.rowBytes, m.sums.At(m.myNode*M), m.sumsOut.Len(p.rows))
			var err error
			if m.sentSums, err = t.flushInPlace(); err != nil {
				return err
			}
			if err := t.raise(t.just(p.src), flagSumRows, 0, t.me, c.Op, uint32(p.rows), nil); err != nil {
				return err
			}
		}
		// Else chunk by chunk, so that the wire starts on the first sums
		// while the next are summed.
		sums := m.sumsOut.At(m.sumsSlot(m.senders[i]) * M)
		tab := src.Frozen()
		var scl hostrows.CTable
		if m.fp8 != nil {
			scl = m.fp8.scl.Frozen()
		}
		for lo := 0; lo < p.rows && !whole; lo += htChunk {
			hi := min(lo+htChunk, p.rows)
			if m.fp8 != nil {
				hostrows.ReduceFP8RowsFrom(t.lsa(t.me, sums+m.sumsOut.Len(lo)), m.e.spec.Elem, tab, scl, p.start[lo:hi+1], hi-lo, m.H)
				m.fp8.sendSums(m, p.src, m.sumsSlot(m.senders[i])*M, sums, lo, hi)
			} else {
				if err := m.sumRows(sums, tab, p.start, lo, hi); err != nil {
					return err
				}
				t.expose(p.src, sums+m.sumsOut.Len(lo), m.sums.At(m.myNode*M+lo), m.sumsOut.Len(hi-lo))
			}
			var err error
			if m.sentSums, err = t.flushInPlace(); err != nil {
				return err
			}
			if err := t.raise(t.just(p.src), flagSumRows, 0, t.me, c.Op, uint32(hi), nil); err != nil {
				return err
			}
			if err := t.progress(); err != nil {
				return err
			}
		}
		if withValues {
			m.vsum = grow.To(m.vsum, p.rows*K)
			hostrows.SumValues(m.vsum, vals, p.start, p.rows, K)
			t.post(p.src, -1, m.svals.At(m.myNode*M), 0, 4*p.rows*K)
			if err := t.flush(dtype.Bytes(m.vsum)); err != nil {
				return err
			}
		}
		t.span(c.Op, "sums", p.src, int64(p.rows*m.rowBytes), t0)
	}
	return t.raise(m.senderRanks, flagSums, 0, t.me, c.Op, 0, nil)
}

// sumsArrived waits until the other nodes' sums of this rank's tokens from
// lo on have arrived for htChunk tokens (or up to the last token), and
// returns the end of the run of tokens from lo whose sums have all arrived
// (a rail peer says how many of its rows of sums it has put so far in
// flagSumRows).
func (m *htMode) sumsArrived(op string, q uint64, rt *driver.Routing, lo int) (int, error) {
	t, N := &m.e.t, m.nodes
	want := min(lo+htChunk, rt.T)
	for b := 0; b < N; b++ {
		if b == m.myNode {
			continue
		}
		need := -1 // the last row of b's sums that tokens [lo, want) need
		for tk := want - 1; tk >= lo && need < 0; tk-- {
			need = int(rt.TokNodeOrd[tk*N+b])
		}
		if need < 0 {
			continue
		}
		if err := t.awaitPayload(op, "the sums of its node", flagSumRows, t.just(m.rails[b]), q, uint32(need+1)); err != nil {
			return 0, err
		}
	}
	// Further tokens whose sums are in already go with these.
	hi := want
	for ; hi < rt.T; hi++ {
		in := true
		for b := 0; b < N && in; b++ {
			if o := rt.TokNodeOrd[hi*N+b]; b != m.myNode && o >= 0 {
				v := loadFlag(t.inboxOf(m.rails[b], t.in.flagOff(flagSumRows, 0, m.rails[b])))
				in = v>>32 == q && int64(o) < int64(uint32(v))
			}
		}
		if !in {
			break
		}
	}
	return hi, nil
}
