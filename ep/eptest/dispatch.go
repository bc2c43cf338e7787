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

func (s Suite) testDispatchCombine(t *testing.T) {
	for _, mode := range modes {
		for _, sc := range scenarios(s.Comm.Size()) {
			t.Run(fmt.Sprintf("%v/%s/f32", mode, sc.name), func(t *testing.T) { checkDispatchCombine[float32](t, s, mode, sc) })
			t.Run(fmt.Sprintf("%v/%s/bf16", mode, sc.name), func(t *testing.T) { checkDispatchCombine[ep.BF16](t, s, mode, sc) })
		}
	}
}

func checkDispatchCombine[E ep.Element](t *testing.T, s Suite, mode ep.Mode, sc scenario) {
	defer s.agree(t)
	g := newGroup[E](t, s, s.Backend, sc.config(mode))
	R, me, H := s.Comm.Size(), s.Comm.Rank(), sc.hidden
	ins := allInputs(sc, R)
	in := ins[me]
	xh := payload[E](me, in.T, H)
	x := upload(t, g, xh)

	h, err := g.Dispatch(ep.Tokens(x, in.topk, in.weights))
	require.NoError(t, err)
	checkLayout(t, s, g, sc, ins, h.Layout())
	if mode == ep.LowLatency {
		checkLLRecv(t, s, h, sc, ins)
	} else {
		checkHTRecv(t, s, h, sc, ins)
	}
	// Identity experts, combined in place.
	out1 := zeros[E](t, g, in.T*H)
	require.NoError(t, g.Combine(h, h.Recv(), out1, nil))
	checkIdentityCombine(t, s, mode, sc, in, host(t, out1))

	// A cached dispatch of other data (2x) lands in the same rows; combined
	// from a copy of Recv, it gives exactly twice the first result.
	x2h := make([]E, len(xh))
	for i := range xh {
		x2h[i] = ep.ElementOf[E](2 * ep.Float32Of(xh[i]))
	}
	h2, err := g.Dispatch(ep.Reuse(h, upload(t, g, x2h), nil))
	require.NoError(t, err)
	if mode == ep.LowLatency {
		assert.Equal(t, h.ExpertCounts(), h2.ExpertCounts())
	} else {
		assert.Equal(t, h.NumRecv(), h2.NumRecv())
	}
	out2 := zeros[E](t, g, in.T*H)
	require.NoError(t, g.Combine(h2, upload(t, g, host(t, h2.Recv())), out2, nil))
	o1, o2 := host(t, out1), host(t, out2)
	for i := range o1 {
		if ep.Float32Of(o2[i]) != 2*ep.Float32Of(o1[i]) {
			t.Fatalf("cached dispatch of 2x: out[%d] = %v, want 2 * %v", i, ep.Float32Of(o2[i]), ep.Float32Of(o1[i]))
		}
	}

	// Repeats are bit-identical: cached, through CombineBuffer, and a fresh
	// dispatch with layout.
	h3, err := g.Dispatch(ep.Reuse(h, x, nil))
	require.NoError(t, err)
	require.NoError(t, ep.Upload(h3.CombineBuffer(), host(t, h3.Recv())))
	out3 := zeros[E](t, g, in.T*H)
	require.NoError(t, g.Combine(h3, h3.CombineBuffer(), out3, nil))
	assert.True(t, slices.Equal(o1, host(t, out3)), "cached repeat through CombineBuffer differs")
	h4, err := g.Dispatch(ep.Tokens(x, in.topk, in.weights))
	require.NoError(t, err)
	out4 := zeros[E](t, g, in.T*H)
	require.NoError(t, g.Combine(h4, h4.Recv(), out4, nil))
	assert.True(t, slices.Equal(o1, host(t, out4)), "a repeated dispatch+combine differs")
}

