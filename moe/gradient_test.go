package moe_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/goep/goep/ep"
	"github.com/goep/goep/internal/mpitesting"
	"github.com/goep/goep/moe"
	"github.com/goep/goep/mpi"
)

// gradProblem is a layer with a fixed batch and the loss
// sum over ranks of |out - target|^2 / (tokens*Hidden) + auxCoef*aux.
type gradProblem struct {
	t       *testing.T
	w       *mpi.Comm
	l       *moe.Layer
	x, y    []float64
	auxCoef float64
}

// loss runs Forward and returns the global loss and this rank's top-k sets.
func (p *gradProblem) loss() (float64, []int32) {
	out, aux, err := p.l.Forward(p.x)
	require.NoError(p.t, err)
	// The chosen set of each token matters, not the order of its slots.
	topk, K := p.l.TopK(), p.l.Config().TopK
	for t := 0; t < len(topk); t += K {
		slices.Sort(topk[t : t+K])
	}
	sse := 0.0
	for i, v := range out {
		d := v - p.y[i]
		sse += d * d
	}
	var sum [1]float64
	require.NoError(p.t, mpi.Allreduce(p.w, mpi.OpSum, []float64{sse}, sum[:]))
	H := p.l.Config().Hidden
	return sum[0]/float64(p.l.GlobalTokens()*H) + p.auxCoef*aux, topk
}

// gradients runs Forward and Backward and returns the gradient of the input.
func (p *gradProblem) gradients() []float64 {
	out, _, err := p.l.Forward(p.x)
	require.NoError(p.t, err)
	H := p.l.Config().Hidden
	g := make([]float64, len(out))
	for i, v := range out {
		g[i] = 2 * (v - p.y[i]) / float64(p.l.GlobalTokens()*H)
	}
	p.l.ZeroGrad()
	gx, err := p.l.Backward(g, p.auxCoef)
	require.NoError(p.t, err)
	return gx
}

// coord is one scalar to perturb: a slice on some ranks and an index in it.
type coord struct {
	name  string
	owner int // the rank that holds it; -1: every rank (the replicated gate)
	value func() []float64
	grad  func() []float64
	i     int
}

// checkGradients compares the analytic gradient of every coordinate with a
// central finite difference of the global loss, and returns the largest
// relative error (with a floor of 1% of the largest gradient) and how many
// coordinates were skipped because the perturbation changed some token's
// top-k choice (the loss is not differentiable there).
func checkGradients(p *gradProblem, coords []coord, eps float64) (maxRel float64, skipped int) {
	me := p.w.Rank()
	var ans, fds []float64
	for _, c := range coords {
		mine := c.owner < 0 || c.owner == me
		_, topk0 := p.loss()
		var orig float64
		if mine {
			orig = c.value()[c.i]
		}
		set := func(v float64) {
			if mine {
				c.value()[c.i] = v
			}
		}
		// Richardson's extrapolation of two central differences, h and h/2:
		// truncation error O(h^4), so h can be large enough that float32
		// rounding in the loss does not matter.
		changed := 0.0
		diff := func(h float64) float64 {
			set(orig + h)
			lp, topkP := p.loss()
			set(orig - h)
			lm, topkM := p.loss()
			set(orig)
			if !slices.Equal(topk0, topkP) || !slices.Equal(topk0, topkM) {
				changed = 1
			}
			return (lp - lm) / (2 * h)
		}
		fd := (4*diff(eps/2) - diff(eps)) / 3
		an := 0.0
		if c.owner == me || (c.owner < 0 && me == 0) {
			an = c.grad()[c.i]
		}
		var sums [2]float64
		require.NoError(p.t, mpi.Allreduce(p.w, mpi.OpSum, []float64{an, changed}, sums[:]))
		if sums[1] > 0 {
			skipped++
			continue
		}
		ans, fds = append(ans, sums[0]), append(fds, fd)
	}
	// Relative error, with a floor of 1% of the largest gradient checked: a
	// gradient far smaller than that is within the float32 noise of the loss.
	floor := 0.0
	for _, a := range ans {
		floor = max(floor, 1e-2*math.Abs(a))
	}
	for i, an := range ans {
		fd := fds[i]
		rel := math.Abs(fd-an) / math.Max(math.Max(math.Abs(fd), math.Abs(an)), floor)
		maxRel = max(maxRel, rel)
	}
	return maxRel, skipped
}

// clearRouting draws T tokens whose top-k choice is clear: the k-th and
// (k+1)-th largest logits differ by at least 0.25, more than any perturbation
// of the check moves them.
func clearRouting(gate []float64, cfg moe.Config, T int, stream uint64) []float64 {
	H, E, K := cfg.Hidden, cfg.Experts, cfg.TopK
	r := rand.New(rand.NewPCG(1, stream))
	x := make([]float64, 0, T*H)
	tok := make([]float64, H)
	logits := make([]float64, E)
	for len(x) < T*H {
		for i := range tok {
			tok[i] = r.NormFloat64()
		}
		for e := range logits {
			logits[e] = 0
			for i, v := range tok {
				logits[e] += v * gate[i*E+e]
			}
		}
		slices.Sort(logits)
		if logits[E-K]-logits[E-K-1] >= 0.25 {
			x = append(x, tok...)
		}
	}
	return x
}

