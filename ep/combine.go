package ep

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
	op := g.names.combine
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
	if g.spec.weightedCombine() && weights == nil {
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
	op := g.names.combine
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
	if g.spec.Mode == LowLatency && !isRefused(err) { // the combine ran (it may have refused an option): the set is free
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
	if o.WeightsOverride != nil && !g.spec.weightedCombine() {
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
	case sameTensor(yb, recv.Rows):
		if g.spec.Mode == HighThroughput && s.d.Op != g.htLast {
			return 0, inputErrorf(op, "y is the receive buffer of an earlier dispatch, which a later dispatch has overwritten")
		}
		return YInRows, nil
	case sameTensor(yb, recv.Outputs):
		return YInOutputs, nil
	}
	return YElsewhere, nil
}
