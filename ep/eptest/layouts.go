package eptest

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goep/goep/ep"
)

// layoutCase is a receive layout other than a mode's default, or an id
// kind, that a backend may implement (Config.Layout, ExpertAlignment,
// RecvIDs), and the features it asks for.
type layoutCase struct {
	name     string
	mode     ep.Mode
	layout   ep.RecvLayout
	align    int
	ids      ep.ExpertIDKind
	features []ep.Feature
}

func layoutCases() []layoutCase {
	em, rm, gl := ep.FeatureHTExpertMajor, ep.FeatureLLRankMajor, ep.FeatureGlobalExpertIDs
	return []layoutCase{
		{name: "ht/expert-major", mode: ep.HighThroughput, layout: ep.LayoutExpertMajor, features: []ep.Feature{em}},
		{name: "ht/expert-major-align8", mode: ep.HighThroughput, layout: ep.LayoutExpertMajor, align: 8, features: []ep.Feature{em}},
		{name: "ht/flat-global-ids", mode: ep.HighThroughput, layout: ep.LayoutFlat, ids: ep.GlobalExpertIDs, features: []ep.Feature{gl}},
		{name: "ll/rank-major", mode: ep.LowLatency, layout: ep.LayoutRankMajor, features: []ep.Feature{rm}},
		{name: "ll/rank-major-global-ids", mode: ep.LowLatency, layout: ep.LayoutRankMajor, ids: ep.GlobalExpertIDs, features: []ep.Feature{rm, gl}},
	}
}

func (c layoutCase) config(sc scenario) ep.Config {
	cfg := sc.config(c.mode)
	cfg.Layout, cfg.ExpertAlignment, cfg.RecvIDs = c.layout, c.align, c.ids
	return cfg
}

// supported reports whether b implements every feature c asks for, and
// the first it does not.
func (c layoutCase) supported(b ep.Backend) (bool, ep.Feature) {
	for _, f := range c.features {
		if !ep.Supports(b, f) {
			return false, f
		}
	}
	return true, 0
}

func (c layoutCase) expertMajor() bool { return c.layout == ep.LayoutExpertMajor }

// testLayouts checks every receive layout and id kind the backend claims,
// and that it is refused the others.
func (s Suite) testLayouts(t *testing.T) {
	R := s.Comm.Size()
	scs := scenarios(R)
	t.Run("InvalidConfigs", func(t *testing.T) { s.checkInvalidLayoutConfigs(t) })
	for _, c := range layoutCases() {
		t.Run(c.name, func(t *testing.T) {
			if ok, f := c.supported(s.Backend); !ok {
				s.checkLayoutRefused(t, c, f)
				return
			}
			for i, sc := range []scenario{scs[0], scs[2], scs[3]} {
				t.Run(sc.name+"/f32", func(t *testing.T) { checkLayoutRound[float32](t, s, c, sc) })
				if i == 0 {
					t.Run(sc.name+"/bf16", func(t *testing.T) { checkLayoutRound[ep.BF16](t, s, c, sc) })
				}
			}
			t.Run("Backward", func(t *testing.T) { checkLayoutBackward(t, s, c, scs[0]) })
			t.Run("RowValues", func(t *testing.T) { checkLayoutRowValues(t, s, c, scs[0]) })
			t.Run("ConsecutiveCalls", func(t *testing.T) { checkLayoutConsecutive(t, s, c, scs[0]) })
			t.Run("Stats", func(t *testing.T) { checkLayoutStats(t, s, c, scs[0]) })
			if ep.Supports(s.Backend, ep.FeatureFP8Wire) {
				t.Run("FP8", func(t *testing.T) { checkLayoutFP8(t, s, c, fp8Scenarios(R)[0]) })
			}
			if s.Reference != nil {
				if ok, _ := c.supported(s.Reference); ok {
					t.Run("MatchesReference", func(t *testing.T) { checkLayoutAgainstReference(t, s, c, scs[1]) })
				}
			}
		})
	}
}

