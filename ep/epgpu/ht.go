package epgpu

import (
	"fmt"

	"github.com/goep/goep/ep/driver"
	"github.com/goep/goep/gpu"
)

// High-throughput mode on the device, for a call with sequence number q
// (one buffer set). The receivers' sizes must be known to post their
// receives, so the counts go to the host first:
//
//	dispatch send: (unless cached) exchange every rank's tokens per rank
//	  (q and the counts, one group, copied to the host) and wait for them
//	  polling the communicator; refuse a dispatch that would overflow a receiver,
//	  on every rank alike. Kernel stream: copy the routing (each token's
//	  place among the tokens to each rank) and each sent row's token,
//	  global top-k ids and weights to the device; pack the rows, grouped
//	  by destination, each token once per rank; record "packed". Transfer
//	  stream: wait; one group: to every rank its rows, their metadata and
//	  a header q, from every rank the same, received in place (by source,
//	  then token); record "arrived". Kernel stream: wait; ht_meta makes
//	  the top-k ids local (-1: elsewhere, weight zeroed); count_local
//	  counts the rows per local expert; copy the counts and headers to
//	  the host; record "dispatched".
//	dispatch wait: wait for "dispatched" polling the communicator.
//	combine send: copy the reduction's lists (each token's partials, rank
//	  by rank) to the device; record "ready"; transfer stream: wait; one
//	  group: to every source its rows of the expert outputs, straight from
//	  them, with their values and a header (q, whether values were given);
//	  from every destination the same; record "returned"; kernel stream:
//	  wait; sum each token's partials in rank order, and its slot values;
//	  copy the headers to the host; record "combined".
//	combine wait: wait for "combined" polling the communicator.
type htMode struct {
	e                                  *engine
	R, L, M, K, H, rb, capS, maxRecv   int
	cntSend, cntRecv                   gpu.DevicePtr // [2+R], [R][2+R] int32: q, flags, tokens to each rank
	route                              gpu.DevicePtr // [M*R] token places, [R] block starts, [R] headers
	sendRows, sendMeta                 gpu.DevicePtr // [capS] rows; [capS] tokens, [capS][K] ids, [capS][K] weights
	recvRows, outRows                  gpu.DevicePtr // [maxRecv] rows: Recv and CombineBuffer
	rawTok, rawIDs, rawW               gpu.DevicePtr // as received
	tok, topk, w                       gpu.DevicePtr // made local
	status                             gpu.DevicePtr // [L] counts, [R] headers
	cback, cbackVals, cbackHdr         gpu.DevicePtr // [capS] rows, [capS][K] values, [R] headers
	comb                               gpu.DevicePtr // reduction lists (combOffsets)
	hCnt, hCntRecv, hRoute, hSendMeta  gpu.HostBuffer
	hStatus, hComb, hHdr               gpu.HostBuffer
	cntSent, cntHere, packed, arrived  gpu.Event
	dispatched, ready, returned, combd gpu.Event
	// A refused call's headers: refOut the [R] going out, refIn the [R]
	// that came in, hRef both on the host (out, then in).
	refOut, refIn gpu.DevicePtr
	hRef          gpu.HostBuffer
	refDone       gpu.Event
	links         []htLink // [R]: the call's rows with each rank
}

// An HT group's header, one per peer: the call's sequence number q, flags,
// and the rows the sender sends the receiver and receives from it in the
// group, so that a rank that refused the call without knowing its routing
// can take part in its transfers (htMode.refuse).
const hdrWords = 4

// htLink is what this rank and one peer move in a group: send rows to it,
// from row sendAt of this rank's source buffers, and recv rows from it,
// landing at row recvAt.
type htLink struct{ send, sendAt, recv, recvAt int }

// htState is a dispatch's routing between ranks, kept for its combine and
// for cached dispatches.
type htState struct {
	n       []int32 // [R][R]: tokens from s to d
	recvOff []int   // [R+1]: where each source's rows start here
	base    []int   // [R]: where the rows to each rank start in the send buffer
	expert  []int   // [L]
	source  []int   // [R]
}

