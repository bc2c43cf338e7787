package ep

/*
#include "kernels.h"
*/
import "C"

import (
	"runtime"
	"unsafe"

	"github.com/goep/goep/mpi"
)

// High-throughput protocol, for one call with sequence number q:
//
//	dispatch send: allgather every rank's tokens per rank and per node (the
//	  row offsets follow); copy each token once into every rank of this node
//	  that owns one of its experts, with its metadata; raise their data flags
//	  for this rank; put each token once per other node, with its global
//	  top-k and weights, into the staging window of the rank with this
//	  rank's local rank there (its rail peer).
//	dispatch wait: as a rail peer, wait for each other node's staged tokens
//	  and forward them into the ranks of this node that own their experts,
//	  raising those ranks' data flags on behalf of the original sender; then
//	  wait for every source's data flag.
//	combine send: publish where the partial outputs are and raise
//	  combine-ready.
//	combine wait: wait for this node's combine-ready; as a rail peer, sum
//	  this node's partials of each forwarded token and put the sums back to
//	  the sender's staging window; then sum, for each own token, the partials
//	  of this node's ranks (read in place) and of other nodes (staged), node
//	  by node in a fixed order; raise combine-done.

// htCounts is this rank's row of the allgathered count matrix: tokens per
// rank, then per node.
func (g *Group[E]) htCountStride() int { return g.size + g.shape.nodes }

// htOffset is where rows from source s start among rank d's received rows.
func (h *Handle[E]) htOffset(s, d int) int {
	stride := h.g.htCountStride()
	off := 0
	for p := 0; p < s; p++ {
		off += int(h.n[p*stride+d])
	}
	return off
}

func (g *Group[E]) htSend(op string, h *Handle[E], x []E, cached bool) error {
	q := h.op
	R, M, K, nodes := g.size, g.cfg.MaxTokensPerRank, g.cfg.TopK, g.shape.nodes
	me, rowBytes, stride := g.rank, g.rowBytes, g.htCountStride()
	if !cached {
		mine := append(append([]int32{}, h.rt.perRank...), h.rt.perNode...)
		if err := g.publishCounts(h.parity, q, mine); err != nil {
			return err
		}
		h.n = make([]int32, R*stride)
		copy(h.n[me*stride:], mine)
		if err := g.gatherCounts(op, h.parity, q, h.n, 0, R); err != nil {
			return err
		}
		limit := maxRecv(g.cfg, R)
		for d := 0; d < R; d++ {
			total := 0
			for s := 0; s < R; s++ {
				total += int(h.n[s*stride+d])
			}
			if total > limit {
				// Every rank sees the same matrix and fails the same way,
				// before anything is written.
				return inputErrorf(op, "rank %d would receive %d rows, more than MaxRecvTokensPerRank = %d", d, total, limit)
			}
		}
		h.recvOff = make([]int, R+1)
		for s := 0; s < R; s++ {
			h.recvOff[s+1] = h.recvOff[s] + int(h.n[s*stride+me])
		}
		h.sendOff = make([]int, R)
		for d := 0; d < R; d++ {
			h.sendOff[d] = h.htOffset(me, d)
		}
	}
	if err := g.waitCombineDone(op, 0); err != nil {
		return err
	}
	var pin runtime.Pinner
	defer pin.Unpin()
	xp := pinned(&pin, x)
	dst, src := g.sc.dst[:0], g.sc.src[:0]
	rows := g.sc.listsFor(R) // tokens going to each rank of this node, in order
	for t := 0; t < h.T; t++ {
		for _, d := range g.nodeRanks {
			if o := h.rt.tokRankOrd[t*R+d]; o >= 0 {
				dst = append(dst, g.at(d, g.sl.htRecv+(h.sendOff[d]+int(o))*rowBytes))
				src = append(src, unsafe.Add(xp, t*rowBytes))
				rows[d] = append(rows[d], int32(t))
			}
		}
	}
	g.sc.dst, g.sc.src = dst, src
	copyRows(dst, src, rowBytes)
	clear(src) // it pointed into x, pinned only for this call: cgo rejects stale Go pointers
	for _, d := range g.nodeRanks {
		g.htMeta(d, h.sendOff[d], rows[d], nil, h.topk, h.weights)
	}
	flags := make([]ptr, len(g.nodeRanks))
	for i, d := range g.nodeRanks {
		flags[i] = g.flag(d, fData(0, me, R))
	}
	signal(flags, q)
	if g.rma == nil {
		return nil
	}
	// Once per other node, to the rail peer there: the rows, then their
	// tokens, top-k ids and weights packed in one buffer.
	var rails []int
	total := 0
	for n := 0; n < nodes; n++ {
		if n != g.myNode {
			rails = append(rails, g.rail[n])
			total += int(h.rt.perNode[n])
		}
	}
	meta := g.sc.metaBytes(4 * total * (1 + 2*K))
	tok := view[int32](ptr(unsafe.SliceData(meta)), total)
	ids := view[int32](unsafe.Add(ptr(unsafe.SliceData(meta)), 4*total), total*K)
	wts := view[float32](unsafe.Add(ptr(unsafe.SliceData(meta)), 4*total*(1+K)), total*K)
	blocks, metaBlocks := g.sc.blocks[:0], g.sc.blocks2[:0]
	first := 0 // this node's first packed row
	for n := 0; n < nodes; n++ {
		if n == g.myNode || h.rt.perNode[n] == 0 {
			continue
		}
		r, cnt := g.rail[n], int(h.rt.perNode[n])
		for t := 0; t < h.T; t++ {
			o := int(h.rt.tokNodeOrd[t*nodes+n])
			if o < 0 {
				continue
			}
			blocks = append(blocks, mpi.Block{SrcOffset: t * rowBytes, Len: rowBytes, Target: r,
				DstOffset: g.rl.htStage + (g.myNode*M+o)*rowBytes})
			tok[first+o] = int32(t)
			copy(ids[(first+o)*K:], h.topk[t*K:(t+1)*K])
			copy(wts[(first+o)*K:], h.weights[t*K:(t+1)*K])
		}
		metaBlocks = append(metaBlocks,
			mpi.Block{SrcOffset: 4 * first, Len: 4 * cnt, Target: r, DstOffset: g.rl.htTok + 4*g.myNode*M},
			mpi.Block{SrcOffset: 4 * (total + first*K), Len: 4 * cnt * K, Target: r, DstOffset: g.rl.htTopk + 4*g.myNode*M*K},
			mpi.Block{SrcOffset: 4 * (total*(1+K) + first*K), Len: 4 * cnt * K, Target: r, DstOffset: g.rl.htW + 4*g.myNode*M*K})
		first += cnt
	}
	g.sc.blocks, g.sc.blocks2 = blocks, metaBlocks
	if err := g.rma.PutBlocks(bytesOf(x), blocks); err != nil {
		return g.fail(err)
	}
	if err := g.rma.PutBlocks(meta, metaBlocks); err != nil {
		return g.fail(err)
	}
	return g.putFlags(rails, func(int) int { return rDataHT(g.myNode, R) }, q)
}