func checkLayout[E ep.Element](t *testing.T, s Suite, g *ep.Group[E], sc scenario, ins []input, got *ep.Layout) {
	t.Helper()
	R, me := g.Size(), g.Rank()
	in := ins[me]
	L := sc.experts / R
	perExpert := make([]int, sc.experts)
	perRank := make([]int, R)
	perNode := make([]int, g.Nodes())
	inRank := make([]bool, in.T*R)
	for t := 0; t < in.T; t++ {
		nodeSeen := map[int]bool{}
		for k := 0; k < sc.topk; k++ {
			e := in.topk[t*sc.topk+k]
			if e < 0 {
				continue
			}
			perExpert[e]++
			r := int(e) / L
			if !inRank[t*R+r] {
				inRank[t*R+r] = true
				perRank[r]++
			}
			if n := g.NodeOf(r); !nodeSeen[n] {
				nodeSeen[n] = true
				perNode[n]++
			}
		}
	}
	assert.Equal(t, in.T, got.NumTokens)
	assert.Equal(t, perExpert, got.TokensPerExpert, "tokens per expert")
	assert.Equal(t, perRank, got.TokensPerRank, "tokens per rank")
	assert.Equal(t, perNode, got.TokensPerNode, "tokens per node")
	assert.Equal(t, inRank, got.TokenInRank, "token in rank")
	direct, err := g.Layout(in.topk)
	require.NoError(t, err)
	assert.Equal(t, got, direct, "Group.Layout and Handle.Layout")
}

func checkLLRecv[E ep.Element](t *testing.T, s Suite, h ep.Handle[E], sc scenario, ins []input) {
	t.Helper()
	R, me, H := len(ins), s.Comm.Rank(), sc.hidden
	span := R * sc.maxTok
	exp := llExpected(sc, ins, me, R)
	recv, wts := host(t, h.Recv()), host(t, h.RecvWeights())
	require.Equal(t, len(exp)*span*H, len(recv))
	assert.True(t, h.RecvTopK().IsZero(), "LL has no RecvTopK")
	total := 0
	for l, rows := range exp {
		require.Equal(t, len(rows), h.ExpertCounts()[l], "rows of local expert %d", l)
		total += len(rows)
		for j, want := range rows {
			r := l*span + j
			x := payload[E](want.src, ins[want.src].T, H)
			if !rowsEqual(t, fmt.Sprintf("expert %d row %d (rank %d token %d)", l, j, want.src, want.tok),
				recv[r*H:(r+1)*H], x[want.tok*H:(want.tok+1)*H]) {
				return
			}
			assert.Equal(t, want.weight, wts[r], "weight of expert %d row %d", l, j)
			src, tok, err := h.Source(r)
			require.NoError(t, err)
			assert.Equal(t, [2]int{want.src, want.tok}, [2]int{src, tok}, "source of expert %d row %d", l, j)
		}
	}
	assert.Equal(t, total, h.NumRecv())
}

func checkHTRecv[E ep.Element](t *testing.T, s Suite, h ep.Handle[E], sc scenario, ins []input) {
	t.Helper()
	R, me, H, K := len(ins), s.Comm.Rank(), sc.hidden, sc.topk
	L := sc.experts / R
	checkHTRows(t, h, ins, htExpected(sc, ins, me, R), me, H, K, L, "rows received")
}

// checkHTRows checks that an HT handle received exactly the rows want, in
// that order: each row's values, source, local top-k ids and weights, and
// the rows per local expert. It reports whether every row's values matched.
func checkHTRows[E ep.Element](t *testing.T, h ep.Handle[E], ins []input, want []row, me, H, K, L int, what string) bool {
	t.Helper()
	require.Equal(t, len(want), h.NumRecv(), what)
	recv, ids, wts := host(t, h.Recv()), host(t, h.RecvTopK()), host(t, h.RecvWeights())
	counts := make([]int, L)
	for r, w := range want {
		x := payload[E](w.src, ins[w.src].T, H)
		if !rowsEqual(t, fmt.Sprintf("row %d (rank %d token %d)", r, w.src, w.tok), recv[r*H:(r+1)*H], x[w.tok*H:(w.tok+1)*H]) {
			return false
		}
		src, tok, err := h.Source(r)
		require.NoError(t, err)
		assert.Equal(t, [2]int{w.src, w.tok}, [2]int{src, tok}, "source of row %d", r)
		from := ins[w.src]
		for k := 0; k < K; k++ {
			e := from.topk[w.tok*K+k]
			wantID, wantW := int32(-1), float32(0)
			if e >= 0 && int(e)/L == me {
				wantID, wantW = e-int32(me*L), from.weights[w.tok*K+k]
				counts[wantID]++
			}
			assert.Equal(t, wantID, ids[r*K+k], "local id of row %d slot %d", r, k)
			assert.Equal(t, wantW, wts[r*K+k], "weight of row %d slot %d", r, k)
		}
	}
	assert.Equal(t, counts, h.ExpertCounts(), "rows per local expert")
	return true
}