func (st *htState) copyFrom(o *htState) {
	if st == o {
		return
	}
	copy(st.n, o.n)
	copy(st.recvOff, o.recvOff)
	copy(st.base, o.base)
}

// combOffsets: [M*R] partial row addresses (u64), [M*R] value row
// addresses (u64), [M+1] list starts, [R] headers.
func (m *htMode) combOffsets() (vals, start, hdr, size int) {
	mr := m.M * m.R
	vals, start = 8*mr, 16*mr
	hdr = start + 4*(m.M+1)
	return vals, start, hdr, hdr + 4*hdrWords*m.R
}

func newHT(e *engine) (*htMode, error) {
	s := e.spec
	R := e.size
	m := &htMode{e: e, R: R, L: s.LocalExperts(R), M: s.MaxTokensPerRank, K: s.TopK, H: s.Hidden, rb: s.RowBytes}
	m.capS = m.M * min(m.K, R)
	m.maxRecv = R * m.M
	if s.MaxRecvTokensPerRank > 0 {
		m.maxRecv = s.MaxRecvTokensPerRank
	}
	a := &allocator{e: e}
	n, K := m.maxRecv, m.K
	_, _, _, combBytes := m.combOffsets()
	m.cntSend, m.cntRecv = a.dev(4*(2+R)), a.dev(4*R*(2+R))
	m.route = a.dev(4 * (m.M*R + R + hdrWords*R))
	m.sendRows, m.sendMeta = a.dev(m.capS*m.rb), a.dev(4*m.capS*(1+2*K))
	m.recvRows, m.outRows = a.dev(n*m.rb), a.dev(n*m.rb)
	m.rawTok, m.rawIDs, m.rawW = a.dev(4*n), a.dev(4*n*K), a.dev(4*n*K)
	m.tok, m.topk, m.w = a.dev(4*n), a.dev(4*n*K), a.dev(4*n*K)
	hb := 4 * hdrWords * R
	m.status = a.dev(4*m.L + hb)
	m.cback, m.cbackVals, m.cbackHdr = a.dev(m.capS*m.rb), a.dev(4*m.capS*K), a.dev(hb)
	m.comb = a.dev(combBytes)
	m.hCnt, m.hCntRecv = a.host(4*(2+R)), a.host(4*R*(2+R))
	m.hRoute, m.hSendMeta = a.host(4*(m.M*R+R)+hb), a.host(4*m.capS*(1+2*K))
	m.hStatus, m.hComb, m.hHdr = a.host(4*m.L+hb), a.host(combBytes), a.host(hb)
	m.cntSent, m.cntHere, m.packed, m.arrived = a.event(), a.event(), a.event(), a.event()
	m.dispatched, m.ready, m.returned, m.combd = a.event(), a.event(), a.event(), a.event()
	m.refOut, m.refIn, m.hRef, m.refDone = a.dev(hb), a.dev(hb), a.host(2*hb), a.event()
	m.links = make([]htLink, R)
	return m, a.err
}

func (m *htMode) end(kind, _ int) gpu.Event {
	if kind == 0 {
		return m.dispatched
	}
	return m.combd
}

func (m *htMode) state(d *driver.Dispatch) *htState {
	st, ok := d.State.(*htState)
	if !ok {
		R := m.R
		st = &htState{n: make([]int32, R*R), recvOff: make([]int, R+1), base: make([]int, R), expert: make([]int, m.L),
			source: make([]int, R)}
		d.State = st
	}
	return st
}