// htMeta writes the metadata of rows received by rank d (on this node),
// starting at row first: rows[i] indexes srcTopk/srcW (and srcTok, or is the
// token itself when srcTok is nil).
func (g *Group[E]) htMeta(d, first int, rows, srcTok, srcTopk []int32, srcW []float32) {
	if len(rows) == 0 {
		return
	}
	K := g.cfg.TopK
	C.ep_ht_meta((*C.int32_t)(g.at(d, g.sl.htTok+4*first)), (*C.int32_t)(g.at(d, g.sl.htTopk+4*first*K)),
		(*C.float)(g.at(d, g.sl.htW+4*first*K)), i32p(rows), C.int64_t(len(rows)),
		i32p(srcTok), i32p(srcTopk), f32p(srcW), C.int(K), C.int(g.shape.L), C.int(d))
}

func (g *Group[E]) htWait(op string, h *Handle[E], cached bool) error {
	q := h.op
	R, L, M, K, nodes := g.size, g.shape.L, g.cfg.MaxTokensPerRank, g.cfg.TopK, g.shape.nodes
	me, rowBytes, stride := g.rank, g.rowBytes, g.htCountStride()
	if g.rma != nil {
		if !cached {
			h.fwd = make([]*fwdPlan, nodes)
		}
		for a := 0; a < nodes; a++ {
			if a == g.myNode {
				continue
			}
			s := g.rail[a]
			if err := g.waitFlags(op, "its tokens for this node", []ptr{g.rmaFlag(rDataHT(a, R))}, []int{s}, q); err != nil {
				return err
			}
			n := int(h.n[s*stride+R+g.myNode])
			tok := view[int32](g.rmaAt(g.rl.htTok+4*a*M), n)
			topk := view[int32](g.rmaAt(g.rl.htTopk+4*a*M*K), n*K)
			w := view[float32](g.rmaAt(g.rl.htW+4*a*M*K), n*K)
			if !cached {
				h.fwd[a] = g.planForward(h, s, topk, n)
			}
			p := h.fwd[a]
			dst, src := g.sc.dst[:0], g.sc.src[:0]
			perDst := g.sc.listsFor(R)
			for j := 0; j < n; j++ {
				for i := p.start[j]; i < p.start[j+1]; i++ {
					d := int(p.dst[i])
					dst = append(dst, g.at(d, g.sl.htRecv+int(p.row[i])*rowBytes))
					src = append(src, g.rmaAt(g.rl.htStage+(a*M+j)*rowBytes))
					perDst[d] = append(perDst[d], int32(j))
				}
			}
			g.sc.dst, g.sc.src = dst, src
			copyRows(dst, src, rowBytes)
			flags := make([]ptr, len(g.nodeRanks))
			for i, d := range g.nodeRanks {
				g.htMeta(d, h.htOffset(s, d), perDst[d], tok, topk, w)
				flags[i] = g.flag(d, fData(0, s, R))
			}
			signal(flags, q)
		}
	}
	flags := make([]ptr, R)
	peers := make([]int, R)
	for s := 0; s < R; s++ {
		flags[s], peers[s] = g.flag(me, fData(0, s, R)), s
		if !g.local[s] {
			peers[s] = g.rail[g.shape.nodeOf[s]] // forwarded by this node's rail peer of s
		}
	}
	if err := g.waitFlags(op, "rows it sends or forwards", flags, peers, q); err != nil {
		return err
	}
	counts := make([]int32, L)
	n := h.recvOff[R]
	C.ep_count_local(i32p(view[int32](g.at(me, g.sl.htTopk), n*K)), C.int64_t(n), C.int(K), C.int(L), i32p(counts))
	h.expertCounts = ints(counts)
	return nil
}

