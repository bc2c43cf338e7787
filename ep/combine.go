package ep

import "github.com/goep/goep/ep/driver"

// CombineOptions adjusts a Combine; nil means none.
type CombineOptions struct {
	// WeightsOverride replaces, in LL mode with the expert-major layout,
	// the top-k weights given to Dispatch ([tokens][TopK], host); all ones
	// make the combine an unweighted sum (the backward of dispatch). Must
	// be nil in HT mode and the LL rank-major layout, where the expert side
	// applies the weights.
	WeightsOverride []float32
	// RowValues and SlotValues carry floats of the received rows back to
	// the token's (token, slot), in Memory(). RowValues is laid out like
	// RecvWeights. Expert-major layouts, one per row (a row is one (token,
	// slot) pair): SlotValues[t*TopK+k] gets the value of the row of pair
	// (t,k) (0 where masked). Flat and rank-major layouts, [rows][TopK]:
	// SlotValues[t*TopK+k] gets the sum over the ranks that received token
	// t. Either both are set on every rank or neither is (the zero Tensor
	// is "not set").
	RowValues, SlotValues Tensor[float32]
}

// CombineRequest is a combine whose sends are done; Wait receives and
// reduces. It is a small value: copy it freely.
type CombineRequest[E Element] struct {
	s   *handleState[E]
	gen uint64
	op  uint64
}

// Combine brings the expert outputs y (laid out like h.Recv(); h.Recv() or
// h.CombineBuffer() themselves avoid a copy) back to the tokens' ranks and
// reduces them into out ([tokens][Hidden]): LL expert-major, out[t] = sum
// over k of weight[t][k] * y(pair t,k); HT flat and LL rank-major, out[t] =
// sum over the ranks t went to of their y row of t; HT expert-major, out[t]
// = sum over the ranks t went to, and there over t's rows in top-k slot
// order, of y (padding rows are never read). Only LL expert-major applies
// the gate weights here: elsewhere the expert side does. It is CombineSend
// then Wait.
func (g *Group[E]) Combine(h Handle[E], y, out Tensor[E], opts *CombineOptions) error {
	req, err := g.CombineSend(h, y, out, opts)
	if err != nil {
		return err
	}
	return req.Wait()
}

// CombineSend does the sending half of a combine: y has been published (or
// copied) and may be reused when it returns.
func (g *Group[E]) CombineSend(h Handle[E], y, out Tensor[E], opts *CombineOptions) (CombineRequest[E], error) {
	op := g.names.Combine
	if err := g.usable(op); err != nil {
		return CombineRequest[E]{}, err
	}
	var o CombineOptions
	if opts != nil {
		o = *opts
	}
	s, err := g.checkHandle(op, h)
	var where YPlace
	if err == nil {
		where, err = g.checkCombine(op, s, y, out, o)
	}
	if err != nil {
		r := Refusal{Kind: CallCombine, Set: -1}
		if s != nil {
			r.Set, r.Dispatch = s.d.Set, &s.d
		}
		return CombineRequest[E]{}, g.refuse(r, err)
	}
	weights := o.WeightsOverride
	if g.spec.WeightedCombine() && weights == nil {
		weights = s.weights
	}
	g.op++
	c := &s.c // field by field, as a dispatch's
	c.Op, c.Dispatch, c.Y, c.YIn, c.Out, c.Weights = g.op, &s.d, AsBytes(y), where, AsBytes(out), weights
	c.RowValues, c.SlotValues = o.RowValues, o.SlotValues
	if err := g.engineError(g.eng.CombineSend(c)); err != nil {
		return CombineRequest[E]{}, err
	}
	s.inComb = true
	return CombineRequest[E]{s: s, gen: s.gen, op: s.c.Op}, nil
}

// Wait completes the combine: out holds the reduced rows.
func (r CombineRequest[E]) Wait() error {
	s := r.s
	if s == nil || s.gen != r.gen {
		return inputErrorf("combine", "Wait on a zero or stale CombineRequest")
	}
	g := s.g
	op := g.names.Combine
	if !s.inComb || s.c.Op != r.op {
		return inputErrorf(op, "Wait called twice")
	}
	if err := g.usable(op); err != nil {
		return err
	}
	s.inComb = false
	err := g.engineError(g.eng.CombineWait(&s.c))
	if err == nil {
		g.count(s, true)
	}
	if g.spec.Mode == LowLatency && !driver.IsRefused(err) { // the combine ran (it may have refused an option): the set is free
		s.done = true
		if g.pending[s.d.Set] == s {
			g.pending[s.d.Set] = nil
		}
	}
	return err
}

