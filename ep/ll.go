package ep

import (
	"fmt"
	"runtime"
	"unsafe"

	"github.com/goep/goep/mpi"
)

// Low-latency protocol, for one call with sequence number q on buffer set b:
//
//	dispatch send: publish this rank's per-expert counts (a store into its own
//	  segment, puts to other nodes); wait for the counts of lower ranks, which
//	  fix where this rank's rows start in each expert block; copy every
//	  (token, expert) row straight into its slot in the owner's segment (other
//	  nodes: put into the owner's staging window); raise the data flag at
//	  every rank.
//	dispatch wait: wait for the counts of higher ranks and for every rank's
//	  data flag; copy rows staged by other nodes into their slots.
//	combine send: publish where the expert outputs are (in place, or copied
//	  into the combine buffer) and raise combine-ready; put the rows of
//	  tokens from other nodes into their owners' staging windows.
//	combine wait: wait for every rank's combine-ready, reduce each token's
//	  rows straight from the experts' segments (or the staging window) in
//	  top-k order, raise combine-done.
//
// A rank writes buffer set b again only after every rank of its node raised
// combine-done for the last combine on b; across nodes the order of calls
// guarantees it (a rank two dispatches ahead has combined, which needed
// every rank's combine-ready).

func (g *Group[E]) llSend(op string, h *Handle[E], x []E, cached bool) error {
	b, q := h.parity, h.op
	R, NE, L, M, K := g.size, g.shape.E, g.shape.L, g.cfg.MaxTokensPerRank, g.cfg.TopK
	me, rowBytes := g.rank, g.rowBytes
	if err := g.waitCombineDone(op, b); err != nil {
		return err
	}
	var myOff []int32 // where this rank's rows start in each expert's block
	if cached {
		myOff = h.off[me*NE : (me+1)*NE]
	} else {
		if err := g.publishCounts(b, q, h.rt.perExpert); err != nil {
			return err
		}
		h.cnt = make([]int32, R*NE)
		copy(h.cnt[me*NE:], h.rt.perExpert)
		if err := g.gatherCounts(op, b, q, h.cnt, 0, me); err != nil {
			return err
		}
		myOff = make([]int32, NE)
		for s := 0; s < me; s++ {
			for e := 0; e < NE; e++ {
				myOff[e] += h.cnt[s*NE+e]
			}
		}
	}

	var pin runtime.Pinner
	defer pin.Unpin()
	xp := pinned(&pin, x)
	span := R * M
	// Where this rank's rows for each expert start in its owner's staging
	// area (other nodes only): experts of one owner in order.
	var stagePos []int32
	if g.rma != nil {
		stagePos = make([]int32, NE)
		for d := 0; d < R; d++ {
			var p int32
			for e := d * L; e < (d+1)*L; e++ {
				stagePos[e] = p
				p += h.rt.perExpert[e]
			}
		}
	}
	dst, src, blocks := g.sc.dst[:0], g.sc.src[:0], g.sc.blocks[:0]
	// Token and weight of each row staged at another node, packed for one
	// put per owner: tokens of all owners, then weights, each owner's at base[d].
	var meta []byte
	var stageTok []int32
	var stageW []float32
	var base []int
	if g.rma != nil {
		base = make([]int, R+1)
		for d := 0; d < R; d++ {
			base[d+1] = base[d]
			if !g.local[d] {
				for e := d * L; e < (d+1)*L; e++ {
					base[d+1] += int(h.rt.perExpert[e])
				}
			}
		}
		meta = g.sc.metaBytes(8 * base[R])
		stageTok, stageW = view[int32](ptr(unsafe.SliceData(meta)), base[R]), view[float32](unsafe.Add(ptr(unsafe.SliceData(meta)), 4*base[R]), base[R])
	}
	for t := 0; t < h.T; t++ {
		for k := 0; k < K; k++ {
			e := int(h.topk[t*K+k])
			if e < 0 {
				continue
			}
			d, l, ord := e/L, e%L, h.rt.pairOrd[t*K+k]
			if g.local[d] {
				row := l*span + int(myOff[e]+ord)
				dst = append(dst, g.at(d, g.sl.llRecv[b]+row*rowBytes))
				src = append(src, unsafe.Add(xp, t*rowBytes))
				view[int32](g.at(d, g.sl.llTok[b]), L*span)[row] = int32(t)
				view[float32](g.at(d, g.sl.llW[b]), L*span)[row] = h.weights[t*K+k]
				continue
			}
			p := int(stagePos[e] + ord)
			blocks = append(blocks, mpi.Block{SrcOffset: t * rowBytes, Len: rowBytes, Target: d,
				DstOffset: g.rl.llStage[b] + (me*g.rl.llCap+p)*rowBytes})
			stageTok[base[d]+p], stageW[base[d]+p] = int32(t), h.weights[t*K+k]
		}
	}
	g.sc.dst, g.sc.src, g.sc.blocks = dst, src, blocks
	copyRows(dst, src, rowBytes)
	clear(src) // it pointed into x, pinned only for this call: cgo rejects stale Go pointers
	local := make([]ptr, len(g.nodeRanks))
	for i, d := range g.nodeRanks {
		local[i] = g.flag(d, fData(b, me, R))
	}
	signal(local, q)
	if g.rma == nil {
		return nil
	}
	if err := g.rma.PutBlocks(bytesOf(x), blocks); err != nil {
		return g.fail(err)
	}
	metaBlocks := g.sc.blocks2[:0]
	for d := 0; d < R; d++ {
		if n := base[d+1] - base[d]; n > 0 {
			metaBlocks = append(metaBlocks,
				mpi.Block{SrcOffset: 4 * base[d], Len: 4 * n, Target: d, DstOffset: g.rl.llStageTok[b] + 4*me*g.rl.llCap},
				mpi.Block{SrcOffset: 4 * (base[R] + base[d]), Len: 4 * n, Target: d, DstOffset: g.rl.llStageW[b] + 4*me*g.rl.llCap})
		}
	}
	g.sc.blocks2 = metaBlocks
	if err := g.rma.PutBlocks(meta, metaBlocks); err != nil {
		return g.fail(err)
	}
	return g.putFlags(g.remoteRanks(), func(int) int { return rData(b, me, R) }, q)
}

