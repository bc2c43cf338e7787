package ep

// DispatchRequest is a dispatch whose sends are done; Wait receives. It is a
// small value: copy it freely.
type DispatchRequest[E Element] struct {
	s   *handleState[E]
	gen uint64
}

// DispatchInput is one dispatch's inputs, as NCCL EP's ncclEpDispatch
// takes them: the tokens, and where their routing comes from.
//
// The tokens are Tokens, [T][Hidden] in the element type, or, in a group
// that forwards rows the caller quantized (a Config.Wire whose
// WireInfo.Forward is set, NCCL EP's scales-forward recipe: a low-precision
// GEMM's output goes out without a round trip through the element type),
// the rows in that format: for WireFP8Forward, Codes, [T][Hidden] e4m3,
// with Scales, [T][ScaleGroups(Hidden)] float32 (row r's elements
// [g*ScaleGroup, (g+1)*ScaleGroup) are codes times scale g), which arrive
// as RecvFP8 and RecvScales; for any forwarded format, Packed, T rows of
// the format's RowBytes, with PackedScales, T rows of its SideBytes, which
// arrive as RecvWire. They travel as they are and are in Memory().
//
// The routing is TopK, [T][TopK] expert ids on the host (-1 = none; nil
// for no tokens), with Weights, [T][TopK]; or Reuse, an earlier handle of
// the group whose routing this dispatch takes, skipping the layout and the
// count exchange (every rank must reuse at the same call; NCCL EP
// dispatches a handle again so), with Weights, or the earlier weights where
// Weights is nil. Reuse is how the gradient of a combine reaches the expert
// rows.
type DispatchInput[E Element] struct {
	Tokens       Tensor[E]
	Codes        Tensor[E4M3]
	Scales       Tensor[float32]
	Packed       Tensor[byte]
	PackedScales Tensor[byte]
	TopK         []int32
	Weights      []float32
	Reuse        Handle[E]
	reuse        bool // made by ep.Reuse: a cached dispatch even where Reuse is the zero Handle (refused by name)
}

// Tokens is the input of a dispatch of x routed by topk with weights.
func Tokens[E Element](x Tensor[E], topk []int32, weights []float32) DispatchInput[E] {
	return DispatchInput[E]{Tokens: x, TopK: topk, Weights: weights}
}

// Reuse is the input of a dispatch of x with prev's routing, and weights
// (nil: prev's). A zero prev is refused, naming it, as every rank's call
// expects a cached dispatch.
func Reuse[E Element](prev Handle[E], x Tensor[E], weights []float32) DispatchInput[E] {
	return DispatchInput[E]{Tokens: x, Weights: weights, Reuse: prev, reuse: true}
}

// Dispatch sends the tokens of in to the ranks owning each token's experts
// and returns the handle of what this rank received. It is DispatchSend
// then Wait.
func (g *Group[E]) Dispatch(in DispatchInput[E]) (Handle[E], error) {
	req, err := g.DispatchSend(in)
	if err != nil {
		return Handle[E]{}, err
	}
	return req.Wait()
}

// DispatchSend does the sending half of a dispatch (NCCL EP's send_only):
// when it returns, this rank's rows are in (or on their way to) the
// receivers' buffers and the tokens may be reused. Compute can run before
// Wait (NCCL EP's ncclEpComplete).
func (g *Group[E]) DispatchSend(in DispatchInput[E]) (DispatchRequest[E], error) {
	reuse := in.reuse || in.Reuse.s != nil
	op := g.names.Dispatch
	if reuse {
		op = g.names.Cached
	}
	x, err := inputTokens(op, in)
	if err == nil && reuse && len(in.TopK) > 0 {
		err = inputErrorf(op, "DispatchInput has both TopK and Reuse: the routing comes from one of them")
	}
	if err != nil {
		if err := g.usable(op); err != nil {
			return DispatchRequest[E]{}, err
		}
		return DispatchRequest[E]{}, g.refuse(Refusal{Kind: CallDispatch, Cached: reuse}, err)
	}
	if reuse {
		return g.cachedSend(in.Reuse, x, in.Weights)
	}
	return g.dispatchSend(op, x, in.TopK, in.Weights)
}