// checkCombine validates a combine's inputs and says where y is.
func (g *Group[E]) checkCombine(op string, s *handleState[E], y, out Tensor[E], o CombineOptions) (YPlace, error) {
	H, K := g.spec.Hidden, g.spec.TopK
	T := s.rt.T
	recv := &s.d.Recv
	rows := recv.Rows.Len() / g.spec.WireRowBytes
	rowValues := recv.Weights.Len()
	if s.inComb {
		return 0, inputErrorf(op, "a combine of this handle is in flight (call its Wait)")
	}
	if g.spec.Mode == LowLatency {
		if s.done {
			return 0, inputErrorf(op, "the handle has already been combined")
		}
		if o.WeightsOverride != nil && len(o.WeightsOverride) != T*K {
			return 0, inputErrorf(op, "len(WeightsOverride) = %d, want tokens*TopK = %d*%d", len(o.WeightsOverride), T, K)
		}
	}
	if o.WeightsOverride != nil && !g.spec.WeightedCombine() {
		return 0, inputErrorf(op, "WeightsOverride is for LL mode's expert-major layout: an %v %v combine is an unweighted sum (the expert side applies the weights)",
			g.spec.Mode, g.spec.Layout)
	}
	if y.Len() != rows*H {
		hint := ""
		if g.spec.Wire.FP8() && y.IsZero() {
			hint = ": an FP8 group's Recv() is empty (it receives RecvFP8); write the outputs into CombineBuffer()"
		}
		return 0, inputErrorf(op, "len(y) = %d, want %d rows of %d = %d (laid out like Recv())%s", y.Len(), rows, H, rows*H, hint)
	}
	if out.Len() != T*H {
		return 0, inputErrorf(op, "len(out) = %d, want tokens*Hidden = %d*%d = %d", out.Len(), T, H, T*H)
	}
	if o.RowValues.IsZero() != o.SlotValues.IsZero() {
		return 0, inputErrorf(op, "set both RowValues and SlotValues, or neither")
	}
	if !o.RowValues.IsZero() {
		if o.RowValues.Len() != rowValues {
			return 0, inputErrorf(op, "len(RowValues) = %d, want %d", o.RowValues.Len(), rowValues)
		}
		if o.SlotValues.Len() != T*K {
			return 0, inputErrorf(op, "len(SlotValues) = %d, want tokens*TopK = %d*%d", o.SlotValues.Len(), T, K)
		}
		if err := g.checkMemory(op, "RowValues", o.RowValues.Memory()); err != nil {
			return 0, err
		}
		if err := g.checkMemory(op, "SlotValues", o.SlotValues.Memory()); err != nil {
			return 0, err
		}
	}
	if err := g.checkMemory(op, "y", y.Memory()); err != nil {
		return 0, err
	}
	if err := g.checkMemory(op, "out", out.Memory()); err != nil {
		return 0, err
	}
	yb := AsBytes(y)
	switch {
	case driver.SameTensor(yb, recv.Rows):
		if g.spec.Mode == HighThroughput && s.d.Op != g.htLast {
			return 0, inputErrorf(op, "y is the receive buffer of an earlier dispatch, which a later dispatch has overwritten")
		}
		return YInRows, nil
	case driver.SameTensor(yb, recv.Outputs):
		return YInOutputs, nil
	}
	return YElsewhere, nil
}

// Release ends handle h without its combine, giving back what it holds:
// in LowLatency, its buffer set, which the second dispatch after h would
// otherwise be refused for (two dispatches at most wait for their
// combine). h and its views are then empty, and calls refuse it. A zero or
// stale handle holds nothing: Release does nothing. A handle whose dispatch
// or combine is in flight (its Wait has not run) cannot be released: Wait
// first.
//
// Releasing an LL handle that has not been combined is collective, in the
// place of its combine: every rank must release it (or combine it on none).
// Engines with FeatureCallSequence move nothing and fail the call on every
// rank where some ranks release the handle and others combine it; with
// other engines it is a combine whose outputs are dropped. Other handles
// (HighThroughput ones, combined or never dispatched LL ones) are released
// on this rank alone. After the group failed (closed, or unusable), the
// handle is released here with no call.
func (g *Group[E]) Release(h Handle[E]) error {
	const op = "Release"
	s := h.s
	if s == nil || s.gen != h.gen {
		return nil
	}
	if s.g != g {
		return inputErrorf(op, "the handle belongs to another group")
	}
	if (s.sent && !s.ready) || s.inComb {
		return inputErrorf(op, "the handle's dispatch or combine is in flight: call its Wait first")
	}
	var err error
	if s.mode == LowLatency && s.ready && !s.done && g.usable(op) == nil {
		err = g.releaseCall(s)
	}
	if !driver.IsRefused(err) { // a refusal leaves the handle as it was: every rank's release failed alike
		g.gen++
		s.gen = g.gen
		s.sent, s.ready, s.done, s.inComb = false, false, false, false
		if g.pending[s.d.Set] == s {
			g.pending[s.d.Set] = nil
		}
	}
	return err
}

// releaseCall is Release's collective call, in the place of s's combine.
func (g *Group[E]) releaseCall(s *handleState[E]) error {
	if _, ok := g.eng.(Sequencer); !ok {
		return g.dropCombine(s)
	}
	g.op++
	c := &s.c
	c.Op, c.Dispatch, c.Y, c.YIn, c.Out, c.Weights = g.op, &s.d, Tensor[byte]{}, YElsewhere, Tensor[byte]{}, nil
	c.RowValues, c.SlotValues, c.Release = Tensor[float32]{}, Tensor[float32]{}, true
	defer func() { c.Release = false }()
	if err := g.engineError(g.eng.CombineSend(c)); err != nil {
		return err
	}
	return g.engineError(g.eng.CombineWait(c))
}

// dropCombine combines s into memory of its own and drops the result: the
// release of an engine that cannot release without moving rows.
func (g *Group[E]) dropCombine(s *handleState[E]) error {
	out, err := Alloc[E](g.mem, s.rt.T*g.spec.Hidden)
	if err != nil {
		return err
	}
	defer Free(out)
	y := Handle[E]{s: s, gen: s.gen}.CombineBuffer()
	return g.Combine(Handle[E]{s: s, gen: s.gen}, y, out, nil)
}

// Held is, in LowLatency, the handle that holds the buffer set the next
// dispatch needs: the earlier of two dispatches that wait for their
// combine, which must be combined or released first (false when the set
// is free). Not collective.
func (g *Group[E]) Held() (Handle[E], bool) {
	if g == nil || g.spec.Mode != LowLatency {
		return Handle[E]{}, false
	}
	s := g.pending[g.dispatches%2]
	if s == nil {
		return Handle[E]{}, false
	}
	return Handle[E]{s: s, gen: s.gen}, true
}