// checkLayoutRefused: NewGroup refuses the layout on every rank, naming the
// backend and the feature.
func (s Suite) checkLayoutRefused(t *testing.T, c layoutCase, f ep.Feature) {
	defer s.agree(t)
	cfg := c.config(scenarios(s.Comm.Size())[1])
	cfg.Backend, cfg.Timeout = s.Backend, testTimeout
	g, err := ep.NewGroup[ep.BF16](s.Comm, cfg)
	if g != nil {
		assert.NoError(t, g.Close())
	}
	require.Error(t, err, "%v on a backend that does not support it", f)
	assert.True(t, errors.Is(err, ep.ErrUnsupported), "errors.Is(%v, ErrUnsupported)", err)
	assert.ErrorContains(t, err, "the "+s.Backend.Name()+" backend does not implement "+f.String())
}

// validLayoutRows lists the rows of Recv that hold a received row.
func validLayoutRows[E ep.Element](c layoutCase, h ep.Handle[E], maxTok int) []int {
	var rows []int
	switch {
	case c.mode == ep.HighThroughput && c.expertMajor():
		off := h.ExpertOffsets()
		for l, n := range h.ExpertCounts() {
			for j := 0; j < n; j++ {
				rows = append(rows, off[l]+j)
			}
		}
	case c.mode == ep.HighThroughput:
		for r := 0; r < h.NumRecv(); r++ {
			rows = append(rows, r)
		}
	default: // LL rank-major
		for src, n := range h.SourceCounts() {
			for j := 0; j < n; j++ {
				rows = append(rows, src*maxTok+j)
			}
		}
	}
	return rows
}

// checkLayoutRecv checks what h received against the reference layout, and
// returns, per valid row, its origin and (expert-major) expert.
func checkLayoutRecv[E ep.Element](t *testing.T, s Suite, c layoutCase, h ep.Handle[E], sc scenario, ins []input) {
	t.Helper()
	R, me, H, K := len(ins), s.Comm.Rank(), sc.hidden, sc.topk
	L := sc.experts / R
	recv, wts := host(t, h.Recv()), host(t, h.RecvWeights())
	rowIs := func(r int, src, tok int) bool {
		x := payload[E](src, ins[src].T, H)
		if !rowsEqual(t, fmt.Sprintf("row %d (rank %d token %d)", r, src, tok), recv[r*H:(r+1)*H], x[tok*H:(tok+1)*H]) {
			return false
		}
		gs, gt, err := h.Source(r)
		require.NoError(t, err)
		return assert.Equal(t, [2]int{src, tok}, [2]int{gs, gt}, "source of row %d", r)
	}
	if c.expertMajor() { // HT zones
		align := max(c.align, 1)
		zones := htZonesExpected(sc, ins, me, R, align)
		require.Len(t, h.ExpertOffsets(), L+1, "ExpertOffsets")
		assert.True(t, h.RecvTopK().IsZero(), "an expert-major layout has no RecvTopK")
		counts, offs, src := make([]int, L), make([]int, L+1), make([]int, R*L)
		for l, z := range zones {
			counts[l], offs[l], offs[l+1] = len(z.rows), z.off, z.off+z.padded
			for _, r := range z.rows {
				src[r.src*L+l]++
			}
		}
		assert.Equal(t, counts, h.ExpertCounts(), "rows per expert")
		assert.Equal(t, offs, h.ExpertOffsets(), "zone offsets (padded to %d)", align)
		assert.Equal(t, src, h.SourceCounts(), "rows per source and expert")
		require.Equal(t, offs[L], h.NumRecv(), "NumRecv is the padded total")
		require.Len(t, recv, offs[L]*H)
		require.Len(t, wts, offs[L])
		for l, z := range zones {
			for j, want := range z.rows {
				r := z.off + j
				if !rowIs(r, want.src, want.tok) {
					return
				}
				assert.Equal(t, want.weight, wts[r], "weight of zone %d row %d", l, j)
			}
			for r := z.off + len(z.rows); r < z.off+z.padded; r++ {
				for col, v := range recv[r*H : (r+1)*H] {
					if ep.Float32Of(v) != 0 || math.Signbit(float64(ep.Float32Of(v))) {
						t.Fatalf("padding row %d of zone %d: element %d = %v, want +0", r, l, col, ep.Float32Of(v))
					}
				}
				assert.Zero(t, wts[r], "weight of padding row %d", r)
				_, _, err := h.Source(r)
				assert.Error(t, err, "Source of padding row %d", r)
			}
		}
		return
	}
	// Flat (HT) and rank-major (LL): a token once per rank, with ids and weights.
	exp := tokensExpected(sc, ins, me, R, c.ids == ep.GlobalExpertIDs)
	ids := host(t, h.RecvTopK())
	srcCounts, counts, total := make([]int, R), make([]int, L), 0
	for src, rows := range exp {
		srcCounts[src] = len(rows)
		total += len(rows)
		for _, r := range rows {
			for _, id := range r.ids {
				if id >= 0 {
					l := int(id)
					if c.ids == ep.GlobalExpertIDs {
						l -= me * L
					}
					counts[l]++
				}
			}
		}
	}
	assert.Equal(t, srcCounts, h.SourceCounts(), "rows per source")
	assert.Equal(t, counts, h.ExpertCounts(), "rows per local expert")
	assert.Equal(t, total, h.NumRecv(), "NumRecv")
	first := func(src int) int { // the row where src's rows start
		if c.mode == ep.LowLatency {
			return src * sc.maxTok
		}
		n := 0
		for s := 0; s < src; s++ {
			n += len(exp[s])
		}
		return n
	}
	if c.mode == ep.LowLatency {
		require.Len(t, recv, R*sc.maxTok*H, "rank-major Recv is [Size][MaxTokensPerRank][Hidden]")
	}
	require.Len(t, ids, len(recv)/H*K)
	for src, rows := range exp {
		for j, want := range rows {
			r := first(src) + j
			if !rowIs(r, want.src, want.tok) {
				return
			}
			assert.Equal(t, want.ids, ids[r*K:(r+1)*K], "top-k ids of row %d (%v)", r, c.ids)
			assert.Equal(t, want.weights, wts[r*K:(r+1)*K], "weights of row %d", r)
		}
	}
}