func randNormal(seed, stream uint64, n int, scale float64) []float64 {
	r := rand.New(rand.NewPCG(seed, stream))
	v := make([]float64, n)
	for i := range v {
		v[i] = scale * r.NormFloat64()
	}
	return v
}

// TestGradients checks every kind of gradient (gate, shared expert, each
// expert array of every rank, inputs of every rank) against central finite
// differences of the global loss, in both modes, with both activations, with
// and without a shared expert. The wire type is float32: the loss then has
// float32 rounding noise, well below the differences taken.
func TestGradients(t *testing.T) {
	w := mpitesting.World
	R, me := w.Size(), w.Rank()
	for _, tc := range []struct {
		mode   ep.Mode
		act    moe.Activation
		shared int
	}{{ep.LowLatency, moe.SiLU, 0}, {ep.HighThroughput, moe.GELU, 0}, {ep.LowLatency, moe.GELU, 0}, {ep.HighThroughput, moe.SiLU, 0},
		{ep.LowLatency, moe.SiLU, 12}, {ep.HighThroughput, moe.GELU, 12}} {
		name := fmt.Sprintf("%v-%v", tc.mode, tc.act)
		if tc.shared > 0 {
			name += fmt.Sprintf("-shared%d", tc.shared)
		}
		t.Run(name, func(t *testing.T) {
			defer mpitesting.Agree(t, w)
			cfg := moe.Config{Mode: tc.mode, DType: moe.Float32, Experts: testExperts(), TopK: 3, Hidden: 6, FFN: 10,
				Tokens: 8, Act: tc.act, Seed: 11, SharedFFN: tc.shared}
			l, err := moe.NewLayer(w, cfg)
			require.NoError(t, err)
			defer l.Close()
			// A sharper gate than the initial one, so that the gate's gradient is not tiny.
			for i := range l.Params().Gate {
				l.Params().Gate[i] *= 8
			}
			T := 5 + me%3 // ranks with different token counts
			p := &gradProblem{t: t, w: w, l: l, auxCoef: 0.3,
				x: clearRouting(l.Params().Gate, cfg, T, uint64(me)), y: randNormal(2, uint64(me), T*cfg.Hidden, 1)}
			gx := p.gradients()
			P, G := l.Params(), l.Grads()
			var coords []coord
			add := func(name string, owner int, v, g func() []float64, n, count int, salt uint64) {
				r := rand.New(rand.NewPCG(salt, uint64(owner+1)))
				for j := 0; j < count; j++ {
					coords = append(coords, coord{name: name, owner: owner, value: v, grad: g, i: r.IntN(n)})
				}
			}
			sizes := []int{len(P.W1), len(P.B1), len(P.W2), len(P.B2)} // the same on every rank
			add("gate", -1, func() []float64 { return P.Gate }, func() []float64 { return G.Gate }, len(P.Gate), 8, 1)
			if tc.shared > 0 { // replicated, like the gate
				add("shared_w1", -1, func() []float64 { return P.SharedW1 }, func() []float64 { return G.SharedW1 }, len(P.SharedW1), 4, 7)
				add("shared_b1", -1, func() []float64 { return P.SharedB1 }, func() []float64 { return G.SharedB1 }, len(P.SharedB1), 3, 8)
				add("shared_w2", -1, func() []float64 { return P.SharedW2 }, func() []float64 { return G.SharedW2 }, len(P.SharedW2), 4, 9)
				add("shared_b2", -1, func() []float64 { return P.SharedB2 }, func() []float64 { return G.SharedB2 }, len(P.SharedB2), 3, 10)
			}
			for r := 0; r < R; r++ {
				add("w1", r, func() []float64 { return P.W1 }, func() []float64 { return G.W1 }, sizes[0], 3, 2)
				add("b1", r, func() []float64 { return P.B1 }, func() []float64 { return G.B1 }, sizes[1], 2, 3)
				add("w2", r, func() []float64 { return P.W2 }, func() []float64 { return G.W2 }, sizes[2], 3, 4)
				add("b2", r, func() []float64 { return P.B2 }, func() []float64 { return G.B2 }, sizes[3], 2, 5)
				nx := (5 + r%3) * cfg.Hidden
				add("x", r, func() []float64 { return p.x }, func() []float64 { return gx }, nx, 4, 6)
			}
			maxRel, skipped := checkGradients(p, coords, 1e-2)
			if me == 0 {
				t.Logf("%d coordinates on %d rank(s): max relative error %.2e, %d skipped (top-k changed)", len(coords), R, maxRel, skipped)
			}
			require.Less(t, maxRel, 5e-3, "max relative error")
			require.Zero(t, skipped, "coordinates skipped")
		})
	}
}
