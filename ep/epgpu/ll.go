package epgpu

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/goep/goep/ep/driver"
	"github.com/goep/goep/gpu"
)

// Low-latency mode on the device, for a call with sequence number q on
// buffer set b. Nothing on the send path waits for the host: the counts of
// a source's rows travel with them, and a kernel places the rows on
// arrival.
//
//	dispatch send, kernel stream: copy the host-built routing (top-k ids,
//	  pair ordinals, each expert's first staged row) and metadata (q, the
//	  counts per expert of each destination, each staged row's token and
//	  weight) to the device; pack the (token, expert) rows, grouped by
//	  destination, by expert, by token, into fixed-capacity blocks of
//	  cap = M*min(K, L) rows per destination; record "packed".
//	transfer stream: wait for "packed"; one group: to every rank its block
//	  and metadata, from every rank the same into staging; record
//	  "arrived".
//	kernel stream: wait for "arrived"; ll_place: each staged row's row in
//	  the expert-major receive buffer [L][R*M] (by source, then token:
//	  packed), its token and weight there, the counts, and whether every
//	  block is of call q; copy the rows there; copy the counts to the host;
//	  record "dispatched".
//	dispatch wait: wait for "dispatched" polling the communicator.
//	combine send, kernel stream: copy the reduction's lists (each token's
//	  source rows in slot order, their weights) to the device; gather the
//	  expert outputs back into staged order (the inverse of the
//	  placement); record "gathered". Transfer stream: wait; one group: to
//	  every rank its rows, values and a header (q, whether values were
//	  given), from every rank the same; record "returned". Kernel stream:
//	  wait; reduce each token's rows in slot order with their weights;
//	  gather the slot values; copy the headers to the host; record
//	  "combined".
//	combine wait: wait for "combined" polling the communicator.
//
// The staged block a rank sends to rank d is laid out like the one it
// receives back in the combine, so the rows of a token's pairs are found
// by the same position both ways: pair (t,k) with expert x = d*L+l is row
// stagedPos[x] + PairOrd[t,k] of block d.
type llMode struct {
	e                                      *engine
	R, L, E, M, K, H, rb, cap, words, span int
	set                                    [2]llSet
	spos                                   []int32 // [E]: where each expert's rows start in its owner's block
	// A refused call's headers: refMeta is a dispatch's metadata block
	// (zero counts), refHdr a combine's header; hRef holds the header
	// going out, then the [R][2] header words that came in.
	refMeta, refHdr gpu.DevicePtr
	hRef            gpu.HostBuffer
	refDone         gpu.Event
}

// llSet is one buffer set.
type llSet struct {
	sendRows, sendMeta, stageRows, stageMeta gpu.DevicePtr // [R][cap] rows, [R][words] int32
	recvRows, outRows                        gpu.DevicePtr // [L][span] rows: Recv and CombineBuffer
	recvTok, recvW                           gpu.DevicePtr // [L][span]
	dstRow                                   gpu.DevicePtr // [R][cap]: the receive row of each staged row
	status                                   gpu.DevicePtr // [bad u64][R][L] counts
	route                                    gpu.DevicePtr // [M*K] top-k, [M*K] pair ordinals, [E] first rows
	cstage, cvals                            gpu.DevicePtr // [R][cap] rows and values going back
	cback, cbackVals, cbackHdr               gpu.DevicePtr // [R][cap] rows and values come back, [R][2] headers
	comb                                     gpu.DevicePtr // reduction lists (combLayout)
	hMeta, hRoute, hStatus, hComb, hHdr      gpu.HostBuffer
	packed, arrived, dispatched              gpu.Event
	gathered, returned, combined             gpu.Event
}

// llState is a dispatch's: the counts for its handle.
type llState struct {
	expert []int // [L]
	source []int // [R][L]
}

// combLayout: [M*K] source row addresses (u64), [M*K] weights, [M*K] slot
// sources (-1: none), [M+1] list starts, a header of 2 words.
func (m *llMode) combOffsets() (wts, slot, start, hdr, size int) {
	mk := m.M * m.K
	wts, slot, start = 8*mk, 12*mk, 16*mk
	hdr = start + 4*(m.M+1)
	return wts, slot, start, hdr, hdr + 8
}

