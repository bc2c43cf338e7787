package eptest

import (
	"fmt"
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goep/goep/ep"
	"github.com/goep/goep/internal/fp8ref"
)

// testFP8Combine checks the low-precision combine (Config.CombineWire FP8)
// in both modes where the backend supports it (testFeatureRefusals checks
// its refusal where it does not).
func (s Suite) testFP8Combine(t *testing.T) {
	if !ep.Supports(s.Backend, ep.FeatureFP8Combine) {
		return
	}
	for _, w := range fp8Wires {
		for i, sc := range fp8Scenarios(s.Comm.Size()) {
			t.Run(fmt.Sprintf("ll/%v/%s/bf16", w, sc.name), func(t *testing.T) { checkFP8Combine2[ep.BF16](t, s, w, sc) })
			t.Run(fmt.Sprintf("ht/%v/%s/bf16", w, sc.name), func(t *testing.T) { checkHTFP8Combine[ep.BF16](t, s, w, sc) })
			if i == 0 {
				t.Run(fmt.Sprintf("ll/%v/%s/f32", w, sc.name), func(t *testing.T) { checkFP8Combine2[float32](t, s, w, sc) })
				t.Run(fmt.Sprintf("ht/%v/%s/f32", w, sc.name), func(t *testing.T) { checkHTFP8Combine[float32](t, s, w, sc) })
			}
		}
	}
}

// An HT low-precision combine is exactly its definition: each rank's
// partial output of a token (here its received row times a factor of the
// rank) is quantized as Quantize does; a token's result is the float32
// sum, node by node, of the float32 values (code times scale) of its own
// node's partials, ranks in local order, and of each other node's sum: the
// float32 sum of that node's partial values in local order, rounded to the
// element type and quantized again; rounded once to the element type. It
// is also within the bound of that definition of the exact combine: per
// partial, 3/16 of it relative and 2^-8 of its scale absolute (two
// quantizations, and the node sum's rounding), plus the final rounding.
func checkHTFP8Combine[E ep.Element](t *testing.T, s Suite, w ep.WireFormat, sc scenario) {
	defer s.agree(t)
	topo, err := s.Comm.Topology()
	require.NoError(t, err)
	defer func() { assert.NoError(t, topo.Free()) }()
	cfg := sc.config(ep.HighThroughput)
	cfg.CombineWire = w
	g := newGroup[E](t, s, s.Backend, cfg)
	R, me, H, K := s.Comm.Size(), s.Comm.Rank(), sc.hidden, sc.topk
	L := sc.experts / R
	ins := allInputs(sc, R)
	in := ins[me]
	x := payloadFP8[E](me, in.T, H)
	h, err := g.Dispatch(ep.Tokens(upload(t, g, x), in.topk, in.weights))
	require.NoError(t, err)
	recv := host(t, h.Recv())
	y := make([]E, len(recv))
	for i := range y {
		y[i] = ep.ElementOf[E](expertFactor(int32(me)) * ep.Float32Of(recv[i]))
	}
	require.NoError(t, ep.Upload(h.CombineBuffer(), y))
	outT := zeros[E](t, g, in.T*H)
	require.NoError(t, g.Combine(h, h.CombineBuffer(), outT, nil))
	out := host(t, outT)

	pow2 := w == ep.WireFP8UE8M0
	values := func(q fp8Row) []float32 { // code times scale, as the reducers compute it
		v := make([]float32, H)
		for c := range v {
			v[c] = float32(float32(fp8ref.Decode(q.codes[c])) * q.scales[c/ep.ScaleGroup])
		}
		return v
	}
	yd := make([]E, H)
	for tok := 0; tok < in.T; tok++ {
		var terms [][]float32
		exact, bound := make([]float64, H), make([]float64, H)
		for b := 0; b < topo.Nodes; b++ {
			var node []float32 // the node's sum of its partial values
			for _, d := range topo.RanksOnNode(b) {
				got := false
				for k := 0; k < K; k++ {
					got = got || (in.topk[tok*K+k] >= 0 && int(in.topk[tok*K+k])/L == d)
				}
				if !got {
					continue
				}
				for c := range yd {
					yd[c] = ep.ElementOf[E](expertFactor(int32(d)) * ep.Float32Of(x[tok*H+c]))
				}
				q := quantizeRef(yd, pow2)
				v := values(q)
				for c := range yd {
					yv := float64(ep.Float32Of(yd[c]))
					exact[c] += yv
					bound[c] += math.Abs(yv)*3/16 + float64(q.scales[c/ep.ScaleGroup])/256
				}
				switch {
				case b == topo.Node:
					terms = append(terms, v)
				case node == nil:
					node = v
				default:
					for c := range node {
						node[c] = float32(node[c] + v[c])
					}
				}
			}
			if node != nil {
				for c := range yd {
					yd[c] = ep.ElementOf[E](node[c])
				}
				terms = append(terms, values(quantizeRef(yd, pow2)))
			}
		}
		for c := 0; c < H; c++ {
			var acc float32
			for i, v := range terms {
				if i == 0 {
					acc = v[c]
				} else {
					acc = float32(acc + v[c])
				}
			}
			if err := checkElement(tok, c, out[tok*H+c], acc, exact[c], bound[c]); err != nil {
				t.Error(err)
				return
			}
		}
	}
}

// expertFactor is what the checks' expert e multiplies its rows by: not
// dyadic, so that outputs round in the element type and in e4m3, and the
// order of the products matters.
func expertFactor(e int32) float32 {
	return float32(1+int(e)%3) * float32(math.Ldexp(1, int(e)%5-2)) * (1 + float32(int(e)%7)/10)
}

