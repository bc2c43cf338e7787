package ep_test

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/goep/goep/ep"
	"github.com/goep/goep/internal/mpitesting"
	"github.com/stretchr/testify/require"
)

// LL's direct path and its general path are one protocol, so the ranks of
// a node may take either: here odd ranks take the general path and even
// ranks the direct one (on one node; across nodes every rank takes the
// general one), for rounds of varied sizes on both buffer sets, and every
// rank's received rows, tokens' sources, weights and combined outputs must
// equal the two-sided baseline's bit for bit.
func TestLLPathsInterop(t *testing.T) {
	w := mpitesting.World
	R, me := w.Size(), w.Rank()
	if R < 2 {
		t.Skip("needs 2 ranks or more: the two paths meet across ranks")
	}
	const M, H, K = 8, 64, 3
	cfg := ep.Config{Mode: ep.LowLatency, NumExperts: 4 * R, MaxTokensPerRank: M, Hidden: H, TopK: K}
	if me%2 == 1 {
		cfg.Backend = ep.CPUGeneralLL // the same name as ep.CPU: one protocol
	}
	g, err := ep.NewGroup[ep.BF16](w, cfg)
	require.NoError(t, err)
	defer g.Close()
	cfg.Backend = ep.Alltoallv
	ref, err := ep.NewGroup[ep.BF16](w, cfg)
	require.NoError(t, err)
	defer ref.Close()

	rng := rand.New(rand.NewPCG(17, uint64(me)))
	for round := 0; round < 6; round++ {
		T := (round + me) % (M + 1) // 0 to M tokens: some ranks send nothing in some rounds
		topk, weights := make([]int32, T*K), make([]float32, T*K)
		for tk := 0; tk < T; tk++ {
			for k, e := range rng.Perm(4 * R)[:K] {
				topk[tk*K+k], weights[tk*K+k] = int32(e), rng.Float32()
			}
			topk[tk*K+rng.IntN(K)] = -1 // one slot unused
		}
		x := make([]ep.BF16, T*H)
		for i := range x {
			x[i] = ep.ElementOf[ep.BF16](rng.Float32()*2 - 1)
		}
		h, err := g.Dispatch(ep.Tokens(ep.Host(x), topk, weights))
		require.NoError(t, err, "round %d", round)
		rh, err := ref.Dispatch(ep.Tokens(ep.Host(x), topk, weights))
		require.NoError(t, err, "round %d", round)
		require.Equal(t, rh.ExpertCounts(), h.ExpertCounts(), "round %d: rows per local expert", round)
		recv, rrecv := h.Recv().Host(), rh.Recv().Host()
		wts, rwts := h.RecvWeights().Host(), rh.RecvWeights().Host()
		y := make([]ep.BF16, len(recv)) // the experts: y = 2x + 1
		for l, n := range h.ExpertCounts() {
			for j := 0; j < n; j++ {
				r := l*R*M + j
				require.True(t, slices.Equal(rrecv[r*H:(r+1)*H], recv[r*H:(r+1)*H]), "round %d: received row %d", round, r)
				require.Equal(t, rwts[r], wts[r], "round %d: weight of row %d", round, r)
				src, tok, err := h.Source(r)
				require.NoError(t, err)
				rsrc, rtok, err := rh.Source(r)
				require.NoError(t, err)
				require.Equal(t, [2]int{rsrc, rtok}, [2]int{src, tok}, "round %d: source of row %d", round, r)
				for c := 0; c < H; c++ {
					y[r*H+c] = ep.ElementOf[ep.BF16](2*ep.Float32Of(recv[r*H+c]) + 1)
				}
			}
		}
		out, rout := make([]ep.BF16, T*H), make([]ep.BF16, T*H)
		require.NoError(t, g.Combine(h, ep.Host(y), ep.Host(out), nil), "round %d", round)
		require.NoError(t, ref.Combine(rh, ep.Host(y), ep.Host(rout), nil), "round %d", round)
		require.True(t, slices.Equal(rout, out), "round %d: combined outputs differ from the baseline's", round)
	}
}