func newLL(e *engine) (*llMode, error) {
	s := e.spec
	R, L := e.size, s.LocalExperts(e.size)
	m := &llMode{e: e, R: R, L: L, E: s.NumExperts, M: s.MaxTokensPerRank, K: s.TopK, H: s.Hidden, rb: s.RowBytes,
		span: R * s.MaxTokensPerRank}
	m.cap = m.M * min(m.K, m.L)
	m.words = gpu.LLMetaWords(L, m.cap)
	m.spos = make([]int32, m.E)
	a := &allocator{e: e}
	rows := L * m.span
	_, _, _, _, combBytes := m.combOffsets()
	for b := range m.set {
		st := &m.set[b]
		st.sendRows, st.stageRows = a.dev(R*m.cap*m.rb), a.dev(R*m.cap*m.rb)
		st.sendMeta, st.stageMeta = a.dev(4*R*m.words), a.dev(4*R*m.words)
		st.recvRows, st.outRows = a.dev(rows*m.rb), a.dev(rows*m.rb)
		st.recvTok, st.recvW = a.dev(4*rows), a.dev(4*rows)
		st.dstRow = a.dev(4 * R * m.cap)
		st.status = a.dev(8 + 4*R*L)
		st.route = a.dev(4 * (2*m.M*m.K + m.E))
		st.cstage, st.cback = a.dev(R*m.cap*m.rb), a.dev(R*m.cap*m.rb)
		st.cvals, st.cbackVals = a.dev(4*R*m.cap), a.dev(4*R*m.cap)
		st.cbackHdr = a.dev(8 * R)
		st.comb = a.dev(combBytes)
		st.hMeta, st.hRoute = a.host(4*R*m.words), a.host(4*(2*m.M*m.K+m.E))
		st.hStatus, st.hComb, st.hHdr = a.host(8+4*R*L), a.host(combBytes), a.host(8*R)
		st.packed, st.arrived, st.dispatched = a.event(), a.event(), a.event()
		st.gathered, st.returned, st.combined = a.event(), a.event(), a.event()
	}
	m.refMeta, m.refHdr = a.dev(4*m.words), a.dev(8)
	m.hRef, m.refDone = a.host(8+8*R), a.event()
	if a.err == nil {
		a.err = e.dev.MemsetD8(m.refMeta, 0, 4*m.words)
	}
	return m, a.err
}

func (m *llMode) end(kind, set int) gpu.Event {
	if kind == 0 {
		return m.set[set].dispatched
	}
	return m.set[set].combined
}

func (m *llMode) state(d *driver.Dispatch) *llState {
	st, ok := d.State.(*llState)
	if !ok {
		st = &llState{expert: make([]int, m.L), source: make([]int, m.R*m.L)}
		d.State = st
	}
	return st
}

// stagedPos sets m.spos[x] to where expert x's rows start in the block of
// its owner: the owner's earlier experts' rows first.
func (m *llMode) stagedPos(perExpert []int32) {
	for x := 0; x < m.E; x++ {
		if x%m.L == 0 {
			m.spos[x] = 0
		} else {
			m.spos[x] = m.spos[x-1] + perExpert[x-1]
		}
	}
}

