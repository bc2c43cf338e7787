package epgpu

import (
	"fmt"

	"github.com/goep/goep/ep"
	"github.com/goep/goep/gpu"
)

// High-throughput mode on the device, for a call with sequence number q
// (one buffer set). The receivers' sizes must be known to post their
// receives, so the counts go to the host first:
//
//	dispatch send: (unless cached) exchange every rank's tokens per rank
//	  (q and the counts, one group, copied to the host) and wait for them
//	  under the watchdog; refuse a dispatch that would overflow a receiver,
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
//	dispatch wait: wait for "dispatched" under the watchdog.
//	combine send: copy the reduction's lists (each token's partials, rank
//	  by rank) to the device; record "ready"; transfer stream: wait; one
//	  group: to every source its rows of the expert outputs, straight from
//	  them, with their values and a header (q, whether values were given);
//	  from every destination the same; record "returned"; kernel stream:
//	  wait; sum each token's partials in rank order, and its slot values;
//	  copy the headers to the host; record "combined".
//	combine wait: wait for "combined" under the watchdog.
type htMode struct {
	e                                  *engine
	R, L, M, K, H, rb, capS, maxRecv   int
	cntSend, cntRecv                   gpu.DevicePtr // [2+R], [R][2+R] int32: q, 0, tokens to each rank
	route                              gpu.DevicePtr // [M*R] token places, [R] block starts, [2] header
	sendRows, sendMeta                 gpu.DevicePtr // [capS] rows; [capS] tokens, [capS][K] ids, [capS][K] weights
	recvRows, outRows                  gpu.DevicePtr // [maxRecv] rows: Recv and CombineBuffer
	rawTok, rawIDs, rawW               gpu.DevicePtr // as received
	tok, topk, w                       gpu.DevicePtr // made local
	status                             gpu.DevicePtr // [L] counts, [R][2] headers
	cback, cbackVals, cbackHdr         gpu.DevicePtr // [capS] rows, [capS][K] values, [R][2] headers
	comb                               gpu.DevicePtr // reduction lists (combOffsets)
	hCnt, hCntRecv, hRoute, hSendMeta  HostBuffer
	hStatus, hComb, hHdr               HostBuffer
	cntSent, cntHere, packed, arrived  Event
	dispatched, ready, returned, combd Event
}

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
// addresses (u64), [M+1] list starts, a header of 2 words.
func (m *htMode) combOffsets() (vals, start, hdr, size int) {
	mr := m.M * m.R
	vals, start = 8*mr, 16*mr
	hdr = start + 4*(m.M+1)
	return vals, start, hdr, hdr + 8
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
	m.route = a.dev(4 * (m.M*R + R + 2))
	m.sendRows, m.sendMeta = a.dev(m.capS*m.rb), a.dev(4*m.capS*(1+2*K))
	m.recvRows, m.outRows = a.dev(n*m.rb), a.dev(n*m.rb)
	m.rawTok, m.rawIDs, m.rawW = a.dev(4*n), a.dev(4*n*K), a.dev(4*n*K)
	m.tok, m.topk, m.w = a.dev(4*n), a.dev(4*n*K), a.dev(4*n*K)
	m.status = a.dev(4*m.L + 8*R)
	m.cback, m.cbackVals, m.cbackHdr = a.dev(m.capS*m.rb), a.dev(4*m.capS*K), a.dev(8*R)
	m.comb = a.dev(combBytes)
	m.hCnt, m.hCntRecv = a.host(4*(2+R)), a.host(4*R*(2+R))
	m.hRoute, m.hSendMeta = a.host(4*(m.M*R+R+2)), a.host(4*m.capS*(1+2*K))
	m.hStatus, m.hComb, m.hHdr = a.host(4*m.L+8*R), a.host(combBytes), a.host(8*R)
	m.cntSent, m.cntHere, m.packed, m.arrived = a.event(), a.event(), a.event(), a.event()
	m.dispatched, m.ready, m.returned, m.combd = a.event(), a.event(), a.event(), a.event()
	return m, a.err
}