// exchangeCounts shares this rank's tokens per rank with every rank and
// waits for theirs. perRank nil says that this rank refused the call. It
// returns the other ranks that refused it (ascending); when there are any,
// or this rank refused, st is left as it was.
func (m *htMode) exchangeCounts(op string, st *htState, q uint32, perRank []int32) ([]int, error) {
	e, R := m.e, m.R
	mine := i32s(m.hCnt, 0, 2+R)
	mine[0], mine[1] = int32(q), 0
	if perRank == nil {
		mine[1] = flagRefused
		clear(mine[2:])
	} else {
		copy(mine[2:], perRank)
	}
	var qu queue
	qu.do(e.ks.MemcpyHtoDAsync(m.cntSend, m.hCnt, 0, 4*(2+R)))
	qu.do(e.ks.Record(m.cntSent))
	qu.do(e.cs.WaitEvent(m.cntSent))
	if qu.err != nil {
		return nil, fmt.Errorf("epgpu: %s: %w", op, qu.err)
	}
	var sends, recvs []gpu.Transfer
	for _, p := range e.others() {
		sends = append(sends, gpu.Transfer{Peer: p, Ptr: m.cntSend, Bytes: 4 * (2 + R)})
		recvs = append(recvs, gpu.Transfer{Peer: p, Ptr: m.cntRecv + gpu.DevicePtr(4*p*(2+R)), Bytes: 4 * (2 + R)})
	}
	if err := e.sendRecv(op, e.cs, sends, recvs); err != nil {
		return nil, err
	}
	qu.do(e.cs.MemcpyDtoHAsync(m.hCntRecv, 0, m.cntRecv, 4*R*(2+R)))
	qu.do(e.cs.Record(m.cntHere))
	if qu.err != nil {
		return nil, fmt.Errorf("epgpu: %s: %w", op, qu.err)
	}
	if err := e.wait(op, "its counts", m.cntHere, headers{at: m.cntRecv, stride: 4 * (2 + R), peers: e.others(), op: q}); err != nil {
		return nil, err
	}
	all := i32s(m.hCntRecv, 0, R*(2+R))
	var refusers []int
	for s := 0; s < R; s++ {
		if row := all[s*(2+R):]; s != e.rank {
			if uint32(row[0]) != q {
				return nil, fmt.Errorf("epgpu: %s: the counts from rank %d are not of this call", op, s)
			}
			if row[1]&flagRefused != 0 {
				refusers = append(refusers, s)
			}
		}
	}
	if perRank == nil || len(refusers) > 0 {
		return refusers, nil
	}
	for s := 0; s < R; s++ {
		row := all[s*(2+R):]
		if s == e.rank {
			row = mine
		}
		copy(st.n[s*R:(s+1)*R], row[2:2+R])
	}
	for d := 0; d < R; d++ {
		total := 0
		for s := 0; s < R; s++ {
			total += int(st.n[s*R+d])
		}
		if total > m.maxRecv {
			// Every rank sees the same counts and refuses alike, before
			// anything is written.
			return nil, driver.InputErrorf(op, "rank %d would receive %d rows, more than MaxRecvTokensPerRank = %d", d, total, m.maxRecv)
		}
	}
	me := e.rank
	st.recvOff[0] = 0
	for s := 0; s < R; s++ {
		st.recvOff[s+1] = st.recvOff[s] + int(st.n[s*R+me])
	}
	b := 0
	for d := 0; d < R; d++ {
		st.base[d] = b
		b += int(st.n[me*R+d])
	}
	return nil, nil
}

// linksOf sets m.links to a dispatch's rows with each rank (combine: the
// way back).
func (m *htMode) linksOf(st *htState, combine bool) []htLink {
	me, R := m.e.rank, m.R
	for p := range m.links {
		out := htLink{send: int(st.n[me*R+p]), sendAt: st.base[p], recv: int(st.n[p*R+me]), recvAt: st.recvOff[p]}
		if combine {
			out = htLink{send: out.recv, sendAt: out.recvAt, recv: out.send, recvAt: out.sendAt}
		}
		m.links[p] = out
	}
	return m.links
}