// rowWeight is the gate weight an expert applies to received row r: its
// one weight (expert-major) or the sum of its weights here.
func rowWeight(c layoutCase, wts []float32, r, K int) float32 {
	if c.expertMajor() {
		return wts[r]
	}
	var f float32
	for k := 0; k < K; k++ {
		f += wts[r*K+k]
	}
	return f
}

// layoutIdentityFactor is what identity experts multiply token t by: its
// pairs (expert-major: a row each) or the ranks it reached.
func layoutIdentityFactor(c layoutCase, sc scenario, in input, t, ranks int) float32 {
	if c.expertMajor() {
		return float32(pairsOf(sc, in, t))
	}
	return float32(ranksHit(sc, in, t, ranks))
}

// One round of a layout: the received rows against the reference; identity
// experts in place; weighting experts through a copy with NaN on the rows
// that are no received row (the combine must not read them); a cached
// dispatch of 2x; a repeat bit-identical.
func checkLayoutRound[E ep.Element](t *testing.T, s Suite, c layoutCase, sc scenario) {
	defer s.agree(t)
	g := newGroup[E](t, s, s.Backend, c.config(sc))
	R, me, H, K := s.Comm.Size(), s.Comm.Rank(), sc.hidden, sc.topk
	ins := allInputs(sc, R)
	in := ins[me]
	x := upload(t, g, payload[E](me, in.T, H))
	h, err := g.Dispatch(ep.Tokens(x, in.topk, in.weights))
	require.NoError(t, err)
	checkLayoutRecv(t, s, c, h, sc, ins)
	valid := validLayoutRows(c, h, sc.maxTok)

	// Weighting experts first (Recv is read): y = w * x on received rows, NaN elsewhere.
	recv, wts := host(t, h.Recv()), host(t, h.RecvWeights())
	y := make([]E, len(recv))
	for i := range y {
		y[i] = ep.ElementOf[E](float32(math.NaN()))
	}
	for _, r := range valid {
		f := rowWeight(c, wts, r, K)
		for col := 0; col < H; col++ {
			y[r*H+col] = ep.ElementOf[E](ep.Float32Of(recv[r*H+col]) * f)
		}
	}
	outW := zeros[E](t, g, in.T*H)
	require.NoError(t, g.Combine(h, upload(t, g, y), outW, nil))
	ow := host(t, outW)
	// Exact but where HT sums bfloat16 partials per node first (each
	// rounded): within their rounding there.
	relTol := 0.0
	if c.mode == ep.HighThroughput && g.Nodes() > 1 && ep.DTypeOf[E]() == ep.BFloat16 {
		relTol = 3.0 / 256
	}
	for tok := 0; tok < in.T; tok++ {
		f := float64(weightSum(sc, in, tok))
		for col := 0; col < H; col++ {
			want, got := float64(value(me, tok, col))*f, float64(ep.Float32Of(ow[tok*H+col]))
			if relTol == 0 {
				want = float64(ep.Float32Of(ep.ElementOf[E](float32(want))))
			}
			if d := got - want; d > relTol*abs(want) || d < -relTol*abs(want) {
				t.Fatalf("weighted token %d element %d = %v, want %v (relative tolerance %v)", tok, col, got, want, relTol)
			}
		}
	}

	// Dispatch again (an LL handle combines once; HT's repeated combines
	// are HTCombineRepeats').
	h, err = g.Dispatch(ep.Tokens(x, in.topk, in.weights))
	require.NoError(t, err)
	out1 := zeros[E](t, g, in.T*H)
	require.NoError(t, g.Combine(h, h.Recv(), out1, nil))
	o1 := host(t, out1)
	for tok := 0; tok < in.T; tok++ {
		f := layoutIdentityFactor(c, sc, in, tok, R)
		if !rowsEqual(t, fmt.Sprintf("identity-combined token %d (x * %v)", tok, f), o1[tok*H:(tok+1)*H], scaled[E](me, tok, H, f)) {
			break
		}
	}

	x2 := make([]E, in.T*H)
	for i, v := range payload[E](me, in.T, H) {
		x2[i] = ep.ElementOf[E](2 * ep.Float32Of(v))
	}
	h2, err := g.Dispatch(ep.Reuse(h, upload(t, g, x2), nil))
	require.NoError(t, err)
	assert.Equal(t, h.ExpertCounts(), h2.ExpertCounts())
	assert.Equal(t, h.ExpertOffsets(), h2.ExpertOffsets())
	assert.Equal(t, h.SourceCounts(), h2.SourceCounts())
	require.NoError(t, ep.Upload(h2.CombineBuffer(), host(t, h2.Recv())))
	out2 := zeros[E](t, g, in.T*H)
	require.NoError(t, g.Combine(h2, h2.CombineBuffer(), out2, nil))
	for i, v := range host(t, out2) {
		if ep.Float32Of(v) != 2*ep.Float32Of(o1[i]) {
			t.Fatalf("cached dispatch of 2x: out[%d] = %v, want 2 * %v", i, ep.Float32Of(v), ep.Float32Of(o1[i]))
		}
	}
	h3, err := g.Dispatch(ep.Tokens(x, in.topk, in.weights))
	require.NoError(t, err)
	checkLayoutRecv(t, s, c, h3, sc, ins) // the padding written over by the 2x round is zero again
	out3 := zeros[E](t, g, in.T*H)
	require.NoError(t, g.Combine(h3, h3.Recv(), out3, nil))
	assert.True(t, slices.Equal(o1, host(t, out3)), "a repeated dispatch+combine differs")
}

