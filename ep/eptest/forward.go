package eptest

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goep/goep/ep"
)

// forwardedFormats are the formats whose rows the caller quantized and the
// engines move as they are (WireInfo.Forward), from the format table.
func forwardedFormats() []ep.WireFormat {
	var ws []ep.WireFormat
	for _, w := range ep.Wires() {
		if info, _ := w.Info(); info.Forward {
			ws = append(ws, w)
		}
	}
	return ws
}

// checkName is the subtest of Run that checks f: featureChecks' entry, or
// ForwardedRows for the feature of a forwarded format of the table.
func checkName(f ep.Feature) (string, bool) {
	if name, ok := featureChecks[f]; ok {
		return name, true
	}
	for _, w := range forwardedFormats() {
		if info, _ := w.Info(); info.DispatchFeature == f {
			return "ForwardedRows", true
		}
	}
	for _, cf := range combineFormats() {
		if cf == f {
			return "CombineFormats", true
		}
	}
	return "", false
}

// testForwardedRows checks every forwarded format the backend declares:
// the caller's bytes arrive as they were sent, whatever they are.
func (s Suite) testForwardedRows(t *testing.T) {
	for _, w := range forwardedFormats() {
		info, _ := w.Info()
		if !s.declares(info.DispatchFeature) {
			continue
		}
		for _, mode := range modes {
			for _, sc := range forwardScenarios(s.Comm.Size()) {
				t.Run(fmt.Sprintf("%v/%v/%s", w, mode, sc.name), func(t *testing.T) { checkForwardedRows[ep.BF16](t, s, mode, w, sc) })
			}
		}
	}
}

// forwardScenarios have a Hidden every format of the table takes (a
// multiple of 64).
func forwardScenarios(ranks int) []scenario {
	return []scenario{
		{name: "random-uneven-h192", experts: 4 * ranks, topk: 3, maxTok: 16, hidden: 192, seed: 21, tokens: unevenTokens, route: randomRoute(0.15)},
		{name: "full-h64", experts: 2 * ranks, topk: 2, maxTok: 16, hidden: 64, seed: 22, tokens: fullTokens, route: randomRoute(0)},
	}
}

// forwardedBytes is rank src's packed rows and scales for a dispatch of
// format w, random bytes from a seed of (src, call): a forwarded format's
// bytes mean nothing to the engines.
func forwardedBytes(w ep.WireFormat, src, call, T, H int) (rows, scales []byte) {
	info, _ := w.Info()
	rb, sb := info.RowBytes(H, 1), info.SideBytes(H)
	rng := rand.New(rand.NewPCG(uint64(src), uint64(call)))
	rows, scales = make([]byte, T*rb), make([]byte, T*sb)
	for i := range rows {
		rows[i] = byte(rng.Uint32())
	}
	for i := range scales {
		scales[i] = byte(rng.Uint32())
	}
	return rows, scales
}

// The caller's packed rows and scales arrive bit for bit, each at the row
// the mode's layout gives its (source, token), in a fresh dispatch and in
// a cached one with other bytes; rows of the wrong length are refused on
// every rank with nothing sent, and the group goes on.
func checkForwardedRows[E ep.Element](t *testing.T, s Suite, mode ep.Mode, w ep.WireFormat, sc scenario) {
	defer s.agree(t)
	cfg := sc.config(mode)
	cfg.Wire = w
	g := newGroup[E](t, s, s.Backend, cfg)
	R, me, H := s.Comm.Size(), s.Comm.Rank(), sc.hidden
	ins := allInputs(sc, R)
	in := ins[me]

	var h0 ep.Handle[E]
	for call, reuse := range []bool{false, true} {
		rows, scales := forwardedBytes(w, me, call, in.T, H)
		dx := ep.DispatchInput[E]{Packed: upload(t, g, rows), PackedScales: upload(t, g, scales), TopK: in.topk, Weights: in.weights}
		if reuse {
			dx.TopK, dx.Reuse = nil, h0
		}
		h, err := g.Dispatch(dx)
		require.NoError(t, err)
		if !reuse {
			h0 = h
		}
		require.True(t, h.Recv().IsZero(), "Recv of a group of packed rows")
		gotRows, gotScales := h.RecvWire()
		got, gotS := host(t, gotRows), host(t, gotScales)
		want, at := expectedRows(t, h, sc, ins, me)
		if err := sameBytes(h, want, at, call, w, ins, got, gotS, H); err != nil {
			t.Error(err) // not Fatal: this rank makes the collective calls below as the others do
		}
		require.NoError(t, g.Combine(h, h.CombineBuffer(), zeros[E](t, g, in.T*H), nil))
	}

	// Bad input, on every rank alike: refused before anything is sent.
	rows, scales := forwardedBytes(w, me, 0, in.T, H)
	_, err := g.Dispatch(ep.Tokens(zeros[E](t, g, in.T*H), in.topk, in.weights))
	assert.ErrorIs(t, err, ep.ErrBadInput)
	assert.ErrorContains(t, err, "the group forwards rows the caller quantized")
	_, err = g.Dispatch(ep.DispatchInput[E]{Packed: upload(t, g, rows), PackedScales: upload(t, g, append(scales, 0)), TopK: in.topk, Weights: in.weights})
	assert.ErrorIs(t, err, ep.ErrBadInput)
	assert.ErrorContains(t, err, fmt.Sprintf("len(PackedScales) = %d bytes", len(scales)+1))
	h, err := g.Dispatch(ep.DispatchInput[E]{Packed: upload(t, g, rows), PackedScales: upload(t, g, scales), TopK: in.topk, Weights: in.weights})
	require.NoError(t, err)
	require.NoError(t, g.Combine(h, h.CombineBuffer(), zeros[E](t, g, in.T*H), nil))
}

// sameBytes says which received row, if any, differs from the bytes its
// source sent.
func sameBytes[E ep.Element](h ep.Handle[E], want []row, at []int, call int, w ep.WireFormat, ins []input, got, gotS []byte, H int) error {
	info, _ := w.Info()
	rb, sb := info.RowBytes(H, 1), info.SideBytes(H)
	for i, r := range at {
		src, tok, err := h.Source(r)
		if err != nil {
			return err
		}
		if src != want[i].src || tok != want[i].tok {
			return fmt.Errorf("call %d: row %d comes from rank %d token %d, want rank %d token %d", call, r, src, tok, want[i].src, want[i].tok)
		}
		sentRows, sentScales := forwardedBytes(w, src, call, ins[src].T, H)
		if !slices.Equal(got[r*rb:(r+1)*rb], sentRows[tok*rb:(tok+1)*rb]) {
			return fmt.Errorf("call %d: row %d (rank %d token %d) is not the bytes sent", call, r, src, tok)
		}
		if !slices.Equal(gotS[r*sb:(r+1)*sb], sentScales[tok*sb:(tok+1)*sb]) {
			return fmt.Errorf("call %d: the scales of row %d (rank %d token %d) are not the bytes sent", call, r, src, tok)
		}
	}
	return nil
}