// putHeaders writes the header for every peer ([R][hdrWords] at words).
func (m *htMode) putHeaders(words []int32, q uint32, flags int32, links []htLink) {
	for p, l := range links {
		h := words[p*hdrWords : (p+1)*hdrWords]
		h[0], h[1], h[2], h[3] = int32(q), flags, int32(l.send), int32(l.recv)
	}
}

// dispatchTransfers lists a dispatch's group: with every other rank, first
// its header (from hdrOut, into hdrIn, hdrWords per rank), then, where
// there are rows, the rows and their tokens, top-k ids and weights (from
// the send buffers, into the receive buffers). headers and data choose
// which of the two parts to list.
func (m *htMode) dispatchTransfers(links []htLink, hdrOut, hdrIn gpu.DevicePtr, headers, data bool) (sends, recvs []gpu.Transfer) {
	K := m.K
	for p, l := range links {
		if headers && p != m.e.rank {
			at := gpu.DevicePtr(4 * hdrWords * p)
			sends = append(sends, gpu.Transfer{Peer: p, Ptr: hdrOut + at, Bytes: 4 * hdrWords})
			recvs = append(recvs, gpu.Transfer{Peer: p, Ptr: hdrIn + at, Bytes: 4 * hdrWords})
		}
		if !data {
			continue
		}
		if n := l.send; n > 0 {
			b := l.sendAt
			sends = append(sends, gpu.Transfer{Peer: p, Ptr: m.sendRows + gpu.DevicePtr(b*m.rb), Bytes: n * m.rb},
				gpu.Transfer{Peer: p, Ptr: m.sendMeta + gpu.DevicePtr(4*b), Bytes: 4 * n},
				gpu.Transfer{Peer: p, Ptr: m.sendMeta + gpu.DevicePtr(4*(m.capS+b*K)), Bytes: 4 * n * K},
				gpu.Transfer{Peer: p, Ptr: m.sendMeta + gpu.DevicePtr(4*(m.capS*(1+K)+b*K)), Bytes: 4 * n * K})
		}
		if n := l.recv; n > 0 {
			o := l.recvAt
			recvs = append(recvs, gpu.Transfer{Peer: p, Ptr: m.recvRows + gpu.DevicePtr(o*m.rb), Bytes: n * m.rb},
				gpu.Transfer{Peer: p, Ptr: m.rawTok + gpu.DevicePtr(4*o), Bytes: 4 * n},
				gpu.Transfer{Peer: p, Ptr: m.rawIDs + gpu.DevicePtr(4*o*K), Bytes: 4 * n * K},
				gpu.Transfer{Peer: p, Ptr: m.rawW + gpu.DevicePtr(4*o*K), Bytes: 4 * n * K})
		}
	}
	return sends, recvs
}

// combineTransfers lists a combine's group: with every other rank, first
// its header, then, where there are rows, the expert outputs (from y) and
// their values (from vals) going back, and the partials coming back.
func (m *htMode) combineTransfers(links []htLink, y, vals, hdrOut, hdrIn gpu.DevicePtr, headers, data bool) (sends, recvs []gpu.Transfer) {
	K := m.K
	for p, l := range links {
		if headers && p != m.e.rank {
			at := gpu.DevicePtr(4 * hdrWords * p)
			sends = append(sends, gpu.Transfer{Peer: p, Ptr: hdrOut + at, Bytes: 4 * hdrWords})
			recvs = append(recvs, gpu.Transfer{Peer: p, Ptr: hdrIn + at, Bytes: 4 * hdrWords})
		}
		if !data {
			continue
		}
		if n := l.send; n > 0 {
			o := l.sendAt
			sends = append(sends, gpu.Transfer{Peer: p, Ptr: y + gpu.DevicePtr(o*m.rb), Bytes: n * m.rb},
				gpu.Transfer{Peer: p, Ptr: vals + gpu.DevicePtr(4*o*K), Bytes: 4 * n * K})
		}
		if n := l.recv; n > 0 {
			b := l.recvAt
			recvs = append(recvs, gpu.Transfer{Peer: p, Ptr: m.cback + gpu.DevicePtr(b*m.rb), Bytes: n * m.rb},
				gpu.Transfer{Peer: p, Ptr: m.cbackVals + gpu.DevicePtr(4*b*K), Bytes: 4 * n * K})
		}
	}
	return sends, recvs
}

