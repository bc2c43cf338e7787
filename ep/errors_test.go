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

// Every rank makes the same bad call, so each gets its error without
// waiting for a peer; afterwards a normal round must still be right: nothing
// was written.
func TestBadInputIsRefusedAndWritesNothing(t *testing.T) {
	w := mpitesting.World
	R, me := w.Size(), w.Rank()
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) {
			defer mpitesting.Agree(t, w)
			sc := scenarios(R)[0]
			g := newGroup[float32](t, sc.config(mode))
			other := newGroup[float32](t, sc.config(mode))
			H, K, M, E := sc.hidden, sc.topk, sc.maxTok, sc.experts
			in := sc.input(me, R)
			x := payload[float32](me, in.T, H)
			one := func(ids ...int32) []int32 { return ids }
			w1 := make([]float32, K)
			x1 := make([]float32, H)
			dup := one(0, 0, -1)[:K]
			cases := []struct {
				name string
				call func() error
				want string
			}{
				{"expert id too large", func() error { _, err := g.Dispatch(x1, one(0, int32(E), -1)[:K], w1); return err }, "topk[0][1] = " + itoa(E) + " is out of range [-1, " + itoa(E) + ")"},
				{"expert id below -1", func() error { _, err := g.Dispatch(x1, one(-2, 0, 1)[:K], w1); return err }, "topk[0][0] = -2 is out of range"},
				{"expert repeated in a token", func() error { _, err := g.Dispatch(x1, dup, w1); return err }, "token 0 names expert 0 twice"},
				{"more tokens than MaxTokensPerRank", func() error {
					_, err := g.Dispatch(make([]float32, (M+1)*H), make([]int32, (M+1)*K), make([]float32, (M+1)*K))
					return err
				}, "17 tokens exceed MaxTokensPerRank = 16"},
				{"x too short", func() error { _, err := g.Dispatch(x1[:H-1], one(0, 1, 2)[:K], w1); return err }, "len(x) = " + itoa(H-1)},
				{"weights too short", func() error { _, err := g.Dispatch(x1, one(0, 1, 2)[:K], w1[:K-1]); return err }, "len(weights) = " + itoa(K-1)},
				{"topk not a multiple of TopK", func() error { _, err := g.Dispatch(x1, one(0), w1); return err }, "len(topk) = 1 is not a multiple of TopK"},
				{"layout of a bad id", func() error { _, err := g.Layout(one(0, int32(E+5), 1)[:K]); return err }, "out of range"},
				{"nil handle", func() error { return g.Combine(nil, nil, nil, nil) }, "nil handle"},
			}
			for _, c := range cases {
				err := c.call()
				if assert.Error(t, err, c.name) {
					assert.Contains(t, err.Error(), c.want, c.name)
				}
			}

			// Handle checks need a real handle: one from the other group.
			h2, err := other.Dispatch(x, in.topk, in.weights)
			require.NoError(t, err)
			err = g.Combine(h2, h2.Recv(), make([]float32, in.T*H), nil)
			assert.ErrorContains(t, err, "belongs to another group")
			err = other.Combine(h2, h2.Recv()[:1], make([]float32, in.T*H), nil)
			assert.ErrorContains(t, err, "len(y) = 1")
			err = other.Combine(h2, h2.Recv(), make([]float32, in.T*H+1), nil)
			assert.ErrorContains(t, err, "len(out) = ")
			err = other.Combine(h2, h2.Recv(), make([]float32, in.T*H), &ep.CombineOptions{RowValues: []float32{1}})
			assert.ErrorContains(t, err, "set both RowValues and SlotValues")
			if mode == ep.HighThroughput {
				err = other.Combine(h2, h2.Recv(), make([]float32, in.T*H), &ep.CombineOptions{WeightsOverride: in.weights})
				assert.ErrorContains(t, err, "WeightsOverride is for LL mode")
			}
			require.NoError(t, other.Combine(h2, h2.Recv(), make([]float32, in.T*H), nil))
			if mode == ep.LowLatency {
				err = other.Combine(h2, h2.Recv(), make([]float32, in.T*H), nil)
				assert.ErrorContains(t, err, "already been combined")
				// Two dispatches may wait for their combine; a third is refused.
				a, err := other.Dispatch(x, in.topk, in.weights)
				require.NoError(t, err)
				b, err := other.Dispatch(x, in.topk, in.weights)
				require.NoError(t, err)
				_, err = other.Dispatch(x, in.topk, in.weights)
				assert.ErrorContains(t, err, "two LL dispatches are already waiting")
				require.NoError(t, other.Combine(a, a.Recv(), make([]float32, in.T*H), nil))
				require.NoError(t, other.Combine(b, b.Recv(), make([]float32, in.T*H), nil))
			}

			// The refused calls wrote nothing: a normal round is still right.
			h, err := g.Dispatch(x, in.topk, in.weights)
			require.NoError(t, err)
			out := make([]float32, in.T*H)
			require.NoError(t, g.Combine(h, h.Recv(), out, nil))
			checkIdentityCombine(t, mode, sc, in, out)
		})
	}
}