func (m *llMode) send(d *driver.Dispatch) error {
	e := m.e
	op, s, rt := e.names.dispatch, &m.set[d.Set], d.Route
	T, K, L, q := rt.T, m.K, m.L, uint32(d.Op)
	m.stagedPos(rt.PerExpert)

	// The routing, for the pack kernel.
	mk := m.M * K
	copy(i32s(s.hRoute, 0, T*K), d.TopK)
	copy(i32s(s.hRoute, 4*mk, T*K), rt.PairOrd[:T*K])
	base := i32s(s.hRoute, 8*mk, m.E)
	for x := range base {
		base[x] = int32(x/L*m.cap) + m.spos[x]
	}
	// The metadata of each destination's block.
	meta := i32s(s.hMeta, 0, m.R*m.words)
	for dst := 0; dst < m.R; dst++ {
		blk := meta[dst*m.words:]
		blk[0], blk[1] = int32(q), 0
		copy(blk[2:2+L], rt.PerExpert[dst*L:(dst+1)*L])
	}
	for t := 0; t < T; t++ {
		for k := 0; k < K; k++ {
			x := d.TopK[t*K+k]
			if x < 0 {
				continue
			}
			p := int(m.spos[x] + rt.PairOrd[t*K+k])
			blk := meta[int(x)/L*m.words:]
			blk[2+L+p] = int32(t)
			blk[2+L+m.cap+p] = int32(math.Float32bits(d.Weights[t*K+k]))
		}
	}

	var qu queue
	qu.do(e.ks.MemcpyHtoDAsync(s.route, s.hRoute, 0, 4*(2*mk+m.E)))
	qu.do(e.ks.MemcpyHtoDAsync(s.sendMeta, s.hMeta, 0, 4*m.R*m.words))
	if qu.err == nil {
		qu.do(e.k.PackRows(e.ks, gpu.PackRowsArgs{Dst: s.sendRows, DstRows: m.R * m.cap, Src: ptrOf(d.X),
			Ord: s.route + gpu.DevicePtr(4*mk), Group: s.route, Base: s.route + gpu.DevicePtr(8*mk), Groups: m.E,
			Tokens: T, Width: K, RowBytes: m.rb}))
	}
	qu.do(e.ks.Record(s.packed))
	qu.do(e.cs.WaitEvent(s.packed))
	if qu.err != nil {
		return fmt.Errorf("epgpu: %s: %w", op, qu.err)
	}
	sends, recvs := m.dispatchTransfers(s, s.sendMeta, 4*m.words)
	for dst := 0; dst < m.R; dst++ { // a transport that can moves only the rows each block holds
		n := 0
		for _, c := range rt.PerExpert[dst*L : (dst+1)*L] {
			n += int(c)
		}
		sends[2*dst].Partial, sends[2*dst].Used = true, n*m.rb
	}
	if err := e.sendRecv(op, e.cs, sends, recvs); err != nil {
		return err
	}
	qu.do(e.cs.Record(s.arrived))
	qu.do(e.ks.WaitEvent(s.arrived))
	if qu.err == nil {
		qu.do(e.k.LLPlace(e.ks, gpu.LLPlaceArgs{Meta: s.stageMeta, R: m.R, L: L, Cap: m.cap, MetaWords: m.words,
			Span: m.span, Op: q, DstRow: s.dstRow, TokOut: s.recvTok, WOut: s.recvW, Counts: s.status + 8, Bad: s.status}))
	}
	if qu.err == nil {
		qu.do(e.k.CopyRows(e.ks, gpu.CopyRowsArgs{Dst: s.recvRows, DstIdx: s.dstRow, DstRows: L * m.span,
			Src: s.stageRows, SrcRows: m.R * m.cap, N: m.R * m.cap, RowBytes: m.rb}))
	}
	qu.do(e.ks.MemcpyDtoHAsync(s.hStatus, 0, s.status, 8+4*m.R*L))
	qu.do(e.ks.Record(s.dispatched))
	if qu.err != nil {
		return fmt.Errorf("epgpu: %s: %w", op, qu.err)
	}
	return nil
}

// dispatchTransfers lists a dispatch's group on set s: to every rank its
// block of rows and a metadata block (at meta + p*stride), from every rank
// the same into staging.
func (m *llMode) dispatchTransfers(s *llSet, meta gpu.DevicePtr, stride int) (sends, recvs []gpu.Transfer) {
	for p := 0; p < m.R; p++ {
		rows, words := gpu.DevicePtr(p*m.cap*m.rb), gpu.DevicePtr(4*p*m.words)
		sends = append(sends, gpu.Transfer{Peer: p, Ptr: s.sendRows + rows, Bytes: m.cap * m.rb},
			gpu.Transfer{Peer: p, Ptr: meta + gpu.DevicePtr(p*stride), Bytes: 4 * m.words})
		recvs = append(recvs, gpu.Transfer{Peer: p, Ptr: s.stageRows + rows, Bytes: m.cap * m.rb},
			gpu.Transfer{Peer: p, Ptr: s.stageMeta + words, Bytes: 4 * m.words})
	}
	return sends, recvs
}