// refusers reads the headers of call q from every other rank ([R]
// headers) and returns the ranks whose header refuses the call. A header of
// another call is a failure; what names the data in its message.
func (m *htMode) refusers(op, what string, q uint32, words []int32) ([]int, error) {
	var out []int
	for p := 0; p < m.R; p++ {
		if p == m.e.rank {
			continue
		}
		h := words[p*hdrWords:]
		if uint32(h[0]) != q {
			return nil, fmt.Errorf("epgpu: %s: the %s from rank %d are not of this call", op, what, p)
		}
		if h[1]&flagRefused != 0 {
			out = append(out, p)
		}
	}
	return out, nil
}

func (m *htMode) send(d *driver.Dispatch) error {
	e := m.e
	op, rt, me := e.names.dispatch, d.Route, e.rank
	T, K, R, q := rt.T, m.K, m.R, uint32(d.Op)
	st := m.state(d)
	if d.From != nil {
		st.copyFrom(d.From.State.(*htState))
	} else if refusers, err := m.exchangeCounts(op, st, q, rt.PerRank); err != nil {
		return err
	} else if len(refusers) > 0 {
		return e.refusedBy(op, refusers)
	}

	// The routing, and each sent row's token, top-k ids and weights.
	mr := m.M * R
	copy(i32s(m.hRoute, 0, T*R), rt.TokRankOrd[:T*R])
	base := i32s(m.hRoute, 4*mr, R)
	for p := range base {
		base[p] = int32(st.base[p])
	}
	links := m.linksOf(st, false)
	m.putHeaders(i32s(m.hRoute, 4*(mr+R), hdrWords*R), q, 0, links)
	sent := st.base[R-1] + int(st.n[me*R+R-1])
	tok := i32s(m.hSendMeta, 0, m.capS)
	ids := i32s(m.hSendMeta, 4*m.capS, m.capS*K)
	wts := f32s(m.hSendMeta, 4*m.capS*(1+K), m.capS*K)
	for t := 0; t < T; t++ {
		for p := 0; p < R; p++ {
			o := rt.TokRankOrd[t*R+p]
			if o < 0 {
				continue
			}
			row := st.base[p] + int(o)
			tok[row] = int32(t)
			copy(ids[row*K:(row+1)*K], d.TopK[t*K:(t+1)*K])
			copy(wts[row*K:(row+1)*K], d.Weights[t*K:(t+1)*K])
		}
	}

	var qu queue
	qu.do(e.ks.MemcpyHtoDAsync(m.route, m.hRoute, 0, 4*(mr+R+hdrWords*R)))
	qu.do(e.ks.MemcpyHtoDAsync(m.sendMeta, m.hSendMeta, 0, 4*sent))
	qu.do(e.ks.MemcpyHtoDAsync(m.sendMeta+gpu.DevicePtr(4*m.capS), m.hSendMeta, 4*m.capS, 4*sent*K))
	qu.do(e.ks.MemcpyHtoDAsync(m.sendMeta+gpu.DevicePtr(4*m.capS*(1+K)), m.hSendMeta, 4*m.capS*(1+K), 4*sent*K))
	if qu.err == nil {
		qu.do(e.k.PackRows(e.ks, gpu.PackRowsArgs{Dst: m.sendRows, DstRows: m.capS, Src: ptrOf(d.X), Ord: m.route,
			Base: m.route + gpu.DevicePtr(4*mr), Tokens: T, Width: R, RowBytes: m.rb}))
	}
	qu.do(e.ks.Record(m.packed))
	qu.do(e.cs.WaitEvent(m.packed))
	if qu.err != nil {
		return fmt.Errorf("epgpu: %s: %w", op, qu.err)
	}
	sends, recvs := m.dispatchTransfers(links, m.route+gpu.DevicePtr(4*(mr+R)), m.status+gpu.DevicePtr(4*m.L), true, true)
	if err := e.sendRecv(op, e.cs, sends, recvs); err != nil {
		return err
	}
	n := st.recvOff[R]
	qu.do(e.cs.Record(m.arrived))
	qu.do(e.ks.WaitEvent(m.arrived))
	if qu.err == nil {
		qu.do(e.k.HTMeta(e.ks, gpu.HTMetaArgs{TokOut: m.tok, TopKOut: m.topk, WOut: m.w, N: n, SrcTok: m.rawTok,
			SrcTopK: m.rawIDs, SrcW: m.rawW, K: K, L: m.L, Rank: me}))
	}
	if qu.err == nil {
		qu.do(e.k.CountLocal(e.ks, m.status, m.topk, n, K, m.L))
	}
	qu.do(e.ks.MemcpyDtoHAsync(m.hStatus, 0, m.status, 4*(m.L+hdrWords*R)))
	qu.do(e.ks.Record(m.dispatched))
	if qu.err != nil {
		return fmt.Errorf("epgpu: %s: %w", op, qu.err)
	}
	return nil
}

