package ep_test

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goep/goep/ep"
	"github.com/goep/goep/internal/mpitesting"
	"github.com/goep/goep/mpi"
)

// Every Feature has its own name, and Features lists each once.
func TestFeaturesAreNamed(t *testing.T) {
	seen := map[string]bool{}
	for _, f := range ep.Features() {
		name := f.String()
		assert.NotEqual(t, fmt.Sprintf("Feature(%d)", int(f)), name, "feature %d has no name", int(f))
		assert.False(t, seen[name], "%q twice", name)
		seen[name] = true
	}
	assert.Len(t, seen, 15)
}

// claimsAll declares every feature, with engines that hide the optional
// interfaces of the backend's engines.
type claimsAll struct{ ep.Backend }

func (claimsAll) Supports(ep.Feature) bool { return true }

func (b claimsAll) Open(c *mpi.Comm, spec ep.Spec) (ep.Engine, error) {
	e, err := b.Backend.Open(c, spec)
	if e == nil {
		return nil, err
	}
	return bareEngine{e}, err
}

// bareEngine is an Engine and nothing more.
type bareEngine struct{ ep.Engine }

// A backend that declares a feature its engines do not implement the
// interface of is refused at NewGroup, naming the backend, the feature and
// the engine's type, rather than a refusal turning into a timeout later.
func TestDeclaredFeatureNeedsItsInterface(t *testing.T) {
	w := mpitesting.World
	cfg := ep.Config{Mode: ep.LowLatency, NumExperts: 2 * w.Size(), MaxTokensPerRank: 4, Hidden: 8, TopK: 2,
		Backend: claimsAll{ep.CPU}}
	_, err := ep.NewGroup[float32](w, cfg)
	require.Error(t, err)
	assert.ErrorContains(t, err, "the cpu backend declares "+ep.FeatureRefusals.String()+
		", but its engine ep_test.bareEngine is not an ep.Refuser")

	// The CPU backend's own engines implement every interface it declares.
	g, err := ep.NewGroup[float32](w, ep.Config{Mode: ep.LowLatency, NumExperts: 2 * w.Size(), MaxTokensPerRank: 4,
		Hidden: 8, TopK: 2, MaskStalledRanks: true})
	require.NoError(t, err)
	require.NoError(t, g.Close())
}