// inputTokens are in's rows as the engine takes them.
func inputTokens[E Element](op string, in DispatchInput[E]) (tokens, error) {
	fp8 := !in.Codes.IsZero() || !in.Scales.IsZero()
	packed := !in.Packed.IsZero() || !in.PackedScales.IsZero()
	switch {
	case (fp8 || packed) && !in.Tokens.IsZero():
		return tokens{}, inputErrorf(op, "DispatchInput has both Tokens and quantized rows (Codes/Scales or Packed/PackedScales): the rows are one or the other")
	case fp8 && packed:
		return tokens{}, inputErrorf(op, "DispatchInput has both Codes/Scales and Packed/PackedScales: the rows are one or the other")
	case fp8:
		return tokens{rows: AsBytes(in.Codes), scales: AsBytes(in.Scales), quantized: "codes"}, nil
	case packed:
		return tokens{rows: in.Packed, scales: in.PackedScales, quantized: "packed"}, nil
	}
	return tokens{rows: AsBytes(in.Tokens)}, nil
}

// tokens are a dispatch's rows as the engine takes them, in bytes: in the
// element type, or quantized by the caller, given as e4m3 Codes ("codes")
// or as Packed rows ("packed"), with their scales.
type tokens struct {
	rows, scales Tensor[byte]
	quantized    string
}

func (g *Group[E]) dispatchSend(op string, x tokens, topk []int32, weights []float32) (DispatchRequest[E], error) {
	if err := g.usable(op); err != nil {
		return DispatchRequest[E]{}, err
	}
	T, err := g.checkTokens(op, x, topk, weights)
	if err == nil {
		err = g.checkSetFree(op)
	}
	if err == nil {
		err = computeRouting(&g.scratchRT, op, g.sh, topk, T)
	}
	var s *handleState[E]
	if err == nil {
		s, err = g.newState(op)
	}
	if err != nil {
		return DispatchRequest[E]{}, g.refuse(Refusal{Kind: CallDispatch}, err)
	}
	s.rt, g.scratchRT = g.scratchRT, s.rt // the checked routing becomes the record's, without a copy
	s.topk = append(s.topk[:0], topk...)
	s.weights = append(s.weights[:0], weights...)
	return g.send(op, s, x, nil)
}

func (g *Group[E]) cachedSend(prev Handle[E], x tokens, weights []float32) (DispatchRequest[E], error) {
	op := g.names.Cached
	if err := g.usable(op); err != nil {
		return DispatchRequest[E]{}, err
	}
	p, err := g.checkHandle(op, prev)
	if err == nil {
		if weights == nil {
			weights = p.weights
		}
		_, err = g.checkTokens(op, x, p.topk, weights)
	}
	if err == nil {
		err = g.checkSetFree(op)
	}
	var s *handleState[E]
	if err == nil {
		s, err = g.newState(op)
	}
	if err != nil {
		r := Refusal{Kind: CallDispatch, Cached: true}
		if p != nil {
			r.Dispatch = &p.d
		}
		return DispatchRequest[E]{}, g.refuse(r, err)
	}
	if s == p { // the ring came round to prev itself: its routing is already there
		s.weights = append(s.weights[:0], weights...)
	} else {
		copyRouting(&s.rt, &p.rt)
		s.topk = append(s.topk[:0], p.topk...)
		s.weights = append(s.weights[:0], weights...)
	}
	return g.send(op, s, x, &p.d)
}

