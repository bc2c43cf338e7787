package eptest

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goep/goep/ep"
)

// A group's whole lifecycle is safe with no barrier from the user: no check
// here calls one between creating a group and using or closing it (across
// real hosts a first Dispatch right after NewGroup once hung until the
// timeout, and a barrier in the program hid it).
func (s Suite) testLifecycle(t *testing.T) {
	t.Run("CallRightAfterNewGroup", func(t *testing.T) { s.testCallRightAfterNewGroup(t) })
	t.Run("TwoGroupsInterleaved", func(t *testing.T) { s.testTwoGroupsInterleaved(t) })
	t.Run("CreateRunClose50Times", func(t *testing.T) { s.testCreateRunClose(t, 50) })
	t.Run("GroupOnSubCommunicator", func(t *testing.T) { s.testSubCommunicator(t) })
	t.Run("RanksCloseAtDifferentTimes", func(t *testing.T) { s.testCloseAtDifferentTimes(t) })
	if s.Comm.Size() > 1 {
		t.Run("SkippedNewGroupNamesTheRank", func(t *testing.T) { s.testSkippedNewGroup(t) })
		t.Run("SkippedCloseNamesTheRank", func(t *testing.T) { s.testSkippedClose(t) })
	}
}

// oneRound dispatches every rank's tokens of sc on g and combines them with
// identity experts, checking the result.
func oneRound[E ep.Element](t *testing.T, s Suite, g *ep.Group[E], mode ep.Mode, sc scenario) {
	t.Helper()
	R, me := g.Size(), g.Rank()
	in := sc.input(me, R)
	x := upload(t, g, payload[E](me, in.T, sc.hidden))
	out := zeros[E](t, g, in.T*sc.hidden)
	h, err := g.Dispatch(ep.Tokens(x, in.topk, in.weights))
	require.NoError(t, err)
	require.NoError(t, g.Combine(h, h.Recv(), out, nil))
	checkRound(t, mode, sc, in, me, R, host(t, out))
}

// checkRound is checkIdentityCombine for a group of R ranks in which this
// rank is me (a sub-communicator's numbering).
func checkRound[E ep.Element](t *testing.T, mode ep.Mode, sc scenario, in input, me, R int, out []E) {
	t.Helper()
	H := sc.hidden
	for tok := 0; tok < in.T; tok++ {
		f := weightSum(sc, in, tok)
		if mode == ep.HighThroughput {
			f = float32(ranksHit(sc, in, tok, R))
		}
		if !rowsEqual(t, fmt.Sprintf("combined token %d (x * %v)", tok, f), out[tok*H:(tok+1)*H], scaled[E](me, tok, H, f)) {
			return
		}
	}
}

func (s Suite) testCallRightAfterNewGroup(t *testing.T) {
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) {
			defer s.agree(t)
			sc := scenarios(s.Comm.Size())[0]
			g := newGroup[float32](t, s, s.Backend, sc.config(mode))
			oneRound(t, s, g, mode, sc) // the very first call, at once
			oneRound(t, s, g, mode, sc)
		})
	}
}

// Two groups alive at once, of other modes, sizes and element types, their
// calls interleaved: each keeps its own flags and buffers.
func (s Suite) testTwoGroupsInterleaved(t *testing.T) {
	defer s.agree(t)
	R, me := s.Comm.Size(), s.Comm.Rank()
	scLL, scHT := scenarios(R)[1], scenarios(R)[0]
	ll := newGroup[float32](t, s, s.Backend, scLL.config(ep.LowLatency))
	ht := newGroup[ep.BF16](t, s, s.Backend, scHT.config(ep.HighThroughput))
	inLL, inHT := scLL.input(me, R), scHT.input(me, R)
	xLL, outLL := upload(t, ll, payload[float32](me, inLL.T, scLL.hidden)), zeros[float32](t, ll, inLL.T*scLL.hidden)
	xHT, outHT := upload(t, ht, payload[ep.BF16](me, inHT.T, scHT.hidden)), zeros[ep.BF16](t, ht, inHT.T*scHT.hidden)
	for i := 0; i < 10; i++ {
		hLL, err := ll.Dispatch(ep.Tokens(xLL, inLL.topk, inLL.weights))
		require.NoError(t, err)
		hHT, err := ht.Dispatch(ep.Tokens(xHT, inHT.topk, inHT.weights))
		require.NoError(t, err)
		require.NoError(t, ll.Combine(hLL, hLL.Recv(), outLL, nil))
		require.NoError(t, ht.Combine(hHT, hHT.Recv(), outHT, nil))
		checkRound(t, ep.LowLatency, scLL, inLL, me, R, host(t, outLL))
		checkRound(t, ep.HighThroughput, scHT, inHT, me, R, host(t, outHT))
	}
}