func (m *htMode) state(d *ep.Dispatch) *htState {
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
// waits for theirs.
func (m *htMode) exchangeCounts(op string, st *htState, q uint32, perRank []int32) error {
	e, R := m.e, m.R
	mine := i32s(m.hCnt, 0, 2+R)
	mine[0], mine[1] = int32(q), 0
	copy(mine[2:], perRank)
	var qu queue
	qu.do(e.ks.MemcpyHtoDAsync(m.cntSend, m.hCnt, 0, 4*(2+R)))
	qu.do(e.ks.Record(m.cntSent))
	qu.do(e.cs.WaitEvent(m.cntSent))
	if qu.err != nil {
		return fmt.Errorf("epgpu: %s: %w", op, qu.err)
	}
	var sends, recvs []gpu.Transfer
	for _, p := range e.others() {
		sends = append(sends, gpu.Transfer{Peer: p, Ptr: m.cntSend, Bytes: 4 * (2 + R)})
		recvs = append(recvs, gpu.Transfer{Peer: p, Ptr: m.cntRecv + gpu.DevicePtr(4*p*(2+R)), Bytes: 4 * (2 + R)})
	}
	if err := e.sendRecv(op, e.cs, sends, recvs); err != nil {
		return err
	}
	qu.do(e.cs.MemcpyDtoHAsync(m.hCntRecv, 0, m.cntRecv, 4*R*(2+R)))
	qu.do(e.cs.Record(m.cntHere))
	if qu.err != nil {
		return fmt.Errorf("epgpu: %s: %w", op, qu.err)
	}
	if err := e.wait(op, "its counts", m.cntHere, headers{at: m.cntRecv, stride: 4 * (2 + R), peers: e.others(), op: q}); err != nil {
		return err
	}
	all := i32s(m.hCntRecv, 0, R*(2+R))
	for s := 0; s < R; s++ {
		row := all[s*(2+R):]
		if s == e.rank {
			row = mine
		} else if uint32(row[0]) != q {
			return fmt.Errorf("epgpu: %s: the counts from rank %d are not of this call", op, s)
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
			return ep.InputErrorf(op, "rank %d would receive %d rows, more than MaxRecvTokensPerRank = %d", d, total, m.maxRecv)
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
	return nil
}

func (m *htMode) send(d *ep.Dispatch) error {
	e := m.e
	op, rt, me := e.names.dispatch, d.Route, e.rank
	T, K, R, q := rt.T, m.K, m.R, uint32(d.Op)
	st := m.state(d)
	if d.From != nil {
		st.copyFrom(d.From.State.(*htState))
	} else if err := m.exchangeCounts(op, st, q, rt.PerRank); err != nil {
		return err
	}

	// The routing, and each sent row's token, top-k ids and weights.
	mr := m.M * R
	copy(i32s(m.hRoute, 0, T*R), rt.TokRankOrd[:T*R])
	base, hdr := i32s(m.hRoute, 4*mr, R), i32s(m.hRoute, 4*(mr+R), 2)
	for p := range base {
		base[p] = int32(st.base[p])
	}
	hdr[0], hdr[1] = int32(q), 0
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
	qu.do(e.ks.MemcpyHtoDAsync(m.route, m.hRoute, 0, 4*(mr+R+2)))
	qu.do(e.ks.MemcpyHtoDAsync(m.sendMeta, m.hSendMeta, 0, 4*sent))
	qu.do(e.ks.MemcpyHtoDAsync(m.sendMeta+gpu.DevicePtr(4*m.capS), m.hSendMeta, 4*m.capS, 4*sent*K))
	qu.do(e.ks.MemcpyHtoDAsync(m.sendMeta+gpu.DevicePtr(4*m.capS*(1+K)), m.hSendMeta, 4*m.capS*(1+K), 4*sent*K))
	if qu.err == nil {
		qu.do(e.k.PackRows(e.ks.Queue(), gpu.PackRowsArgs{Dst: m.sendRows, DstRows: m.capS, Src: ptrOf(d.X), Ord: m.route,
			Base: m.route + gpu.DevicePtr(4*mr), Tokens: T, Width: R, RowBytes: m.rb}))
	}
	qu.do(e.ks.Record(m.packed))
	qu.do(e.cs.WaitEvent(m.packed))
	if qu.err != nil {
		return fmt.Errorf("epgpu: %s: %w", op, qu.err)
	}
	var sends, recvs []gpu.Transfer
	for p := 0; p < R; p++ {
		if n := int(st.n[me*R+p]); n > 0 {
			b := st.base[p]
			sends = append(sends, gpu.Transfer{Peer: p, Ptr: m.sendRows + gpu.DevicePtr(b*m.rb), Bytes: n * m.rb},
				gpu.Transfer{Peer: p, Ptr: m.sendMeta + gpu.DevicePtr(4*b), Bytes: 4 * n},
				gpu.Transfer{Peer: p, Ptr: m.sendMeta + gpu.DevicePtr(4*(m.capS+b*K)), Bytes: 4 * n * K},
				gpu.Transfer{Peer: p, Ptr: m.sendMeta + gpu.DevicePtr(4*(m.capS*(1+K)+b*K)), Bytes: 4 * n * K},
				gpu.Transfer{Peer: p, Ptr: m.route + gpu.DevicePtr(4*(mr+R)), Bytes: 8})
		}
		if n := int(st.n[p*R+me]); n > 0 {
			o := st.recvOff[p]
			recvs = append(recvs, gpu.Transfer{Peer: p, Ptr: m.recvRows + gpu.DevicePtr(o*m.rb), Bytes: n * m.rb},
				gpu.Transfer{Peer: p, Ptr: m.rawTok + gpu.DevicePtr(4*o), Bytes: 4 * n},
				gpu.Transfer{Peer: p, Ptr: m.rawIDs + gpu.DevicePtr(4*o*K), Bytes: 4 * n * K},
				gpu.Transfer{Peer: p, Ptr: m.rawW + gpu.DevicePtr(4*o*K), Bytes: 4 * n * K},
				gpu.Transfer{Peer: p, Ptr: m.status + gpu.DevicePtr(4*m.L+8*p), Bytes: 8})
		}
	}
	if err := e.sendRecv(op, e.cs, sends, recvs); err != nil {
		return err
	}
	n := st.recvOff[R]
	qu.do(e.cs.Record(m.arrived))
	qu.do(e.ks.WaitEvent(m.arrived))
	if qu.err == nil {
		qu.do(e.k.HTMeta(e.ks.Queue(), gpu.HTMetaArgs{TokOut: m.tok, TopKOut: m.topk, WOut: m.w, N: n, SrcTok: m.rawTok,
			SrcTopK: m.rawIDs, SrcW: m.rawW, K: K, L: m.L, Rank: me}))
	}
	if qu.err == nil {
		qu.do(e.k.CountLocal(e.ks.Queue(), m.status, m.topk, n, K, m.L))
	}
	qu.do(e.ks.MemcpyDtoHAsync(m.hStatus, 0, m.status, 4*m.L+8*R))
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

func (m *htMode) wait(d *ep.Dispatch) error {
	e := m.e
	op, q, st := e.names.dispatch, uint32(d.Op), d.State.(*htState)
	from := m.peers(st, true)
	hdrAt := m.status + gpu.DevicePtr(4*m.L)
	if err := e.wait(op, "its rows", m.dispatched, headers{at: hdrAt, stride: 8, peers: from, op: q}); err != nil {
		return err
	}
	hdr := i32s(m.hStatus, 4*m.L, 2*m.R)
	for _, p := range from {
		if uint32(hdr[2*p]) != q {
			return fmt.Errorf("epgpu: %s: the rows from rank %d are not of this call", op, p)
		}
	}
	for l, c := range i32s(m.hStatus, 0, m.L) {
		st.expert[l] = int(c)
	}
	for s := 0; s < m.R; s++ {
		st.source[s] = st.recvOff[s+1] - st.recvOff[s]
	}
	n, K := st.recvOff[m.R], m.K
	d.Recv = ep.Received{
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

func (m *htMode) combineSend(c *ep.Combine) error {
	e := m.e
	d := c.Dispatch
	op, rt, st, me := e.names.combine, d.Route, d.State.(*htState), e.rank
	T, K, R, q := rt.T, m.K, m.R, uint32(c.Op)

	// Each token's partials, rank by rank.
	valsOff, startOff, hdrOff, _ := m.combOffsets()
	mr := m.M * R
	ptrs, vptrs := u64s(m.hComb, 0, mr), u64s(m.hComb, valsOff, mr)
	start, hdr := i32s(m.hComb, startOff, m.M+1), i32s(m.hComb, hdrOff, 2)
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
	values := !c.RowValues.IsZero()
	vals := m.w // sent, and ignored, when no values are given: its size is right
	hdr[0], hdr[1] = int32(q), 0
	if values {
		vals, hdr[1] = ptrOf(c.RowValues), 1
	}

	var qu queue
	qu.do(e.ks.MemcpyHtoDAsync(m.comb, m.hComb, 0, 8*n))
	qu.do(e.ks.MemcpyHtoDAsync(m.comb+gpu.DevicePtr(valsOff), m.hComb, valsOff, 8*n))
	qu.do(e.ks.MemcpyHtoDAsync(m.comb+gpu.DevicePtr(startOff), m.hComb, startOff, 4*(T+1)))
	qu.do(e.ks.MemcpyHtoDAsync(m.comb+gpu.DevicePtr(hdrOff), m.hComb, hdrOff, 8))
	qu.do(e.ks.Record(m.ready))
	qu.do(e.cs.WaitEvent(m.ready))
	if qu.err != nil {
		return fmt.Errorf("epgpu: %s: %w", op, qu.err)
	}
	y := ptrOf(c.Y)
	var sends, recvs []gpu.Transfer
	for p := 0; p < R; p++ {
		if n := int(st.n[p*R+me]); n > 0 {
			o := st.recvOff[p]
			sends = append(sends, gpu.Transfer{Peer: p, Ptr: y + gpu.DevicePtr(o*m.rb), Bytes: n * m.rb},
				gpu.Transfer{Peer: p, Ptr: vals + gpu.DevicePtr(4*o*K), Bytes: 4 * n * K},
				gpu.Transfer{Peer: p, Ptr: m.comb + gpu.DevicePtr(hdrOff), Bytes: 8})
		}
		if n := int(st.n[me*R+p]); n > 0 {
			b := st.base[p]
			recvs = append(recvs, gpu.Transfer{Peer: p, Ptr: m.cback + gpu.DevicePtr(b*m.rb), Bytes: n * m.rb},
				gpu.Transfer{Peer: p, Ptr: m.cbackVals + gpu.DevicePtr(4*b*K), Bytes: 4 * n * K},
				gpu.Transfer{Peer: p, Ptr: m.cbackHdr + gpu.DevicePtr(8*p), Bytes: 8})
		}
	}
	if err := e.sendRecv(op, e.cs, sends, recvs); err != nil {
		return err
	}
	qu.do(e.cs.Record(m.returned))
	qu.do(e.ks.WaitEvent(m.returned))
	if qu.err == nil {
		qu.do(e.k.ReduceRows(e.ks.Queue(), gpu.ReduceArgs{Out: ptrOf(c.Out), OutType: e.spec.Elem, Src: m.comb,
			Start: m.comb + gpu.DevicePtr(startOff), N: T, Hidden: m.H, InType: e.spec.Elem}))
	}
	if !c.SlotValues.IsZero() && qu.err == nil {
		qu.do(e.k.ReduceRows(e.ks.Queue(), gpu.ReduceArgs{Out: ptrOf(c.SlotValues), OutType: gpu.F32,
			Src: m.comb + gpu.DevicePtr(valsOff), Start: m.comb + gpu.DevicePtr(startOff), N: T, Hidden: K, InType: gpu.F32}))
	}
	qu.do(e.ks.MemcpyDtoHAsync(m.hHdr, 0, m.cbackHdr, 8*R))
	qu.do(e.ks.Record(m.combd))
	if qu.err != nil {
		return fmt.Errorf("epgpu: %s: %w", op, qu.err)
	}
	return nil
}

func (m *htMode) combineWait(c *ep.Combine) error {
	e := m.e
	op, q, st := e.names.combine, uint32(c.Op), c.Dispatch.State.(*htState)
	to := m.peers(st, false)
	if err := e.wait(op, "its partial outputs", m.combd, headers{at: m.cbackHdr, stride: 8, peers: to, op: q}); err != nil {
		return err
	}
	hdr := i32s(m.hHdr, 0, 2*m.R)
	for _, p := range to {
		if uint32(hdr[2*p]) != q {
			return fmt.Errorf("epgpu: %s: the partial outputs from rank %d are not of this call", op, p)
		}
	}
	if !c.SlotValues.IsZero() {
		for _, p := range to {
			if hdr[2*p+1] == 0 {
				return ep.InputErrorf(op, "SlotValues asked for, but rank %d passed no RowValues (set both on every rank, or neither)", p)
			}
		}
	}
	return nil
}