// The layout's combine is the transpose of its dispatch and the other way
// round, over all ranks, with NaN on the rows that hold no received row.
func checkLayoutBackward(t *testing.T, s Suite, c layoutCase, sc scenario) {
	defer s.agree(t)
	g := newGroup[float32](t, s, s.Backend, c.config(sc))
	R, me, H := s.Comm.Size(), s.Comm.Rank(), sc.hidden
	// unweighted combines in these layouts; NaN on the rows that hold no received row
	checkTranspose(t, s, g, c.mode, sc.input(me, R), H, nil, float32(math.NaN()), func(h ep.Handle[float32]) []int {
		return validLayoutRows(c, h, sc.maxTok)
	})
}

// RowValues reach their (token, slot): one per row in an expert-major
// layout, one per row and slot in the others.
func checkLayoutRowValues(t *testing.T, s Suite, c layoutCase, sc scenario) {
	defer s.agree(t)
	g := newGroup[float32](t, s, s.Backend, c.config(sc))
	R, me, H, K, L := s.Comm.Size(), s.Comm.Rank(), sc.hidden, sc.topk, sc.experts/s.Comm.Size()
	in := sc.input(me, R)
	f := func(src, tok, expert int) float32 { return float32(src*10000 + tok*100 + expert) }
	h, err := g.Dispatch(ep.Tokens(upload(t, g, payload[float32](me, in.T, H)), in.topk, in.weights))
	require.NoError(t, err)
	rowValues := make([]float32, h.RecvWeights().Len())
	if c.expertMajor() {
		off := h.ExpertOffsets()
		for l, n := range h.ExpertCounts() {
			for j := 0; j < n; j++ {
				src, tok, err := h.Source(off[l] + j)
				require.NoError(t, err)
				rowValues[off[l]+j] = f(src, tok, me*L+l)
			}
		}
	} else {
		ids := host(t, h.RecvTopK())
		for _, r := range validLayoutRows(c, h, sc.maxTok) {
			src, tok, err := h.Source(r)
			require.NoError(t, err)
			for k := 0; k < K; k++ {
				if id := int(ids[r*K+k]); id >= 0 {
					if c.ids == ep.LocalExpertIDs {
						id += me * L
					}
					rowValues[r*K+k] = f(src, tok, id)
				}
			}
		}
	}
	slots := zeros[float32](t, g, in.T*K)
	require.NoError(t, g.Combine(h, h.Recv(), zeros[float32](t, g, in.T*H),
		&ep.CombineOptions{RowValues: upload(t, g, rowValues), SlotValues: slots}))
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
}