// Create, run, Close and create again, n times.
func (s Suite) testCreateRunClose(t *testing.T, n int) {
	defer s.agree(t)
	sc := scenarios(s.Comm.Size())[1]
	for i := 0; i < n; i++ {
		mode := modes[i%2]
		cfg := sc.config(mode)
		cfg.Backend, cfg.Timeout = s.Backend, testTimeout
		g, err := ep.NewGroup[float32](s.Comm, cfg)
		require.NoError(t, err, "group %d", i)
		oneRound(t, s, g, mode, sc)
		require.NoError(t, g.Close(), "group %d", i)
	}
}

// A group on a sub-communicator (every other rank) beside one on the world,
// their calls interleaved.
func (s Suite) testSubCommunicator(t *testing.T) {
	defer s.agree(t)
	R, me := s.Comm.Size(), s.Comm.Rank()
	sub, err := s.Comm.Split(me%2, me, "eptest-half")
	require.NoError(t, err)
	defer func() { assert.NoError(t, sub.Free()) }()
	scW, scS := scenarios(R)[1], scenarios(sub.Size())[0]
	world := newGroup[float32](t, s, s.Backend, scW.config(ep.LowLatency))
	cfg := scS.config(ep.HighThroughput)
	cfg.Backend, cfg.Timeout = s.Backend, testTimeout
	half, err := ep.NewGroup[float32](sub, cfg)
	require.NoError(t, err)
	defer func() { assert.NoError(t, half.Close()) }()
	for i := 0; i < 5; i++ {
		oneRound(t, s, half, ep.HighThroughput, scS)
		oneRound(t, s, world, ep.LowLatency, scW)
	}
	assert.Equal(t, sub.Size(), half.Size())
	assert.Equal(t, sub.Rank(), half.Rank())
}

// Ranks that reach Close at different times: the others wait in Close for
// the late one (within the timeout), and every Close succeeds.
func (s Suite) testCloseAtDifferentTimes(t *testing.T) {
	defer s.agree(t)
	R, me := s.Comm.Size(), s.Comm.Rank()
	sc := scenarios(R)[1]
	for _, mode := range modes {
		cfg := sc.config(mode)
		cfg.Backend, cfg.Timeout = s.Backend, testTimeout
		g, err := ep.NewGroup[float32](s.Comm, cfg)
		require.NoError(t, err)
		oneRound(t, s, g, mode, sc)
		if me == R-1 {
			time.Sleep(300 * time.Millisecond)
		}
		require.NoError(t, g.Close(), "%v: rank %d closing", mode, me)
	}
}

// skipTimeout is how long the others wait for a rank that skips NewGroup or
// Close in the checks below.
const skipTimeout = time.Second

// requireMissing checks that err names rank as the one that did not call op.
func requireMissing(t *testing.T, err error, op string, rank int) {
	t.Helper()
	var te *ep.TimeoutError
	require.Error(t, err, "%s returned although rank %d never called it", op, rank)
	require.True(t, errors.As(err, &te), "%s: %v is not an *ep.TimeoutError", op, err)
	assert.Equal(t, rank, te.Peer, "%s: the rank named (%v)", op, err)
	assert.Equal(t, op, te.Op)
	assert.ErrorIs(t, err, ep.ErrTimeout)
}

// The last rank does not call NewGroup: every other rank's NewGroup returns
// an error naming it, after the timeout, instead of hanging in a collective.
func (s Suite) testSkippedNewGroup(t *testing.T) {
	defer s.agree(t)
	R, me := s.Comm.Size(), s.Comm.Rank()
	if me == R-1 {
		return
	}
	cfg := scenarios(R)[0].config(ep.LowLatency)
	cfg.Backend, cfg.Timeout = s.Backend, skipTimeout
	g, err := ep.NewGroup[float32](s.Comm, cfg)
	if g != nil {
		assert.NoError(t, g.Close())
	}
	requireMissing(t, err, "NewGroup", R-1)
}

// The last rank does not call Close at first: the others' Close names it and
// frees nothing; when it closes, a second Close on the others succeeds.
func (s Suite) testSkippedClose(t *testing.T) {
	defer s.agree(t)
	R, me := s.Comm.Size(), s.Comm.Rank()
	sc := scenarios(R)[1]
	cfg := sc.config(ep.LowLatency)
	cfg.Backend, cfg.Timeout = s.Backend, skipTimeout
	g, err := ep.NewGroup[float32](s.Comm, cfg)
	require.NoError(t, err)
	oneRound(t, s, g, ep.LowLatency, sc)
	if me != R-1 {
		requireMissing(t, g.Close(), "Close", R-1)
	}
	// Every rank now closes: the last for the first time, the others again.
	require.NoError(t, s.Comm.Barrier())
	require.NoError(t, g.Close(), "rank %d: closing once every rank closes", me)
}
