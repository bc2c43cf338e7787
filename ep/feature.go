package ep

import (
	"errors"
	"fmt"
)

// A Feature is an optional ability that a Config can ask of its Backend.
// A backend that does not know a feature is never handed a Config asking
// for it: NewGroup refuses it first.
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
)

func (f Feature) String() string {
	switch f {
	case FeatureFP8Wire:
		return "FP8 dispatch (Config.Wire)"
	case FeatureMaskStalledRanks:
		return "masking stalled ranks (Config.MaskStalledRanks)"
	case FeatureHTExpertMajor:
		return "the HT expert-major receive layout (Config.Layout)"
	case FeatureLLRankMajor:
		return "the LL rank-major receive layout (Config.Layout)"
	case FeatureGlobalExpertIDs:
		return "global expert ids in RecvTopK (Config.RecvIDs)"
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
func (c Config) features() []Feature {
	var fs []Feature
	if c.Wire.FP8() {
		fs = append(fs, FeatureFP8Wire)
	}
	if c.MaskStalledRanks {
		fs = append(fs, FeatureMaskStalledRanks)
	}
	if c.htExpertMajor() {
		fs = append(fs, FeatureHTExpertMajor)
	}
	if c.llRankMajor() {
		fs = append(fs, FeatureLLRankMajor)
	}
	if c.RecvIDs == GlobalExpertIDs {
		fs = append(fs, FeatureGlobalExpertIDs)
	}
	return fs
}

// checkFeatures refuses a Config that asks for a feature its backend does
// not implement, naming both.
func checkFeatures(c Config) error {
	b := c.backend()
	for _, f := range c.features() {
		if !Supports(b, f) {
			return fmt.Errorf("ep: NewGroup: the %s backend does not implement %v: %w", b.Name(), f, ErrUnsupported)
		}
	}
	return nil
}