// sources lists the ranks other than this one that send here (from) or
// that this rank sends to (to is false).
func (m *htMode) peers(st *htState, from bool) []int {
	var out []int
	me := m.e.rank
	for p := 0; p < m.R; p++ {
		n := st.n[me*m.R+p]
		if from {
			n = st.n[p*m.R+me]
		}
		if p != me && n > 0 {
			out = append(out, p)
		}
	}
	return out
}

func (m *htMode) wait(d *driver.Dispatch) error {
	e := m.e
	op, q, st := e.names.dispatch, uint32(d.Op), d.State.(*htState)
	hdrAt := m.status + gpu.DevicePtr(4*m.L)
	if err := e.wait(op, "its rows", m.dispatched, headers{at: hdrAt, stride: 4 * hdrWords, peers: e.others(), op: q}); err != nil {
		return err
	}
	refusers, err := m.refusers(op, "rows", q, i32s(m.hStatus, 4*m.L, hdrWords*m.R))
	if err != nil {
		return err
	}
	if len(refusers) > 0 {
		return e.refusedBy(op, refusers)
	}
	for l, c := range i32s(m.hStatus, 0, m.L) {
		st.expert[l] = int(c)
	}
	for s := 0; s < m.R; s++ {
		st.source[s] = st.recvOff[s+1] - st.recvOff[s]
	}
	n, K := st.recvOff[m.R], m.K
	d.Recv = driver.Received{
		Rows:         tensor[byte](e, m.recvRows, n*m.rb),
		Outputs:      tensor[byte](e, m.outRows, n*m.rb),
		Weights:      tensor[float32](e, m.w, 4*n*K),
		TopK:         tensor[int32](e, m.topk, 4*n*K),
		Tokens:       tensor[int32](e, m.tok, 4*n),
		ExpertCounts: st.expert,
		SourceCounts: st.source,
		NumRecv:      n,
	}
	return nil
}

