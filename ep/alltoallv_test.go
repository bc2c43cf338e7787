package ep_test

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goep/goep/ep"
	"github.com/goep/goep/internal/mpitesting"
)

// Group against the hand-written MPI_Alltoallv path, on random real-valued
// data: the same rows, counts and metadata; combine results bit-identical
// (LL always; HT on one node, where both sum ranks in order) or, for HT
// across nodes, where partials are summed per node first, within rounding.
func TestMatchesAlltoallvReference(t *testing.T) {
	w := mpitesting.World
	for _, mode := range modes {
		for _, sc := range scenarios(w.Size())[:2] {
			t.Run(fmt.Sprintf("%v/%s/f32", mode, sc.name), func(t *testing.T) { checkAgainstAlltoallv[float32](t, mode, sc) })
			t.Run(fmt.Sprintf("%v/%s/bf16", mode, sc.name), func(t *testing.T) { checkAgainstAlltoallv[ep.BF16](t, mode, sc) })
		}
	}
}

func checkAgainstAlltoallv[E ep.Element](t *testing.T, mode ep.Mode, sc scenario) {
	w := mpitesting.World
	defer mpitesting.Agree(t, w)
	g := newGroup[E](t, sc.config(mode))
	ref, err := ep.NewAlltoallvGroup[E](w, sc.config(mode))
	require.NoError(t, err)
	defer func() { assert.NoError(t, ref.Close()) }()
	R, me, H := w.Size(), w.Rank(), sc.hidden
	in := sc.input(me, R)
	rng := rand.New(rand.NewPCG(99, uint64(me)))
	x := make([]E, in.T*H)
	weights := make([]float32, len(in.weights))
	for i := range x {
		x[i] = fromF32[E](rng.Float32()*2 - 1)
	}
	for i := range weights {
		weights[i] = rng.Float32()
	}
	h, err := g.Dispatch(x, in.topk, weights)
	require.NoError(t, err)
	rh, err := ref.Dispatch(x, in.topk, weights)
	require.NoError(t, err)
	assert.Equal(t, rh.ExpertCounts, h.ExpertCounts(), "rows per local expert")
	rows := validRows(h, sc, R)
	for _, r := range rows {
		if !slices.Equal(rh.Recv[r*H:(r+1)*H], h.Recv()[r*H:(r+1)*H]) {
			t.Fatalf("received row %d differs from the alltoallv path", r)
		}
	}
	if mode == ep.HighThroughput {
		assert.Equal(t, rh.RecvTopK, h.RecvTopK())
		assert.Equal(t, rh.RecvWeights, h.RecvWeights())
	} else {
		for _, r := range rows {
			require.Equal(t, rh.RecvWeights[r], h.RecvWeights()[r], "weight of row %d", r)
		}
	}
	// Non-trivial experts: y = 3x - 0.5, row by row.
	y := make([]E, len(h.Recv()))
	for _, r := range rows {
		for c := 0; c < H; c++ {
			y[r*H+c] = fromF32[E](3*toF32(h.Recv()[r*H+c]) - 0.5)
		}
	}
	out := make([]E, in.T*H)
	require.NoError(t, g.Combine(h, y, out, nil))
	refOut := make([]E, in.T*H)
	require.NoError(t, ref.Combine(rh, slices.Clone(y), refOut))
	if mode == ep.LowLatency || g.Nodes() == 1 {
		assert.True(t, slices.Equal(out, refOut), "combine differs from the alltoallv path")
		return
	}
	for i := range out {
		a, b := float64(toF32(out[i])), float64(toF32(refOut[i]))
		if d := a - b; d > 1e-2*(1+abs(b)) || d < -1e-2*(1+abs(b)) {
			t.Fatalf("combined element %d = %v, alltoallv path %v", i, a, b)
		}
	}
}