func (g *Group[E]) llWait(op string, h *Handle[E], cached bool) error {
	b, q := h.parity, h.op
	R, NE, L, M := g.size, g.shape.E, g.shape.L, g.cfg.MaxTokensPerRank
	me, rowBytes, span := g.rank, g.rowBytes, R*M
	if !cached {
		if err := g.gatherCounts(op, b, q, h.cnt, me+1, R); err != nil {
			return err
		}
		h.off = make([]int32, R*NE)
		for s := 1; s < R; s++ {
			for e := 0; e < NE; e++ {
				h.off[s*NE+e] = h.off[(s-1)*NE+e] + h.cnt[(s-1)*NE+e]
			}
		}
	}
	flags := make([]ptr, R)
	peers := make([]int, R)
	for s := 0; s < R; s++ {
		peers[s] = s
		if g.local[s] {
			flags[s] = g.flag(me, fData(b, s, R))
		} else {
			flags[s] = g.rmaFlag(rData(b, s, R))
		}
	}
	if err := g.waitFlags(op, "its rows", flags, peers, q); err != nil {
		return err
	}
	if g.rma != nil { // rows staged by other nodes go to their slots
		dst, src, lens := g.sc.dst[:0], g.sc.src[:0], g.sc.lens[:0]
		tok := view[int32](g.at(me, g.sl.llTok[b]), L*span)
		w := view[float32](g.at(me, g.sl.llW[b]), L*span)
		for _, s := range g.remoteRanks() {
			stTok := view[int32](g.rmaAt(g.rl.llStageTok[b]+4*s*g.rl.llCap), g.rl.llCap)
			stW := view[float32](g.rmaAt(g.rl.llStageW[b]+4*s*g.rl.llCap), g.rl.llCap)
			pos := 0
			for l := 0; l < L; l++ {
				e := me*L + l
				n := int(h.cnt[s*NE+e])
				if n == 0 {
					continue
				}
				row := l*span + int(h.off[s*NE+e])
				dst = append(dst, g.at(me, g.sl.llRecv[b]+row*rowBytes))
				src = append(src, g.rmaAt(g.rl.llStage[b]+(s*g.rl.llCap+pos)*rowBytes))
				lens = append(lens, int64(n*rowBytes))
				copy(tok[row:row+n], stTok[pos:pos+n])
				copy(w[row:row+n], stW[pos:pos+n])
				pos += n
			}
		}
		g.sc.dst, g.sc.src, g.sc.lens = dst, src, lens
		copyBlocks(dst, src, lens)
	}
	h.expertCounts = make([]int, L)
	for l := 0; l < L; l++ {
		for s := 0; s < R; s++ {
			h.expertCounts[l] += int(h.cnt[s*NE+me*L+l])
		}
	}
	return nil
}