func (m *htMode) combineSend(c *driver.Combine) error {
	e := m.e
	d := c.Dispatch
	op, rt, st := e.names.combine, d.Route, d.State.(*htState)
	T, K, R, q := rt.T, m.K, m.R, uint32(c.Op)

	// Each token's partials, rank by rank.
	valsOff, startOff, hdrOff, _ := m.combOffsets()
	mr := m.M * R
	ptrs, vptrs := u64s(m.hComb, 0, mr), u64s(m.hComb, valsOff, mr)
	start := i32s(m.hComb, startOff, m.M+1)
	n := 0
	for t := 0; t < T; t++ {
		start[t] = int32(n)
		for p := 0; p < R; p++ {
			if o := rt.TokRankOrd[t*R+p]; o >= 0 {
				row := st.base[p] + int(o)
				ptrs[n] = uint64(m.cback) + uint64(row*m.rb)
				vptrs[n] = uint64(m.cbackVals) + uint64(4*row*K)
				n++
			}
		}
	}
	start[T] = int32(n)
	vals, flags := m.w, int32(0) // m.w is sent, and ignored, when no values are given: its size is right
	if !c.RowValues.IsZero() {
		vals, flags = ptrOf(c.RowValues), flagValues
	}
	links := m.linksOf(st, true)
	m.putHeaders(i32s(m.hComb, hdrOff, hdrWords*R), q, flags, links)

	var qu queue
	qu.do(e.ks.MemcpyHtoDAsync(m.comb, m.hComb, 0, 8*n))
	qu.do(e.ks.MemcpyHtoDAsync(m.comb+gpu.DevicePtr(valsOff), m.hComb, valsOff, 8*n))
	qu.do(e.ks.MemcpyHtoDAsync(m.comb+gpu.DevicePtr(startOff), m.hComb, startOff, 4*(T+1)))
	qu.do(e.ks.MemcpyHtoDAsync(m.comb+gpu.DevicePtr(hdrOff), m.hComb, hdrOff, 4*hdrWords*R))
	qu.do(e.ks.Record(m.ready))
	qu.do(e.cs.WaitEvent(m.ready))
	if qu.err != nil {
		return fmt.Errorf("epgpu: %s: %w", op, qu.err)
	}
	sends, recvs := m.combineTransfers(links, ptrOf(c.Y), vals, m.comb+gpu.DevicePtr(hdrOff), m.cbackHdr, true, true)
	if err := e.sendRecv(op, e.cs, sends, recvs); err != nil {
		return err
	}
	qu.do(e.cs.Record(m.returned))
	qu.do(e.ks.WaitEvent(m.returned))
	if qu.err == nil {
		qu.do(e.k.ReduceRows(e.ks, gpu.ReduceArgs{Out: ptrOf(c.Out), OutType: e.spec.Elem, Src: m.comb,
			Start: m.comb + gpu.DevicePtr(startOff), N: T, Hidden: m.H, InType: e.spec.Elem}))
	}
	if !c.SlotValues.IsZero() && qu.err == nil {
		qu.do(e.k.ReduceRows(e.ks, gpu.ReduceArgs{Out: ptrOf(c.SlotValues), OutType: gpu.F32,
			Src: m.comb + gpu.DevicePtr(valsOff), Start: m.comb + gpu.DevicePtr(startOff), N: T, Hidden: K, InType: gpu.F32}))
	}
	qu.do(e.ks.MemcpyDtoHAsync(m.hHdr, 0, m.cbackHdr, 4*hdrWords*R))
	qu.do(e.ks.Record(m.combd))
	if qu.err != nil {
		return fmt.Errorf("epgpu: %s: %w", op, qu.err)
	}
	return nil
}

func (m *htMode) combineWait(c *driver.Combine) error {
	e := m.e
	op, q, st := e.names.combine, uint32(c.Op), c.Dispatch.State.(*htState)
	if err := e.wait(op, "its partial outputs", m.combd, headers{at: m.cbackHdr, stride: 4 * hdrWords, peers: e.others(), op: q}); err != nil {
		return err
	}
	hdr := i32s(m.hHdr, 0, hdrWords*m.R)
	refusers, err := m.refusers(op, "partial outputs", q, hdr)
	if err != nil {
		return err
	}
	if len(refusers) > 0 {
		return e.refusedBy(op, refusers)
	}
	if !c.SlotValues.IsZero() {
		for _, p := range m.peers(st, false) {
			if hdr[hdrWords*p+1]&flagValues == 0 {
				return driver.InputErrorf(op, "SlotValues asked for, but rank %d passed no RowValues (set both on every rank, or neither)", p)
			}
		}
	}
	return nil
}