// send numbers the dispatch and hands it to the engine.
func (g *Group[E]) send(op string, s *handleState[E], x tokens, from *Dispatch) (DispatchRequest[E], error) {
	b := 0
	if g.spec.Mode == LowLatency {
		b = int(g.dispatches % 2)
	}
	g.op++
	g.dispatches++
	d := &s.d // field by field: a new Dispatch would copy the whole record, Recv and all
	d.Op, d.Set, d.From, d.X, d.Scales, d.TopK, d.Weights, d.Route = g.op, b, from, x.rows, x.scales, s.topk, s.weights, &s.rt
	d.Recv = Received{}
	if err := g.engineError(g.eng.DispatchSend(d)); err != nil {
		s.d.From = nil
		return DispatchRequest[E]{}, err
	}
	s.d.From = nil // valid during DispatchSend only
	s.sent = true
	if g.spec.Mode == LowLatency {
		g.pending[b] = s
	} else {
		g.htLast = s.d.Op
	}
	return DispatchRequest[E]{s: s, gen: s.gen}, nil
}

// Wait completes the dispatch and returns its handle.
func (r DispatchRequest[E]) Wait() (Handle[E], error) {
	s := r.s
	if s == nil || s.gen != r.gen {
		return Handle[E]{}, inputErrorf("dispatch", "Wait on a zero or stale DispatchRequest")
	}
	g := s.g
	op := g.names.Dispatch
	if s.ready {
		return Handle[E]{}, inputErrorf(op, "Wait called twice")
	}
	if err := g.usable(op); err != nil {
		return Handle[E]{}, err
	}
	if err := g.engineError(g.eng.DispatchWait(&s.d)); err != nil {
		if g.pending[s.d.Set] == s {
			g.pending[s.d.Set] = nil
		}
		s.sent = false
		return Handle[E]{}, err
	}
	s.ready = true
	g.traffic(s)
	g.count(s, false)
	return Handle[E]{s: s, gen: s.gen}, nil
}

// checkTokens validates the inputs of a dispatch on this rank.
func (g *Group[E]) checkTokens(op string, x tokens, topk []int32, weights []float32) (int, error) {
	H, K := g.spec.Hidden, g.spec.TopK
	forward := g.spec.Wire.Forward()
	switch {
	case forward && x.quantized == "":
		return 0, inputErrorf(op, "the group forwards rows the caller quantized (Config.Wire %v): pass them in that format (%s)", g.spec.Wire, quantizedFields(g.spec.Wire))
	case !forward && x.quantized != "":
		return 0, inputErrorf(op, "quantized rows are for a group with a forwarding Config.Wire, not %v: pass the rows in the element type", g.spec.Wire)
	case x.quantized == "codes" && !g.spec.Wire.FP8():
		return 0, inputErrorf(op, "e4m3 codes are not rows of Config.Wire %v: pass them as DispatchInput.Packed and PackedScales", g.spec.Wire)
	}
	if len(topk)%K != 0 {
		return 0, inputErrorf(op, "len(topk) = %d is not a multiple of TopK = %d", len(topk), K)
	}
	T := len(topk) / K
	if T > g.spec.MaxTokensPerRank {
		return 0, inputErrorf(op, "%d tokens exceed MaxTokensPerRank = %d", T, g.spec.MaxTokensPerRank)
	}
	if len(weights) != T*K {
		return 0, inputErrorf(op, "len(weights) = %d, want tokens*TopK = %d*%d = %d", len(weights), T, K, T*K)
	}
	if x.quantized == "codes" {
		G := ScaleGroups(H)
		if x.rows.Len() != T*H {
			return 0, inputErrorf(op, "len(codes) = %d, want tokens*Hidden = %d*%d = %d", x.rows.Len(), T, H, T*H)
		}
		if x.scales.Len() != 4*T*G {
			return 0, inputErrorf(op, "len(scales) = %d, want tokens*ScaleGroups(Hidden) = %d*%d = %d", x.scales.Len()/4, T, G, T*G)
		}
	}
	if x.quantized != "" {
		rb, sb := g.spec.WireRowBytes, g.spec.WireSideBytes
		if x.rows.Len() != T*rb {
			return 0, inputErrorf(op, "len(Packed) = %d bytes, want tokens*RowBytes = %d*%d = %d for Config.Wire %v", x.rows.Len(), T, rb, T*rb, g.spec.Wire)
		}
		if x.scales.Len() != T*sb {
			return 0, inputErrorf(op, "len(PackedScales) = %d bytes, want tokens*SideBytes = %d*%d = %d for Config.Wire %v", x.scales.Len(), T, sb, T*sb, g.spec.Wire)
		}
		if err := g.checkMemory(op, "the quantized rows", x.rows.Memory()); err != nil {
			return 0, err
		}
		if x.scales.Len() == 0 {
			return T, nil
		}
		return T, g.checkMemory(op, "their scales", x.scales.Memory())
	}
	if es := g.spec.Elem.Size(); x.rows.Len() != T*H*es {
		return 0, inputErrorf(op, "len(x) = %d, want tokens*Hidden = %d*%d = %d", x.rows.Len()/es, T, H, T*H)
	}
	return T, g.checkMemory(op, "x", x.rows.Memory())
}

