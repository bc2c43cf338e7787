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
// where the backend supports it (testFeatureRefusals checks its refusal
// where it does not), and that HighThroughput groups refuse it.
func (s Suite) testFP8Combine(t *testing.T) {
	if !ep.Supports(s.Backend, ep.FeatureFP8Combine) {
		return
	}
	t.Run("HighThroughputRefused", func(t *testing.T) {
		defer s.agree(t)
		cfg := fp8Scenarios(s.Comm.Size())[0].config(ep.HighThroughput)
		cfg.CombineWire, cfg.Backend, cfg.Timeout = ep.WireFP8, s.Backend, testTimeout
		_, err := ep.NewGroup[ep.BF16](s.Comm, cfg)
		require.Error(t, err)
		assert.ErrorContains(t, err, "CombineWire fp8 is not a combine format of HighThroughput groups (it is one of LowLatency groups)")
	})
	for _, w := range fp8Wires {
		for i, sc := range fp8Scenarios(s.Comm.Size()) {
			t.Run(fmt.Sprintf("%v/%s/bf16", w, sc.name), func(t *testing.T) { checkFP8Combine2[ep.BF16](t, s, w, sc) })
			if i == 0 {
				t.Run(fmt.Sprintf("%v/%s/f32", w, sc.name), func(t *testing.T) { checkFP8Combine2[float32](t, s, w, sc) })
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
	in := allInputs(sc, R)[me]
	for i := range in.weights { // not dyadic either (the suite's are, for exact sums elsewhere)
		in.weights[i] = float32(0.05 + 0.9*float64((i*37+me*11)%101)/101)
	}
	x := payloadFP8[E](me, in.T, H)
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
	out := host(t, outT)

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
			got := out[tok*H+c]
			if want := ep.ElementOf[E](acc[c]); got != want {
				t.Errorf("token %d element %d: %v, want %v by the definition", tok, c, ep.Float32Of(got), ep.Float32Of(want))
				return
			}
			// The final rounding to E: half an ulp of the result (bfloat16:
			// 2^-8 relative; float32's is far below the rest).
			lim := bound[c] + math.Abs(exact[c])/256 + 1e-30
			if d := math.Abs(float64(ep.Float32Of(got)) - exact[c]); d > lim {
				t.Errorf("token %d element %d: %v is %g from the exact combine %v, beyond the bound %g", tok, c,
					ep.Float32Of(got), d, exact[c], lim)
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