func checkIdentityCombine[E ep.Element](t *testing.T, s Suite, mode ep.Mode, sc scenario, in input, out []E) {
	t.Helper()
	me, H := s.Comm.Rank(), sc.hidden
	for tok := 0; tok < in.T; tok++ {
		f := weightSum(sc, in, tok)
		if mode == ep.HighThroughput {
			f = float32(ranksHit(sc, in, tok, s.Comm.Size()))
		}
		if !rowsEqual(t, fmt.Sprintf("combined token %d (x * %v)", tok, f), out[tok*H:(tok+1)*H], scaled[E](me, tok, H, f)) {
			return
		}
	}
}

// Experts that scale by (expert+1)/4; the HT expert side applies the
// weights. float32 results are exact; bfloat16 ones within their rounding.
func (s Suite) testScaledExperts(t *testing.T) {
	sc := scenarios(s.Comm.Size())[0]
	for _, mode := range modes {
		t.Run(mode.String()+"/f32", func(t *testing.T) { checkScaledExperts[float32](t, s, mode, sc, 0) })
		t.Run(mode.String()+"/bf16", func(t *testing.T) { checkScaledExperts[ep.BF16](t, s, mode, sc, 3.0/256) })
	}
}

func checkScaledExperts[E ep.Element](t *testing.T, s Suite, mode ep.Mode, sc scenario, relTol float64) {
	defer s.agree(t)
	g := newGroup[E](t, s, s.Backend, sc.config(mode))
	R, me, H, K := s.Comm.Size(), s.Comm.Rank(), sc.hidden, sc.topk
	L := sc.experts / R
	in := sc.input(me, R)
	h, err := g.Dispatch(ep.Tokens(upload(t, g, payload[E](me, in.T, H)), in.topk, in.weights))
	require.NoError(t, err)
	recv := host(t, h.Recv())
	y := make([]E, len(recv))
	scale := func(e int) float32 { return float32(e+1) / 4 }
	if mode == ep.LowLatency {
		span := R * sc.maxTok
		for l := 0; l < L; l++ {
			for j := 0; j < h.ExpertCounts()[l]; j++ {
				r := l*span + j
				for c := 0; c < H; c++ {
					y[r*H+c] = ep.ElementOf[E](ep.Float32Of(recv[r*H+c]) * scale(me*L+l))
				}
			}
		}
	} else {
		ids, wts := host(t, h.RecvTopK()), host(t, h.RecvWeights())
		for r := 0; r < h.NumRecv(); r++ {
			var f float32
			for k := 0; k < K; k++ {
				if ids[r*K+k] >= 0 {
					f += wts[r*K+k] * scale(me*L+int(ids[r*K+k]))
				}
			}
			for c := 0; c < H; c++ {
				y[r*H+c] = ep.ElementOf[E](ep.Float32Of(recv[r*H+c]) * f)
			}
		}
	}
	out := zeros[E](t, g, in.T*H)
	require.NoError(t, g.Combine(h, upload(t, g, y), out, nil))
	o := host(t, out)
	for tok := 0; tok < in.T; tok++ {
		var f float64
		for k := 0; k < K; k++ {
			if e := in.topk[tok*K+k]; e >= 0 {
				f += float64(in.weights[tok*K+k]) * float64(scale(int(e)))
			}
		}
		for c := 0; c < H; c++ {
			want := float64(value(me, tok, c)) * f
			got := float64(ep.Float32Of(o[tok*H+c]))
			if d := got - want; d > relTol*abs(want) || d < -relTol*abs(want) {
				t.Fatalf("token %d element %d = %v, want %v (relative tolerance %v)", tok, c, got, want, relTol)
			}
		}
	}
}

