package driver

import (
	"errors"
	"fmt"
)

// A Feature is an optional behaviour of a Backend's engines, which the
// backend declares (Capable). Two are asked for by a Config (FP8Wire,
// MaskStalledRanks): a backend that does not declare one is never handed a
// Config asking for it, since NewGroup refuses it first. The others are
// what the engines do unasked. NewGroup checks that a backend's engines
// implement the interface a declared feature needs (Refuser, Meter,
// Masker), and the conformance suite (package ep/eptest) derives what it
// checks from the declarations: a declared feature's checks run and must
// pass; an undeclared one asked for by a Config must be refused by name.
type Feature int

// Features.
const (
	// FeatureFP8Wire is dispatch in FP8 (Config.Wire WireFP8 or
	// WireFP8UE8M0): the engine casts the rows on the way and fills
	// Received.Scales.
	FeatureFP8Wire Feature = iota + 1
	// FeatureMaskStalledRanks is Config.MaskStalledRanks: the engines are
	// Maskers.
	FeatureMaskStalledRanks
	// FeatureFP8Forward is Config.Wire WireFP8Forward: the engine moves
	// the caller's e4m3 codes and scales (Dispatch.Scales) as they are.
	FeatureFP8Forward
	// FeatureFP8Combine is Config.CombineWire FP8: a low-precision
	// combine, in both modes.
	FeatureFP8Combine
	// FeatureOverflowDrop is Config.Overflow OverflowDrop: an HT dispatch
	// drops what does not fit, the same on every rank.
	FeatureOverflowDrop
	// FeatureRefusals is a refused call failing at once on every rank: the
	// engines are Refusers. Without it, the other ranks wait for the
	// refusing rank until their timeout.
	FeatureRefusals
	// FeatureMeter is Group.Stats reporting how long this rank waited for
	// each peer and the bytes it sent across nodes: the engines are
	// Meters.
	FeatureMeter
	// FeatureNamedTimeouts is a timeout that names the peer that stalled
	// (TimeoutError.Peer and Host). Without it a timeout may say Peer -1,
	// as an MPI collective cannot say who is missing.
	FeatureNamedTimeouts
	// FeatureZeroAllocs is steady-state dispatch and combine calls
	// allocating nothing on the Go heap.
	FeatureZeroAllocs
	// FeatureHTExpertMajor is Config.Layout LayoutExpertMajor in
	// HighThroughput: the engine writes each (token, local expert) row
	// into its expert's padded zone and fills Received.ExpertOffsets.
	FeatureHTExpertMajor
	// FeatureLLRankMajor is Config.Layout LayoutRankMajor in LowLatency:
	// rows by source rank with their top-k ids and weights, combined
	// unweighted.
	FeatureLLRankMajor
	// FeatureGlobalExpertIDs is Config.RecvIDs GlobalExpertIDs: RecvTopK
	// in global expert ids.
	FeatureGlobalExpertIDs
	// FeatureCallSequence is every rank's call checked against the
	// others' in the exchanges the call makes (its number, with the steps
	// of Group.Mark, and its kind), so that ranks whose calls no longer
	// match fail with an error naming a rank and the call (*SequenceError,
	// *UnusableError) instead of pairing one rank's call with another's;
	// and a group found unusable (a peer that did not arrive) being said
	// so to every rank at once: the engines are Sequencers.
	FeatureCallSequence
	// FeatureNVFP4Forward is Config.Wire WireNVFP4Forward: the engine
	// moves the caller's NVFP4 codes and scales as they are.
	FeatureNVFP4Forward
	// FeatureNVFP4Combine is Config.CombineWire WireNVFP4 in LowLatency.
	FeatureNVFP4Combine

	featureEnd // one past the last
)

// Features lists every Feature.
func Features() []Feature {
	fs := make([]Feature, 0, featureEnd-1)
	for f := Feature(1); f < featureEnd; f++ {
		fs = append(fs, f)
	}
	return fs
}

func (f Feature) String() string {
	switch f {
	case FeatureFP8Wire:
		return "FP8 dispatch (Config.Wire)"
	case FeatureMaskStalledRanks:
		return "masking stalled ranks (Config.MaskStalledRanks)"
	case FeatureFP8Forward:
		return "forwarding FP8 rows the caller quantized (Config.Wire fp8-forward)"
	case FeatureNVFP4Combine:
		return "an NVFP4 combine (Config.CombineWire nvfp4)"
	case FeatureNVFP4Forward:
		return "forwarding NVFP4 rows the caller quantized (Config.Wire nvfp4-forward)"
	case FeatureFP8Combine:
		return "a low-precision combine (Config.CombineWire)"
	case FeatureOverflowDrop:
		return "dropping what does not fit (Config.Overflow drop)"
	case FeatureRefusals:
		return "refusals on every rank (ep.Refuser)"
	case FeatureMeter:
		return "per-peer waits and network bytes (ep.Meter)"
	case FeatureNamedTimeouts:
		return "timeouts naming the stalled peer"
	case FeatureZeroAllocs:
		return "steady-state calls without allocations"
	case FeatureHTExpertMajor:
		return "the HT expert-major receive layout (Config.Layout)"
	case FeatureLLRankMajor:
		return "the LL rank-major receive layout (Config.Layout)"
	case FeatureGlobalExpertIDs:
		return "global expert ids in RecvTopK (Config.RecvIDs)"
	case FeatureCallSequence:
		return "calls checked to match across ranks (ep.Sequencer)"
	}
	return fmt.Sprintf("Feature(%d)", int(f))
}

// A Capable Backend says which optional Features its engines implement, as
// database/sql drivers do with their optional interfaces. A Backend that is
// not Capable implements none.
type Capable interface {
	Supports(f Feature) bool
}

// Supports reports whether backend b implements feature f.
func Supports(b Backend, f Feature) bool {
	c, ok := b.(Capable)
	return ok && c.Supports(f)
}

// ErrUnsupported is matched (errors.Is) by the error of a NewGroup whose
// Config asks for a Feature its Backend does not implement.
var ErrUnsupported = errors.New("ep: not supported by the backend")

// features lists the optional features c asks for.
func (c Config) Needs() []Feature {
	var fs []Feature
	if f := wires[c.Wire].DispatchFeature; f != 0 {
		fs = append(fs, f)
	}
	if c.MaskStalledRanks {
		fs = append(fs, FeatureMaskStalledRanks)
	}
	if f := wires[c.CombineWire].Combine[c.Mode]; f != 0 {
		fs = append(fs, f)
	}
	if c.Overflow == OverflowDrop {
		fs = append(fs, FeatureOverflowDrop)
	}
	if c.HTExpertMajor() {
		fs = append(fs, FeatureHTExpertMajor)
	}
	if c.LLRankMajor() {
		fs = append(fs, FeatureLLRankMajor)
	}
	if c.RecvIDs == GlobalExpertIDs {
		fs = append(fs, FeatureGlobalExpertIDs)
	}
	return fs
}
