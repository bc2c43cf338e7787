package ep

import (
	"fmt"
	"slices"
)

// DispatchRequest is a dispatch whose sends are done; Wait receives.
type DispatchRequest[E Element] struct {
	h      *Handle[E]
	cached bool
	waited bool
}

// CombineRequest is a combine whose sends are done; Wait receives and reduces.
type CombineRequest[E Element] struct {
	h      *Handle[E]
	out    []E
	opts   CombineOptions
	op     uint64
	waited bool
}

func (g *Group[E]) opName(what string) string { return g.cfg.Mode.String() + " " + what }

// Dispatch sends x ([tokens][Hidden]) to the ranks owning each token's
// experts (topk and weights: [tokens][TopK], -1 = none) and returns the
// handle of what this rank received. It is DispatchSend then Wait.
func (g *Group[E]) Dispatch(x []E, topk []int32, weights []float32) (*Handle[E], error) {
	req, err := g.DispatchSend(x, topk, weights)
	if err != nil {
		return nil, err
	}
	return req.Wait()
}

// DispatchSend does the sending half of a dispatch: when it returns, this
// rank's rows are in (or on their way to) the receivers' buffers and x may
// be reused. Compute can run before Wait.
func (g *Group[E]) DispatchSend(x []E, topk []int32, weights []float32) (*DispatchRequest[E], error) {
	op := g.opName("dispatch")
	if err := g.usable(op); err != nil {
		return nil, err
	}
	T, err := g.checkTokens(op, x, topk, weights)
	if err != nil {
		return nil, err
	}
	rt, err := computeRouting(op, g.shape, topk, T)
	if err != nil {
		return nil, err
	}
	h := &Handle[E]{g: g, T: T, topk: slices.Clone(topk), weights: slices.Clone(weights), rt: rt}
	return g.send(op, h, x, false)
}

// DispatchCached dispatches x with the routing of an earlier handle, skipping
// the layout and the count exchange (every rank must use DispatchCached for
// this call). weights nil keeps the earlier weights. It is how the gradient of
// a combine reaches the expert rows.
func (g *Group[E]) DispatchCached(prev *Handle[E], x []E, weights []float32) (*Handle[E], error) {
	req, err := g.DispatchCachedSend(prev, x, weights)
	if err != nil {
		return nil, err
	}
	return req.Wait()
}

// DispatchCachedSend is the sending half of DispatchCached.
func (g *Group[E]) DispatchCachedSend(prev *Handle[E], x []E, weights []float32) (*DispatchRequest[E], error) {
	op := g.opName("cached dispatch")
	if err := g.usable(op); err != nil {
		return nil, err
	}
	if err := g.checkHandle(op, prev); err != nil {
		return nil, err
	}
	if weights == nil {
		weights = prev.weights
	}
	if _, err := g.checkTokens(op, x, prev.topk, weights); err != nil {
		return nil, err
	}
	h := &Handle[E]{g: g, T: prev.T, topk: prev.topk, weights: slices.Clone(weights), rt: prev.rt,
		cnt: prev.cnt, off: prev.off, n: prev.n, recvOff: prev.recvOff, sendOff: prev.sendOff, fwd: prev.fwd}
	return g.send(op, h, x, true)
}

func (g *Group[E]) send(op string, h *Handle[E], x []E, cached bool) (*DispatchRequest[E], error) {
	b := int(g.dispatches % 2)
	if g.cfg.Mode == LowLatency && g.llPending[b] != nil {
		return nil, inputErrorf(op, "two LL dispatches are already waiting for their combine: combine the handle of the earlier one (buffer set %d) first", b)
	}
	g.dispatches++
	g.op++
	h.op, h.parity = g.op, b
	if g.cfg.Mode == LowLatency {
		g.llPending[b] = h
		if err := g.llSend(op, h, x, cached); err != nil {
			return nil, err
		}
	} else {
		g.htLast = h.op
		if err := g.htSend(op, h, x, cached); err != nil {
			return nil, err
		}
	}
	return &DispatchRequest[E]{h: h, cached: cached}, nil
}

// Wait completes the dispatch and returns its handle.
func (r *DispatchRequest[E]) Wait() (*Handle[E], error) {
	g := r.h.g
	op := g.opName("dispatch")
	if r.waited {
		return nil, inputErrorf(op, "Wait called twice")
	}
	r.waited = true
	if err := g.usable(op); err != nil {
		return nil, err
	}
	var err error
	if g.cfg.Mode == LowLatency {
		err = g.llWait(op, r.h, r.cached)
	} else {
		err = g.htWait(op, r.h, r.cached)
	}
	if err != nil {
		return nil, err
	}
	r.h.ready = true
	return r.h, nil
}