// Many consecutive calls with new routing each time; in LL two in flight
// (d0 d1 c0 d2 c1 ...): the rows of call i must survive dispatch i+1.
func (s Suite) testConsecutiveCalls(t *testing.T) {
	R, me := s.Comm.Size(), s.Comm.Rank()
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) {
			defer s.agree(t)
			base := scenarios(R)[0]
			g := newGroup[ep.BF16](t, s, s.Backend, base.config(mode))
			type call struct {
				sc  scenario
				ins []input
				h   ep.Handle[ep.BF16]
			}
			var prev *call
			finish := func(c *call) {
				if mode == ep.LowLatency { // the rows are still intact
					checkLLRecv(t, s, c.h, c.sc, c.ins)
				}
				in := c.ins[me]
				out := zeros[ep.BF16](t, g, in.T*c.sc.hidden)
				req, err := g.CombineSend(c.h, c.h.Recv(), out, nil)
				require.NoError(t, err)
				require.NoError(t, req.Wait())
				checkIdentityCombine(t, s, mode, c.sc, in, host(t, out))
			}
			for i := 0; i < 12; i++ {
				sc := base
				sc.seed = uint64(100 + i)
				c := &call{sc: sc, ins: allInputs(sc, R)}
				in := c.ins[me]
				req, err := g.DispatchSend(ep.Tokens(upload(t, g, payload[ep.BF16](me, in.T, sc.hidden)), in.topk, in.weights))
				require.NoError(t, err)
				c.h, err = req.Wait()
				require.NoError(t, err)
				if mode == ep.LowLatency {
					checkLLRecv(t, s, c.h, sc, c.ins)
					if prev != nil {
						finish(prev)
					}
					prev = c
				} else {
					checkHTRecv(t, s, c.h, sc, c.ins)
					finish(c)
				}
			}
			if prev != nil {
				finish(prev)
			}
		})
	}
}

// Two LL dispatches in flight at once, one per buffer set, as a serving
// loop's two micro-batches are: the second is sent before the first is
// waited for, and each receives and combines its own rows, whatever order
// the waits and combines come in.
func (s Suite) testTwoDispatchesInFlight(t *testing.T) {
	R, me := s.Comm.Size(), s.Comm.Rank()
	defer s.agree(t)
	base := scenarios(R)[0]
	g := newGroup[ep.BF16](t, s, s.Backend, base.config(ep.LowLatency))
	type call struct {
		sc  scenario
		ins []input
		req ep.DispatchRequest[ep.BF16]
		h   ep.Handle[ep.BF16]
	}
	for round, order := range [][2]int{{0, 1}, {1, 0}, {0, 1}} {
		var calls [2]*call
		for i := range calls {
			sc := base
			sc.seed = uint64(300 + 2*round + i)
			c := &call{sc: sc, ins: allInputs(sc, R)}
			in := c.ins[me]
			var err error
			c.req, err = g.DispatchSend(ep.Tokens(upload(t, g, payload[ep.BF16](me, in.T, sc.hidden)), in.topk, in.weights))
			require.NoError(t, err, "round %d, dispatch %d", round, i)
			calls[i] = c
		}
		for _, i := range order {
			c := calls[i]
			var err error
			c.h, err = c.req.Wait()
			require.NoError(t, err, "round %d, dispatch %d", round, i)
			checkLLRecv(t, s, c.h, c.sc, c.ins)
		}
		for _, i := range order {
			c := calls[i]
			in := c.ins[me]
			out := zeros[ep.BF16](t, g, in.T*c.sc.hidden)
			require.NoError(t, g.Combine(c.h, c.h.Recv(), out, nil), "round %d, combine %d", round, i)
			checkIdentityCombine(t, s, ep.LowLatency, c.sc, in, host(t, out))
		}
	}
}