func itoa(i int) string { return fmtInt(i) }

func TestInvalidConfigs(t *testing.T) {
	w := mpitesting.World
	R := w.Size()
	good := ep.Config{Mode: ep.LowLatency, NumExperts: 2 * R, MaxTokensPerRank: 4, Hidden: 8, TopK: 2}
	type badConfig struct {
		name string
		edit func(*ep.Config)
		want string
	}
	cases := []badConfig{
		{"no mode", func(c *ep.Config) { c.Mode = 0 }, "choose ep.LowLatency or ep.HighThroughput"},
		{"top-k above experts", func(c *ep.Config) { c.TopK = 2*R + 1 }, "TopK = " + itoa(2*R+1)},
		{"zero hidden", func(c *ep.Config) { c.Hidden = 0 }, "Hidden = 0"},
		{"zero tokens", func(c *ep.Config) { c.MaxTokensPerRank = 0 }, "MaxTokensPerRank = 0"},
	}
	if R > 1 { // with one rank every expert count divides
		cases = append(cases, badConfig{"experts not a multiple of ranks", func(c *ep.Config) { c.NumExperts = 2*R + 1 },
			"not a multiple of the " + itoa(R) + " ranks"})
	}
	for _, tc := range cases {
		cfg := good
		tc.edit(&cfg)
		_, err := ep.NewGroup[float32](w, cfg)
		if assert.Error(t, err, tc.name) {
			assert.Contains(t, err.Error(), tc.want, tc.name)
		}
	}
	if R > 1 {
		cfg := good
		if w.Rank() == R-1 {
			cfg.Hidden = 16
		}
		_, err := ep.NewGroup[float32](w, cfg)
		require.Error(t, err, "every rank must see the mismatch")
		assert.Contains(t, err.Error(), "ranks passed different configs")
		assert.Contains(t, err.Error(), "rank "+itoa(R-1)+" has Hidden = 16, rank 0 has 8")
		// element types differ
		if w.Rank() == R-1 {
			_, err = ep.NewGroup[ep.BF16](w, good)
		} else {
			_, err = ep.NewGroup[float32](w, good)
		}
		assert.ErrorContains(t, err, "element type = bfloat16, rank 0 has float32")
	}
	mpitesting.Agree(t, w)
}

func TestUseAfterClose(t *testing.T) {
	w := mpitesting.World
	sc := scenarios(w.Size())[1]
	g, err := ep.NewGroup[float32](w, sc.config(ep.HighThroughput))
	require.NoError(t, err)
	in := sc.input(w.Rank(), w.Size())
	h, err := g.Dispatch(payload[float32](w.Rank(), in.T, sc.hidden), in.topk, in.weights)
	require.NoError(t, err)
	require.NoError(t, g.Combine(h, h.Recv(), make([]float32, in.T*sc.hidden), nil))
	require.NoError(t, g.Close())
	_, err = g.Dispatch(payload[float32](w.Rank(), in.T, sc.hidden), in.topk, in.weights)
	assert.ErrorIs(t, err, ep.ErrClosed)
	err = g.Combine(h, make([]float32, h.NumRecv()*sc.hidden), make([]float32, in.T*sc.hidden), nil)
	assert.ErrorIs(t, err, ep.ErrClosed)
	_, err = g.Layout(in.topk)
	assert.ErrorIs(t, err, ep.ErrClosed)
	assert.NoError(t, g.Close(), "closing twice is harmless")
	mpitesting.Agree(t, w)
}

// The last rank stops taking part: the others get a timeout naming it,
// within the group's timeout, and the group refuses further work.
func TestStalledRankTimesOut(t *testing.T) {
	w := mpitesting.World
	R, me := w.Size(), w.Rank()
	if R < 2 {
		t.Skip("needs a second rank to stall: run under mpirun with 2 or more ranks")
	}
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) {
			defer mpitesting.Agree(t, w)
			sc := scenarios(R)[1]
			cfg := sc.config(mode)
			cfg.Timeout = 500 * time.Millisecond
			g, err := ep.NewGroup[float32](w, cfg)
			require.NoError(t, err)
			in := sc.input(me, R)
			x := payload[float32](me, in.T, sc.hidden)
			if me != R-1 {
				start := time.Now()
				_, err := g.Dispatch(x, in.topk, in.weights)
				elapsed := time.Since(start)
				require.Error(t, err)
				assert.True(t, errors.Is(err, ep.ErrTimeout), "want a timeout, got %v", err)
				var te *ep.TimeoutError
				if assert.ErrorAs(t, err, &te) {
					assert.Equal(t, R-1, te.Peer, "the stalled rank is named: %v", err)
				}
				assert.Less(t, elapsed, 5*time.Second)
				_, err = g.Dispatch(x, in.topk, in.weights)
				assert.ErrorContains(t, err, "unusable after an earlier failure")
			} else {
				time.Sleep(3 * cfg.Timeout) // stalled well past the others' timeout
			}
			// Everybody meets again before the collective Close.
			require.NoError(t, w.Barrier())
			require.NoError(t, g.Close())
		})
	}
}