func (m *llMode) wait(d *driver.Dispatch) error {
	e := m.e
	op, s, q := e.names.dispatch, &m.set[d.Set], uint32(d.Op)
	if err := e.wait(op, "its rows", s.dispatched, headers{at: s.stageMeta, stride: 4 * m.words, peers: e.others(), op: q}); err != nil {
		return err
	}
	if bad := u64s(s.hStatus, 0, 1)[0]; bad != math.MaxUint64 {
		return m.badBlock(op, s, q, bad)
	}
	st := m.state(d)
	counts := i32s(s.hStatus, 8, m.R*m.L)
	clear(st.expert)
	n := 0
	for i, c := range counts {
		st.source[i] = int(c)
		st.expert[i%m.L] += int(c)
		n += int(c)
	}
	rows := m.L * m.span
	d.Recv = driver.Received{
		Rows:         tensor[byte](e, s.recvRows, rows*m.rb),
		Outputs:      tensor[byte](e, s.outRows, rows*m.rb),
		Weights:      tensor[float32](e, s.recvW, 4*rows),
		Tokens:       tensor[int32](e, s.recvTok, 4*rows),
		ExpertCounts: st.expert,
		SourceCounts: st.source,
		NumRecv:      n,
	}
	return nil
}

func (m *llMode) combineSend(c *driver.Combine) error {
	e := m.e
	d := c.Dispatch
	op, s, rt := e.names.combine, &m.set[d.Set], d.Route
	T, K, L, q := rt.T, m.K, m.L, uint32(c.Op)
	m.stagedPos(rt.PerExpert)

	// Each token's sources in slot order: the rows that come back.
	wOff, slotOff, startOff, hdrOff, combBytes := m.combOffsets()
	mk := m.M * K
	ptrs, wts := u64s(s.hComb, 0, mk), f32s(s.hComb, wOff, mk)
	slot, start, hdr := i32s(s.hComb, slotOff, mk), i32s(s.hComb, startOff, m.M+1), i32s(s.hComb, hdrOff, 2)
	n := 0
	for t := 0; t < T; t++ {
		start[t] = int32(n)
		for k := 0; k < K; k++ {
			slot[t*K+k] = -1
			x := d.TopK[t*K+k]
			if x < 0 {
				continue
			}
			pos := int(x)/L*m.cap + int(m.spos[x]+rt.PairOrd[t*K+k])
			ptrs[n] = uint64(s.cback) + uint64(pos*m.rb)
			wts[n] = c.Weights[t*K+k]
			slot[t*K+k] = int32(pos)
			n++
		}
	}
	start[T] = int32(n)
	values := !c.RowValues.IsZero()
	hdr[0], hdr[1] = int32(q), 0
	if values {
		hdr[1] = flagValues
	}

	var qu queue
	qu.do(e.ks.MemcpyHtoDAsync(s.comb, s.hComb, 0, combBytes))
	if qu.err == nil {
		qu.do(e.k.CopyRows(e.ks, gpu.CopyRowsArgs{Dst: s.cstage, DstRows: m.R * m.cap, Src: ptrOf(c.Y),
			SrcIdx: s.dstRow, SrcRows: L * m.span, N: m.R * m.cap, RowBytes: m.rb}))
	}
	if values && qu.err == nil {
		qu.do(e.k.CopyRows(e.ks, gpu.CopyRowsArgs{Dst: s.cvals, DstRows: m.R * m.cap, Src: ptrOf(c.RowValues),
			SrcIdx: s.dstRow, SrcRows: L * m.span, N: m.R * m.cap, RowBytes: 4}))
	}
	qu.do(e.ks.Record(s.gathered))
	qu.do(e.cs.WaitEvent(s.gathered))
	if qu.err != nil {
		return fmt.Errorf("epgpu: %s: %w", op, qu.err)
	}
	sends, recvs := m.combineTransfers(s, s.comb+gpu.DevicePtr(hdrOff))
	st := m.state(d)
	for p := 0; p < m.R; p++ { // back to each source only the rows it sent here
		n := 0
		for _, c := range st.source[p*L : (p+1)*L] {
			n += c
		}
		sends[3*p].Partial, sends[3*p].Used = true, n*m.rb
		sends[3*p+1].Partial, sends[3*p+1].Used = true, 4*n
	}
	if err := e.sendRecv(op, e.cs, sends, recvs); err != nil {
		return err
	}
	qu.do(e.cs.Record(s.returned))
	qu.do(e.ks.WaitEvent(s.returned))
	if qu.err == nil {
		qu.do(e.k.ReduceRows(e.ks, gpu.ReduceArgs{Out: ptrOf(c.Out), OutType: e.spec.Elem, Src: s.comb,
			Weights: s.comb + gpu.DevicePtr(wOff), Start: s.comb + gpu.DevicePtr(startOff), N: T, Hidden: m.H, InType: e.spec.Elem}))
	}
	if !c.SlotValues.IsZero() && qu.err == nil {
		qu.do(e.ks.MemsetD8Async(ptrOf(c.SlotValues), 0, 4*T*K))
		qu.do(e.k.CopyRows(e.ks, gpu.CopyRowsArgs{Dst: ptrOf(c.SlotValues), DstRows: T * K, Src: s.cbackVals,
			SrcIdx: s.comb + gpu.DevicePtr(slotOff), SrcRows: m.R * m.cap, N: T * K, RowBytes: 4}))
	}
	qu.do(e.ks.MemcpyDtoHAsync(s.hHdr, 0, s.cbackHdr, 8*m.R))
	qu.do(e.ks.Record(s.combined))
	if qu.err != nil {
		return fmt.Errorf("epgpu: %s: %w", op, qu.err)
	}
	return nil
}

