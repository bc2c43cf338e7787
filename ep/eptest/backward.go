package eptest

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goep/goep/ep"
	"github.com/goep/goep/mpi"
)

// Combine is the transpose of dispatch: for any x and y,
// sum over ranks <Dispatch(x), y> = sum over ranks <x, Combine(y)>, and the
// backward of a combine is a cached dispatch of the output gradient.
func (s Suite) testBackwardIsTranspose(t *testing.T) {
	R, me := s.Comm.Size(), s.Comm.Rank()
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) {
			defer s.agree(t)
			sc := scenarios(R)[0]
			g := newGroup[float32](t, s, s.Backend, sc.config(mode))
			H, K := sc.hidden, sc.topk
			in := sc.input(me, R)
			var opts *ep.CombineOptions
			if mode == ep.LowLatency {
				ones := make([]float32, in.T*K)
				for i := range ones {
					ones[i] = 1
				}
				opts = &ep.CombineOptions{WeightsOverride: ones}
			}
			checkTranspose(t, s, g, mode, in, H, opts, 0, func(h ep.Handle[float32]) []int {
				return validRows(mode, h.ExpertCounts(), h.NumRecv(), R*sc.maxTok)
			})
		})
	}
}

// checkTranspose checks, summed over ranks, that g's combine is the
// transpose of its dispatch (<D x, y> = <x, C y>) and that the backward of
// the combine, a cached dispatch of the output gradient, is the transpose
// of the combine (<C y, g> = <y, D_cached g>), for x, y and g of small
// integers, whose products and sums are exact. valid lists a handle's
// received rows; y's other rows hold pad (NaN where no one may read them).
func checkTranspose(t *testing.T, s Suite, g *ep.Group[float32], mode ep.Mode, in input, H int,
	opts *ep.CombineOptions, pad float32, valid func(ep.Handle[float32]) []int) {
	me := s.Comm.Rank()
	small := func(i, salt int) float32 { return float32((i*7+salt*13+me*5)%9 - 4) }
	x := make([]float32, in.T*H)
	for i := range x {
		x[i] = small(i, 1)
	}
	h, err := g.Dispatch(ep.Tokens(upload(t, g, x), in.topk, in.weights))
	require.NoError(t, err)
	recv := host(t, h.Recv())
	y := make([]float32, len(recv))
	for i := range y {
		y[i] = pad
	}
	var lhs float64
	for _, r := range valid(h) {
		for c := 0; c < H; c++ {
			y[r*H+c] = small(r*H+c, 2)
			lhs += float64(recv[r*H+c]) * float64(y[r*H+c])
		}
	}
	outT := zeros[float32](t, g, in.T*H)
	require.NoError(t, g.Combine(h, upload(t, g, y), outT, opts))
	out := host(t, outT)
	var rhs float64
	for i := range x {
		rhs += float64(x[i]) * float64(out[i])
	}
	sums := make([]float64, 2)
	require.NoError(t, mpi.Allreduce(s.Comm, mpi.OpSum, []float64{lhs, rhs}, sums))
	assert.Equal(t, sums[0], sums[1], "<D x, y> = <x, C y> summed over ranks")

	// Backward of the combine: dispatch the output gradient with the same routing.
	gradOut := make([]float32, in.T*H)
	var lhs2 float64
	for i := range gradOut {
		gradOut[i] = small(i, 3)
		lhs2 += float64(out[i]) * float64(gradOut[i])
	}
	hb, err := g.Dispatch(ep.Reuse(h, upload(t, g, gradOut), nil))
	require.NoError(t, err)
	var rhs2 float64
	grecv := host(t, hb.Recv())
	for _, r := range valid(hb) {
		for c := 0; c < H; c++ {
			rhs2 += float64(y[r*H+c]) * float64(grecv[r*H+c])
		}
	}
	require.NoError(t, mpi.Allreduce(s.Comm, mpi.OpSum, []float64{lhs2, rhs2}, sums))
	assert.Equal(t, sums[0], sums[1], "<C y, g> = <y, D_cached g> summed over ranks")
	if mode == ep.LowLatency {
		require.NoError(t, g.Combine(hb, hb.Recv(), zeros[float32](t, g, in.T*H), nil))
	}
}

// RowValues travel back to their (token, slot): the gradient of the gate.
func (s Suite) testRowValues(t *testing.T) {
	R, me := s.Comm.Size(), s.Comm.Rank()
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) {
			defer s.agree(t)
			sc := scenarios(R)[0]
			g := newGroup[float32](t, s, s.Backend, sc.config(mode))
			H, K, L := sc.hidden, sc.topk, sc.experts/R
			in := sc.input(me, R)
			f := func(src, tok, expert int) float32 { return float32(src*10000 + tok*100 + expert) }
			h, err := g.Dispatch(ep.Tokens(upload(t, g, payload[float32](me, in.T, H)), in.topk, in.weights))
			require.NoError(t, err)
			var rowValues []float32
			if mode == ep.LowLatency {
				span := R * sc.maxTok
				rowValues = make([]float32, L*span)
				for _, r := range validRows(mode, h.ExpertCounts(), h.NumRecv(), span) {
					src, tok, err := h.Source(r)
					require.NoError(t, err)
					rowValues[r] = f(src, tok, me*L+r/span)
				}
			} else {
				rowValues = make([]float32, h.NumRecv()*K)
				ids := host(t, h.RecvTopK())
				for r := 0; r < h.NumRecv(); r++ {
					src, tok, err := h.Source(r)
					require.NoError(t, err)
					for k := 0; k < K; k++ {
						if ids[r*K+k] >= 0 {
							rowValues[r*K+k] = f(src, tok, me*L+int(ids[r*K+k]))
						}
					}
				}
			}
			slots := zeros[float32](t, g, in.T*K)
			out := zeros[float32](t, g, in.T*H)
			require.NoError(t, g.Combine(h, h.Recv(), out, &ep.CombineOptions{RowValues: upload(t, g, rowValues), SlotValues: slots}))
			got := host(t, slots)
			for tok := 0; tok < in.T; tok++ {
				for k := 0; k < K; k++ {
					want := float32(0)
					if e := in.topk[tok*K+k]; e >= 0 {
						want = f(me, tok, int(e))
					}
					assert.Equal(t, want, got[tok*K+k], "slot value of token %d slot %d", tok, k)
				}
			}
		})
	}
}
