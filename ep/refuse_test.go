package ep_test

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goep/goep/ep"
	"github.com/goep/goep/internal/mpitesting"
)

// A layer above ep that refuses its caller's arguments on one rank
// (RefuseDispatch, RefuseCombine) fails every rank's same call at once,
// naming that rank and its reason, and the group goes on: fresh, cached
// and combine, in both modes.
func TestRefuseOnOneRank(t *testing.T) {
	w := mpitesting.World
	R, me := w.Size(), w.Rank()
	for _, mode := range []ep.Mode{ep.LowLatency, ep.HighThroughput} {
		t.Run(mode.String(), func(t *testing.T) {
			defer mpitesting.Agree(t, w)
			const H, K = 8, 2
			cfg := ep.Config{Mode: mode, NumExperts: 2 * R, MaxTokensPerRank: 4, Hidden: H, TopK: K, Timeout: 20 * time.Second}
			g, err := ep.NewGroup[float32](w, cfg)
			require.NoError(t, err)
			defer g.Close()
			x := make([]float32, 2*H)
			topk := []int32{0, int32(2*R - 1), int32(R), -1}
			weights := []float32{1, 1, 1, 0}
			const reason = "inputs->tokens has shape [2, 9], want [2, 8]"
			bad := R - 1 // the last rank refuses
			check := func(what string, err error) {
				t.Helper()
				require.Error(t, err, what)
				assert.True(t, errors.Is(err, ep.ErrBadInput), "%s: %v", what, err)
				// At once: a call that waited for the refusing rank would end in a timeout.
				assert.False(t, errors.Is(err, ep.ErrTimeout), "%s: %v", what, err)
				assert.ErrorContains(t, err, reason, what)
				if me != bad {
					var re *ep.RefusedError
					if assert.ErrorAs(t, err, &re, what) {
						assert.Equal(t, bad, re.Rank, what)
					}
				}
			}
			if me == bad {
				check("fresh", g.RefuseDispatch(ep.Handle[float32]{}, reason))
			} else {
				_, err := g.Dispatch(ep.Tokens(ep.Host(x), topk, weights))
				check("fresh", err)
			}
			h, err := g.Dispatch(ep.Tokens(ep.Host(x), topk, weights))
			require.NoError(t, err, "the group goes on")
			if me == bad {
				check("cached", g.RefuseDispatch(h, reason))
				check("combine", g.RefuseCombine(h, reason))
			} else {
				_, err := g.Dispatch(ep.Reuse(h, ep.Host(x), nil))
				check("cached", err)
				check("combine", g.Combine(h, h.CombineBuffer(), ep.Host(make([]float32, 2*H)), nil))
			}
			require.NoError(t, g.Combine(h, h.CombineBuffer(), ep.Host(make([]float32, 2*H)), nil))
		})
	}
}
