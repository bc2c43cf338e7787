package eptest

import (
	"fmt"
	"runtime/debug"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goep/goep/ep"
	"github.com/goep/goep/mpi"
)

// Suite says what to check.
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
	// AnonymousTimeouts says that the backend's timeouts cannot name the
	// rank that stalled (TimeoutError.Peer -1, as an MPI collective).
	AnonymousTimeouts bool
	// ZeroAllocs asks for the check that steady-state dispatch+combine
	// cycles allocate nothing.
	ZeroAllocs bool
	// Refusals asks for the check that one rank's refused input fails the
	// same call on every rank at once (the backend's engines are
	// ep.Refusers).
	Refusals bool
	// Masking asks for the check of MaskStalledRanks with a rank stopped by
	// SIGSTOP (the backend supports ep.FeatureMaskStalledRanks).
	Masking bool
}

// testTimeout is the groups' timeout in the checks: long enough for a
// loaded 2-core machine running 8 ranks, short enough to fail fast.
const testTimeout = 30 * time.Second

var modes = []ep.Mode{ep.LowLatency, ep.HighThroughput}

// Run runs every check as a subtest of t. It is collective over s.Comm.
func Run(t *testing.T, s Suite) {
	require.NotNil(t, s.Comm, "Suite.Comm")
	require.NotNil(t, s.Backend, "Suite.Backend")
	t.Run("Lifecycle", func(t *testing.T) { s.testLifecycle(t) })
	t.Run("DispatchCombine", func(t *testing.T) { s.testDispatchCombine(t) })
	t.Run("ScaledExperts", func(t *testing.T) { s.testScaledExperts(t) })
	t.Run("ConsecutiveCallsBothBuffers", func(t *testing.T) { s.testConsecutiveCalls(t) })
	t.Run("BackwardIsTranspose", func(t *testing.T) { s.testBackwardIsTranspose(t) })
	t.Run("RowValuesReturnToSlots", func(t *testing.T) { s.testRowValues(t) })
	t.Run("StatsCountTraffic", func(t *testing.T) { s.testStats(t) })
	t.Run("FP8Dispatch", func(t *testing.T) { s.testFP8(t) })
	t.Run("ReceiveLayouts", func(t *testing.T) { s.testLayouts(t) })
	t.Run("UnsupportedFeaturesRefused", func(t *testing.T) { s.testFeatureRefusals(t) })
	if s.Reference != nil {
		t.Run("MatchesReference", func(t *testing.T) { s.testMatchesReference(t) })
	}
	t.Run("BadInputIsRefusedAndWritesNothing", func(t *testing.T) { s.testBadInput(t) })
	if s.Refusals {
		t.Run("RefusalFailsEveryRank", func(t *testing.T) { s.testRefusalFailsEveryRank(t) })
	}
	t.Run("InvalidConfigs", func(t *testing.T) { s.testInvalidConfigs(t) })
	t.Run("UseAfterClose", func(t *testing.T) { s.testUseAfterClose(t) })
	if s.ZeroAllocs {
		t.Run("SteadyStateAllocatesNothing", func(t *testing.T) { s.testZeroAllocs(t) })
		t.Run("RoutingChangeAllocatesNothing", func(t *testing.T) { s.testRoutingChanges(t) })
	}
	t.Run("StalledRankTimesOut", func(t *testing.T) { s.testStalledRank(t) })
	if s.Masking {
		t.Run("MaskStalledRank", func(t *testing.T) { s.testMaskStalledRank(t) })
	}
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
