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
	// FeatureFP8Forward is Config.Wire WireFP8Forward: the engine moves
	// the caller's e4m3 codes and scales (Dispatch.Scales) as they are.
	FeatureFP8Forward
	// FeatureFP8Combine is Config.CombineWire FP8: a low-precision
	// combine.
	FeatureFP8Combine
	// FeatureOverflowDrop is Config.Overflow OverflowDrop: an HT dispatch
	// drops what does not fit, the same on every rank.
	FeatureOverflowDrop
)

func (f Feature) String() string {
	switch f {
	case FeatureFP8Wire:
		return "FP8 dispatch (Config.Wire)"
	case FeatureMaskStalledRanks:
		return "masking stalled ranks (Config.MaskStalledRanks)"
	case FeatureFP8Forward:
		return "forwarding FP8 rows the caller quantized (Config.Wire fp8-forward)"
	case FeatureFP8Combine:
		return "a low-precision combine (Config.CombineWire)"
	case FeatureOverflowDrop:
		return "dropping what does not fit (Config.Overflow drop)"
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
	switch {
	case c.Wire == WireFP8Forward:
		fs = append(fs, FeatureFP8Forward)
	case c.Wire.FP8():
		fs = append(fs, FeatureFP8Wire)
	}
	if c.MaskStalledRanks {
		fs = append(fs, FeatureMaskStalledRanks)
	}
	if c.CombineWire.FP8() {
		fs = append(fs, FeatureFP8Combine)
	}
	if c.Overflow == OverflowDrop {
		fs = append(fs, FeatureOverflowDrop)
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