// Calls with a new routing each time (LL: two in flight), each right.
func checkLayoutConsecutive(t *testing.T, s Suite, c layoutCase, base scenario) {
	defer s.agree(t)
	R, me := s.Comm.Size(), s.Comm.Rank()
	g := newGroup[ep.BF16](t, s, s.Backend, c.config(base))
	type call struct {
		sc  scenario
		ins []input
		h   ep.Handle[ep.BF16]
	}
	finish := func(cl *call) {
		checkLayoutRecv(t, s, c, cl.h, cl.sc, cl.ins)
		in := cl.ins[me]
		out := zeros[ep.BF16](t, g, in.T*cl.sc.hidden)
		require.NoError(t, g.Combine(cl.h, cl.h.Recv(), out, nil))
		o := host(t, out)
		H := cl.sc.hidden
		for tok := 0; tok < in.T; tok++ {
			f := layoutIdentityFactor(c, cl.sc, in, tok, R)
			if !rowsEqual(t, fmt.Sprintf("combined token %d", tok), o[tok*H:(tok+1)*H], scaled[ep.BF16](me, tok, H, f)) {
				return
			}
		}
	}
	var prev *call
	for i := 0; i < 6; i++ {
		sc := base
		sc.seed = uint64(200 + i)
		cl := &call{sc: sc, ins: allInputs(sc, R)}
		in := cl.ins[me]
		var err error
		cl.h, err = g.Dispatch(ep.Tokens(upload(t, g, payload[ep.BF16](me, in.T, sc.hidden)), in.topk, in.weights))
		require.NoError(t, err)
		if c.mode == ep.HighThroughput {
			finish(cl)
			continue
		}
		if prev != nil {
			finish(prev) // its rows survived the dispatch after it
		}
		prev = cl
	}
	if prev != nil {
		finish(prev)
	}
}

