//go:build mpi

package main

/*
#include "capi_internal.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"unsafe"

	"github.com/goep/goep/ep"
)

// handleImpl is one step's routing (its copy of topk_idx) and the ep
// handle of its latest dispatch.
type handleImpl[E ep.Element] struct {
	g         *groupImpl[E]
	id, gid   uint64 // its number in the registry, and its group's
	layout    C.goepEpLayout_t
	T         int
	kh        int // the top-k of the handle's topk_idx, at most the group's; its copy, topk, is padded with -1 to the group's
	topk      []int32
	mem       []int32 // the caller's handle_mem (goepEpInitHandle), which holds topk; nil: Go memory
	destroyed bool    // goepEpHandleDestroy ran: its calls are refused
	// routed: the handle has a routing to dispatch (goepEpCreateHandle, or
	// goepEpUpdateHandle's last call succeeded); refusedUpdate: that last
	// goepEpUpdateHandle was refused.
	routed, refusedUpdate bool

	eh         ep.Handle[E] // the latest completed dispatch
	dispatched bool
	number     uint64 // the group's dispatch count at eh's dispatch: its rows' lifetime
	hasWeights bool   // a dispatch was given gate weights (LL combine may apply them)

	// A send-only call waiting for goepEpComplete.
	sentDispatch *sentDispatch[E]
	sentCombine  *ep.CombineRequest[E]
}

// sentDispatch is a send-only dispatch and the outputs its completion writes.
type sentDispatch[E ep.Element] struct {
	req    ep.DispatchRequest[E]
	out    dispatchOut
	number uint64
}

// dispatchOut is a dispatch's checked outputs.
type dispatchOut struct {
	tokens, weights, topkIdx, scales tensor
	expertCounts, total              tensor
	srcCounts, offsets               tensor // LL RANK_MAJOR's src_rank_counters, HT EXPERT_MAJOR's expert_offsets
	global                           bool   // recv_topk_idx_kind GLOBAL
}

// dispatchIn is a dispatch's checked inputs: the rows in the element type
// (x), or, in a group forwarding them, e4m3 codes with their scales or
// NVFP4 rows as bytes (packed, packedScales, the scales' datatype
// scaleType); and the weights.
type dispatchIn[E ep.Element] struct {
	x                    ep.Tensor[E]
	codes                ep.Tensor[ep.E4M3]
	scales               ep.Tensor[float32]
	packed, packedScales ep.Tensor[byte]
	scaleType            dataType
	weights              []float32
}

// lock takes the handle's group for a call.
func (h *handleImpl[E]) lock() error { return h.g.lock() }

func (h *handleImpl[E]) unlock() {
	h.g.noteMask()
	h.g.mu.Unlock()
}

func (h *handleImpl[E]) idle(op string) error {
	switch {
	case h.sentDispatch != nil:
		return invalidUsagef("%s: the handle's send-only dispatch has not been completed: call goepEpComplete first", op)
	case h.sentCombine != nil:
		return invalidUsagef("%s: the handle's send-only combine has not been completed: call goepEpComplete first", op)
	}
	return nil
}

type dispatchConfig struct {
	sendOnly, backward bool
	recipe             C.goepEpDispQuant_t
	roundScales        bool
}

func readDispatchConfig(p *C.goepEpDispatchConfig_t) (dispatchConfig, error) {
	var c dispatchConfig
	if p == nil {
		return c, nil
	}
	if err := checkHeader("config", "goepEpDispatchConfig_t", uint32(p.size), uint32(p.magic), C.GOEP_EP_DISPATCH_CONFIG_V1_SIZE,
		C.GOEP_EP_MAGIC, "GOEP_EP_DISPATCH_CONFIG_INIT"); err != nil {
		return c, err
	}
	if covers(p.size, unsafe.Offsetof(p.quant_recipe), unsafe.Sizeof(p.quant_recipe)) {
		c.recipe = p.quant_recipe
	}
	switch {
	case c.recipe != C.GOEP_EP_DISP_QUANT_NONE && c.recipe != C.GOEP_EP_DISP_QUANT_FWD && c.recipe != C.GOEP_EP_DISP_QUANT_DS_FP8E3M4 &&
		c.recipe != C.GOEP_EP_DISP_QUANT_FWD_NVFP4:
		return c, invalidArgf("config.quant_recipe = %d: want GOEP_EP_DISP_QUANT_NONE (0), FWD (1), DS_FP8E3M4 (2) or FWD_NVFP4 (0x100)", int(c.recipe))
	case p.round_scales > 1:
		return c, invalidArgf("config.round_scales = %d: want 0 or 1", uint(p.round_scales))
	case p.pass_direction != C.GOEP_EP_FWD_PASS && p.pass_direction != C.GOEP_EP_BWD_PASS:
		return c, invalidArgf("config.pass_direction = %d: want GOEP_EP_FWD_PASS (0) or GOEP_EP_BWD_PASS (1)", int(p.pass_direction))
	}
	c.sendOnly = p.send_only != 0
	c.backward = p.pass_direction == C.GOEP_EP_BWD_PASS
	c.roundScales = p.round_scales != 0
	return c, nil
}

// checkRecipe checks a dispatch's recipe against the group's: NONE (with
// round_scales 0) takes the group's; any other must be the group's own,
// since the group's buffers hold its rows in that one format. FWD, NCCL
// EP's one forwarding recipe, names a group's FWD_NVFP4 too.
func (gc *groupConfig) checkRecipe(c dispatchConfig) error {
	if c.recipe == C.GOEP_EP_DISP_QUANT_NONE && !c.roundScales {
		return nil
	}
	own := c.recipe == gc.dispQuant || (c.recipe == C.GOEP_EP_DISP_QUANT_FWD && gc.dispQuant == C.GOEP_EP_DISP_QUANT_FWD_NVFP4)
	if own && c.roundScales == gc.roundScales {
		return nil
	}
	return invalidUsagef("config.quant_recipe = %s and config.round_scales = %d, but this group's dispatches are %s with round_scales %d "+
		"(goepEpGroupOptions_t.dispatch_quant and dispatch_round_scales): goep lays out a group's buffers for one format, so the recipe is "+
		"the group's; pass GOEP_EP_DISP_QUANT_NONE or the group's recipe, or make a group with this one",
		dispQuantName(c.recipe), b2i(c.roundScales), dispQuantName(gc.dispQuant), b2i(gc.roundScales))
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

func (h *handleImpl[E]) setID(id, gid uint64) { h.id, h.gid = id, gid }
func (h *handleImpl[E]) groupID() uint64      { return h.gid }

// refuseDispatch takes part in this dispatch as a refusal: the others'
// same call fails at once, naming this rank and err, and the group stays
// usable. The caller holds the group.
func (h *handleImpl[E]) refuseDispatch(err error) error {
	var prev ep.Handle[E]
	if h.dispatched { // the others make a cached dispatch of it
		prev = h.eh
	}
	h.g.dispatches++ // as a dispatch that ran
	if rerr := h.g.g.RefuseDispatch(prev, err.Error()); rerr != nil && !errors.Is(rerr, ep.ErrBadInput) {
		return rerr // the group failed: that says more than the refusal
	}
	return err
}

// refuseCombine is refuseDispatch for a combine.
func (h *handleImpl[E]) refuseCombine(err error) error {
	if rerr := h.g.g.RefuseCombine(h.eh, err.Error()); rerr != nil && !errors.Is(rerr, ep.ErrBadInput) {
		return rerr
	}
	return err
}

// refuse is goepEpRefuse of the handle's dispatch or combine.
func (h *handleImpl[E]) refuse(call C.goepEpCall_t, reason string) error {
	if err := h.lock(); err != nil {
		return err
	}
	defer h.unlock()
	err := invalidArgf("%s", reason)
	switch call {
	case C.GOEP_EP_CALL_DISPATCH:
		if derr := h.g.deliver(); derr != nil {
			return derr
		}
		return h.refuseDispatch(err)
	case C.GOEP_EP_CALL_COMBINE:
		return h.refuseCombine(err)
	}
	return invalidArgf("call = %d: a handle's calls are GOEP_EP_CALL_DISPATCH (%d) and GOEP_EP_CALL_COMBINE (%d)",
		int(call), int(C.GOEP_EP_CALL_DISPATCH), int(C.GOEP_EP_CALL_COMBINE))
}

// update is goepEpUpdateHandle: the handle's next step, numbered as a
// goepEpCreateHandle; a refused one is delivered as a refused create is.
func (h *handleImpl[E]) update(topkDesc *C.goepEpTensor_t, info *C.goepEpLayoutInfo_t) error {
	if err := h.lock(); err != nil {
		return err
	}
	defer h.unlock()
	if err := h.g.deliver(); err != nil {
		return err
	}
	h.g.g.Mark() // the step's number, refused or not
	err := h.idle("goepEpUpdateHandle")
	switch {
	case h.destroyed:
		err = h.errDestroyed()
	case err == nil && h.dispatched && h.eh.Waiting():
		err = invalidUsagef("the handle's LL dispatch has not been combined: combine it (goepEpCombine) before giving the handle new routing")
	case err == nil:
		err = h.route(topkDesc, info)
	}
	if err != nil {
		h.routed, h.refusedUpdate = false, true
		h.g.refused = "goepEpUpdateHandle refused this rank's routing for the dispatch: " + err.Error()
		return err
	}
	return nil
}

// route checks topk_idx and makes it the handle's routing, releasing what
// an earlier dispatch of the handle holds. Nothing changes when it fails.
// The caller holds the group.
func (h *handleImpl[E]) route(topkDesc *C.goepEpTensor_t, info *C.goepEpLayoutInfo_t) error {
	gi := h.g
	if info != nil {
		return invalidUsagef("layout_info must be NULL: goep writes the layout counters at dispatch (pass layout_info to goepEpDispatch)")
	}
	t, err := need("topk_idx", topkDesc)
	if err != nil {
		return err
	}
	K, maxT := gi.gc.cfg.TopK, gi.gc.cfg.MaxTokensPerRank
	if err := t.want("[num_tokens, num_topk]", []dataType{dtInt32, dtInt64}, -1, -1); err != nil {
		return err
	}
	T, kh := t.dims[0], t.dims[1]
	if T > maxT {
		return invalidArgf("topk_idx has %d tokens (shape %s), more than config.max_dispatch_tokens_per_rank = %d", T, shapeString(t.shape()), maxT)
	}
	switch {
	case kh < 1:
		return invalidArgf("topk_idx has shape %s: want num_topk >= 1", shapeString(t.shape()))
	case kh > K:
		return gi.tooWide(kh)
	case kh < K && gi.gc.cfg.Mode != ep.LowLatency:
		return invalidUsagef("topk_idx has num_topk = %d, less than the group's %d: goep pads a narrower handle's routing in LL groups only "+
			"(an HT handle's [slots, num_topk] outputs would need narrowing); give HT handles the group's top-k", kh, K)
	}
	// A fresh copy, each token's kh ids then -1 up to the group's K: an
	// earlier dispatch of the handle may read its routing until it is
	// released below.
	topk := make([]int32, T*K)
	if t.dtype == dtInt32 {
		for i, e := range view[int32](&t, T*kh) {
			topk[i/kh*K+i%kh] = e
		}
	} else {
		for i, e := range view[int64](&t, T*kh) {
			v := int32(max(min(e, 1<<31-1), -1<<31))
			if int64(v) != e {
				return invalidArgf("topk_idx[%d][%d] = %d is not an expert id in [0, %d) or -1", i/kh, i%kh, e, gi.gc.cfg.NumExperts)
			}
			topk[i/kh*K+i%kh] = v
		}
	}
	for i := range topk {
		if i%K >= kh {
			topk[i] = -1
		}
	}
	if err := checkRouting(topk, K, gi.gc.cfg.NumExperts); err != nil {
		return err
	}
	if h.dispatched {
		if err := gi.g.Release(h.eh); err != nil { // local: an HT handle, or an LL one combined
			return err
		}
	}
	if h.mem != nil {
		topk = h.mem[:copy(h.mem, topk)]
	}
	h.topk, h.T, h.kh, h.routed, h.refusedUpdate = topk, T, kh, true, false
	h.eh, h.dispatched, h.hasWeights = ep.Handle[E]{}, false, false
	return nil
}

// widen gives [T][kh] weights of a handle narrower than the group as the
// group's [T][K], 0 in the padding slots (whose expert ids are -1); the
// caller's slice itself when kh is K.
func (h *handleImpl[E]) widen(w []float32, K int) []float32 {
	if h.kh == K {
		return w
	}
	out := make([]float32, h.T*K)
	for i, v := range w {
		out[i/h.kh*K+i%h.kh] = v
	}
	return out
}

// errDestroyed is the refusal of a call on a destroyed handle.
func (h *handleImpl[E]) errDestroyed() error {
	return invalidArgf("handle %#x has been destroyed (goepEpHandleDestroy)", h.id)
}

func (h *handleImpl[E]) dispatch(in *C.goepEpDispatchInputs_t, out *C.goepEpDispatchOutputs_t, info *C.goepEpLayoutInfo_t,
	cfgp *C.goepEpDispatchConfig_t) error {
	if err := h.lock(); err != nil {
		return err
	}
	defer h.unlock()
	delivering := h.g.refused != ""
	if err := h.g.deliver(); err != nil {
		return err
	}
	if h.destroyed {
		return h.refuseDispatch(h.errDestroyed())
	}
	if !h.routed {
		err := invalidUsagef("the handle has no routing: goepEpUpdateHandle gives it one")
		if h.refusedUpdate {
			err = invalidUsagef("goepEpUpdateHandle refused the handle's routing: update it again before dispatching it")
		}
		if delivering {
			return err // this rank's refusal of the step's dispatch was just made (deliver)
		}
		return h.refuseDispatch(err)
	}
	if err := h.idle("dispatch"); err != nil {
		return h.refuseDispatch(err)
	}
	if h.dispatched && h.eh.Waiting() {
		return h.refuseDispatch(invalidUsagef("the handle's last LL dispatch has not been combined: combine it (or destroy the handle) before dispatching it again"))
	}
	if id, ok := h.g.held(); ok {
		return h.refuseDispatch(invalidUsagef("two LL dispatches of the group wait for their combine: combine or destroy "+
			"handle %#x, the earlier of them, first (it holds the buffers this dispatch needs)", id))
	}
	var o dispatchOut // large: filled in place, never copied on the way
	cfg, din, err := h.dispatchArgs(in, out, info, cfgp, &o)
	if err != nil {
		return h.refuseDispatch(err)
	}
	var req ep.DispatchRequest[E]
	h.g.dispatches++ // even one that fails may have reused the receive buffer
	number := h.g.dispatches
	var input ep.DispatchInput[E]
	if h.dispatched {
		input = ep.Reuse(h.eh, din.x, din.weights)
	} else {
		input = ep.Tokens(din.x, h.topk, din.weights)
	}
	input.Codes, input.Scales = din.codes, din.scales
	input.Packed, input.PackedScales = din.packed, din.packedScales
	if req, err = h.g.g.DispatchSend(input); err != nil {
		return err
	}
	h.hasWeights = h.hasWeights || (din.weights != nil && in.topk_weights != nil)
	if cfg.sendOnly {
		h.sentDispatch = &sentDispatch[E]{req: req, out: o, number: number}
		return nil
	}
	return h.finishDispatch(req, &o, number)
}

// dispatchArgs checks a dispatch's structs and tensors and makes ep's
// arguments of them, the outputs in o.
func (h *handleImpl[E]) dispatchArgs(in *C.goepEpDispatchInputs_t, out *C.goepEpDispatchOutputs_t, info *C.goepEpLayoutInfo_t,
	cfgp *C.goepEpDispatchConfig_t, o *dispatchOut) (cfg dispatchConfig, din dispatchIn[E], err error) {
	if cfg, err = readDispatchConfig(cfgp); err != nil {
		return
	}
	if err = h.g.gc.checkRecipe(cfg); err != nil {
		return
	}
	if din, err = h.dispatchInputs(in); err != nil {
		return
	}
	if err = h.dispatchOutputs(out, info, o); err != nil {
		return
	}
	if o.scales.given() && !din.packedScales.IsZero() && o.scales.dtype != din.scaleType {
		err = invalidArgf("outputs->scales has datatype %s and inputs->scales %s: forwarded scale bytes arrive in the type they were given "+
			"(as NCCL EP's QUANT_FWD requires, the same datatype in and out)", o.scales.dtype, din.scaleType)
		return
	}
	ll := h.g.gc.cfg.Mode == ep.LowLatency
	if cfg.backward && !ll {
		switch {
		case !h.dispatched:
			err = invalidUsagef("a backward (GOEP_EP_BWD_PASS) dispatch reuses the routing of an earlier dispatch of the handle, and this handle has none")
		case din.weights != nil:
			err = invalidArgf("inputs->topk_weights must be NULL in a backward dispatch")
		case o.weights.given() || o.topkIdx.given():
			err = invalidArgf("outputs->topk_weights and outputs->topk_idx must be NULL in a backward dispatch")
		}
		if err != nil {
			return
		}
	}
	if !h.dispatched && din.weights == nil {
		if !ll {
			err = invalidArgf("inputs->topk_weights is required by an HT handle's first dispatch ([num_tokens, num_topk] float32)")
			return
		}
		din.weights = h.g.ones[:h.T*h.g.gc.cfg.TopK]
	}
	return
}

func (h *handleImpl[E]) finishDispatch(req ep.DispatchRequest[E], o *dispatchOut, number uint64) error {
	eh, err := req.Wait()
	if err != nil {
		return err
	}
	h.eh, h.dispatched, h.number = eh, true, number
	return h.writeOutputs(o)
}

// dispatchInputs checks the inputs: the tokens (or, in a group forwarding
// FP8 rows, their e4m3 codes and scales) and the optional weights.
func (h *handleImpl[E]) dispatchInputs(in *C.goepEpDispatchInputs_t) (dispatchIn[E], error) {
	var d dispatchIn[E]
	if in == nil {
		return d, invalidArgf("inputs is NULL")
	}
	if err := checkHeader("inputs", "goepEpDispatchInputs_t", uint32(in.size), uint32(in.magic), C.GOEP_EP_DISPATCH_INPUTS_V1_SIZE,
		C.GOEP_EP_MAGIC, "GOEP_EP_DISPATCH_INPUTS_INIT"); err != nil {
		return d, err
	}
	gc := &h.g.gc
	tok, err := need("inputs->tokens", in.tokens)
	if err != nil {
		return d, err
	}
	switch gc.cfg.Wire {
	case ep.WireFP8Forward:
		err = h.fp8Inputs(&d, &tok, in.scales)
	case ep.WireNVFP4Forward:
		err = h.nvfp4Inputs(&d, &tok, in.scales)
	default:
		err = tok.want("[num_tokens of the handle's topk_idx, hidden]", []dataType{gc.elem}, h.T, gc.cfg.Hidden)
		if err == nil {
			err = noScales(in.scales, gc)
		}
		if err == nil {
			d.x = ep.Host(view[E](&tok, h.T*gc.cfg.Hidden))
		}
	}
	if err != nil {
		return d, err
	}
	w, err := readTensor("inputs->topk_weights", in.topk_weights)
	if err == nil && w.given() {
		err = w.want("[num_tokens, num_topk]", []dataType{dtFloat32}, h.T, h.kh)
	}
	if err != nil {
		return d, err
	}
	if w.given() {
		d.weights = h.widen(view[float32](&w, h.T*h.kh), gc.cfg.TopK)
	}
	return d, nil
}

// noScales refuses inputs->scales in a group whose dispatches take the rows
// in the token type.
func noScales(p *C.goepEpTensor_t, gc *groupConfig) error {
	sc, err := readTensor("inputs->scales", p)
	if err == nil && sc.given() {
		err = invalidArgf("inputs->scales must be NULL: it carries forwarded scales (GOEP_EP_DISP_QUANT_FWD), and this group's dispatches are %s",
			dispQuantName(gc.dispQuant))
	}
	return err
}

// fp8Inputs checks the inputs of a group forwarding FP8 rows: e4m3 codes
// [T, hidden] with float32 scales [T, ScaleGroups(hidden)].
func (h *handleImpl[E]) fp8Inputs(d *dispatchIn[E], tok *tensor, scales *C.goepEpTensor_t) error {
	H, G := h.g.gc.cfg.Hidden, ep.ScaleGroups(h.g.gc.cfg.Hidden)
	if tok.dtype != dtFloat8e4 {
		other := "NCCL EP's other forwarded payloads (bfloat16, float16 or float32 rows) are not offered"
		if tok.dtype == dtFloat4x2 {
			other = "float4x2 rows (NVFP4) are forwarded by a group made with options.dispatch_quant = GOEP_EP_DISP_QUANT_FWD_NVFP4"
		}
		return invalidUsagef("inputs->tokens has datatype %s: this group forwards FP8 rows (GOEP_EP_DISP_QUANT_FWD), and goep forwards "+
			"e4m3 codes (goepEpFloat8e4m3) with float32 scales, one per 128 elements; %s", tok.dtype, other)
	}
	if err := tok.want("[num_tokens of the handle's topk_idx, hidden]", []dataType{dtFloat8e4}, h.T, H); err != nil {
		return err
	}
	sc, err := forwardedScales(scales, h.T, forwardedScaleRule{
		cols: G, shape: "[num_tokens, scale groups of hidden]", types: []dataType{dtFloat32},
		missing: fmt.Sprintf("inputs->scales is required by GOEP_EP_DISP_QUANT_FWD: [num_tokens, %d] float32, one scale per 128 elements of a row", G),
		wrongType: "inputs->scales has datatype %s: goep forwards float32 scales (one per 128 elements); NCCL EP's other " +
			"forwarded scales (uint8 exponents, bfloat16, float16) are not offered (ep.ScalesFromUE8M0 widens UE8M0 exponents exactly)",
		wrongCols: fmt.Sprintf("inputs->scales has %%d scales a row (shape %%s): goep forwards one float32 scale per 128 elements, "+
			"%d for hidden %d; other scale counts are not offered", G, H),
	})
	if err != nil {
		return err
	}
	d.codes, d.scales = ep.Host(view[ep.E4M3](tok, h.T*H)), ep.Host(view[float32](&sc, h.T*G))
	return nil
}

// nvfp4Inputs checks the inputs of a group forwarding NVFP4 rows, as NCCL
// EP's QUANT_FWD takes them with ncclFloat4x2 tokens: codes [T, hidden/2]
// float4x2, and one e4m3 scale byte per 16 elements, [T, hidden/16] uint8
// or float8e4m3. They are the rows and side bytes of WireNVFP4Forward, whose
// sizes the format table gives, and travel as they are.
func (h *handleImpl[E]) nvfp4Inputs(d *dispatchIn[E], tok *tensor, scales *C.goepEpTensor_t) error {
	H := h.g.gc.cfg.Hidden
	info, _ := ep.WireNVFP4Forward.Info()
	rb, sb := info.RowBytes(H, 1), info.SideBytes(H)
	if tok.dtype != dtFloat4x2 {
		return invalidUsagef("inputs->tokens has datatype %s: this group forwards NVFP4 rows (GOEP_EP_DISP_QUANT_FWD_NVFP4): float4x2 codes "+
			"(goepEpFloat4x2, two a byte) [num_tokens, hidden / 2] with one e4m3 scale byte per 16 elements (e4m3 codes with float32 "+
			"scales are forwarded by a group made with GOEP_EP_DISP_QUANT_FWD)", tok.dtype)
	}
	if tok.nd == 2 && tok.dims[0] == h.T && tok.dims[1] == H && rb != H {
		return invalidArgf("inputs->tokens has shape %s: a float4x2 element holds two values, so a row of hidden %d is %d elements "+
			"(NCCL EP's [num_tokens, H/2])", shapeString(tok.shape()), H, rb)
	}
	if err := tok.want("[num_tokens of the handle's topk_idx, hidden / 2]", []dataType{dtFloat4x2}, h.T, rb); err != nil {
		return err
	}
	sc, err := forwardedScales(scales, h.T, forwardedScaleRule{
		cols: sb, shape: "[num_tokens, hidden / 16]", types: []dataType{dtUint8, dtFloat8e4},
		missing: fmt.Sprintf("inputs->scales is required by GOEP_EP_DISP_QUANT_FWD_NVFP4: [num_tokens, %d] uint8 (or float8e4m3), "+
			"one e4m3 scale byte per 16 elements of a row", sb),
		wrongType: "inputs->scales has datatype %s: goep forwards NVFP4 rows with one e4m3 scale byte per 16 elements " +
			"(uint8 or float8e4m3); NCCL EP's other forwarded scales (float32, bfloat16, float16) are not offered with them",
		wrongCols: fmt.Sprintf("inputs->scales has %%d scales a row (shape %%s): goep forwards NVFP4 rows with one scale byte per 16 "+
			"elements, %d for hidden %d; other scale counts are not offered", sb, H),
	})
	if err != nil {
		return err
	}
	d.packed, d.packedScales = ep.Host(view[byte](tok, h.T*rb)), ep.Host(view[byte](&sc, h.T*sb))
	d.scaleType = sc.dtype
	return nil
}

// forwardedScaleRule is what a forwarded format takes as inputs->scales:
// cols scales a row of one of types, and the refusals that name it
// (wrongType formats the datatype, wrongCols the count and the shape).
type forwardedScaleRule struct {
	cols                          int
	shape                         string
	types                         []dataType
	missing, wrongType, wrongCols string
}

// forwardedScales reads inputs->scales of a dispatch forwarding quantised
// rows: required, of the format's types, cols scales for each of T rows.
func forwardedScales(p *C.goepEpTensor_t, T int, r forwardedScaleRule) (tensor, error) {
	sc, err := readTensor("inputs->scales", p)
	switch {
	case err != nil:
		return sc, err
	case !sc.given():
		return sc, invalidArgf("%s", r.missing)
	case !slices.Contains(r.types, sc.dtype):
		return sc, invalidUsagef(r.wrongType, sc.dtype)
	case sc.nd == 2 && sc.dims[0] == T && sc.dims[1] != r.cols:
		return sc, invalidUsagef(r.wrongCols, sc.dims[1], shapeString(sc.shape()))
	}
	if err := sc.want(r.shape, r.types, T, r.cols); err != nil {
		return sc, err
	}
	return sc, nil
}

// outShape is how a dispatch of the group lays out its outputs: the
// leading dimensions of a row (rowDims), named by what, and the layout's.
// The group's is made once, when its first handle opens it (its layout is
// fixed from then on): groupImpl.shape.
type outShape struct {
	rowDims []int      // the dimensions before hidden, num_topk or the scale groups (-1: any)
	what    string     // their names, e.g. "[local_experts, nranks * max_dispatch_tokens_per_rank"
	ll, rm  bool       // LowLatency; its RANK_MAJOR layout
	em      bool       // HighThroughput's EXPERT_MAJOR layout
	quant   *rowFormat // a quantised dispatch's codes and scales; nil: rows in the token type
}

// newOutShape is the outputs' shape of the dispatches of open group g.
func newOutShape[E ep.Element](gc groupConfig, g *ep.Group[E]) outShape {
	R, L, maxT := g.Size(), g.LocalExperts(), gc.cfg.MaxTokensPerRank
	s := outShape{ll: gc.cfg.Mode == ep.LowLatency, rm: gc.cfg.LLRankMajor(), em: gc.cfg.HTExpertMajor(), quant: gc.rowFormat()}
	switch {
	case s.rm:
		s.rowDims, s.what = []int{R, maxT}, "[nranks, max_dispatch_tokens_per_rank"
	case s.ll:
		s.rowDims, s.what = []int{L, R * maxT}, "[local_experts, nranks * max_dispatch_tokens_per_rank"
	default:
		s.rowDims, s.what = []int{-1}, "[slots"
	}
	return s
}

// outShape is how the handle's group lays out a dispatch's outputs.
func (h *handleImpl[E]) outShape() *outShape { return &h.g.shape }

// wantRows checks a tensor laid out as a dispatch's received rows: of one
// of types, with s's leading dimensions then last, whose name is lastWhat
// (e.g. "hidden]"). The message is made only for a refusal.
func (t *tensor) wantRows(s *outShape, lastWhat string, types []dataType, last int) error {
	var dims [maxDims]int
	n := copy(dims[:], s.rowDims)
	dims[n] = last
	return t.wantNamed(s.what, lastWhat, types, dims[:n+1])
}

// rowFormat is how a quantised dispatch writes each received row:
// rowElems elements of codes in outputs->tokens, and sideElems scales of
// one of scaleTypes in outputs->scales (their bytes those of the format
// table's row, RowBytes and SideBytes). In messages, rowWhat and sideWhat
// name their last dimensions, and name the dispatch.
type rowFormat struct {
	codes               dataType
	rowElems, sideElems int
	scaleTypes          []dataType
	rowWhat, sideWhat   string
	name                string
}

// rowFormat is how the group's dispatches write their rows, nil where the
// rows arrive in the token type.
func (gc groupConfig) rowFormat() *rowFormat {
	H := gc.cfg.Hidden
	switch {
	case gc.cfg.Wire.FP8():
		return &rowFormat{codes: dtFloat8e4, rowElems: H, sideElems: ep.ScaleGroups(H), scaleTypes: []dataType{dtFloat32},
			rowWhat: "hidden]", sideWhat: "scale groups of hidden] (one float32 scale per 128 elements)",
			name: "an FP8 dispatch (" + dispQuantName(gc.dispQuant) + ")"}
	case gc.cfg.Wire == ep.WireNVFP4Forward:
		info, _ := gc.cfg.Wire.Info()
		return &rowFormat{codes: dtFloat4x2, rowElems: info.RowBytes(H, 1), sideElems: info.SideBytes(H),
			scaleTypes: []dataType{dtUint8, dtFloat8e4},
			rowWhat:    "hidden / 2] (float4x2: two codes an element)", sideWhat: "hidden / 16] (one e4m3 scale byte per 16 elements)",
			name: "an NVFP4 dispatch (" + dispQuantName(gc.dispQuant) + ")"}
	}
	return nil
}

// dispatchOutputs checks the outputs and the layout info against the
// layout, into o.
func (h *handleImpl[E]) dispatchOutputs(out *C.goepEpDispatchOutputs_t, info *C.goepEpLayoutInfo_t, o *dispatchOut) error {
	if out == nil {
		return invalidArgf("outputs is NULL")
	}
	if err := checkHeader("outputs", "goepEpDispatchOutputs_t", uint32(out.size), uint32(out.magic), C.GOEP_EP_DISPATCH_OUTPUTS_V1_SIZE,
		C.GOEP_EP_MAGIC, "GOEP_EP_DISPATCH_OUTPUTS_INIT"); err != nil {
		return err
	}
	gc := &h.g.gc
	R, L := h.g.g.Size(), h.g.g.LocalExperts()
	H, K := gc.cfg.Hidden, gc.cfg.TopK
	s := h.outShape()
	q := s.quant
	layout := layoutName(h.g.layout)
	var err error
	// outputs->tokens NULL: the rows stay in the group's buffer, read in
	// place through goepEpHandleRecvTokens.
	if o.tokens, err = readTensor("outputs->tokens", out.tokens); err == nil && o.tokens.given() {
		if q != nil {
			err = o.tokens.wantRows(s, q.rowWhat, []dataType{q.codes}, q.rowElems)
		} else {
			err = o.tokens.wantRows(s, "hidden]", []dataType{gc.elem}, H)
		}
	}
	if err != nil {
		return err
	}
	if o.scales, err = readTensor("outputs->scales", out.scales); err == nil && o.scales.given() {
		if q == nil {
			return invalidArgf("outputs->scales must be NULL: this group's dispatches move the rows in %v (options.dispatch_quant NONE), without scales", gc.elem)
		}
		err = o.scales.wantRows(s, q.sideWhat, q.scaleTypes, q.sideElems)
	}
	if err != nil {
		return err
	}
	if q != nil && !o.scales.given() && o.tokens.given() {
		return invalidArgf("outputs->scales is required by %s: %s, %d] %s, the scales of outputs->tokens' codes",
			q.name, s.what, q.sideElems, q.scaleTypes[0])
	}
	if q != nil && !o.tokens.given() {
		return invalidUsagef("outputs->tokens is NULL, and %s's rows (%s codes and their scales) are not read in place: "+
			"pass outputs->tokens and outputs->scales", q.name, q.codes)
	}
	switch {
	case s.ll && !s.rm:
		if out.topk_weights != nil || out.topk_idx != nil {
			return invalidArgf("outputs->topk_weights and outputs->topk_idx must be NULL in the LL EXPERT_MAJOR layout (a row's expert is its block; combine applies the weights)")
		}
	case s.em:
		if out.topk_idx != nil {
			return invalidArgf("outputs->topk_idx must be NULL in the HT EXPERT_MAJOR layout (a row's expert is its zone)")
		}
		if o.weights, err = readTensor("outputs->topk_weights", out.topk_weights); err == nil && o.weights.given() {
			err = o.weights.want("[slots] (one weight per row of the HT EXPERT_MAJOR layout)", []dataType{dtFloat32}, -1)
		}
	default:
		if o.weights, err = readTensor("outputs->topk_weights", out.topk_weights); err == nil && o.weights.given() {
			err = o.weights.wantRows(s, "num_topk]", []dataType{dtFloat32}, K)
		}
		if err != nil {
			return err
		}
		if o.topkIdx, err = readTensor("outputs->topk_idx", out.topk_idx); err == nil && o.topkIdx.given() {
			err = o.topkIdx.wantRows(s, "num_topk]", []dataType{dtInt32, dtInt64}, K)
		}
	}
	if err != nil {
		return err
	}
	needCounters := s.ll && !s.rm
	if info == nil {
		if needCounters {
			return invalidArgf("layout_info is required by an LL EXPERT_MAJOR dispatch: its expert_counters say how many rows of each expert are valid")
		}
		return nil
	}
	if err := checkHeader("layout_info", "goepEpLayoutInfo_t", uint32(info.size), uint32(info.magic), C.GOEP_EP_LAYOUT_INFO_V1_SIZE,
		C.GOEP_EP_MAGIC, "GOEP_EP_LAYOUT_INFO_INIT"); err != nil {
		return err
	}
	kind := C.goepEpExpertIdKind_t(C.GOEP_EP_EXPERT_ID_AUTO)
	if covers(info.size, unsafe.Offsetof(info.recv_topk_idx_kind), unsafe.Sizeof(info.recv_topk_idx_kind)) {
		kind = info.recv_topk_idx_kind
	}
	switch {
	case info.src_rank_counters != nil && !s.rm:
		return invalidArgf("layout_info->src_rank_counters is for the LL RANK_MAJOR layout; this group's is %s: leave it NULL", layout)
	case info.expert_offsets != nil && !s.em:
		return invalidArgf("layout_info->expert_offsets is for the HT EXPERT_MAJOR layout; this group's is %s: leave it NULL", layout)
	}
	switch kind {
	case C.GOEP_EP_EXPERT_ID_AUTO, C.GOEP_EP_EXPERT_ID_LOCAL:
	case C.GOEP_EP_EXPERT_ID_GLOBAL:
		o.global = true
	default:
		return invalidArgf("layout_info->recv_topk_idx_kind = %d: want AUTO (0), LOCAL (1) or GLOBAL (2)", int(kind))
	}
	if o.expertCounts, err = readTensor("layout_info->expert_counters", info.expert_counters); err == nil && o.expertCounts.given() {
		err = o.expertCounts.want("[local_experts]", []dataType{dtInt32, dtInt64}, L)
	}
	if err != nil {
		return err
	}
	if needCounters && !o.expertCounts.given() {
		return invalidArgf("layout_info->expert_counters is required by an LL EXPERT_MAJOR dispatch ([local_experts] int32)")
	}
	if o.srcCounts, err = readTensor("layout_info->src_rank_counters", info.src_rank_counters); err == nil && o.srcCounts.given() {
		err = o.srcCounts.want("[nranks]", []dataType{dtInt32, dtInt64}, R)
	}
	if err != nil {
		return err
	}
	if o.offsets, err = readTensor("layout_info->expert_offsets", info.expert_offsets); err == nil && o.offsets.given() {
		err = o.offsets.want("[local_experts]", []dataType{dtInt32, dtInt64}, L)
	}
	if err != nil {
		return err
	}
	if o.total, err = readTensor("layout_info->recv_total_counter", info.recv_total_counter); err == nil && o.total.given() {
		err = o.total.want("[1]", []dataType{dtInt32, dtInt64}, 1)
	}
	return err
}

// rowCopier copies received rows, by row index of the layout, into a
// dispatch's outputs: the rows (or, in a quantised dispatch, the bytes of
// their codes and scales as they travelled), their top-k weights and ids.
type rowCopier[E ep.Element] struct {
	o      *dispatchOut
	H, K   int
	wPer   int   // weights a row: K, or 1 in HT EXPERT_MAJOR
	base   int32 // added to the local expert ids (GLOBAL)
	rows   []E
	quant  bool
	codes  []byte // a quantised dispatch's rows, rb bytes each, and their scales, sb bytes each
	scales []byte
	rb, sb int
	w      []float32
	ids    []int32
}

func (h *handleImpl[E]) rowCopier(o *dispatchOut, s *outShape) rowCopier[E] {
	gc := &h.g.gc
	c := rowCopier[E]{o: o, H: gc.cfg.Hidden, K: gc.cfg.TopK, wPer: gc.cfg.TopK, quant: s.quant != nil}
	if s.em {
		c.wPer = 1
	}
	if c.quant {
		info, _ := gc.cfg.Wire.Info()
		rows, scales := h.eh.RecvWire()
		c.codes, c.scales = rows.Host(), scales.Host()
		c.rb, c.sb = info.RowBytes(c.H, gc.elem.size()), info.SideBytes(c.H)
	} else {
		c.rows = h.eh.Recv().Host()
	}
	if o.weights.given() {
		c.w = h.eh.RecvWeights().Host()
	}
	if o.topkIdx.given() {
		c.ids = h.eh.RecvTopK().Host()
		if o.global {
			c.base = int32(h.g.g.Rank() * h.g.g.LocalExperts())
		}
	}
	return c
}

// copy copies n rows from row r of the layout.
func (c *rowCopier[E]) copy(r, n int) {
	if n == 0 {
		return
	}
	o, H, K := c.o, c.H, c.K
	if o.tokens.given() {
		if c.quant {
			copy(view[byte](&o.tokens, (r+n)*c.rb)[r*c.rb:], c.codes[r*c.rb:(r+n)*c.rb])
		} else {
			copy(view[E](&o.tokens, (r+n)*H)[r*H:], c.rows[r*H:(r+n)*H])
		}
	}
	if o.scales.given() {
		copy(view[byte](&o.scales, (r+n)*c.sb)[r*c.sb:], c.scales[r*c.sb:(r+n)*c.sb])
	}
	if o.weights.given() {
		copy(view[float32](&o.weights, (r+n)*c.wPer)[r*c.wPer:], c.w[r*c.wPer:(r+n)*c.wPer])
	}
	if o.topkIdx.given() {
		ids := c.ids[r*K : (r+n)*K]
		if o.topkIdx.dtype == dtInt32 {
			dst := view[int32](&o.topkIdx, (r+n)*K)[r*K:]
			for i, e := range ids {
				dst[i] = shift(e, c.base)
			}
		} else {
			dst := view[int64](&o.topkIdx, (r+n)*K)[r*K:]
			for i, e := range ids {
				dst[i] = int64(shift(e, c.base))
			}
		}
	}
}

// writeOutputs copies what the dispatch received into the caller's outputs,
// after checking that they hold it: nothing is written otherwise.
func (h *handleImpl[E]) writeOutputs(o *dispatchOut) error {
	gc := &h.g.gc
	s := h.outShape()
	counts := h.eh.ExpertCounts()
	n := h.eh.NumRecv()
	if s.em {
		counts = h.paddedCounts()
		n = h.eh.ExpertOffsets()[len(counts)]
	}
	if !s.ll {
		for _, t := range []*tensor{&o.tokens, &o.scales, &o.weights, &o.topkIdx} {
			if t.given() {
				if err := t.atLeastReceived(n, ": config.max_recv_tokens_per_rank rows always do"); err != nil {
					return err
				}
			}
		}
	}
	// With o.tokens NULL the rows stay where they are (goepEpHandleRecvTokens),
	// and with no other per-row output there is nothing to copy.
	copies := o.tokens.given() || o.scales.given() || o.weights.given() || o.topkIdx.given()
	var c rowCopier[E]
	if copies {
		c = h.rowCopier(o, s)
	}
	switch {
	case s.rm:
		maxT := gc.cfg.MaxTokensPerRank
		src := h.eh.SourceCounts()
		n = 0
		for r, k := range src {
			if copies {
				c.copy(r*maxT, k)
			}
			n += k
		}
		if o.srcCounts.given() {
			writeInts(&o.srcCounts, src)
		}
	case !copies:
	case s.ll:
		span := h.g.g.Size() * gc.cfg.MaxTokensPerRank
		for l, k := range counts {
			c.copy(l*span, k)
		}
	default:
		c.copy(0, n)
	}
	if o.offsets.given() {
		writeInts(&o.offsets, h.eh.ExpertOffsets()[:len(counts)])
	}
	if o.expertCounts.given() {
		writeInts(&o.expertCounts, counts)
	}
	if o.total.given() {
		writeInts(&o.total, []int{n})
	}
	return nil
}

// paddedCounts are the rows of each zone of an HT EXPERT_MAJOR dispatch,
// padding included, as NCCL EP's expert_counters of that layout count them.
func (h *handleImpl[E]) paddedCounts() []int {
	off := h.eh.ExpertOffsets()
	c := make([]int, len(off)-1)
	for l := range c {
		c[l] = off[l+1] - off[l]
	}
	return c
}

func shift(e, base int32) int32 {
	if e < 0 {
		return -1
	}
	return e + base
}

// writeInts writes v into an int32 or int64 tensor of len(v) elements.
func writeInts(t *tensor, v []int) {
	if t.dtype == dtInt32 {
		dst := view[int32](t, len(v))
		for i, x := range v {
			dst[i] = int32(x)
		}
		return
	}
	dst := view[int64](t, len(v))
	for i, x := range v {
		dst[i] = int64(x)
	}
}

type combineConfig struct {
	sendOnly, backward bool
	recipe             C.goepEpCombQuant_t
}

func readCombineConfig(p *C.goepEpCombineConfig_t) (combineConfig, error) {
	var c combineConfig
	if p == nil {
		return c, nil
	}
	if err := checkHeader("config", "goepEpCombineConfig_t", uint32(p.size), uint32(p.magic), C.GOEP_EP_COMBINE_CONFIG_V1_SIZE,
		C.GOEP_EP_MAGIC, "GOEP_EP_COMBINE_CONFIG_INIT"); err != nil {
		return c, err
	}
	if covers(p.size, unsafe.Offsetof(p.quant_recipe), unsafe.Sizeof(p.quant_recipe)) {
		c.recipe = p.quant_recipe
	}
	switch c.recipe {
	case C.GOEP_EP_COMB_QUANT_NONE, C.GOEP_EP_COMB_QUANT_NVFP4, C.GOEP_EP_COMB_QUANT_FP8, C.GOEP_EP_COMB_QUANT_FP8_UE8M0:
	default:
		return c, invalidArgf("config.quant_recipe = %#x: want GOEP_EP_COMB_QUANT_NONE (0), NVFP4 (1), FP8 (0x100) or FP8_UE8M0 (0x101)", int(c.recipe))
	}
	switch {
	case p.pass_direction != C.GOEP_EP_FWD_PASS && p.pass_direction != C.GOEP_EP_BWD_PASS:
		return c, invalidArgf("config.pass_direction = %d: want GOEP_EP_FWD_PASS (0) or GOEP_EP_BWD_PASS (1)", int(p.pass_direction))
	}
	c.sendOnly = p.send_only != 0
	c.backward = p.pass_direction == C.GOEP_EP_BWD_PASS
	return c, nil
}

func (h *handleImpl[E]) combine(in *C.goepEpCombineInputs_t, out *C.goepEpCombineOutputs_t, cfgp *C.goepEpCombineConfig_t) error {
	if err := h.lock(); err != nil {
		return err
	}
	defer h.unlock()
	if h.destroyed {
		return h.refuseCombine(h.errDestroyed())
	}
	if err := h.idle("combine"); err != nil {
		return h.refuseCombine(err)
	}
	if !h.dispatched {
		// Its dispatch failed on every rank (a refusal is collective), or
		// never ran: no rank combines it.
		return invalidUsagef("the handle has not been dispatched: goepEpDispatch (and goepEpComplete after a send-only one) comes first")
	}
	cfg, err := readCombineConfig(cfgp)
	if err == nil && cfg.recipe != C.GOEP_EP_COMB_QUANT_NONE && cfg.recipe != h.g.gc.combQuant {
		err = invalidUsagef("config.quant_recipe = %#x (%s), but the group's combine format is %#x (%s, goepEpGroupOptions_t.combine_quant): "+
			"goep fixes it per group; pass GOEP_EP_COMB_QUANT_NONE or the group's", int(cfg.recipe), combQuantName(cfg.recipe),
			int(h.g.gc.combQuant), combQuantName(h.g.gc.combQuant))
	}
	var y, outTok ep.Tensor[E]
	var opts ep.CombineOptions
	if err == nil {
		y, outTok, opts, err = h.combineArgs(in, out, cfg)
	}
	if err != nil {
		return h.refuseCombine(err) // the others' same call fails at once, naming this rank and err
	}
	req, err := h.g.g.CombineSend(h.eh, y, outTok, &opts)
	if err != nil {
		return err
	}
	if cfg.sendOnly {
		sent := req // on the heap in this branch alone
		h.sentCombine = &sent
		return nil
	}
	return req.Wait()
}

// combineArgs checks a combine's tensors and makes ep's arguments of them.
func (h *handleImpl[E]) combineArgs(in *C.goepEpCombineInputs_t, out *C.goepEpCombineOutputs_t, cfg combineConfig) (y, outTok ep.Tensor[E],
	opts ep.CombineOptions, err error) {
	if in == nil {
		return y, outTok, opts, invalidArgf("inputs is NULL")
	}
	if out == nil {
		return y, outTok, opts, invalidArgf("outputs is NULL")
	}
	if err := checkHeader("inputs", "goepEpCombineInputs_t", uint32(in.size), uint32(in.magic), C.GOEP_EP_COMBINE_INPUTS_V1_SIZE,
		C.GOEP_EP_MAGIC, "GOEP_EP_COMBINE_INPUTS_INIT"); err != nil {
		return y, outTok, opts, err
	}
	var scalesDesc *C.goepEpTensor_t
	if covers(in.size, unsafe.Offsetof(in.scales), unsafe.Sizeof(in.scales)) {
		scalesDesc = in.scales
	}
	scales, err := readTensor("inputs->scales", scalesDesc)
	if err != nil {
		return y, outTok, opts, err
	}
	if scales.given() && h.g.gc.cfg.CombineWire != ep.WireNVFP4 {
		return y, outTok, opts, invalidUsagef("inputs->scales must be NULL: it carries the row scales of an NVFP4 combine "+
			"(options.combine_quant = GOEP_EP_COMB_QUANT_NVFP4), and this group's combine is %s", combQuantName(h.g.gc.combQuant))
	}
	if err := checkHeader("outputs", "goepEpCombineOutputs_t", uint32(out.size), uint32(out.magic), C.GOEP_EP_COMBINE_OUTPUTS_V1_SIZE,
		C.GOEP_EP_MAGIC, "GOEP_EP_COMBINE_OUTPUTS_INIT"); err != nil {
		return y, outTok, opts, err
	}
	gc := &h.g.gc
	H, K := gc.cfg.Hidden, gc.cfg.TopK
	s := h.outShape()
	ll := s.ll
	n := h.eh.NumRecv()
	if s.em {
		n = h.eh.ExpertOffsets()[h.g.g.LocalExperts()]
	}
	tok, err := need("inputs->tokens", in.tokens)
	if err != nil {
		return y, outTok, opts, err
	}
	rows := n
	if ll {
		rows = s.rowDims[0] * s.rowDims[1]
		err = tok.wantRows(s, "hidden] (the dispatch's outputs->tokens, in the token type)", []dataType{gc.elem}, H)
		if err == nil && scales.given() {
			err = h.checkGlobalScales(&scales, &tok, s)
		}
	} else if err = tok.want("[slots, hidden] (the dispatch's outputs->tokens, in the token type)", []dataType{gc.elem}, -1, H); err == nil {
		err = tok.atLeastReceived(n, " in the dispatch")
	}
	if err != nil {
		return y, outTok, opts, err
	}
	o, err := need("outputs->tokens", out.tokens)
	if err == nil {
		err = o.want("[num_tokens of the handle, hidden]", []dataType{gc.elem}, h.T, H)
	}
	if err != nil {
		return y, outTok, opts, err
	}
	inW, err := readTensor("inputs->topk_weights", in.topk_weights)
	if err != nil {
		return y, outTok, opts, err
	}
	outW, err := readTensor("outputs->topk_weights", out.topk_weights)
	if err == nil && outW.given() {
		err = outW.want("[num_tokens, num_topk]", []dataType{dtFloat32}, h.T, h.kh)
	}
	if err != nil {
		return y, outTok, opts, err
	}
	switch {
	case s.rm:
		if inW.given() || outW.given() {
			return y, outTok, opts, invalidArgf("inputs->topk_weights and outputs->topk_weights must be NULL in the LL RANK_MAJOR layout: " +
				"the expert side applies the weights (outputs->topk_weights of the dispatch), and combine sums the ranks' rows")
		}
	case ll:
		if inW.given() {
			return y, outTok, opts, invalidArgf("inputs->topk_weights is for HT combines; an LL combine takes the weights it applies in outputs->topk_weights")
		}
		if outW.given() {
			opts.WeightsOverride = h.widen(view[float32](&outW, h.T*h.kh), K)
		} else if !h.hasWeights {
			return y, outTok, opts, invalidArgf("an LL combine applies the gate weights: give them in outputs->topk_weights ([num_tokens, num_topk] float32), or in the dispatch's inputs->topk_weights")
		}
	default:
		perRow := K
		if inW.given() && s.em {
			perRow = 1
			err = inW.want("[slots] (one value per row of the HT EXPERT_MAJOR layout)", []dataType{dtFloat32}, -1)
		} else if inW.given() {
			err = inW.want("[slots, num_topk]", []dataType{dtFloat32}, -1, K)
		}
		if err != nil {
			return y, outTok, opts, err
		}
		if inW.given() {
			if err := inW.atLeastReceived(n, " in the dispatch"); err != nil {
				return y, outTok, opts, err
			}
		}
		switch {
		case !inW.given() != !outW.given():
			return y, outTok, opts, invalidArgf("give inputs->topk_weights and outputs->topk_weights together (values per received row and slot, summed back to each token's slots), or neither")
		case cfg.backward && !inW.given():
			return y, outTok, opts, invalidArgf("a backward (GOEP_EP_BWD_PASS) HT combine needs inputs->topk_weights and outputs->topk_weights")
		case inW.given():
			opts.RowValues = ep.Host(view[float32](&inW, n*perRow))
			opts.SlotValues = ep.Host(view[float32](&outW, h.T*K))
		}
	}
	return ep.Host(view[E](&tok, rows*H)), ep.Host(view[E](&o, h.T*H)), opts, nil
}

// checkGlobalScales checks NCCL EP's global scales of an NVFP4 combine
// (inputs->scales, one float32 a row of the LL EXPERT_MAJOR layout) against
// the expert outputs tok: each valid row's scale must be its row's
// (globalScaleOK). goep's combine computes that scale itself, as amax/2688,
// so a caller whose scale differs would get results it did not ask for: it
// is refused instead, naming the row.
func (h *handleImpl[E]) checkGlobalScales(sc, tok *tensor, s *outShape) error {
	if err := sc.wantRows(s, "1] (NCCL EP's global scales: one float32 a row of inputs->tokens)", []dataType{dtFloat32}, 1); err != nil {
		return err
	}
	H, span := h.g.gc.cfg.Hidden, s.rowDims[1]
	rows := view[E](tok, s.rowDims[0]*span*H)
	scales := view[float32](sc, s.rowDims[0]*span)
	for l, n := range h.eh.ExpertCounts() {
		for j := range n {
			r := l*span + j
			amax := rowAmax(rows[r*H : (r+1)*H])
			if want, ok := globalScaleOK(scales[r], amax); !ok {
				if amax != amax {
					return invalidArgf("inputs->scales[%d][%d][0] = %v: row [%d][%d] of inputs->tokens has a NaN value, and an NVFP4 row scale "+
						"is not defined for it", l, j, scales[r], l, j)
				}
				return invalidArgf("inputs->scales[%d][%d][0] = %v (float32 bits %#08x), but row [%d][%d] of inputs->tokens has amax %v: "+
					"want 2688/amax = %v (bits %#08x) or a float32 next to it (0 where amax is 0); goep's NVFP4 combine uses each row's own "+
					"scale, so it refuses another (or pass NULL)", l, j, scales[r], math.Float32bits(scales[r]), l, j, amax, want,
					math.Float32bits(want))
			}
		}
	}
	return nil
}

// rowAmax is the largest |value| of a row, in float32; NaN where the row
// has a NaN.
func rowAmax[E ep.Element](row []E) float32 {
	var amax float32
	for _, v := range row {
		amax = max(amax, float32(math.Abs(float64(ep.Float32Of(v)))))
	}
	return amax
}

// globalScaleOK reports whether s is NCCL EP's global scale of an NVFP4
// combine for a row whose largest |value| is amax, and the scale it wants:
// 2688/amax as a float32 division gives it (0 where amax is 0, and where it
// is infinite), or a float32 next to that one: another division, or a
// reciprocal, is a unit in the last place away. No scale is a NaN row's.
func globalScaleOK(s, amax float32) (want float32, ok bool) {
	switch {
	case amax != amax:
		return amax, false
	case amax == 0:
		return 0, s == 0
	}
	want = 2688 / amax
	if want == 0 || !(s > 0) {
		return want, s == want
	}
	d := int64(math.Float32bits(s)) - int64(math.Float32bits(want))
	return want, d >= -1 && d <= 1
}

func (h *handleImpl[E]) complete(cfg *C.goepEpCompleteConfig_t) error {
	if err := h.lock(); err != nil {
		return err
	}
	defer h.unlock()
	if h.destroyed {
		return h.errDestroyed()
	}
	if cfg != nil {
		if err := checkHeader("config", "goepEpCompleteConfig_t", uint32(cfg.size), uint32(cfg.magic), C.GOEP_EP_COMPLETE_CONFIG_V1_SIZE,
			C.GOEP_EP_MAGIC, "GOEP_EP_COMPLETE_CONFIG_INIT"); err != nil {
			return err
		}
	}
	if s := h.sentDispatch; s != nil {
		h.sentDispatch = nil
		return h.finishDispatch(s.req, &s.out, s.number)
	}
	if req := h.sentCombine; req != nil {
		h.sentCombine = nil
		return req.Wait()
	}
	return nil
}

// recvTokens describes, in v, the rows the handle's latest dispatch received,
// where they are: in the group's buffer (goepEpHandleRecvTokens).
func (h *handleImpl[E]) recvTokens(v *C.goepEpTensor_t) error {
	if err := h.lock(); err != nil {
		return err
	}
	defer h.unlock()
	if v == nil {
		return invalidArgf("tokens is NULL")
	}
	if err := checkHeader("tokens", "goepEpTensor_t", uint32(v.size), uint32(v.magic), C.GOEP_EP_TENSOR_V1_SIZE,
		C.GOEP_EP_TENSOR_MAGIC, "GOEP_EP_TENSOR_INIT"); err != nil {
		return err
	}
	if v.sizes == nil {
		return invalidArgf("tokens->sizes is NULL: point it at 3 size_t of yours, which the call fills")
	}
	if h.destroyed {
		return h.errDestroyed()
	}
	if !slices.Contains(cpuEngines, h.g.gc.backend) {
		return invalidUsagef("goepEpHandleRecvTokens: the rows of backend %q are not in memory C may be given (only the CPU engine's, %v): "+
			"pass outputs->tokens to goepEpDispatch instead", h.g.gc.backend, cpuEngines)
	}
	if err := h.idle("goepEpHandleRecvTokens"); err != nil {
		return err
	}
	if q := h.outShape().quant; q != nil {
		return invalidUsagef("goepEpHandleRecvTokens: this group's dispatches are %s, whose rows arrive as %s codes with their scales: "+
			"pass outputs->tokens and outputs->scales to goepEpDispatch instead", dispQuantName(h.g.gc.dispQuant), q.codes)
	}
	if !h.dispatched {
		return invalidUsagef("the handle has not been dispatched")
	}
	gc := &h.g.gc
	ll := gc.cfg.Mode == ep.LowLatency
	// LL rows stay until the second dispatch after theirs, HT rows until the next.
	if later := h.g.dispatches - h.number; (ll && later > 1) || (!ll && later > 0) {
		return invalidUsagef("the handle's rows are gone: %d later dispatches of the group reused the buffer they were in", later)
	}
	rows := h.eh.Recv().Host()
	if rows == nil {
		return invalidUsagef("the handle's rows are gone: its record has been reused by later dispatches")
	}
	H := gc.cfg.Hidden
	var dims [maxDims]int
	nd := 1
	dims[0] = len(rows) / H
	if ll {
		nd = copy(dims[:], h.outShape().rowDims)
	}
	dims[nd] = H
	nd++
	sizes := unsafe.Slice(v.sizes, nd)
	for i, d := range dims[:nd] {
		sizes[i] = C.size_t(d)
	}
	v.ndim = C.uint(nd)
	v.datatype = C.goepEpDataType_t(gc.elem)
	v.data = nil
	if len(rows) > 0 {
		// The CPU engine's receive buffer is MPI shared memory, not Go memory:
		// C may keep its address.
		v.data = unsafe.Pointer(unsafe.SliceData(rows))
	}
	return nil
}

// destroy ends the handle, giving back what it holds: a send-only call
// not completed is completed (its outputs not written: the caller is done
// with them), and an LL dispatch not combined is released (ep.Release, in
// the place of its combine). The handle is destroyed even when one of
// those fails; the first failure is returned.
func (h *handleImpl[E]) destroy() error {
	if err := h.lock(); err != nil {
		h.destroyed = true
		return err
	}
	defer h.unlock()
	var sent, combined, released error
	if s := h.sentDispatch; s != nil {
		h.sentDispatch = nil
		var eh ep.Handle[E]
		if eh, sent = s.req.Wait(); sent == nil {
			h.eh, h.dispatched, h.number = eh, true, s.number
		}
	}
	if req := h.sentCombine; req != nil {
		h.sentCombine = nil
		combined = req.Wait()
	}
	if h.dispatched {
		released = h.g.g.Release(h.eh)
	}
	h.destroyed, h.topk, h.mem = true, nil, nil
	return errors.Join(sent, combined, released)
}
