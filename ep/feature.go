package ep

import "fmt"

// backendOf is c.Backend, or the default backend when unset.
func backendOf(c Config) Backend {
	if c.Backend == nil {
		return CPU
	}
	return c.Backend
}

// checkFeatures refuses a Config that asks for a feature its backend does
// not implement, naming both.
func checkFeatures(c Config) error {
	b := backendOf(c)
	for _, f := range c.Needs() {
		if !Supports(b, f) {
			return fmt.Errorf("ep: NewGroup: the %s backend does not implement %v: %w", b.Name(), f, ErrUnsupported)
		}
	}
	return nil
}

// checkEngine refuses an engine that lacks the interface of a feature its
// backend declares, so that a declaration that the engine does not back
// (or a method whose signature drifted) fails NewGroup instead of turning a
// refusal into a timeout or a statistic into nothing.
func checkEngine(b Backend, eng Engine) error {
	for _, need := range []struct {
		f    Feature
		ok   bool
		name string
	}{
		{FeatureRefusals, is[Refuser](eng), "Refuser"},
		{FeatureMeter, is[Meter](eng), "Meter"},
		{FeatureMaskStalledRanks, is[Masker](eng), "Masker"},
		{FeatureCallSequence, is[Sequencer](eng), "Sequencer"},
	} {
		if Supports(b, need.f) && !need.ok {
			return fmt.Errorf("ep: NewGroup: the %s backend declares %v, but its engine %T is not an ep.%s", b.Name(), need.f, eng, need.name)
		}
	}
	return nil
}

// is reports whether v implements I.
func is[I any](v any) bool {
	_, ok := v.(I)
	return ok
}