// The backend and the reference backend receive the same rows, metadata
// and counts bit for bit on random data, and combine alike (bit for bit
// where both sum in the same order: on one node, and LL always).
func checkLayoutAgainstReference(t *testing.T, s Suite, c layoutCase, sc scenario) {
	defer s.agree(t)
	g := newGroup[ep.BF16](t, s, s.Backend, c.config(sc))
	ref := newGroup[ep.BF16](t, s, s.Reference, c.config(sc))
	R, me, H := s.Comm.Size(), s.Comm.Rank(), sc.hidden
	in := sc.input(me, R)
	xh := randomRows[ep.BF16](me, in.T*H)
	h, err := g.Dispatch(ep.Tokens(upload(t, g, xh), in.topk, in.weights))
	require.NoError(t, err)
	rh, err := ref.Dispatch(ep.Tokens(upload(t, ref, xh), in.topk, in.weights))
	require.NoError(t, err)
	assert.Equal(t, rh.ExpertCounts(), h.ExpertCounts(), "ExpertCounts")
	assert.Equal(t, rh.ExpertOffsets(), h.ExpertOffsets(), "ExpertOffsets")
	assert.Equal(t, rh.SourceCounts(), h.SourceCounts(), "SourceCounts")
	valid := validLayoutRows(c, h, sc.maxTok)
	recv, rrecv := host(t, h.Recv()), host(t, rh.Recv())
	require.Equal(t, len(rrecv), len(recv), "len(Recv)")
	for _, r := range valid {
		require.True(t, slices.Equal(rrecv[r*H:(r+1)*H], recv[r*H:(r+1)*H]), "row %d differs from the reference backend's", r)
	}
	wts, rwts := host(t, h.RecvWeights()), host(t, rh.RecvWeights())
	ids, rids := host(t, h.RecvTopK()), host(t, rh.RecvTopK())
	w := len(wts) / max(len(recv)/H, 1) // weights per row
	for _, r := range valid {
		require.Equal(t, rwts[r*w:(r+1)*w], wts[r*w:(r+1)*w], "weights of row %d", r)
		if !c.expertMajor() {
			require.Equal(t, rids[r*w:(r+1)*w], ids[r*w:(r+1)*w], "top-k ids of row %d", r)
		}
	}
	y := make([]ep.BF16, len(recv))
	for _, r := range valid {
		for col := 0; col < H; col++ {
			y[r*H+col] = ep.BF16From(3*recv[r*H+col].Float32() - 0.5)
		}
	}
	out, refOut := zeros[ep.BF16](t, g, in.T*H), zeros[ep.BF16](t, ref, in.T*H)
	require.NoError(t, g.Combine(h, upload(t, g, y), out, nil))
	require.NoError(t, ref.Combine(rh, upload(t, ref, y), refOut, nil))
	o, ro := host(t, out), host(t, refOut)
	if c.mode == ep.LowLatency || (g.Nodes() == 1 && ref.Nodes() == 1) {
		assert.True(t, slices.Equal(o, ro), "combine differs from the reference backend's")
		return
	}
	for i := range o {
		a, b := float64(o[i].Float32()), float64(ro[i].Float32())
		if d := a - b; d > 1e-2*(1+abs(b)) || d < -1e-2*(1+abs(b)) {
			t.Fatalf("combined element %d = %v, reference %v", i, a, b)
		}
	}
}

// randomRows is n random values in [-1, 1) of rank me, the same on every
// backend.
func randomRows[E ep.Element](me, n int) []E {
	x := make([]E, n)
	for i := range x {
		x[i] = ep.ElementOf[E](float32((i*7919+me*104729)%2001-1000) / 1000)
	}
	return x
}