// checkElement says how element c of token tok of a low-precision
// combine, got, differs from the definition's float32 sum acc rounded to
// E, or lies beyond bound of the exact combine exact, plus the final
// rounding to E (half an ulp of the result: bfloat16's 2^-8 relative;
// float32's is far below the rest).
func checkElement[E ep.Element](tok, c int, got E, acc float32, exact, bound float64) error {
	if want := ep.ElementOf[E](acc); got != want {
		return fmt.Errorf("token %d element %d: %v, want %v by the definition", tok, c, ep.Float32Of(got), ep.Float32Of(want))
	}
	lim := bound + math.Abs(exact)/256 + 1e-30
	if d := math.Abs(float64(ep.Float32Of(got)) - exact); d > lim {
		return fmt.Errorf("token %d element %d: %v is %g from the exact combine %v, beyond the bound %g", tok, c, ep.Float32Of(got), d, exact, lim)
	}
	return nil
}

// llExpertRound dispatches this rank's payload (payloadFP8) in LowLatency
// group g with weights that are not dyadic (the suite's are, for exact
// sums elsewhere), so that the order of the products shows; has expert e
// multiply its rows by expertFactor(e); and combines. It returns this
// rank's input, its tokens and the combined tokens.
func llExpertRound[E ep.Element](t *testing.T, s Suite, g *ep.Group[E], sc scenario) (in input, x, out []E) {
	t.Helper()
	R, me, H := s.Comm.Size(), s.Comm.Rank(), sc.hidden
	in = allInputs(sc, R)[me]
	for i := range in.weights {
		in.weights[i] = float32(0.05 + 0.9*float64((i*37+me*11)%101)/101)
	}
	x = payloadFP8[E](me, in.T, H)
	h, err := g.Dispatch(ep.Tokens(upload(t, g, x), in.topk, in.weights))
	require.NoError(t, err)
	recv := host(t, h.Recv())
	L, span := g.LocalExperts(), R*sc.maxTok
	y := make([]E, len(recv))
	for l, n := range h.ExpertCounts() {
		f := expertFactor(int32(me*L + l))
		for r := l * span; r < l*span+n; r++ {
			for c := 0; c < H; c++ {
				y[r*H+c] = ep.ElementOf[E](f * ep.Float32Of(recv[r*H+c]))
			}
		}
	}
	require.NoError(t, ep.Upload(h.CombineBuffer(), y))
	outT := zeros[E](t, g, in.T*H)
	require.NoError(t, g.Combine(h, h.CombineBuffer(), outT, nil))
	return in, x, host(t, outT)
}

// A low-precision combine is exactly its definition: each token's result is
// the float32 sum, in top-k order, of weight times the float32 value of its
// expert outputs quantized as Quantize does (code times scale), rounded once
// to the element type; and it is within the bound of that definition of the
// exact combine: per slot, |weight| times half an e4m3 step of the output
// (2^-4 of it relative, 2^-10 of the scale absolute), plus the final
// rounding.
func checkFP8Combine2[E ep.Element](t *testing.T, s Suite, w ep.WireFormat, sc scenario) {
	defer s.agree(t)
	cfg := sc.config(ep.LowLatency)
	cfg.CombineWire = w
	g := newGroup[E](t, s, s.Backend, cfg)
	R, me, H, K := s.Comm.Size(), s.Comm.Rank(), sc.hidden, sc.topk
	in, x, out := llExpertRound(t, s, g, sc)

	pow2 := w == ep.WireFP8UE8M0
	yk := make([]E, H)
	acc, exact, bound := make([]float32, H), make([]float64, H), make([]float64, H)
	for tok := 0; tok < in.T; tok++ {
		clear(acc)
		clear(exact)
		clear(bound)
		first := true
		for k := 0; k < K; k++ {
			e := in.topk[tok*K+k]
			if e < 0 {
				continue
			}
			wk := in.weights[tok*K+k]
			for c := 0; c < H; c++ {
				yk[c] = ep.ElementOf[E](expertFactor(e) * ep.Float32Of(x[tok*H+c]))
			}
			q := quantizeRef(yk, pow2)
			for c := 0; c < H; c++ {
				v := float32(float32(fp8ref.Decode(q.codes[c])) * q.scales[c/ep.ScaleGroup])
				term := float32(wk * v)
				if first {
					acc[c] = term
				} else {
					acc[c] = float32(acc[c] + term)
				}
				yv := float64(ep.Float32Of(yk[c]))
				exact[c] += float64(wk) * yv
				bound[c] += math.Abs(float64(wk)) * (math.Abs(yv)/16 + float64(q.scales[c/ep.ScaleGroup])/1024)
			}
			first = false
		}
		for c := 0; c < H; c++ {
			if err := checkElement(tok, c, out[tok*H+c], acc[c], exact[c], bound[c]); err != nil {
				t.Error(err)
				return
			}
		}
	}
	// Its statistics count the codes and scales a combine moves back.
	st := g.Stats()
	rows := rowsBetween(sc, allInputs(sc, R), ep.LowLatency, R)
	wire := int64(H + 4*ep.ScaleGroups(H))
	elem := int64(H * ep.DTypeOf[E]().Size())
	for p := 0; p < R; p++ {
		assert.Equal(t, rows[me][p]*elem+rows[p][me]*wire, st.SentBytes[p], "bytes sent to rank %d", p)
		assert.Equal(t, rows[p][me]*elem+rows[me][p]*wire, st.RecvBytes[p], "bytes received from rank %d", p)
	}
}