// The backend against a reference backend, on random real-valued data: the
// same rows, counts and metadata; combine results bit-identical (LL always;
// HT on one node, where both sum ranks in order) or, for HT across nodes,
// where partials are summed per node first, within rounding.
func (s Suite) testMatchesReference(t *testing.T) {
	for _, mode := range modes {
		for _, sc := range scenarios(s.Comm.Size())[:2] {
			t.Run(fmt.Sprintf("%v/%s/f32", mode, sc.name), func(t *testing.T) { checkAgainstReference[float32](t, s, mode, sc) })
			t.Run(fmt.Sprintf("%v/%s/bf16", mode, sc.name), func(t *testing.T) { checkAgainstReference[ep.BF16](t, s, mode, sc) })
		}
	}
}

func checkAgainstReference[E ep.Element](t *testing.T, s Suite, mode ep.Mode, sc scenario) {
	defer s.agree(t)
	g := newGroup[E](t, s, s.Backend, sc.config(mode))
	ref := newGroup[E](t, s, s.Reference, sc.config(mode))
	R, me, H := s.Comm.Size(), s.Comm.Rank(), sc.hidden
	in := sc.input(me, R)
	rng := rand.New(rand.NewPCG(99, uint64(me)))
	xh := make([]E, in.T*H)
	weights := make([]float32, len(in.weights))
	for i := range xh {
		xh[i] = ep.ElementOf[E](rng.Float32()*2 - 1)
	}
	for i := range weights {
		weights[i] = rng.Float32()
	}
	h, err := g.Dispatch(ep.Tokens(upload(t, g, xh), in.topk, weights))
	require.NoError(t, err)
	rh, err := ref.Dispatch(ep.Tokens(upload(t, ref, xh), in.topk, weights))
	require.NoError(t, err)
	assert.Equal(t, rh.ExpertCounts(), h.ExpertCounts(), "rows per local expert")
	rows := validRows(mode, h.ExpertCounts(), h.NumRecv(), R*sc.maxTok)
	recv, rrecv := host(t, h.Recv()), host(t, rh.Recv())
	for _, r := range rows {
		if !slices.Equal(rrecv[r*H:(r+1)*H], recv[r*H:(r+1)*H]) {
			t.Fatalf("received row %d differs from the reference backend's", r)
		}
	}
	wts, rwts := host(t, h.RecvWeights()), host(t, rh.RecvWeights())
	if mode == ep.HighThroughput {
		assert.Equal(t, host(t, rh.RecvTopK()), host(t, h.RecvTopK()))
		assert.Equal(t, rwts, wts)
	} else {
		for _, r := range rows {
			require.Equal(t, rwts[r], wts[r], "weight of row %d", r)
		}
	}
	// Non-trivial experts: y = 3x - 0.5, row by row.
	y := make([]E, len(recv))
	for _, r := range rows {
		for c := 0; c < H; c++ {
			y[r*H+c] = ep.ElementOf[E](3*ep.Float32Of(recv[r*H+c]) - 0.5)
		}
	}
	out, refOut := zeros[E](t, g, in.T*H), zeros[E](t, ref, in.T*H)
	require.NoError(t, g.Combine(h, upload(t, g, y), out, nil))
	require.NoError(t, ref.Combine(rh, upload(t, ref, y), refOut, nil))
	o, ro := host(t, out), host(t, refOut)
	if mode == ep.LowLatency || (g.Nodes() == 1 && ref.Nodes() == 1) {
		assert.True(t, slices.Equal(o, ro), "combine differs from the reference backend's")
		return
	}
	for i := range o {
		a, b := float64(ep.Float32Of(o[i])), float64(ep.Float32Of(ro[i]))
		if d := a - b; d > 1e-2*(1+abs(b)) || d < -1e-2*(1+abs(b)) {
			t.Fatalf("combined element %d = %v, reference %v", i, a, b)
		}
	}
}