// combineTransfers lists a combine's group on set s: to every rank its
// rows, values and the header at hdr, from every rank the same.
func (m *llMode) combineTransfers(s *llSet, hdr gpu.DevicePtr) (sends, recvs []gpu.Transfer) {
	for p := 0; p < m.R; p++ {
		rows, vals := gpu.DevicePtr(p*m.cap*m.rb), gpu.DevicePtr(4*p*m.cap)
		sends = append(sends, gpu.Transfer{Peer: p, Ptr: s.cstage + rows, Bytes: m.cap * m.rb},
			gpu.Transfer{Peer: p, Ptr: s.cvals + vals, Bytes: 4 * m.cap},
			gpu.Transfer{Peer: p, Ptr: hdr, Bytes: 8})
		recvs = append(recvs, gpu.Transfer{Peer: p, Ptr: s.cback + rows, Bytes: m.cap * m.rb},
			gpu.Transfer{Peer: p, Ptr: s.cbackVals + vals, Bytes: 4 * m.cap},
			gpu.Transfer{Peer: p, Ptr: s.cbackHdr + gpu.DevicePtr(8*p), Bytes: 8})
	}
	return sends, recvs
}

func (m *llMode) combineWait(c *driver.Combine) error {
	e := m.e
	d := c.Dispatch
	op, s, q := e.names.combine, &m.set[d.Set], uint32(c.Op)
	if err := e.wait(op, "its expert outputs", s.combined, headers{at: s.cbackHdr, stride: 8, peers: e.others(), op: q}); err != nil {
		return err
	}
	hdr := i32s(s.hHdr, 0, 2*m.R)
	refusers, err := m.refusers(op, driver.CallCombine, q, hdr)
	if err != nil {
		return err
	}
	if len(refusers) > 0 {
		return e.refusedBy(op, refusers)
	}
	if !c.SlotValues.IsZero() {
		for p := 0; p < m.R; p++ {
			if hdr[2*p+1]&flagValues == 0 && owns(d.Route.PerExpert[p*m.L:(p+1)*m.L]) {
				return driver.InputErrorf(op, "SlotValues asked for, but rank %d passed no RowValues (set both on every rank, or neither)", p)
			}
		}
	}
	return nil
}

// owns reports whether any of counts is positive.
func owns(counts []int32) bool {
	for _, c := range counts {
		if c > 0 {
			return true
		}
	}
	return false
}

