//go:build mpi

package main

/*
#include "capi_internal.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"
	"unsafe"

	"github.com/goep/goep/ep"
	"github.com/goep/goep/ep/driver"
	"github.com/goep/goep/mpi"
)

// groupConfig is a checked goepEpGroupConfig_t with its goepEpGroupOptions_t:
// the ep.Config, the token element type, the combine's recipe and the
// backend's name.
type groupConfig struct {
	cfg       ep.Config
	elem      dataType
	combQuant C.goepEpCombQuant_t
	// dispQuant and roundScales are options.dispatch_quant and
	// dispatch_round_scales: the recipe of every dispatch of the group
	// (cfg.Wire), which a dispatch's config may name again.
	dispQuant   C.goepEpDispQuant_t
	roundScales bool
	backend     string
	be          ep.Backend // the backend named backend, for the features it declares
}

// need refuses what setting asks of the group's backend where the backend
// does not declare feature f.
func (gc *groupConfig) need(f ep.Feature, setting string) error {
	if ep.Supports(gc.be, f) {
		return nil
	}
	return invalidUsagef("%s needs %v, which backend %q does not declare (goepEpBackendSupports)", setting, f, gc.backend)
}

// readGroupConfig checks p and o (NULL: the default options) and maps them
// onto an ep.Config. It checks what this layer adds (the structs, the
// version, the fields a CPU ignores or refuses, the element type, hidden
// from max_token_bytes, the backend); ep checks the rest.
func readGroupConfig(p *C.goepEpGroupConfig_t, o *C.goepEpGroupOptions_t) (groupConfig, error) {
	var gc groupConfig
	if p == nil {
		return gc, invalidArgf("config is NULL")
	}
	if err := checkHeader("config", "goepEpGroupConfig_t", uint32(p.size), uint32(p.magic), C.GOEP_EP_GROUP_CONFIG_V1_SIZE,
		C.GOEP_EP_MAGIC, "GOEP_EP_GROUP_CONFIG_INIT"); err != nil {
		return gc, err
	}
	switch v := int(p.version); {
	case v == 0:
		return gc, invalidArgf("config.version = 0: set it to GOEP_EP_API_VERSION (%d), as GOEP_EP_GROUP_CONFIG_INIT does", C.GOEP_EP_API_VERSION)
	case v > C.GOEP_EP_API_VERSION:
		return gc, invalidArgf("config.version = %d: the program was built for a newer API than this library's version %d", v, C.GOEP_EP_API_VERSION)
	}
	switch p.algorithm {
	case C.GOEP_EP_ALGO_LOW_LATENCY:
		gc.cfg.Mode = ep.LowLatency
	case C.GOEP_EP_ALGO_HIGH_THROUGHPUT:
		gc.cfg.Mode = ep.HighThroughput
	default:
		return gc, invalidArgf("config.algorithm = %d: want GOEP_EP_ALGO_LOW_LATENCY (0) or GOEP_EP_ALGO_HIGH_THROUGHPUT (1)", int(p.algorithm))
	}
	if err := readGroupOptions(o, &gc); err != nil {
		return gc, err
	}
	es := gc.elem.size()
	if p.max_token_bytes == 0 || int(p.max_token_bytes)%es != 0 {
		return gc, invalidArgf("config.max_token_bytes = %d: want hidden * %d (a %v row's bytes), > 0", uint(p.max_token_bytes), es, gc.elem)
	}
	// rdma_buffer_size, num_qp_per_rank, num_channels and max_num_sms tune a
	// GPU's transport: accepted, and nothing here reads them.
	if (p.alloc.alloc_fn == nil) != (p.alloc.free_fn == nil) {
		return gc, invalidArgf("config.alloc: alloc_fn and free_fn go together (both set, or neither)")
	}
	if covers(p.size, unsafe.Offsetof(p.zero_copy), unsafe.Sizeof(p.zero_copy)) {
		switch p.zero_copy {
		case C.GOEP_EP_ZERO_COPY_AUTO, C.GOEP_EP_ZERO_COPY_OFF:
		case C.GOEP_EP_ZERO_COPY_ON:
			return gc, invalidUsagef("config.zero_copy = GOEP_EP_ZERO_COPY_ON: it needs window-backed tensors, and goep's are host memory " +
				"(goep's way without copies: outputs->tokens NULL and goepEpHandleRecvTokens)")
		default:
			return gc, invalidArgf("config.zero_copy = %d: want GOEP_EP_ZERO_COPY_AUTO (0), OFF (1) or ON (2)", int(p.zero_copy))
		}
	}
	if covers(p.size, unsafe.Offsetof(p.overflow_policy), unsafe.Sizeof(p.overflow_policy)) {
		switch p.overflow_policy {
		case C.GOEP_EP_OVERFLOW_AUTO, C.GOEP_EP_OVERFLOW_TRAP:
			gc.cfg.Overflow = ep.OverflowFail
		case C.GOEP_EP_OVERFLOW_DROP:
			gc.cfg.Overflow = ep.OverflowDrop
			if err := gc.need(ep.FeatureOverflowDrop, "config.overflow_policy = GOEP_EP_OVERFLOW_DROP"); err != nil {
				return gc, err
			}
		default:
			return gc, invalidArgf("config.overflow_policy = %d: want GOEP_EP_OVERFLOW_AUTO (0), TRAP (1) or DROP (2)", int(p.overflow_policy))
		}
	}
	topk := 0
	if covers(p.size, unsafe.Offsetof(p.num_topk), unsafe.Sizeof(p.num_topk)) {
		topk = int(p.num_topk)
	}
	if topk < 0 || topk > driver.MaxTopK {
		return gc, invalidArgf("config.num_topk = %d: want 0 (each handle's) or 1..%d", topk, driver.MaxTopK)
	}
	gc.cfg.NumExperts = int(p.num_experts)
	gc.cfg.MaxTokensPerRank = int(p.max_dispatch_tokens_per_rank)
	if gc.cfg.Mode == ep.HighThroughput {
		gc.cfg.MaxRecvTokensPerRank = int(p.max_recv_tokens_per_rank)
	}
	gc.cfg.Hidden = int(p.max_token_bytes) / es
	gc.cfg.TopK = topk
	gc.cfg.MaskStalledRanks = p.enable_mask != 0
	if gc.cfg.MaskStalledRanks {
		if err := gc.need(ep.FeatureMaskStalledRanks, "config.enable_mask = 1"); err != nil {
			return gc, err
		}
	}
	if uint64(p.timeout_ns) > 1<<62 {
		return gc, invalidArgf("config.timeout_ns = %d: too large", uint64(p.timeout_ns))
	}
	gc.cfg.Timeout = time.Duration(p.timeout_ns)
	if gc.cfg.Timeout == 0 {
		gc.cfg.Timeout = ep.DefaultTimeout
	}
	return gc, nil
}

// cpuEngines are the backends whose receive buffers are MPI shared memory
// (the CPU engine's), which C may be given the address of
// (goepEpHandleRecvTokens); another backend's may be Go memory.
var cpuEngines = []string{"cpu", "cpu-onesided"}

// readGroupOptions checks o (nil: every option its default) into gc: the
// element type, the backend, and the wire formats of the dispatch and the
// combine, each refused by name where the backend does not declare it.
func readGroupOptions(o *C.goepEpGroupOptions_t, gc *groupConfig) error {
	gc.elem, gc.backend = dtBfloat16, ep.DefaultBackend
	be, err := ep.OpenBackend(ep.DefaultBackend)
	if err != nil {
		return err
	}
	gc.be = be
	if o == nil {
		return nil
	}
	if err := checkHeader("options", "goepEpGroupOptions_t", uint32(o.size), uint32(o.magic), C.GOEP_EP_GROUP_OPTIONS_V1_SIZE,
		C.GOEP_EP_MAGIC, "GOEP_EP_GROUP_OPTIONS_INIT"); err != nil {
		return err
	}
	if o.token_datatype != 0 {
		gc.elem = dataType(o.token_datatype)
	}
	if gc.elem != dtBfloat16 && gc.elem != dtFloat32 {
		return invalidArgf("options.token_datatype = %v (%d): want goepEpBfloat16 (%d) or goepEpFloat32 (%d), the token element types",
			gc.elem, int(o.token_datatype), int(dtBfloat16), int(dtFloat32))
	}
	if o.backend != nil && C.GoString(o.backend) != "" {
		name := C.GoString(o.backend)
		b, err := ep.OpenBackend(name)
		if err != nil {
			return invalidArgf("options.backend = %q: %v", name, err)
		}
		// The C interface's contract: a refused call fails on every rank, and
		// ranks whose calls no longer match fail naming the call.
		for _, f := range []ep.Feature{ep.FeatureRefusals, ep.FeatureCallSequence} {
			if !ep.Supports(b, f) {
				return invalidUsagef("options.backend = %q: goep's C interface needs a backend with %v, which %s does not declare", name, f, b.Name())
			}
		}
		gc.cfg.Backend, gc.backend, gc.be = b, b.Name(), b
	}
	if err := readCombineQuant(o, gc); err != nil {
		return err
	}
	return readDispatchQuant(o, gc)
}

// readCombineQuant reads options.combine_quant into gc.cfg.CombineWire.
func readCombineQuant(o *C.goepEpGroupOptions_t, gc *groupConfig) error {
	gc.combQuant = o.combine_quant
	switch o.combine_quant {
	case C.GOEP_EP_COMB_QUANT_NONE:
	case C.GOEP_EP_COMB_QUANT_NVFP4:
		gc.cfg.CombineWire = ep.WireNVFP4
	case C.GOEP_EP_COMB_QUANT_FP8:
		gc.cfg.CombineWire = ep.WireFP8
	case C.GOEP_EP_COMB_QUANT_FP8_UE8M0:
		gc.cfg.CombineWire = ep.WireFP8UE8M0
	default:
		return invalidArgf("options.combine_quant = %#x: want GOEP_EP_COMB_QUANT_NONE (0), NVFP4 (1), FP8 (0x100) or FP8_UE8M0 (0x101)",
			int(o.combine_quant))
	}
	// The feature a combine format asks of the backend in this mode is its
	// row of the format table; a format the table does not allow in the mode
	// is refused by the config's own check (ep.Config.Validate), naming it.
	if info, _ := gc.cfg.CombineWire.Info(); info.Combine[gc.cfg.Mode] != 0 {
		return gc.need(info.Combine[gc.cfg.Mode], "options.combine_quant = "+combQuantName(o.combine_quant))
	}
	return nil
}

// readDispatchQuant reads options.dispatch_quant and dispatch_round_scales
// (version 2) into gc.cfg.Wire.
func readDispatchQuant(o *C.goepEpGroupOptions_t, gc *groupConfig) error {
	if !covers(o.size, unsafe.Offsetof(o.dispatch_round_scales), unsafe.Sizeof(o.dispatch_round_scales)) {
		return nil
	}
	gc.dispQuant, gc.roundScales = o.dispatch_quant, o.dispatch_round_scales != 0
	if o.dispatch_round_scales > 1 {
		return invalidArgf("options.dispatch_round_scales = %d: want 0 or 1", uint(o.dispatch_round_scales))
	}
	switch o.dispatch_quant {
	case C.GOEP_EP_DISP_QUANT_NONE:
		if gc.roundScales {
			return invalidArgf("options.dispatch_round_scales = 1 rounds the scales of a quantised dispatch, and options.dispatch_quant is GOEP_EP_DISP_QUANT_NONE")
		}
		return nil
	case C.GOEP_EP_DISP_QUANT_DS_FP8E3M4:
		gc.cfg.Wire = ep.WireFP8
		if gc.roundScales {
			gc.cfg.Wire = ep.WireFP8UE8M0
		}
	case C.GOEP_EP_DISP_QUANT_FWD, C.GOEP_EP_DISP_QUANT_FWD_NVFP4:
		if gc.roundScales {
			return invalidArgf("options.dispatch_round_scales = 1 with %s: forwarded scales travel as they are (want 0)", dispQuantName(o.dispatch_quant))
		}
		gc.cfg.Wire = ep.WireFP8Forward
		if o.dispatch_quant == C.GOEP_EP_DISP_QUANT_FWD_NVFP4 {
			gc.cfg.Wire = ep.WireNVFP4Forward
		}
	default:
		return invalidArgf("options.dispatch_quant = %d: want GOEP_EP_DISP_QUANT_NONE (0), FWD (1), DS_FP8E3M4 (2) or FWD_NVFP4 (0x100)",
			int(o.dispatch_quant))
	}
	// What the format asks of the backend is its row of the format table.
	info, _ := gc.cfg.Wire.Info()
	return gc.need(info.DispatchFeature, "options.dispatch_quant = "+dispQuantName(o.dispatch_quant))
}

// newGroup creates the group over a duplicate of comm (collective).
func newGroup(comm C.MPI_Comm, p *C.goepEpGroupConfig_t, o *C.goepEpGroupOptions_t) (group, error) {
	gc, err := readGroupConfig(p, o)
	if err != nil {
		return nil, err
	}
	c, err := mpi.Adopt(uintptr(C.goep_ep_comm_handle(comm)), "goepEp", gc.cfg.Timeout)
	if err != nil {
		return nil, err
	}
	// The config is checked now, locally, as far as it can be without the
	// top-k (which the first handle may give); NewGroup checks it all, and
	// compares it across ranks, when the first handle opens the group.
	v := gc.cfg
	v.TopK = max(v.TopK, 1)
	if err := v.Validate(c.Size()); err != nil {
		return nil, errors.Join(withCode(C.goepEpInvalidArgument, err), c.Free())
	}
	if gc.elem == dtBfloat16 {
		return newGroupImpl[ep.BF16](c, gc), nil
	}
	return newGroupImpl[float32](c, gc), nil
}

// groupError gives NewGroup's errors about the config (checked, and
// compared across ranks) goepEpInvalidArgument.
func groupError(err error) error {
	var me *mpi.Error
	if errors.Is(err, ep.ErrTimeout) || errors.Is(err, mpi.ErrTimeout) || errors.Is(err, ep.ErrUnsupported) || errors.As(err, &me) {
		return err
	}
	return withCode(C.goepEpInvalidArgument, err)
}

// groupImpl is a group of element type E: an ep.Group and what the C
// interface keeps beside it.
type groupImpl[E ep.Element] struct {
	mu sync.Mutex // calls on a group are serialised
	// g is opened, collectively, by the group's first handle (open), with
	// that handle's top-k unless config.num_topk fixes it; nil until then.
	g    *ep.Group[E]
	comm *mpi.Comm // the duplicate of the caller's communicator
	// gc.cfg.TopK is config.num_topk (0: each handle's) until g opens, then
	// g's.
	gc groupConfig
	// layout is the C layout of the group's first handle, which opened g
	// with it (gc.cfg.Layout); every later handle's must be the same.
	layout C.goepEpLayout_t
	// shape is how g's dispatches lay out their outputs, made when g opens.
	shape  outShape
	nranks int
	fixedK int // config.num_topk: an upper bound on every handle's top-k; 0: the first handle's
	// marks counts handle numbers taken before g opened, given to g.Mark
	// when it does; every numbered call opens g first, so it stays 0 unless
	// a call is added that numbers without opening.
	marks     int
	destroyed bool
	ones      []float32 // LL weights of a dispatch given none: MaxTokensPerRank*TopK ones
	// the async error flag: a call masked a rank not masked before
	asyncErr bool
	known    []bool // the mask as this layer last saw it
	// dispatches counts the group's completed dispatches, which reuse
	// the receive buffers (goepEpHandleRecvTokens)
	dispatches uint64
	benchOut   []E
	benchRecv  []E
	// refused is the reason of this rank's last goepEpCreateHandle, if
	// it was refused and the dispatch its handle stood for has not been
	// refused yet on every rank (deliver).
	refused string
}

func newGroupImpl[E ep.Element](c *mpi.Comm, gc groupConfig) *groupImpl[E] {
	return &groupImpl[E]{comm: c, gc: gc, nranks: c.Size(), fixedK: gc.cfg.TopK, known: make([]bool, c.Size())}
}

// open opens the ep.Group at the group's first handle, collectively: with
// config.num_topk when it was set, else with K, the handle's top-k (0 when
// this rank's handle has none to give, so that the other ranks' NewGroup
// fails naming this rank), and with the handle's layout and zone alignment,
// which hold for the group's buffers from then on. Every rank's first
// handle must agree: NewGroup compares the configs and fails on every rank,
// naming the ranks that differ. The numbers taken before are then given to
// the group. The caller holds gi.mu.
func (gi *groupImpl[E]) open(K int, layout C.goepEpLayout_t, align int, call string) error {
	if gi.g != nil {
		return nil
	}
	cfg := gi.gc.cfg
	if cfg.TopK == 0 {
		cfg.TopK = K
	}
	cfg.Layout = epLayout(cfg.Mode, layout)
	if cfg.Layout == ep.LayoutExpertMajor && cfg.Mode == ep.HighThroughput {
		cfg.ExpertAlignment = align
	}
	g, err := ep.NewGroup[E](gi.comm, cfg)
	if err != nil {
		return groupError(fmt.Errorf("%s opens the group (num_topk %d, layout %s) as every rank's first handle: %w",
			call, cfg.TopK, layoutName(layout), err))
	}
	gi.g, gi.gc.cfg, gi.layout = g, cfg, layout
	gi.shape = newOutShape(gi.gc, g)
	gi.ones = make([]float32, cfg.MaxTokensPerRank*cfg.TopK)
	for i := range gi.ones {
		gi.ones[i] = 1
	}
	for ; gi.marks > 0; gi.marks-- {
		g.Mark()
	}
	return nil
}

// notOpen refuses op on a group no handle has opened yet.
func (gi *groupImpl[E]) notOpen(op string) error {
	if gi.g == nil {
		return invalidUsagef("%s: the group's buffers are allocated by its first goepEpInitHandle or goepEpCreateHandle (collective), "+
			"and no handle has been made yet", op)
	}
	return nil
}

// lock takes the group for a call, refusing a destroyed one.
func (gi *groupImpl[E]) lock() error {
	gi.mu.Lock()
	if gi.destroyed {
		gi.mu.Unlock()
		return invalidArgf("the group has been destroyed")
	}
	return nil
}

func (gi *groupImpl[E]) size() int { return gi.nranks }

// defaultLayout is the C layout of the mode's own ep layout.
func (gi *groupImpl[E]) defaultLayout() C.goepEpLayout_t {
	if gi.gc.cfg.Mode == ep.LowLatency {
		return C.GOEP_EP_LAYOUT_EXPERT_MAJOR
	}
	return C.GOEP_EP_LAYOUT_FLAT
}

// deliver takes part, as a refusal, in the dispatch that the handle of a
// refused goepEpCreateHandle stood for: the other ranks made it at once,
// and their calls fail naming this rank and why (the group stays usable,
// and the ranks' calls matched). The caller holds gi.mu.
func (gi *groupImpl[E]) deliver() error {
	if gi.refused == "" {
		return nil
	}
	reason := gi.refused
	gi.refused = ""
	gi.dispatches++
	err := gi.g.RefuseDispatch(ep.Handle[E]{}, reason)
	if errors.Is(err, ep.ErrBadInput) {
		return nil // the refusal, as meant: this rank reported it at goepEpCreateHandle
	}
	return err
}

// refuseCreate is a goepEpCreateHandle refused on this rank, here or by the
// layer above (goepEpRefuse): the handle's number is taken, and the dispatch
// it stood for is refused on every rank (deliver). The caller holds gi.mu.
func (gi *groupImpl[E]) refuseCreate(err error) error {
	gi.refused = "goepEpCreateHandle refused this rank's handle for the dispatch: " + err.Error()
	return err
}

func (gi *groupImpl[E]) destroy() error {
	if err := gi.lock(); err != nil {
		return err
	}
	defer gi.mu.Unlock()
	if gi.g != nil {
		_ = gi.deliver() // best effort: the group goes anyway, and Close says what failed
		if err := gi.g.Close(); err != nil {
			return err // a rank did not come: nothing freed, and Close may be called again
		}
	}
	gi.destroyed = true
	return gi.comm.Free()
}

func (gi *groupImpl[E]) bufferBytes() (int, error) {
	if err := gi.lock(); err != nil {
		return 0, err
	}
	defer gi.mu.Unlock()
	if err := gi.notOpen("goepEpGroupBufferBytes (goepEpBufferPlan gives the sizes ahead)"); err != nil {
		return 0, err
	}
	return gi.g.BufferBytes(), nil
}

// epLayout is ep's layout of a C layout in mode, LayoutDefault for one
// that is not the mode's (layoutFor refuses it).
func epLayout(mode ep.Mode, layout C.goepEpLayout_t) ep.RecvLayout {
	switch {
	case mode == ep.LowLatency && layout == C.GOEP_EP_LAYOUT_RANK_MAJOR:
		return ep.LayoutRankMajor
	case mode == ep.HighThroughput && layout == C.GOEP_EP_LAYOUT_EXPERT_MAJOR:
		return ep.LayoutExpertMajor
	}
	return ep.LayoutDefault
}

// layoutFor checks that layout is one of the group's mode that its backend
// implements, and, once a handle has opened the group, the group's.
func (gi *groupImpl[E]) layoutFor(layout C.goepEpLayout_t) error {
	mode := gi.gc.cfg.Mode
	ll := mode == ep.LowLatency
	switch {
	case layout == C.GOEP_EP_LAYOUT_UNSET:
		return invalidArgf("layout is GOEP_EP_LAYOUT_UNSET: choose GOEP_EP_LAYOUT_EXPERT_MAJOR or RANK_MAJOR (LL), FLAT or EXPERT_MAJOR (HT)")
	case layout == C.GOEP_EP_LAYOUT_RANK_MAJOR && !ll:
		return invalidUsagef("layout GOEP_EP_LAYOUT_RANK_MAJOR is for LL groups; this is an HT group: use GOEP_EP_LAYOUT_FLAT or EXPERT_MAJOR")
	case layout == C.GOEP_EP_LAYOUT_FLAT && ll:
		return invalidUsagef("layout GOEP_EP_LAYOUT_FLAT is for HT groups; this is an LL group: use GOEP_EP_LAYOUT_EXPERT_MAJOR or RANK_MAJOR")
	case layout == C.GOEP_EP_LAYOUT_RANK_MAJOR:
		if err := gi.gc.need(ep.FeatureLLRankMajor, "layout GOEP_EP_LAYOUT_RANK_MAJOR"); err != nil {
			return err
		}
	case layout == C.GOEP_EP_LAYOUT_EXPERT_MAJOR && !ll:
		if err := gi.gc.need(ep.FeatureHTExpertMajor, "layout GOEP_EP_LAYOUT_EXPERT_MAJOR in an HT group"); err != nil {
			return err
		}
	case layout != C.GOEP_EP_LAYOUT_EXPERT_MAJOR && layout != C.GOEP_EP_LAYOUT_FLAT:
		return invalidArgf("layout %d is not a goepEpLayout_t", int(layout))
	}
	if gi.g != nil && layout != gi.layout {
		return invalidUsagef("layout %s: the group's layout is %s, set by its first handle; goep lays out a group's buffers for one layout "+
			"and does not re-open the group for another: make another group for this one", layoutName(layout), layoutName(gi.layout))
	}
	return nil
}

// readHandleConfig checks p (NULL: the defaults) for a handle of layout in
// mode and returns its zone alignment: HT EXPERT_MAJOR's
// dispatch_output_per_expert_alignment, 0 for no padding.
func readHandleConfig(p *C.goepEpHandleConfig_t, mode ep.Mode, layout C.goepEpLayout_t) (int, error) {
	if p == nil {
		return 0, nil
	}
	if err := checkHeader("config", "goepEpHandleConfig_t", uint32(p.size), uint32(p.magic), C.GOEP_EP_HANDLE_CONFIG_V1_SIZE,
		C.GOEP_EP_MAGIC, "GOEP_EP_HANDLE_CONFIG_INIT"); err != nil {
		return 0, err
	}
	a := uint64(p.dispatch_output_per_expert_alignment)
	switch {
	case a <= 1:
		return 0, nil
	case epLayout(mode, layout) != ep.LayoutExpertMajor || mode != ep.HighThroughput:
		return 0, invalidUsagef("config.dispatch_output_per_expert_alignment = %d: it pads the zones of the HT EXPERT_MAJOR layout, "+
			"and this handle's is %s in %v mode (want 0 or 1)", a, layoutName(layout), mode)
	case a&(a-1) != 0 || a > 1<<20:
		return 0, invalidArgf("config.dispatch_output_per_expert_alignment = %d: want a power of two (up to 2^20), or 0 or 1 for no padding", a)
	}
	return int(a), nil
}

// handleAlignment checks a handle's config against the group's zone
// alignment, once a handle has opened the group.
func (gi *groupImpl[E]) handleAlignment(cfg *C.goepEpHandleConfig_t, layout C.goepEpLayout_t) (int, error) {
	a, err := readHandleConfig(cfg, gi.gc.cfg.Mode, layout)
	if err != nil || gi.g == nil || !gi.gc.cfg.HTExpertMajor() {
		return a, err
	}
	if have := max(gi.gc.cfg.ExpertAlignment, 1); max(a, 1) != have {
		return 0, invalidUsagef("config.dispatch_output_per_expert_alignment = %d: the group's zones are padded to %d rows, set by its first handle; "+
			"goep does not re-open a group for another alignment: make another group for it", a, have)
	}
	return a, nil
}

func (gi *groupImpl[E]) handleMemSize(layout C.goepEpLayout_t, cfg *C.goepEpHandleConfig_t, topk int) (int, error) {
	if err := gi.lock(); err != nil {
		return 0, err
	}
	defer gi.mu.Unlock()
	if err := gi.layoutFor(layout); err != nil {
		return 0, err
	}
	if _, err := gi.handleAlignment(cfg, layout); err != nil {
		return 0, err
	}
	K, err := gi.handleTopK(topk)
	if err != nil {
		return 0, err
	}
	return gi.gc.cfg.MaxTokensPerRank * K * 4, nil // the copy of topk_idx, as int32, padded to the group's top-k
}

func (gi *groupImpl[E]) createHandle(layout C.goepEpLayout_t, topkDesc *C.goepEpTensor_t, info *C.goepEpLayoutInfo_t,
	cfg *C.goepEpHandleConfig_t) (handle, error) {
	if err := gi.lock(); err != nil {
		return nil, err
	}
	defer gi.mu.Unlock()
	if gi.g == nil {
		K := 0 // a topk_idx this rank cannot read opens nothing: the other ranks fail naming it
		if t, err := readTensor("topk_idx", topkDesc); err == nil && t.nd == 2 {
			K = t.dims[1]
		}
		align, _ := readHandleConfig(cfg, gi.gc.cfg.Mode, layout) // a bad one: makeHandle refuses it, after the open
		if err := gi.open(K, layout, align, "goepEpCreateHandle"); err != nil {
			return nil, err
		}
	}
	if err := gi.deliver(); err != nil {
		return nil, err
	}
	gi.g.Mark() // the handle's number, refused or not
	h, err := gi.newHandle(layout, topkDesc, info, cfg)
	if err != nil {
		return nil, gi.refuseCreate(err)
	}
	return h, nil
}

// refuse is goepEpRefuse of a goepEpCreateHandle.
func (gi *groupImpl[E]) refuse(reason string) error {
	if err := gi.lock(); err != nil {
		return err
	}
	defer gi.mu.Unlock()
	if err := gi.open(0, gi.defaultLayout(), 0, "goepEpRefuse of a goepEpCreateHandle"); err != nil {
		return errors.Join(invalidArgf("%s", reason), err)
	}
	if err := gi.deliver(); err != nil {
		return err
	}
	gi.g.Mark()
	return gi.refuseCreate(invalidArgf("%s", reason))
}

// held is the live handle of the group whose LL dispatch holds the buffer
// set the next dispatch needs, if any. The caller holds gi.mu.
func (gi *groupImpl[E]) held() (uint64, bool) {
	eh, ok := gi.g.Held()
	if !ok {
		return 0, false
	}
	for id, h := range liveHandles(gi) {
		if hi, ok := h.(*handleImpl[E]); ok && hi.eh == eh {
			return id, true
		}
	}
	return 0, false
}

// newHandle checks createHandle's arguments and makes the handle with its
// routing.
func (gi *groupImpl[E]) newHandle(layout C.goepEpLayout_t, topkDesc *C.goepEpTensor_t, info *C.goepEpLayoutInfo_t,
	cfg *C.goepEpHandleConfig_t) (handle, error) {
	h, err := gi.makeHandle(layout, cfg, 0, nil)
	if err == nil {
		err = h.route(topkDesc, info)
	}
	if err != nil {
		return nil, err
	}
	return h, nil
}

// initHandle is goepEpInitHandle: a handle without routing, not numbered.
func (gi *groupImpl[E]) initHandle(layout C.goepEpLayout_t, cfg *C.goepEpHandleConfig_t, numTopK int, mem *C.goepEpTensor_t) (handle, error) {
	if err := gi.lock(); err != nil {
		return nil, err
	}
	defer gi.mu.Unlock()
	k := numTopK
	if k < 0 || k > driver.MaxTopK {
		k = 0 // makeHandle refuses it, after the open every rank takes part in
	}
	align, _ := readHandleConfig(cfg, gi.gc.cfg.Mode, layout) // a bad one: makeHandle refuses it, after the open
	if err := gi.open(k, layout, align, "goepEpInitHandle"); err != nil {
		return nil, err
	}
	h, err := gi.makeHandle(layout, cfg, numTopK, mem)
	if err != nil {
		return nil, err
	}
	return h, nil
}

// makeHandle checks a handle's layout, config, top-k and handle_mem. The
// caller holds gi.mu.
func (gi *groupImpl[E]) makeHandle(layout C.goepEpLayout_t, cfg *C.goepEpHandleConfig_t, numTopK int, mem *C.goepEpTensor_t) (*handleImpl[E], error) {
	if err := gi.layoutFor(layout); err != nil {
		return nil, err
	}
	if _, err := gi.handleAlignment(cfg, layout); err != nil {
		return nil, err
	}
	maxT := gi.gc.cfg.MaxTokensPerRank
	K, err := gi.handleTopK(numTopK)
	if err != nil {
		return nil, err
	}
	h := &handleImpl[E]{g: gi, layout: layout}
	t, err := readTensor("handle_mem", mem)
	if err != nil || !t.given() {
		return h, err
	}
	if err := t.want("[bytes]", []dataType{dtUint8}, -1); err != nil {
		return nil, err
	}
	if need := maxT * K * 4; t.elems < need {
		return nil, invalidArgf("handle_mem has %d bytes, want at least %d (goepEpHandleMemSize)", t.elems, need)
	}
	if uintptr(t.data)%4 != 0 {
		return nil, invalidArgf("handle_mem: data %p is not 4-byte aligned (it holds int32 expert ids)", t.data)
	}
	h.mem = view[int32](&t, maxT*K)
	return h, nil
}

// handleTopK is the top-k a handle's copy of topk_idx holds given its
// num_topk (0 or negative, as NCCL EP's HT callers pass: the group's): the
// group's, once open, which a smaller one is padded to; before,
// config.num_topk or else num_topk.
func (gi *groupImpl[E]) handleTopK(numTopK int) (int, error) {
	K := gi.gc.cfg.TopK
	numTopK = max(numTopK, 0)
	switch {
	case numTopK > driver.MaxTopK:
		return 0, invalidArgf("num_topk = %d: want 0 (the group's) or 1..%d", numTopK, driver.MaxTopK)
	case K == 0 && numTopK == 0:
		return 0, invalidArgf("num_topk = 0, and the group's config.num_topk is 0 too: give the handle's top-k")
	case K == 0:
		return numTopK, nil
	case numTopK > K:
		return 0, gi.tooWide(numTopK)
	}
	return K, nil
}

// tooWide refuses a handle whose top-k exceeds the group's.
func (gi *groupImpl[E]) tooWide(k int) error {
	if gi.fixedK > 0 {
		return invalidArgf("num_topk = %d, more than the group's config.num_topk = %d (an upper bound)", k, gi.fixedK)
	}
	return invalidUsagef("num_topk = %d, more than the group's top-k %d, fixed by its first handle (or config.num_topk): "+
		"goep does not re-open a group for a wider top-k; create the group with config.num_topk = %d or more", k, gi.gc.cfg.TopK, k)
}

// checkRouting checks the expert ids of [tokens][K] topk (in range or -1,
// none twice in a token) when the handle is made, locally, so that a bad
// one is this call's error and not a collective dispatch's. (ep checks them
// again at dispatch.)
func checkRouting(topk []int32, K, experts int) error {
	for i, e := range topk {
		if e < -1 || int(e) >= experts {
			return invalidArgf("topk_idx[%d][%d] = %d is not an expert id in [0, %d) or -1", i/K, i%K, e, experts)
		}
		if e < 0 {
			continue
		}
		for j := i - i%K; j < i; j++ {
			if topk[j] == e {
				return invalidArgf("topk_idx[%d] names expert %d twice (slots %d and %d)", i/K, e, j%K, i%K)
			}
		}
	}
	return nil
}

// noteMask sets the async error flag when a call masked a rank that was not
// masked before (groups with enable_mask).
func (gi *groupImpl[E]) noteMask() {
	if !gi.gc.cfg.MaskStalledRanks || gi.g == nil {
		return
	}
	for _, r := range gi.g.Masked() {
		if !gi.known[r] {
			gi.known[r] = true
			gi.asyncErr = true
		}
	}
}

func (gi *groupImpl[E]) needMask(op string) error {
	if !gi.gc.cfg.MaskStalledRanks {
		return invalidUsagef("%s needs a group created with config.enable_mask = 1", op)
	}
	return nil
}

func (gi *groupImpl[E]) maskQuery(status []C.int) error {
	if err := gi.lock(); err != nil {
		return err
	}
	defer gi.mu.Unlock()
	if err := gi.needMask("goepEpMaskQuery"); err != nil {
		return err
	}
	for r := range status {
		status[r] = 1
	}
	if gi.g == nil {
		return nil // no rank can have been masked before the group's first handle
	}
	for _, r := range gi.g.Masked() {
		status[r] = 0
	}
	return nil
}

func (gi *groupImpl[E]) maskUpdate(mask []C.int) error {
	if err := gi.lock(); err != nil {
		return err
	}
	defer gi.mu.Unlock()
	if err := gi.needMask("goepEpMaskUpdate"); err != nil {
		return err
	}
	var masked []int
	for r, m := range mask {
		switch m {
		case 0:
			masked = append(masked, r)
		case 1:
		default:
			return invalidArgf("mask[%d] = %d: want 1 (active) or 0 (masked)", r, int(m))
		}
	}
	return gi.setMask(masked)
}

func (gi *groupImpl[E]) maskClean() error {
	if err := gi.lock(); err != nil {
		return err
	}
	defer gi.mu.Unlock()
	if err := gi.needMask("goepEpMaskClean"); err != nil {
		return err
	}
	return gi.setMask(nil)
}

func (gi *groupImpl[E]) setMask(masked []int) error {
	if err := gi.notOpen("goepEpMaskUpdate and goepEpMaskClean"); err != nil {
		return err
	}
	if err := gi.g.SetMask(masked); err != nil {
		return err
	}
	for r := range gi.known {
		gi.known[r] = slices.Contains(masked, r)
	}
	return nil
}

func (gi *groupImpl[E]) asyncError() (bool, error) {
	if err := gi.lock(); err != nil {
		return false, err
	}
	defer gi.mu.Unlock()
	if err := gi.needMask("goepEpGetAsyncError"); err != nil {
		return false, err
	}
	gi.noteMask()
	return gi.asyncErr, nil
}

func (gi *groupImpl[E]) errorClear() error {
	if err := gi.lock(); err != nil {
		return err
	}
	defer gi.mu.Unlock()
	if err := gi.needMask("goepEpErrorClear"); err != nil {
		return err
	}
	gi.noteMask()
	gi.asyncErr = false
	return nil
}