// An FP8 dispatch in the layout: each received row's codes and scales are
// the reference quantization of the row it came from, bit for bit, padding
// rows have zero codes and scales, and the dequantized rows combine exactly.
func checkLayoutFP8(t *testing.T, s Suite, c layoutCase, sc scenario) {
	defer s.agree(t)
	cfg := c.config(sc)
	cfg.Wire = ep.WireFP8
	g := newGroup[ep.BF16](t, s, s.Backend, cfg)
	R, me, H := s.Comm.Size(), s.Comm.Rank(), sc.hidden
	G := ep.ScaleGroups(H)
	ins := allInputs(sc, R)
	in := ins[me]
	h, err := g.Dispatch(ep.Tokens(upload(t, g, payloadFP8[ep.BF16](me, in.T, H)), in.topk, in.weights))
	require.NoError(t, err)
	require.True(t, h.Recv().IsZero(), "Recv of an FP8 group")
	codes, scales := host(t, h.RecvFP8()), host(t, h.RecvScales())
	require.Equal(t, len(codes)/H*G, len(scales), "one scale per group of 128 of every row")
	valid := validLayoutRows(c, h, sc.maxTok)
	isValid := make([]bool, len(codes)/H)
	for _, r := range valid {
		isValid[r] = true
		src, tok, err := h.Source(r)
		require.NoError(t, err)
		want := quantizeRef(payloadFP8[ep.BF16](src, ins[src].T, H)[tok*H:(tok+1)*H], false)
		for i, q := range codes[r*H : (r+1)*H] {
			require.Equal(t, want.codes[i], uint8(q), "row %d (rank %d token %d) code %d", r, src, tok, i)
		}
		require.Equal(t, want.scales, scales[r*G:(r+1)*G], "row %d scales", r)
	}
	if c.expertMajor() { // the padding
		for r, ok := range isValid {
			if !ok {
				require.True(t, slices.Equal(make([]ep.E4M3, H), codes[r*H:(r+1)*H]), "codes of padding row %d", r)
				require.True(t, slices.Equal(make([]float32, G), scales[r*G:(r+1)*G]), "scales of padding row %d", r)
			}
		}
	}
	out := combineDequantized(t, s, g, h, sc, in)
	for tok := 0; tok < in.T; tok++ {
		f := float64(layoutIdentityFactor(c, sc, in, tok, R))
		r := quantizeRef(payloadFP8[ep.BF16](me, in.T, H)[tok*H:(tok+1)*H], false)
		for col := 0; col < H; col++ {
			if want := ep.BF16From(float32(r.values[col] * f)); out[tok*H+col].Float32() != want.Float32() {
				t.Fatalf("combined token %d element %d = %v, want %v (dequantized %v times %v)", tok, col,
					out[tok*H+col].Float32(), want.Float32(), r.values[col], f)
			}
		}
	}
}

// Stats count the layout's rows: a row per (token, expert) pair in an
// expert-major layout, per (token, rank) in the others, out and back.
func checkLayoutStats(t *testing.T, s Suite, c layoutCase, sc scenario) {
	defer s.agree(t)
	R, me, H := s.Comm.Size(), s.Comm.Rank(), sc.hidden
	g := newGroup[float32](t, s, s.Backend, c.config(sc))
	ins := allInputs(sc, R)
	in := ins[me]
	counting := ep.HighThroughput // rowsBetween counts pairs for LL, tokens per rank for HT
	if c.expertMajor() {
		counting = ep.LowLatency
	}
	rows := rowsBetween(sc, ins, counting, R)
	g.ResetStats()
	h, err := g.Dispatch(ep.Tokens(upload(t, g, payload[float32](me, in.T, H)), in.topk, in.weights))
	require.NoError(t, err)
	require.NoError(t, g.Combine(h, h.Recv(), zeros[float32](t, g, in.T*H), nil))
	st := g.Stats()
	for p := 0; p < R; p++ {
		want := (rows[me][p] + rows[p][me]) * int64(4*H)
		assert.Equal(t, want, st.SentBytes[p], "bytes sent to rank %d", p)
		assert.Equal(t, want, st.RecvBytes[p], "bytes received from rank %d", p)
	}
}

