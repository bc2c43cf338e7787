package eptest

import (
	"fmt"
	"runtime/debug"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goep/goep/ep"
	"github.com/goep/goep/mpi"
)

// Suite says what to check: every property of the contract, and each
// optional behaviour (ep.Feature) where the backend declares it (ep.Capable).
// Nothing else chooses the checks, so a backend cannot claim a behaviour
// whose checks do not run.
type Suite struct {
	// Comm is the communicator every check runs on (every rank of it runs
	// Run, with the same Suite).
	Comm *mpi.Comm
	// Backend is the backend under test.
	Backend ep.Backend
	// Reference, when set, is an independent backend whose results the
	// backend's must equal: bit for bit on one node (and in LL mode
	// always), within bfloat16 rounding across nodes in HT mode, where
	// partial sums are taken per node first.
	Reference ep.Backend
}

// testTimeout is the groups' timeout in the checks: long enough for a
// loaded 2-core machine running 8 ranks, short enough to fail fast.
const testTimeout = 30 * time.Second

var modes = []ep.Mode{ep.LowLatency, ep.HighThroughput}

// featureChecks names, for every ep.Feature, the subtest of Run that checks
// it where the backend declares it. Run refuses a backend that declares a
// feature missing here, and the suite's own test refuses a Feature of ep
// missing here, so that a new feature cannot be declared unchecked.
var featureChecks = map[ep.Feature]string{
	ep.FeatureFP8Wire:          "FP8Dispatch",
	ep.FeatureMaskStalledRanks: "MaskStalledRank",
	ep.FeatureRefusals:         "RefusalFailsEveryRank",
	ep.FeatureMeter:            "StatsCountTraffic",   // waits and network bytes; without it, none
	ep.FeatureNamedTimeouts:    "StalledRankTimesOut", // the peer named; without it, -1 allowed
	ep.FeatureZeroAllocs:       "SteadyStateAllocatesNothing",
	ep.FeatureFP8Forward:       "FP8Forward",
	ep.FeatureFP8Combine:       "FP8Combine",
	ep.FeatureOverflowDrop:     "OverflowDrop",
	ep.FeatureHTExpertMajor:    "ReceiveLayouts", // run always: the layouts not declared are refused
	ep.FeatureLLRankMajor:      "ReceiveLayouts",
	ep.FeatureGlobalExpertIDs:  "ReceiveLayouts",
	ep.FeatureCallSequence:     "MismatchedCallsFailEveryRank",
}

// declares reports whether the backend under test declares f.
func (s Suite) declares(f ep.Feature) bool { return ep.Supports(s.Backend, f) }

// Run runs every check as a subtest of t. It is collective over s.Comm.
func Run(t *testing.T, s Suite) {
	require.NotNil(t, s.Comm, "Suite.Comm")
	require.NotNil(t, s.Backend, "Suite.Backend")
	var declared []string
	for _, f := range ep.Features() {
		if !s.declares(f) {
			continue
		}
		declared = append(declared, f.String())
		if _, ok := checkName(f); !ok {
			t.Fatalf("the %s backend declares %v, which the suite has no check for", s.Backend.Name(), f)
		}
	}
	if s.Comm.Rank() == 0 {
		t.Logf("the %s backend declares %d optional features: %s", s.Backend.Name(), len(declared), strings.Join(declared, "; "))
	}
	optional := func(f ep.Feature, check func(*testing.T)) {
		if s.declares(f) {
			name, _ := checkName(f)
			t.Run(name, check)
		}
	}
	t.Run("Lifecycle", func(t *testing.T) { s.testLifecycle(t) })
	t.Run("DispatchCombine", func(t *testing.T) { s.testDispatchCombine(t) })
	t.Run("ScaledExperts", func(t *testing.T) { s.testScaledExperts(t) })
	t.Run("HTCombineRepeats", func(t *testing.T) { s.testCombineRepeats(t) })
	t.Run("ConsecutiveCallsBothBuffers", func(t *testing.T) { s.testConsecutiveCalls(t) })
	t.Run("TwoDispatchesInFlight", func(t *testing.T) { s.testTwoDispatchesInFlight(t) })
	t.Run("BackwardIsTranspose", func(t *testing.T) { s.testBackwardIsTranspose(t) })
	t.Run("RowValuesReturnToSlots", func(t *testing.T) { s.testRowValues(t) })
	t.Run("StatsCountTraffic", func(t *testing.T) { s.testStats(t) })
	optional(ep.FeatureFP8Wire, s.testFP8)
	optional(ep.FeatureFP8Forward, s.testFP8Forward)
	t.Run("ForwardedRows", func(t *testing.T) { s.testForwardedRows(t) })
	t.Run("CombineFormats", func(t *testing.T) { s.testCombineFormats(t) })
	optional(ep.FeatureFP8Combine, s.testFP8Combine)
	t.Run("OverflowFail", func(t *testing.T) { s.testOverflow(t, ep.OverflowFail) })
	optional(ep.FeatureOverflowDrop, func(t *testing.T) { s.testOverflow(t, ep.OverflowDrop) })
	t.Run("ReceiveLayouts", func(t *testing.T) { s.testLayouts(t) })
	t.Run("UnsupportedFeaturesRefused", func(t *testing.T) { s.testFeatureRefusals(t) })
	if s.Reference != nil {
		t.Run("MatchesReference", func(t *testing.T) { s.testMatchesReference(t) })
	}
	t.Run("BadInputIsRefusedAndWritesNothing", func(t *testing.T) { s.testBadInput(t) })
	optional(ep.FeatureRefusals, s.testRefusalFailsEveryRank)
	optional(ep.FeatureCallSequence, s.testMismatchedCalls)
	t.Run("ReleaseGivesBuffersBack", func(t *testing.T) { s.testRelease(t) })
	t.Run("InvalidConfigs", func(t *testing.T) { s.testInvalidConfigs(t) })
	t.Run("UseAfterClose", func(t *testing.T) { s.testUseAfterClose(t) })
	optional(ep.FeatureZeroAllocs, s.testZeroAllocs)
	if s.declares(ep.FeatureZeroAllocs) {
		t.Run("RoutingChangeAllocatesNothing", func(t *testing.T) { s.testRoutingChanges(t) })
	}
	t.Run("StalledRankTimesOut", func(t *testing.T) { s.testStalledRank(t) })
	optional(ep.FeatureMaskStalledRanks, s.testMaskStalledRank)
}