// planForward decides, for the n tokens rail peer s staged here, which ranks
// of this node get each and at which row.
func (g *Group[E]) planForward(h *Handle[E], s int, topk []int32, n int) *fwdPlan {
	R, L, K := g.size, g.shape.L, g.cfg.TopK
	p := &fwdPlan{src: s, rows: n, start: make([]int32, n+1)}
	next := make([]int, R)
	for _, d := range g.nodeRanks {
		next[d] = h.htOffset(s, d)
	}
	for j := 0; j < n; j++ {
		p.start[j] = int32(len(p.dst))
		for _, d := range g.nodeRanks {
			for k := 0; k < K; k++ {
				if e := int(topk[j*K+k]); e >= 0 && e/L == d {
					p.dst = append(p.dst, int32(d))
					p.row = append(p.row, int32(next[d]))
					next[d]++
					break
				}
			}
		}
	}
	p.start[n] = int32(len(p.dst))
	return p
}

func (g *Group[E]) htCombineSend(op string, req *CombineRequest[E], y []E) error {
	h, q := req.h, req.op
	me := g.rank
	if err := g.waitCombineDone(op, 0); err != nil {
		return err
	}
	recv, comb := view[E](g.at(me, g.sl.htRecv), len(y)), h.CombineBuffer()
	ysrc := ySrcComb
	switch {
	case sameSlice(y, recv):
		if h.op != g.lastHTDispatch() {
			return inputErrorf(op, "y is the receive buffer of an earlier dispatch, which a later dispatch has overwritten")
		}
		ysrc = ySrcRecv
	case sameSlice(y, comb):
	default:
		copy(comb, y)
	}
	if req.opts.RowValues != nil {
		copy(view[float32](g.at(me, g.sl.htVals), len(req.opts.RowValues)), req.opts.RowValues)
		ysrc |= ySrcValues
	}
	signal([]ptr{g.flag(me, fYSrc(0))}, uint64(ysrc))
	signal([]ptr{g.flag(me, fCombReady(0))}, q)
	return nil
}

// lastHTDispatch is the sequence number of the newest HT dispatch: the one
// whose rows the receive buffer holds.
func (g *Group[E]) lastHTDispatch() uint64 { return g.htLast }

