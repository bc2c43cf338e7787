package eptest

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goep/goep/ep"
)

// One rank's refused input fails the same call on every rank, promptly
// (long before the group's timeout), with one error naming that rank and
// what was wrong; the group stays usable, and the next round is right.
func (s Suite) testRefusalFailsEveryRank(t *testing.T) {
	R, me := s.Comm.Size(), s.Comm.Rank()
	origin := R - 1
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) {
			defer s.agree(t)
			r := s.newRound(t, mode, func(c *ep.Config) { c.Timeout = time.Minute }) // a refusal must not wait for it
			sc, in, g, x, out := r.sc, r.in, r.g, r.x, r.out
			H, E := sc.hidden, sc.experts
			bad := append([]int32(nil), in.topk...)
			bad[0] = int32(E) // out of range
			cases := []struct {
				name string
				call func() error
				want string // the origin's reason
			}{
				{"bad expert id", func() error {
					topk := in.topk
					if me == origin {
						topk = bad
					}
					h, err := g.Dispatch(ep.Tokens(x, topk, in.weights))
					if err == nil {
						err = g.Combine(h, h.Recv(), out, nil)
					}
					return err
				}, "is out of range"},
				{"wrong output length in combine", func() error {
					h, err := g.Dispatch(ep.Tokens(x, in.topk, in.weights))
					require.NoError(t, err)
					o := out
					if me == origin {
						o = zeros[float32](t, g, in.T*H+1)
					}
					err = g.Combine(h, h.Recv(), o, nil)
					if err != nil && mode == ep.LowLatency { // the handle is still to combine
						require.NoError(t, g.Combine(h, h.Recv(), out, nil))
					}
					return err
				}, "len(out) = "},
				{"zero handle in combine", func() error {
					h, err := g.Dispatch(ep.Tokens(x, in.topk, in.weights))
					require.NoError(t, err)
					hh := h
					if me == origin {
						hh = ep.Handle[float32]{}
					}
					err = g.Combine(hh, h.Recv(), out, nil)
					if err != nil && mode == ep.LowLatency {
						require.NoError(t, g.Combine(h, h.Recv(), out, nil))
					}
					return err
				}, "nil handle"},
			}
			for _, c := range cases {
				start := time.Now()
				err := c.call()
				elapsed := time.Since(start)
				if !assert.Error(t, err, c.name) {
					continue
				}
				assert.ErrorIs(t, err, ep.ErrBadInput, c.name)
				// A call that waited for the refusing rank would end in a timeout.
				assert.NotErrorIs(t, err, ep.ErrTimeout, "%s: the refusal took %v: it waited for a timeout", c.name, elapsed)
				assert.Contains(t, err.Error(), c.want, c.name)
				if me != origin {
					var refused *ep.RefusedError
					if assert.ErrorAs(t, err, &refused, c.name) {
						assert.Equal(t, origin, refused.Rank, c.name)
					}
				}
				// The group is still usable: a normal round is right.
				h, err := g.Dispatch(ep.Tokens(x, in.topk, in.weights))
				require.NoError(t, err, c.name)
				require.NoError(t, g.Combine(h, h.Recv(), out, nil), c.name)
				checkIdentityCombine(t, s, mode, sc, in, host(t, out))
			}
		})
	}
}