// quantizedFields names the DispatchInput fields that carry rows already
// in format w.
func quantizedFields(w WireFormat) string {
	if w.FP8() {
		return "e4m3 codes and scales, DispatchInput.Codes and Scales, or their bytes as Packed and PackedScales"
	}
	return "DispatchInput.Packed and PackedScales"
}

// checkMemory refuses a tensor outside the engine's memory.
func (g *Group[E]) checkMemory(op, what string, m Memory) error {
	if m != g.mem {
		return inputErrorf(op, "%s is in %v memory; the %s backend works on %v memory", what, m, g.Backend(), g.mem)
	}
	return nil
}

// checkSetFree refuses a dispatch whose buffers are still needed: in LL, a
// buffer set whose handle has not been combined; in HT, a receive buffer
// whose dispatch or combine is still in flight.
func (g *Group[E]) checkSetFree(op string) error {
	if g.spec.Mode == LowLatency {
		b := int(g.dispatches % 2)
		if g.pending[b] != nil {
			return inputErrorf(op, "two LL dispatches are already waiting for their combine: combine or Release the handle of the earlier one (it holds buffer set %d) first", b)
		}
		return nil
	}
	for _, s := range g.states {
		if s != nil && ((s.sent && !s.ready) || s.inComb) {
			return inputErrorf(op, "an HT dispatch or combine is still in flight: call its Wait first")
		}
	}
	return nil
}

// checkHandle resolves a handle of this group whose dispatch has completed.
func (g *Group[E]) checkHandle(op string, h Handle[E]) (*handleState[E], error) {
	if h.s == nil {
		return nil, inputErrorf(op, "nil handle")
	}
	if h.s.g != g {
		return nil, inputErrorf(op, "the handle belongs to another group")
	}
	if h.s.gen != h.gen {
		return nil, inputErrorf(op, "the handle is stale: it was made more than %d dispatches ago, and its record has been reused", handleRing)
	}
	if !h.s.ready {
		return nil, inputErrorf(op, "the handle's dispatch has not completed (call Wait)")
	}
	return h.s, nil
}

// Layout computes the routing of topk ([tokens][TopK] expert ids, -1 =
// none), checking the ids. It is local: no communication.
func (g *Group[E]) Layout(topk []int32) (*Layout, error) {
	if err := g.usable("Layout"); err != nil {
		return nil, err
	}
	if len(topk)%g.spec.TopK != 0 {
		return nil, inputErrorf("Layout", "len(topk) = %d is not a multiple of TopK = %d", len(topk), g.spec.TopK)
	}
	var r Routing
	if err := computeRouting(&r, "Layout", g.sh, topk, len(topk)/g.spec.TopK); err != nil {
		return nil, err
	}
	return layoutOf(&r, g.size), nil
}