// agree fails t on every rank if it failed on any, so that ranks stay in
// step; deferred, it also turns a panic into a failure.
func (s Suite) agree(t *testing.T) {
	t.Helper()
	if r := recover(); r != nil {
		t.Errorf("rank %d: panic: %v\n%s", s.Comm.Rank(), r, debug.Stack())
	}
	var mine error
	if t.Failed() {
		mine = fmt.Errorf("failed")
	}
	if err := mpi.AgreeOnError(s.Comm, mine); err != nil {
		t.Fatalf("rank %d: the check failed on some rank: %v", s.Comm.Rank(), err)
	}
}

// newGroup makes a group of the backend under test (or another backend),
// closed when the test ends.
func newGroup[E ep.Element](t *testing.T, s Suite, b ep.Backend, cfg ep.Config) *ep.Group[E] {
	t.Helper()
	if cfg.Timeout == 0 {
		cfg.Timeout = testTimeout
	}
	cfg.Backend = b
	g, err := ep.NewGroup[E](s.Comm, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, g.Close()) })
	return g
}

// round is a group of the backend under test in the second scenario's
// configuration, with this rank's input and its tokens (float32) uploaded
// and a zeroed output: where the tests of calls that go wrong start.
type round struct {
	sc     scenario
	in     input
	g      *ep.Group[float32]
	x, out ep.Tensor[float32]
}

// newRound is round in mode, its group's configuration changed by tune
// (nil for none) and closed when the test ends.
func (s Suite) newRound(t *testing.T, mode ep.Mode, tune func(*ep.Config)) round {
	t.Helper()
	R, me := s.Comm.Size(), s.Comm.Rank()
	r := round{sc: scenarios(R)[1]}
	cfg := r.sc.config(mode)
	if tune != nil {
		tune(&cfg)
	}
	r.g = newGroup[float32](t, s, s.Backend, cfg)
	r.in = r.sc.input(me, R)
	r.x = upload(t, r.g, payload[float32](me, r.in.T, r.sc.hidden))
	r.out = zeros[float32](t, r.g, r.in.T*r.sc.hidden)
	return r
}

// upload puts host values into a new tensor of the group's memory, freed
// when the test ends.
func upload[T ep.Scalar, E ep.Element](t *testing.T, g *ep.Group[E], host []T) ep.Tensor[T] {
	t.Helper()
	x, err := ep.Alloc[T](g.Memory(), len(host))
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, ep.Free(x)) })
	require.NoError(t, ep.Upload(x, host))
	return x
}

// zeros is a new zeroed tensor of the group's memory.
func zeros[T ep.Scalar, E ep.Element](t *testing.T, g *ep.Group[E], n int) ep.Tensor[T] {
	t.Helper()
	return upload[T](t, g, make([]T, n))
}

// host reads a tensor back.
func host[T ep.Scalar](t *testing.T, x ep.Tensor[T]) []T {
	t.Helper()
	out, err := ep.ToHost(x)
	require.NoError(t, err)
	return out
}

// rowsEqual compares the values of a row with want (so +0 equals -0) and
// reports the first difference.
func rowsEqual[E ep.Element](t *testing.T, what string, got, want []E) bool {
	t.Helper()
	for c := range want {
		if ep.Float32Of(got[c]) != ep.Float32Of(want[c]) {
			t.Errorf("%s: element %d = %v, want %v", what, c, ep.Float32Of(got[c]), ep.Float32Of(want[c]))
			return false
		}
	}
	return true
}

func abs(f float64) float64 {
	if f < 0 {
		return -f
	}
	return f
}
