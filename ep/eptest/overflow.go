package eptest

import (
	"fmt"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goep/goep/ep"
)

// testOverflow checks Config.Overflow policy: OverflowFail on every
// backend, OverflowDrop where the backend declares it (testFeatureRefusals
// checks its refusal where it does not).
func (s Suite) testOverflow(t *testing.T, policy ep.OverflowPolicy) {
	for _, sc := range []scenario{scenarios(s.Comm.Size())[0], scenarios(s.Comm.Size())[2]} {
		t.Run(sc.name, func(t *testing.T) { checkOverflow[ep.BF16](t, s, sc, policy) })
	}
	if policy == ep.OverflowDrop {
		t.Run("LowLatencyRefused", func(t *testing.T) {
			defer s.agree(t)
			cfg := scenarios(s.Comm.Size())[0].config(ep.LowLatency)
			cfg.Overflow, cfg.Backend, cfg.Timeout = ep.OverflowDrop, s.Backend, testTimeout
			_, err := ep.NewGroup[ep.BF16](s.Comm, cfg)
			require.Error(t, err)
			assert.ErrorContains(t, err, "is for HighThroughput groups")
		})
	}
}

// htKept is, for every rank, its tokens that fit at each destination with
// MaxRecvTokensPerRank = cap, by the rule of Config.Overflow: each rank's
// rows are kept source rank by source rank, each source's tokens in order,
// until it holds cap. kept[s][t][d] says whether rank s's token t reaches
// rank d.
func htKept(sc scenario, ins []input, R, cap int) [][][]bool {
	L, K := sc.experts/R, sc.topk
	kept := make([][][]bool, R)
	for s, in := range ins {
		kept[s] = make([][]bool, in.T)
		for t := range kept[s] {
			kept[s][t] = make([]bool, R)
		}
	}
	for d := 0; d < R; d++ {
		used := 0
		for s, in := range ins {
			for t := 0; t < in.T; t++ {
				goes := false
				for k := 0; k < K; k++ {
					if e := in.topk[t*K+k]; e >= 0 && int(e)/L == d {
						goes = true
					}
				}
				if goes && used < cap {
					kept[s][t][d] = true
					used++
				}
			}
		}
	}
	return kept
}

// A rank's received rows are exactly those the rule keeps, by source rank
// then token, with their local ids and weights; each source's handle lists
// the (token, slot) pairs that did not fit; identity experts combine each
// token to x times the ranks that kept it; a cached dispatch drops the
// same; and OverflowFail refuses the same dispatch on every rank.
func checkOverflow[E ep.Element](t *testing.T, s Suite, sc scenario, policy ep.OverflowPolicy) {
	defer s.agree(t)
	R, me, H, K := s.Comm.Size(), s.Comm.Rank(), sc.hidden, sc.topk
	L := sc.experts / R
	ins := allInputs(sc, R)
	in := ins[me]
	most := 0 // the most rows one rank gets: the cap is below it
	for d := 0; d < R; d++ {
		most = max(most, len(htExpected(sc, ins, d, R)))
	}
	cap := max(1, most*2/3)
	cfg := sc.config(ep.HighThroughput)
	cfg.MaxRecvTokensPerRank, cfg.Overflow = cap, policy
	g := newGroup[E](t, s, s.Backend, cfg)
	xh := payload[E](me, in.T, H)
	h, err := g.Dispatch(ep.Tokens(upload(t, g, xh), in.topk, in.weights))
	if policy == ep.OverflowFail {
		require.Error(t, err)
		assert.ErrorIs(t, err, ep.ErrBadInput)
		assert.ErrorContains(t, err, fmt.Sprintf("more than MaxRecvTokensPerRank = %d", cap))
		return
	}
	require.NoError(t, err)
	kept := htKept(sc, ins, R, cap)

	// What this rank received.
	var want []row
	for src, sin := range ins {
		for tok := 0; tok < sin.T; tok++ {
			if kept[src][tok][me] {
				want = append(want, row{src: src, tok: tok})
			}
		}
	}
	if !checkHTRows(t, h, ins, want, me, H, K, L, fmt.Sprintf("rows received with MaxRecvTokensPerRank = %d", cap)) {
		return
	}

	// What this rank's dispatch dropped.
	var dropped []int32
	hit := make([]int, in.T) // ranks that kept each token
	for tok := 0; tok < in.T; tok++ {
		for k := 0; k < K; k++ {
			if e := in.topk[tok*K+k]; e >= 0 && !kept[me][tok][int(e)/L] {
				dropped = append(dropped, int32(tok*K+k))
			}
		}
		for d := 0; d < R; d++ {
			if kept[me][tok][d] {
				hit[tok]++
			}
		}
	}
	assert.Equal(t, dropped, slices.Clone(h.Dropped()), "the (token, slot) pairs this rank's dispatch dropped")

	// Identity experts: a token comes back times the ranks that kept it.
	out := zeros[E](t, g, in.T*H)
	require.NoError(t, g.Combine(h, h.Recv(), out, nil))
	o1 := host(t, out)
	for tok := 0; tok < in.T; tok++ {
		if !rowsEqual(t, fmt.Sprintf("combined token %d (x * %d)", tok, hit[tok]), o1[tok*H:(tok+1)*H], scaled[E](me, tok, H, float32(hit[tok]))) {
			return
		}
	}
	// A cached dispatch of 2x drops the same and combines to twice as much.
	x2 := make([]E, len(xh))
	for i := range xh {
		x2[i] = ep.ElementOf[E](2 * ep.Float32Of(xh[i]))
	}
	h2, err := g.Dispatch(ep.Reuse(h, upload(t, g, x2), nil))
	require.NoError(t, err)
	assert.Equal(t, dropped, slices.Clone(h2.Dropped()), "a cached dispatch's drops")
	out2 := zeros[E](t, g, in.T*H)
	require.NoError(t, g.Combine(h2, h2.Recv(), out2, nil))
	for i, v := range host(t, out2) {
		if ep.Float32Of(v) != 2*ep.Float32Of(o1[i]) {
			t.Errorf("cached dispatch of 2x: out[%d] = %v, want 2 * %v", i, ep.Float32Of(v), ep.Float32Of(o1[i]))
			break
		}
	}
}