// badBlock is the error of a dispatch whose placement found rank bad's
// block not of this call (or its counts out of bounds): a refusal when the
// blocks' headers say so (LLPlace placed nothing of a refusing block: its
// counts are zero and its word 0 is not the call's), else a failure.
func (m *llMode) badBlock(op string, s *llSet, q uint32, bad uint64) error {
	e := m.e
	words := make([]int32, 2*m.R)
	b := make([]byte, 8)
	for p := 0; p < m.R; p++ {
		// The blocks arrived before the event the wait saw.
		if err := e.dev.MemcpyDtoH(b, s.stageMeta+gpu.DevicePtr(4*p*m.words)); err != nil {
			return fmt.Errorf("epgpu: %s: reading the blocks' headers: %w", op, err)
		}
		words[2*p], words[2*p+1] = int32(binary.LittleEndian.Uint32(b)), int32(binary.LittleEndian.Uint32(b[4:]))
	}
	refusers, err := m.refusers(op, driver.CallDispatch, q, words)
	if err != nil {
		return err
	}
	if len(refusers) == 0 {
		return fmt.Errorf("epgpu: %s: the block from rank %d is not of this call, or its counts do not fit", op, bad)
	}
	return e.refusedBy(op, refusers)
}

// refusers reads the header words of call q from every rank ([R][2]: a
// dispatch's metadata words 0 and 1, a combine's header) and returns the
// ranks other than this one whose header refuses the call. A dispatch's
// refusing block has ^q in word 0 (so that LLPlace places none of it) and
// flagRefused in word 1; a combine's has q and flagRefused. A header of
// another call is a failure.
func (m *llMode) refusers(op string, kind driver.CallKind, q uint32, words []int32) ([]int, error) {
	var out []int
	for p := 0; p < m.R; p++ {
		if p == m.e.rank {
			continue
		}
		w0, flags := uint32(words[2*p]), words[2*p+1]
		want := q
		if flags&flagRefused != 0 && kind == driver.CallDispatch {
			want = ^q
		}
		if w0 != want {
			what := "block"
			if kind == driver.CallCombine {
				what = "outputs"
			}
			return nil, fmt.Errorf("epgpu: %s: the %s from rank %d are not of this call", op, what, p)
		}
		if flags&flagRefused != 0 {
			out = append(out, p)
		}
	}
	return out, nil
}

// refuse takes part in a refused call's group on its buffer set (set 0 for
// a combine whose handle this rank could not resolve): every transfer has
// its size, so nothing but the headers need be known; the rows sent are
// whatever the buffers hold, and the rows received land where no later
// call reads them (staging; the combine's return buffers), after the
// kernels queued before.
func (m *llMode) refuse(r *driver.Refusal) ([]int, error) {
	e := m.e
	q := uint32(r.Op)
	s := &m.set[max(r.Set, 0)]
	out := i32s(m.hRef, 0, 2)
	var qu queue
	e.afterKernels(&qu)
	var op string
	var sends, recvs []gpu.Transfer
	var h headers
	if r.Kind == driver.CallDispatch {
		op = e.names.dispatch
		out[0], out[1] = int32(^q), flagRefused
		qu.do(e.cs.MemcpyHtoDAsync(m.refMeta, m.hRef, 0, 8))
		sends, recvs = m.dispatchTransfers(s, m.refMeta, 0)
		h = headers{at: s.stageMeta, stride: 4 * m.words}
	} else {
		op = e.names.combine
		out[0], out[1] = int32(q), flagRefused
		qu.do(e.cs.MemcpyHtoDAsync(m.refHdr, m.hRef, 0, 8))
		sends, recvs = m.combineTransfers(s, m.refHdr)
		h = headers{at: s.cbackHdr, stride: 8}
	}
	if qu.err != nil {
		return nil, fmt.Errorf("epgpu: %s: %w", op, qu.err)
	}
	if err := e.sendRecv(op, e.cs, sends, recvs); err != nil {
		return nil, err
	}
	for p := 0; p < m.R; p++ {
		qu.do(e.cs.MemcpyDtoHAsync(m.hRef, 8+8*p, h.at+gpu.DevicePtr(p*h.stride), 8))
	}
	qu.do(e.cs.Record(m.refDone))
	if qu.err != nil {
		return nil, fmt.Errorf("epgpu: %s: %w", op, qu.err)
	}
	h.peers, h.op = e.others(), q
	if err := e.wait(op, "the other ranks' part in a call this rank refused", m.refDone, h); err != nil {
		return nil, err
	}
	return m.refusers(op, r.Kind, q, i32s(m.hRef, 8, 2*m.R))
}
