package eptest

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goep/goep/ep"
)

// The handle's lifecycle split as NCCL EP's: what a layout needs (buffers,
// sizes) is set once, at NewGroup (ncclEpInitHandle), and each dispatch
// brings a new routing (ncclEpUpdateHandle). A routing change must then
// allocate nothing, even the first time it is larger than any before.

// routingCases are routings of one config (scenarios(R)[0]'s): a tiny one
// to warm up with, then random, full, and all of a rank's pairs to one
// rank's experts (the largest counts).
func routingCases(ranks int) (warm scenario, changes []scenario) {
	base := scenarios(ranks)[0]
	warm = base
	warm.name, warm.tokens, warm.route = "tiny", func(int, int) int { return 1 }, oneExpertRoute
	for i := 0; i < 3; i++ {
		sc := base
		sc.name, sc.seed = "random", uint64(300+i)
		changes = append(changes, sc)
	}
	full := base
	full.name, full.tokens, full.route = "full", fullTokens, randomRoute(0)
	skew := base
	skew.name, skew.tokens = "all-to-rank-0", fullTokens
	skew.route = func(_ *rand.Rand, _, t int, ids []int32, _ int) {
		for k := range ids {
			ids[k] = int32(k) // rank 0's experts (L >= TopK here)
		}
	}
	return warm, append(changes, full, skew, base)
}

// testRoutingChanges: once the handle ring has been used by tiny
// dispatches, a sequence of dispatches whose routing changes every time,
// growing up to every token to TopK experts and every pair to one rank,
// allocates nothing (dispatch, combine, a cached dispatch and its combine
// each), in every layout the backend has; and cycling through them
// allocates nothing either.
func (s Suite) testRoutingChanges(t *testing.T) {
	R := s.Comm.Size()
	cases := []layoutCase{{name: "ll/expert-major", mode: ep.LowLatency}, {name: "ht/flat", mode: ep.HighThroughput}}
	for _, c := range layoutCases() {
		if ok, _ := c.supported(s.Backend); ok {
			cases = append(cases, c)
		}
	}
	warm, changes := routingCases(R)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) { checkRoutingChanges(t, s, c, warm, changes) })
	}
}

func checkRoutingChanges(t *testing.T, s Suite, c layoutCase, warm scenario, changes []scenario) {
	defer s.agree(t)
	R, me := s.Comm.Size(), s.Comm.Rank()
	g := newGroup[ep.BF16](t, s, s.Backend, c.config(warm))
	H := warm.hidden
	type step struct {
		in  input
		x   ep.Tensor[ep.BF16]
		out ep.Tensor[ep.BF16]
	}
	prepare := func(sc scenario) step {
		in := sc.input(me, R)
		return step{in: in, x: upload(t, g, payload[ep.BF16](me, in.T, H)), out: zeros[ep.BF16](t, g, in.T*H)}
	}
	var failed error
	round := func(st step) {
		h, err := g.Dispatch(ep.Tokens(st.x, st.in.topk, st.in.weights))
		if err == nil {
			err = g.Combine(h, h.Recv(), st.out, nil)
		}
		if err == nil {
			h, err = g.Dispatch(ep.Reuse(h, st.x, nil))
		}
		if err == nil {
			err = g.Combine(h, h.CombineBuffer(), st.out, nil)
		}
		if err != nil && failed == nil {
			failed = err
		}
	}
	tiny := prepare(warm)
	steps := make([]step, len(changes))
	for i, sc := range changes {
		steps[i] = prepare(sc)
	}
	round(tiny) // the first call sets up what the transport keeps per peer
	first, where := engineAllocs(func() {
		for _, st := range steps {
			round(st)
		}
	})
	require.NoError(t, failed)
	assert.Zero(t, first, "allocations of the first dispatches with changing, growing routings, at:\n%s", where)
	cycles, where := engineAllocs(func() {
		for i := 0; i < 3*len(steps); i++ {
			round(steps[i%len(steps)])
		}
	})
	require.NoError(t, failed)
	assert.Zero(t, cycles, "allocations of %d dispatch+combine+cached dispatch+combine rounds, the routing changing each time, at:\n%s",
		3*len(steps), where)
	// And the group still gives the right result.
	sc, st := changes[len(changes)-1], steps[len(steps)-1]
	h, err := g.Dispatch(ep.Tokens(st.x, st.in.topk, st.in.weights))
	require.NoError(t, err)
	require.NoError(t, g.Combine(h, h.Recv(), st.out, nil))
	if c.layout == ep.LayoutDefault {
		checkRound(t, c.mode, sc, st.in, me, R, host(t, st.out))
		return
	}
	o := host(t, st.out)
	for tok := 0; tok < st.in.T; tok++ {
		f := layoutIdentityFactor(c, sc, st.in, tok, R)
		if !rowsEqual(t, "combined token", o[tok*H:(tok+1)*H], scaled[ep.BF16](me, tok, H, f)) {
			return
		}
	}
}