func (g *Group[E]) llCombineSend(op string, req *CombineRequest[E], y []E) error {
	h, q := req.h, req.op
	b := h.parity
	R, NE, L, M, H := g.size, g.shape.E, g.shape.L, g.cfg.MaxTokensPerRank, g.cfg.Hidden
	me, rowBytes, span := g.rank, g.rowBytes, R*M
	if err := g.waitCombineDone(op, b); err != nil {
		return err
	}
	ysrc, origin := ySrcRecv, h.Recv()
	switch {
	case sameSlice(y, h.Recv()):
	case sameSlice(y, h.CombineBuffer()):
		ysrc, origin = ySrcComb, h.CombineBuffer()
	default: // copy the valid rows into the combine buffer
		ysrc, origin = ySrcComb, h.CombineBuffer()
		for l := 0; l < L; l++ {
			lo, hi := l*span*H, (l*span+h.expertCounts[l])*H
			copy(origin[lo:hi], y[lo:hi])
		}
	}
	vals := view[float32](g.at(me, g.sl.llVals[b]), L*span)
	if req.opts.RowValues != nil {
		copy(vals, req.opts.RowValues)
		ysrc |= ySrcValues
	}
	signal([]ptr{g.flag(me, fYSrc(b))}, uint64(ysrc))
	signal([]ptr{g.flag(me, fCombReady(b))}, q)
	if g.rma == nil {
		return nil
	}
	// Rows of tokens from other nodes go to their staging windows, placed by
	// the token rank's own expert order.
	blocks, valBlocks := g.sc.blocks[:0], g.sc.blocks2[:0]
	remote := g.remoteRanks()
	for _, s := range remote {
		var pos int32
		for e := 0; e < NE; e++ {
			n := h.cnt[s*NE+e]
			if e/L == me && n > 0 {
				l := e % L
				first := l*span + int(h.off[s*NE+e])
				blocks = append(blocks, mpi.Block{SrcOffset: first * rowBytes, Len: int(n) * rowBytes, Target: s,
					DstOffset: g.rl.llCStage[b] + int(pos)*rowBytes})
				valBlocks = append(valBlocks, mpi.Block{SrcOffset: 4 * first, Len: 4 * int(n), Target: s,
					DstOffset: g.rl.llCVals[b] + 4*int(pos)})
			}
			pos += n
		}
	}
	g.sc.blocks, g.sc.blocks2 = blocks, valBlocks
	if err := g.rma.PutBlocks(bytesOf(origin), blocks); err != nil {
		return g.fail(err)
	}
	if ysrc&ySrcValues != 0 {
		if err := g.rma.PutBlocks(bytesOf(vals), valBlocks); err != nil {
			return g.fail(err)
		}
	}
	return g.putFlags(remote, func(int) int { return rComb(b, me, R) }, q)
}

