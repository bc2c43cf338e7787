package eptest

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goep/goep/ep"
)

// When one rank's calls stop matching the others' (it made a step the
// others did not, skipped a call, made another kind of call, released a
// handle the others combine, closed the group), every rank's call fails
// with an error that matches ep.ErrMismatch and names a rank and the call,
// never a timeout and never a result; the group is unusable on every rank
// afterwards and closes normally. The group's timeout is a minute: a check
// that waited for it would fail for the kind of its error, not for taking
// long.
func (s Suite) testMismatchedCalls(t *testing.T) {
	R := s.Comm.Size()
	if R < 2 {
		t.Skip("needs a second rank whose calls differ: run under mpirun with 2 or more ranks")
	}
	origin := R - 1
	cases := []struct {
		name  string
		modes []ep.Mode
		// run makes this rank's calls, given a group on which one round
		// has run (and its handle h, combined), and returns the error of
		// its call that must fail.
		run func(g *ep.Group[float32], me int, dispatch func() (ep.Handle[float32], error),
			combine func(ep.Handle[float32]) error) error
	}{
		{"StepMarkedOnOneRank", modes, func(g *ep.Group[float32], me int, dispatch func() (ep.Handle[float32], error),
			_ func(ep.Handle[float32]) error) error {
			if me == origin { // a step of its own: the C interface's handle whose creation it refused
				g.Mark()
			}
			_, err := dispatch()
			return err
		}},
		{"CombineSkippedOnOneRank", modes, func(g *ep.Group[float32], me int, dispatch func() (ep.Handle[float32], error),
			combine func(ep.Handle[float32]) error) error {
			h, err := dispatch()
			if err != nil {
				return err
			}
			if me != origin {
				if err := combine(h); err != nil {
					return err
				}
			}
			_, err = dispatch()
			return err
		}},
		{"DispatchWhereOthersCombine", modes, func(g *ep.Group[float32], me int, dispatch func() (ep.Handle[float32], error),
			combine func(ep.Handle[float32]) error) error {
			h, err := dispatch()
			if err != nil {
				return err
			}
			if me == origin {
				_, err = dispatch()
				return err
			}
			return combine(h)
		}},
		{"ReleaseWhereOthersCombine", []ep.Mode{ep.LowLatency}, func(g *ep.Group[float32], me int,
			dispatch func() (ep.Handle[float32], error), combine func(ep.Handle[float32]) error) error {
			h, err := dispatch()
			if err != nil {
				return err
			}
			if me == origin {
				return g.Release(h)
			}
			return combine(h)
		}},
		{"CloseWhereOthersDispatch", modes, func(g *ep.Group[float32], me int, dispatch func() (ep.Handle[float32], error),
			_ func(ep.Handle[float32]) error) error {
			if me == origin {
				require.NoError(t, g.Close()) // the others come to Close after their error
				return ep.ErrMismatch         // what the others' dispatch is checked for
			}
			_, err := dispatch()
			return err
		}},
	}
	for _, c := range cases {
		for _, mode := range c.modes {
			t.Run(c.name+"/"+mode.String(), func(t *testing.T) {
				defer s.agree(t)
				me := s.Comm.Rank()
				r := s.newRound(t, mode, func(c *ep.Config) { c.Timeout = time.Minute })
				sc, in, g, x, out := r.sc, r.in, r.g, r.x, r.out
				dispatch := func() (ep.Handle[float32], error) { return g.Dispatch(ep.Tokens(x, in.topk, in.weights)) }
				combine := func(h ep.Handle[float32]) error { return g.Combine(h, h.Recv(), out, nil) }
				h, err := dispatch() // one good round first: the calls match up to here
				require.NoError(t, err)
				require.NoError(t, combine(h))
				checkRound(t, mode, sc, in, me, R, host(t, out))

				err = c.run(g, me, dispatch, combine)
				require.Error(t, err, "rank %d's calls differ from the others': every rank's call must fail", origin)
				assert.ErrorIs(t, err, ep.ErrMismatch, "the error says that the calls no longer match: %v", err)
				assert.NotErrorIs(t, err, ep.ErrTimeout, "found in the exchange, not by waiting for a timeout: %v", err)
				var se *ep.SequenceError
				var ue *ep.UnusableError
				switch {
				case me == origin && c.name == "CloseWhereOthersDispatch":
				case errors.As(err, &se):
					assert.NotEqual(t, me, se.Rank, "another rank is named: %v", err)
					assert.Contains(t, err.Error(), "at call ")
				case errors.As(err, &ue):
					assert.NotEqual(t, me, ue.Rank, "the rank that found it is named: %v", err)
					assert.Contains(t, ue.Reason, "at call ")
				default:
					t.Errorf("want an *ep.SequenceError or *ep.UnusableError, got %T: %v", err, err)
				}
				if c.name == "CloseWhereOthersDispatch" && me == origin {
					return
				}
				_, err = dispatch()
				assert.ErrorContains(t, err, "unusable", "and the group stays unusable")
				if c.name == "CloseWhereOthersDispatch" {
					require.NoError(t, g.Close()) // where the origin waits for every rank, before the next collective
				}
			})
		}
	}
}

// Release gives a handle's buffers back: an LL handle released instead of
// combined (every rank releases it) no longer counts against the two
// dispatches that may wait for their combine, so that dispatches go on and
// their results are right; a handle whose combine every rank refused is
// released the same way; a released handle is refused afterwards, and
// releasing it again, or a zero handle, does nothing.
func (s Suite) testRelease(t *testing.T) {
	R := s.Comm.Size()
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) {
			defer s.agree(t)
			me := s.Comm.Rank()
			r := s.newRound(t, mode, func(c *ep.Config) { c.Timeout = time.Minute })
			sc, in, g, x, out := r.sc, r.in, r.g, r.x, r.out
			for i := 0; i < 5; i++ { // more than the two buffer sets, each released in turn
				h, err := g.Dispatch(ep.Tokens(x, in.topk, in.weights))
				require.NoError(t, err, "dispatch %d", i)
				require.NoError(t, g.Release(h), "release %d", i)
				assert.True(t, h.Recv().IsZero(), "a released handle has no views")
				assert.Error(t, g.Combine(h, x, out, nil), "a released handle is refused")
				assert.NoError(t, g.Release(h), "releasing it again does nothing")
			}
			assert.NoError(t, g.Release(ep.Handle[float32]{}), "nor does releasing the zero handle")
			// A combine every rank refused (one rank's output is too long),
			// then the handle released on every rank.
			for i := 0; i < 3; i++ {
				h, err := g.Dispatch(ep.Tokens(x, in.topk, in.weights))
				require.NoError(t, err)
				o := out
				if me == R-1 {
					o = zeros[float32](t, g, in.T*sc.hidden+1)
				}
				require.ErrorIs(t, g.Combine(h, h.Recv(), o, nil), ep.ErrBadInput)
				require.NoError(t, g.Release(h))
			}
			h, err := g.Dispatch(ep.Tokens(x, in.topk, in.weights))
			require.NoError(t, err)
			require.NoError(t, g.Combine(h, h.Recv(), out, nil))
			checkRound(t, mode, sc, in, me, R, host(t, out))
		})
	}
}
