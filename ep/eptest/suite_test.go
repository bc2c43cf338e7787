package eptest

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/goep/goep/ep"
)

// Every feature of package ep has a check in the suite, and a feature a
// Config asks for is one the suite knows how to ask for: a new Feature
// cannot be declared without being checked.
func TestEveryFeatureIsChecked(t *testing.T) {
	for _, f := range ep.Features() {
		_, ok := checkName(f)
		assert.True(t, ok, "%v has no check", f)
		if ask, ok := askFor(f); ok {
			var cfg ep.Config
			ask(&cfg)
			assert.NotEqual(t, ep.Config{}, cfg, "%v: asking changes the Config", f)
		}
	}
	for f := range featureChecks {
		assert.Contains(t, ep.Features(), f, "a check of a feature ep does not have")
	}
	for _, f := range []ep.Feature{ep.FeatureFP8Wire, ep.FeatureFP8Forward, ep.FeatureFP8Combine, ep.FeatureMaskStalledRanks, ep.FeatureOverflowDrop} {
		_, ok := askFor(f)
		assert.True(t, ok, "a Config asks for %v", f)
	}
}