func (g *Group[E]) htCombineWait(op string, req *CombineRequest[E]) error {
	h, q := req.h, req.op
	R, M, K, H, nodes := g.size, g.cfg.MaxTokensPerRank, g.cfg.TopK, g.cfg.Hidden, g.shape.nodes
	me, rowBytes := g.rank, g.rowBytes
	flags := make([]ptr, len(g.nodeRanks))
	for i, d := range g.nodeRanks {
		flags[i] = g.flag(d, fCombReady(0))
	}
	if err := g.waitFlags(op, "its partial outputs", flags, g.nodeRanks, q); err != nil {
		return err
	}
	area := make([]int, R) // where each rank of this node keeps its partials
	missingValues := -1
	for _, d := range g.nodeRanks {
		ys := int(loadFlag(g.flag(d, fYSrc(0))))
		area[d] = g.sl.htComb
		if ys&3 == ySrcRecv {
			area[d] = g.sl.htRecv
		}
		if req.opts.SlotValues != nil && ys&ySrcValues == 0 {
			missingValues = d
		}
	}
	withValues := req.opts.SlotValues != nil && missingValues < 0
	if g.rma != nil { // rail duty: this node's sums of the tokens forwarded here
		var targets []int
		for a := 0; a < nodes; a++ {
			if a == g.myNode {
				continue
			}
			p := h.fwd[a]
			targets = append(targets, p.src)
			if p.rows == 0 {
				continue
			}
			src, vals := growTo(g.sc.src, len(p.dst)), growTo(g.sc.vals, len(p.dst))
			g.sc.src, g.sc.vals = src, vals
			for i := range p.dst {
				d, row := int(p.dst[i]), int(p.row[i])
				src[i] = g.at(d, area[d]+row*rowBytes)
				vals[i] = g.at(d, g.sl.htVals+4*row*K)
			}
			if len(g.partials) < p.rows*H { // grows once, to the most rows a rail peer sends
				g.partials = make([]E, g.cfg.MaxTokensPerRank*H)
			}
			sums := g.partials[:p.rows*H]
			reduceRows(unsafe.Pointer(unsafe.SliceData(sums)), g.dtype, src, nil, p.start, p.rows, H, g.dtype, g.acc)
			blocks := []mpi.Block{{Len: p.rows * rowBytes, Target: p.src, DstOffset: g.rl.htCStage + g.myNode*M*rowBytes}}
			if err := g.rma.PutBlocks(bytesOf(sums), blocks); err != nil {
				return g.fail(err)
			}
			if withValues {
				vsum := make([]float32, p.rows*K)
				sumValues(vsum, vals, p.start, p.rows, K)
				vb := []mpi.Block{{Len: 4 * len(vsum), Target: p.src, DstOffset: g.rl.htCVals + 4*g.myNode*M*K}}
				if err := g.rma.PutBlocks(bytesOf(vsum), vb); err != nil {
					return g.fail(err)
				}
			}
		}
		if err := g.putFlags(targets, func(int) int { return rCombHT(g.myNode, R, nodes) }, q); err != nil {
			return err
		}
		var rflags []ptr
		var peers []int
		for b := 0; b < nodes; b++ {
			if b != g.myNode {
				rflags = append(rflags, g.rmaFlag(rCombHT(b, R, nodes)))
				peers = append(peers, g.rail[b])
			}
		}
		if err := g.waitFlags(op, "the sums of its node", rflags, peers, q); err != nil {
			return err
		}
	}
	// This rank's tokens: node by node, ranks in local order inside this node.
	start, src, vals := growTo(g.sc.start, h.T+1), g.sc.src[:0], g.sc.vals[:0]
	for t := 0; t < h.T; t++ {
		start[t] = int32(len(src))
		for b := 0; b < nodes; b++ {
			if b == g.myNode {
				for _, d := range g.nodeRanks {
					if o := h.rt.tokRankOrd[t*R+d]; o >= 0 {
						row := h.sendOff[d] + int(o)
						src = append(src, g.at(d, area[d]+row*rowBytes))
						vals = append(vals, g.at(d, g.sl.htVals+4*row*K))
					}
				}
			} else if o := h.rt.tokNodeOrd[t*nodes+b]; o >= 0 {
				src = append(src, g.rmaAt(g.rl.htCStage+(b*M+int(o))*rowBytes))
				vals = append(vals, g.rmaAt(g.rl.htCVals+4*(b*M+int(o))*K))
			}
		}
	}
	start[h.T] = int32(len(src))
	g.sc.start, g.sc.src, g.sc.vals = start, src, vals
	var pin runtime.Pinner
	defer pin.Unpin()
	reduceRows(pinned(&pin, req.out), g.dtype, src, nil, start, h.T, H, g.dtype, g.acc)
	if withValues {
		sumValues(req.opts.SlotValues, vals, start, h.T, K)
	}
	signal([]ptr{g.flag(me, fCombDone(0))}, q)
	g.lastCombine[0] = q
	if missingValues >= 0 {
		return inputErrorf(op, "SlotValues asked for, but rank %d passed no RowValues (set both on every rank, or neither)", missingValues)
	}
	return nil
}