// A layout its mode does not have, a bad alignment or id kind, and ranks
// that disagree are refused at NewGroup, naming the field and the value.
func (s Suite) checkInvalidLayoutConfigs(t *testing.T) {
	defer s.agree(t)
	R := s.Comm.Size()
	good := ep.Config{Mode: ep.HighThroughput, NumExperts: 2 * R, MaxTokensPerRank: 4, Hidden: 8, TopK: 2, Backend: s.Backend,
		Timeout: testTimeout}
	for _, tc := range []struct {
		name string
		edit func(*ep.Config)
		want string
	}{
		{"flat in LL", func(c *ep.Config) { c.Mode, c.Layout = ep.LowLatency, ep.LayoutFlat }, "Layout = flat is for HighThroughput"},
		{"rank-major in HT", func(c *ep.Config) { c.Layout = ep.LayoutRankMajor }, "Layout = rank-major is for LowLatency"},
		{"unknown layout", func(c *ep.Config) { c.Layout = 9 }, "Layout = RecvLayout(9)"},
		{"alignment not a power of two", func(c *ep.Config) { c.Layout, c.ExpertAlignment = ep.LayoutExpertMajor, 24 },
			"ExpertAlignment = 24: want a power of two"},
		{"alignment of a flat layout", func(c *ep.Config) { c.ExpertAlignment = 8 }, "ExpertAlignment = 8 pads HighThroughput's expert-major zones"},
		{"global ids of zones", func(c *ep.Config) { c.Layout, c.RecvIDs = ep.LayoutExpertMajor, ep.GlobalExpertIDs },
			"an expert-major layout receives no top-k ids"},
		{"unknown id kind", func(c *ep.Config) { c.RecvIDs = 5 }, "RecvIDs = ExpertIDKind(5)"},
		{"masking rank-major", func(c *ep.Config) { c.Mode, c.Layout, c.MaskStalledRanks = ep.LowLatency, ep.LayoutRankMajor, true },
			"MaskStalledRanks is not implemented with Layout = rank-major"},
		{"dropping into zones", func(c *ep.Config) { c.Layout, c.Overflow = ep.LayoutExpertMajor, ep.OverflowDrop },
			"Overflow = drop is not implemented with Layout = expert-major"},
		{"an FP8 combine rank-major", func(c *ep.Config) { c.Mode, c.Layout, c.CombineWire = ep.LowLatency, ep.LayoutRankMajor, ep.WireFP8 },
			"CombineWire = fp8 is not implemented with ll Layout = rank-major"},
		{"an FP8 combine into zones", func(c *ep.Config) {
			c.Mode, c.Layout, c.CombineWire = ep.HighThroughput, ep.LayoutExpertMajor, ep.WireFP8
		},
			"CombineWire = fp8 is not implemented with ht Layout = expert-major"},
	} {
		cfg := good
		tc.edit(&cfg)
		g, err := ep.NewGroup[float32](s.Comm, cfg)
		if g != nil {
			assert.NoError(t, g.Close())
		}
		if assert.Error(t, err, tc.name) {
			assert.Contains(t, err.Error(), tc.want, tc.name)
		}
	}
	if R > 1 {
		cfg := good
		if s.Comm.Rank() == R-1 {
			cfg.Layout = ep.LayoutExpertMajor
		}
		g, err := ep.NewGroup[float32](s.Comm, cfg)
		if g != nil {
			assert.NoError(t, g.Close())
		}
		require.Error(t, err, "every rank must see the mismatch")
		assert.Contains(t, err.Error(), "rank "+itoa(R-1)+" has Layout = expert-major, rank 0 has default")
	}
}