// refuse takes part in a refused call. A fresh dispatch: the count
// exchange, with a refusing header and no counts. A cached dispatch or a
// combine: its group, whose sizes follow the routing of the dispatch it
// uses. Where this rank resolved that dispatch (r.Dispatch) it posts the
// same group as the others, with refusing headers; where it did not, it
// posts the headers alone, reads from each peer's header the rows it sends
// and expects, and then posts the rest of the group with those sizes (NCCL
// matches the transfers between two ranks in order, whichever groups they
// are posted in). The rows sent are whatever the buffers hold; those
// received land in the buffers the others' same call fills (the receive
// buffer, which a refused dispatch counts as overwritten; the combine's
// return buffers), after the kernels queued before.
func (m *htMode) refuse(r *driver.Refusal) ([]int, error) {
	e := m.e
	q := uint32(r.Op)
	op := e.names.combine
	if r.Kind == driver.CallDispatch {
		op = e.names.dispatch
		if !r.Cached {
			return m.exchangeCounts(op, nil, q, nil)
		}
	}
	combine := r.Kind == driver.CallCombine
	known := r.Dispatch != nil
	links := m.links
	if known {
		links = m.linksOf(r.Dispatch.State.(*htState), combine)
	} else {
		clear(links)
	}
	hb := 4 * hdrWords * m.R
	m.putHeaders(i32s(m.hRef, 0, hdrWords*m.R), q, flagRefused, links)
	var qu queue
	e.afterKernels(&qu)
	qu.do(e.cs.MemcpyHtoDAsync(m.refOut, m.hRef, 0, hb))
	if qu.err != nil {
		return nil, fmt.Errorf("epgpu: %s: %w", op, qu.err)
	}
	post := func(withHeaders, data bool) error {
		sends, recvs := m.dispatchTransfers(links, m.refOut, m.refIn, withHeaders, data)
		if combine {
			sends, recvs = m.combineTransfers(links, m.recvRows, m.w, m.refOut, m.refIn, withHeaders, data)
		}
		if err := e.sendRecv(op, e.cs, sends, recvs); err != nil {
			return err
		}
		if withHeaders {
			qu.do(e.cs.MemcpyDtoHAsync(m.hRef, hb, m.refIn, hb))
		}
		qu.do(e.cs.Record(m.refDone))
		if qu.err != nil {
			return fmt.Errorf("epgpu: %s: %w", op, qu.err)
		}
		h := headers{at: m.refIn, stride: 4 * hdrWords, peers: e.others(), op: q}
		return e.wait(op, "the other ranks' part in a call this rank refused", m.refDone, h)
	}
	if err := post(true, known); err != nil {
		return nil, err
	}
	in := i32s(m.hRef, hb, hdrWords*m.R)
	what := "rows"
	if combine {
		what = "partial outputs"
	}
	refusers, err := m.refusers(op, what, q, in)
	if err != nil || known {
		return refusers, err
	}
	// The rest of the group, as the peers' headers size it: each sent
	// its rows to this rank (h[2]) and expects h[3] from it.
	sendCap, recvCap := m.capS, m.maxRecv
	if combine {
		sendCap, recvCap = m.maxRecv, m.capS
	}
	sent, got := 0, 0
	for p := range links {
		if p == e.rank {
			continue
		}
		h := in[p*hdrWords:]
		send, recv := int(h[3]), int(h[2])
		if send < 0 || recv < 0 || sent+send > sendCap || got+recv > recvCap {
			return nil, fmt.Errorf("epgpu: %s: the header from rank %d asks for %d rows and sends %d: more than the buffers hold", op, p, send, recv)
		}
		links[p] = htLink{send: send, sendAt: sent, recv: recv, recvAt: got}
		sent, got = sent+send, got+recv
	}
	if sent+got == 0 {
		return refusers, nil
	}
	return refusers, post(false, true)
}