// Combine brings the expert outputs y (laid out like h.Recv(); h.Recv() or
// h.CombineBuffer() themselves avoid a copy) back to the tokens' ranks and
// reduces them into out ([tokens][Hidden]): LL, out[t] = sum over k of
// weight[t][k] * y(pair t,k); HT, out[t] = sum over the ranks t went to of
// their y row of t. It is CombineSend then Wait.
func (g *Group[E]) Combine(h *Handle[E], y, out []E, opts *CombineOptions) error {
	req, err := g.CombineSend(h, y, out, opts)
	if err != nil {
		return err
	}
	return req.Wait()
}

// CombineSend does the sending half of a combine: y has been published (or
// copied) and may be reused when it returns.
func (g *Group[E]) CombineSend(h *Handle[E], y, out []E, opts *CombineOptions) (*CombineRequest[E], error) {
	op := g.opName("combine")
	if err := g.usable(op); err != nil {
		return nil, err
	}
	if err := g.checkHandle(op, h); err != nil {
		return nil, err
	}
	var o CombineOptions
	if opts != nil {
		o = *opts
	}
	if err := g.checkCombine(op, h, y, out, o); err != nil {
		return nil, err
	}
	g.op++
	req := &CombineRequest[E]{h: h, out: out, opts: o, op: g.op}
	var err error
	if g.cfg.Mode == LowLatency {
		err = g.llCombineSend(op, req, y)
	} else {
		err = g.htCombineSend(op, req, y)
	}
	if err != nil {
		return nil, err
	}
	return req, nil
}

// Wait completes the combine: out holds the reduced rows.
func (r *CombineRequest[E]) Wait() error {
	g := r.h.g
	op := g.opName("combine")
	if r.waited {
		return inputErrorf(op, "Wait called twice")
	}
	r.waited = true
	if err := g.usable(op); err != nil {
		return err
	}
	if g.cfg.Mode == LowLatency {
		return g.llCombineWait(op, r)
	}
	return g.htCombineWait(op, r)
}

func (g *Group[E]) checkCombine(op string, h *Handle[E], y, out []E, o CombineOptions) error {
	H, K := g.cfg.Hidden, g.cfg.TopK
	recvRows := h.NumRecv()
	rowValues := recvRows * K
	if g.cfg.Mode == LowLatency {
		if h.done {
			return inputErrorf(op, "the handle has already been combined")
		}
		recvRows = g.shape.L * g.size * g.cfg.MaxTokensPerRank
		rowValues = recvRows
		if o.WeightsOverride != nil && len(o.WeightsOverride) != h.T*K {
			return inputErrorf(op, "len(WeightsOverride) = %d, want tokens*TopK = %d*%d", len(o.WeightsOverride), h.T, K)
		}
	} else if o.WeightsOverride != nil {
		return inputErrorf(op, "WeightsOverride is for LL mode: an HT combine is an unweighted sum (the expert side applies the weights)")
	}
	if len(y) != recvRows*H {
		return inputErrorf(op, "len(y) = %d, want %d rows of %d = %d (laid out like Recv())", len(y), recvRows, H, recvRows*H)
	}
	if len(out) != h.T*H {
		return inputErrorf(op, "len(out) = %d, want tokens*Hidden = %d*%d = %d", len(out), h.T, H, h.T*H)
	}
	if (o.RowValues == nil) != (o.SlotValues == nil) {
		return inputErrorf(op, "set both RowValues and SlotValues, or neither")
	}
	if o.RowValues != nil {
		if len(o.RowValues) != rowValues {
			return inputErrorf(op, "len(RowValues) = %d, want %d", len(o.RowValues), rowValues)
		}
		if len(o.SlotValues) != h.T*K {
			return inputErrorf(op, "len(SlotValues) = %d, want tokens*TopK = %d*%d", len(o.SlotValues), h.T, K)
		}
	}
	return nil
}

// waitCombineDone waits until every rank of this node has finished reading
// this rank's and its peers' buffers of set b in the last combine on it, so
// that they can be written again.
func (g *Group[E]) waitCombineDone(op string, b int) error {
	last := g.lastCombine[b]
	if last == 0 {
		return nil
	}
	flags := make([]ptr, len(g.nodeRanks))
	for i, r := range g.nodeRanks {
		flags[i] = g.flag(r, fCombDone(b))
	}
	return g.waitFlags(op, fmt.Sprintf("the end of its combine #%d", last), flags, g.nodeRanks, last)
}
