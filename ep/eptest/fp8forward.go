package eptest

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goep/goep/ep"
)

// testFP8Forward checks the forwarding of rows the caller quantized
// (Config.Wire WireFP8Forward, DispatchInput.Codes) where the backend supports it
// (testFeatureRefusals checks its refusal where it does not).
func (s Suite) testFP8Forward(t *testing.T) {
	if !ep.Supports(s.Backend, ep.FeatureFP8Forward) {
		return
	}
	for _, mode := range modes {
		for _, w := range fp8Wires { // the recipe the caller quantized with
			for _, sc := range fp8Scenarios(s.Comm.Size())[:2] {
				t.Run(fmt.Sprintf("%v/%v/%s", mode, w, sc.name), func(t *testing.T) { checkFP8Forward[ep.BF16](t, s, mode, w, sc) })
			}
		}
	}
}

// The caller's codes and scales (made by Quantize with recipe w) arrive as
// they were sent, bit for bit, in the mode's layout and order (a fresh and
// a cached dispatch); dequantized and combined by identity experts they
// give exactly the reference's combine; tokens in the element type, and
// codes or scales of the wrong length, are refused with nothing sent.
func checkFP8Forward[E ep.Element](t *testing.T, s Suite, mode ep.Mode, w ep.WireFormat, sc scenario) {
	defer s.agree(t)
	cfg := sc.config(mode)
	cfg.Wire = ep.WireFP8Forward
	g := newGroup[E](t, s, s.Backend, cfg)
	R, me, H := s.Comm.Size(), s.Comm.Rank(), sc.hidden
	G := ep.ScaleGroups(H)
	ins := allInputs(sc, R)
	in := ins[me]
	pow2 := w == ep.WireFP8UE8M0
	ref := func(f float32) func(src, tok int) fp8Row {
		return func(src, tok int) fp8Row {
			x := payloadFP8[E](src, ins[src].T, H)[tok*H : (tok+1)*H]
			for i := range x {
				x[i] = ep.ElementOf[E](f * ep.Float32Of(x[i]))
			}
			return quantizeRef(x, pow2)
		}
	}
	quantized := func(f float32) (ep.Tensor[ep.E4M3], ep.Tensor[float32]) {
		xh := payloadFP8[E](me, in.T, H)
		for i := range xh {
			xh[i] = ep.ElementOf[E](f * ep.Float32Of(xh[i]))
		}
		codes, scales := make([]ep.E4M3, in.T*H), make([]float32, in.T*G)
		require.NoError(t, ep.Quantize(codes, scales, xh, H, w))
		return upload(t, g, codes), upload(t, g, scales)
	}

	codes, scales := quantized(1)
	h, err := g.Dispatch(ep.DispatchInput[E]{Codes: codes, Scales: scales, TopK: in.topk, Weights: in.weights})
	require.NoError(t, err)
	checkFP8Recv(t, s, h, sc, ins, ref(1))
	out1 := combineDequantized(t, s, g, h, sc, in)
	checkFP8Combine(t, s, mode, sc, in, out1, func(tok int) fp8Row { return ref(1)(me, tok) })

	// A cached dispatch of the caller's quantization of 2x.
	codes2, scales2 := quantized(2)
	h2, err := g.Dispatch(ep.DispatchInput[E]{Codes: codes2, Scales: scales2, Reuse: h})
	require.NoError(t, err)
	checkFP8Recv(t, s, h2, sc, ins, ref(2))
	out2 := combineDequantized(t, s, g, h2, sc, in)
	for i := range out1 {
		if ep.Float32Of(out2[i]) != 2*ep.Float32Of(out1[i]) {
			t.Errorf("cached forwarded dispatch of 2x: out[%d] = %v, want 2 * %v", i, ep.Float32Of(out2[i]), ep.Float32Of(out1[i]))
			break
		}
	}

	// Bad input, on every rank alike: refused before anything is sent.
	_, err = g.Dispatch(ep.Tokens(zeros[E](t, g, in.T*H), in.topk, in.weights))
	assert.ErrorIs(t, err, ep.ErrBadInput)
	assert.ErrorContains(t, err, "pass them in that format (e4m3 codes and scales, DispatchInput.Codes and Scales")
	_, err = g.Dispatch(ep.DispatchInput[E]{Codes: codes, Scales: zeros[float32](t, g, in.T*G+1), TopK: in.topk, Weights: in.weights})
	assert.ErrorIs(t, err, ep.ErrBadInput)
	assert.ErrorContains(t, err, fmt.Sprintf("len(scales) = %d", in.T*G+1))
	// The group goes on.
	h3, err := g.Dispatch(ep.DispatchInput[E]{Codes: codes, Scales: scales, TopK: in.topk, Weights: in.weights})
	require.NoError(t, err)
	require.NoError(t, g.Combine(h3, h3.CombineBuffer(), zeros[E](t, g, in.T*H), nil))
}