func (g *Group[E]) llCombineWait(op string, req *CombineRequest[E]) error {
	h, q := req.h, req.op
	b := h.parity
	R, NE, L, M, K := g.size, g.shape.E, g.shape.L, g.cfg.MaxTokensPerRank, g.cfg.TopK
	me, rowBytes, span := g.rank, g.rowBytes, R*M
	flags := make([]ptr, R)
	peers := make([]int, R)
	for d := 0; d < R; d++ {
		peers[d] = d
		if g.local[d] {
			flags[d] = g.flag(d, fCombReady(b))
		} else {
			flags[d] = g.rmaFlag(rComb(b, d, R))
		}
	}
	if err := g.waitFlags(op, "its expert outputs", flags, peers, q); err != nil {
		return err
	}
	ysrc := make([]int, R)
	missingValues := -1
	for _, d := range g.nodeRanks {
		ysrc[d] = int(loadFlag(g.flag(d, fYSrc(b))))
		if req.opts.SlotValues != nil && ysrc[d]&ySrcValues == 0 {
			missingValues = d
		}
	}
	var stagePos []int32 // this rank's rows of each expert in its own staging
	if g.rma != nil {
		stagePos = make([]int32, NE)
		var p int32
		for e := 0; e < NE; e++ {
			stagePos[e] = p
			p += h.rt.perExpert[e]
		}
	}
	weights := h.weights
	if req.opts.WeightsOverride != nil {
		weights = req.opts.WeightsOverride
	}
	start, src, w := growTo(g.sc.start, h.T+1), g.sc.src[:0], g.sc.w[:0]
	var valPtrs []ptr
	if req.opts.SlotValues != nil {
		valPtrs = growTo(g.sc.vals, h.T*K)
		clear(valPtrs)
		g.sc.vals = valPtrs
	}
	for t := 0; t < h.T; t++ {
		start[t] = int32(len(src))
		for k := 0; k < K; k++ {
			e := int(h.topk[t*K+k])
			if e < 0 {
				continue
			}
			d, l, ord := e/L, e%L, h.rt.pairOrd[t*K+k]
			var p, vp ptr
			if g.local[d] {
				row := l*span + int(h.off[me*NE+e]+ord)
				area := g.sl.llRecv[b]
				if ysrc[d]&3 == ySrcComb {
					area = g.sl.llComb[b]
				}
				p, vp = g.at(d, area+row*rowBytes), g.at(d, g.sl.llVals[b]+4*row)
			} else {
				sp := int(stagePos[e] + ord)
				p, vp = g.rmaAt(g.rl.llCStage[b]+sp*rowBytes), g.rmaAt(g.rl.llCVals[b]+4*sp)
			}
			src = append(src, p)
			w = append(w, weights[t*K+k])
			if valPtrs != nil {
				valPtrs[t*K+k] = vp
			}
		}
	}
	start[h.T] = int32(len(src))
	g.sc.start, g.sc.src, g.sc.w = start, src, w
	var pin runtime.Pinner
	defer pin.Unpin()
	reduceRows(pinned(&pin, req.out), g.dtype, src, w, start, h.T, g.cfg.Hidden, g.dtype, g.acc)
	if valPtrs != nil && missingValues < 0 {
		gatherValues(req.opts.SlotValues, valPtrs)
	}
	signal([]ptr{g.flag(me, fCombDone(b))}, q)
	g.lastCombine[b] = q
	h.done = true
	if g.llPending[b] == h {
		g.llPending[b] = nil
	}
	if missingValues >= 0 {
		return inputErrorf(op, "SlotValues asked for, but rank %d passed no RowValues (set both on every rank, or neither)", missingValues)
	}
	return nil
}

func (g *Group[E]) String() string {
	return fmt.Sprintf("ep.Group[%s]{%v, rank %d of %d, %v}", g.dtypeName, g.cfg.Mode, g.rank, g.size, g.shape)
}
