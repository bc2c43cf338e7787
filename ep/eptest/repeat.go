package eptest

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/goep/goep/ep"
)

// testCombineRepeats: an HT handle combined several times in a row, with
// other expert outputs each time (a training step's forward and backward
// reusing one dispatch), gives each combine its own sums. Across nodes, a
// rail peer that finished one combine returns the next one's sums at once:
// they must not land on the sums a slower token rank is still reducing.
// The rows are large enough (256 tokens of 4 KiB per rank) that a rank's
// reduce overlaps its peers' next combine.
func (s Suite) testCombineRepeats(t *testing.T) {
	defer s.agree(t)
	R, me := s.Comm.Size(), s.Comm.Rank()
	sc := scenario{name: "repeats", experts: 2 * R, topk: 2, maxTok: 256, hidden: 1024, seed: 21,
		tokens: func(int, int) int { return 256 }, route: randomRoute(0.1)}
	g := newGroup[float32](t, s, s.Backend, sc.config(ep.HighThroughput))
	in := sc.input(me, R)
	H := sc.hidden
	h, err := g.Dispatch(ep.Tokens(upload(t, g, payload[float32](me, in.T, H)), in.topk, in.weights))
	require.NoError(t, err)
	recv := host(t, h.Recv())
	const repeats = 12
	ys := make([]ep.Tensor[float32], 3) // the expert outputs: Recv times 1, 2 and 4
	for i := range ys {
		y := make([]float32, len(recv))
		for j, v := range recv {
			y[j] = v * float32(int(1)<<i)
		}
		ys[i] = upload(t, g, y)
	}
	outs := make([]ep.Tensor[float32], repeats)
	for i := range outs {
		outs[i] = zeros[float32](t, g, in.T*H)
	}
	for i := range outs { // back to back, nothing between the calls
		require.NoError(t, g.Combine(h, ys[i%3], outs[i], nil), "combine %d", i)
	}
	first := host(t, outs[0])
	for i := 1; i < repeats; i++ {
		f := float32(int(1) << (i % 3)) // a power of two: the sums scale exactly
		got := host(t, outs[i])
		for j, v := range first {
			if got[j] != f*v {
				t.Fatalf("combine %d of one handle: out[%d] (token %d) = %v, want %v x %v (the first combine's)", i, j, j/H, got[j], f, v)
			}
		}
	}
}
