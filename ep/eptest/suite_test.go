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
		assert.Contains(t, featureChecks, f, "%v has no check", f)
	}
	assert.Len(t, featureChecks, len(ep.Features()), "checks of features ep does not have")
	for f, ask := range configAsks {
		var cfg ep.Config
		ask(&cfg)
		assert.NotEqual(t, ep.Config{}, cfg, "%v: asking changes the Config", f)
		assert.Contains(t, featureChecks, f)
	}
}
