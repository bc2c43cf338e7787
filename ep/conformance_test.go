package ep_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goep/goep/ep"
	"github.com/goep/goep/internal/mpitesting"
	"github.com/goep/goep/mpi"
)

func TestMain(m *testing.M) { mpitesting.Main(m) }

var modes = []ep.Mode{ep.LowLatency, ep.HighThroughput}

const testTimeout = 30 * time.Second

func newGroup[E ep.Element](t *testing.T, cfg ep.Config) *ep.Group[E] {
	t.Helper()
	cfg.Timeout = testTimeout
	g, err := ep.NewGroup[E](mpitesting.World, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, g.Close()) })
	return g
}

func allInputs(sc scenario, ranks int) []input {
	ins := make([]input, ranks)
	for r := range ins {
		ins[r] = sc.input(r, ranks)
	}
	return ins
}

// rowsEqual compares the values of a row with want (so +0 equals -0) and
// reports the first difference.
func rowsEqual[E ep.Element](t *testing.T, what string, got, want []E) bool {
	t.Helper()
	for c := range want {
		if toF32(got[c]) != toF32(want[c]) {
			t.Errorf("%s: element %d = %v, want %v", what, c, toF32(got[c]), toF32(want[c]))
			return false
		}
	}
	return true
}

func TestDispatchCombine(t *testing.T) {
	w := mpitesting.World
	for _, mode := range modes {
		for _, sc := range scenarios(w.Size()) {
			t.Run(fmt.Sprintf("%v/%s/f32", mode, sc.name), func(t *testing.T) { checkDispatchCombine[float32](t, mode, sc) })
			t.Run(fmt.Sprintf("%v/%s/bf16", mode, sc.name), func(t *testing.T) { checkDispatchCombine[ep.BF16](t, mode, sc) })
		}
	}
}

func checkDispatchCombine[E ep.Element](t *testing.T, mode ep.Mode, sc scenario) {
	w := mpitesting.World
	defer mpitesting.Agree(t, w)
	g := newGroup[E](t, sc.config(mode))
	R, me, H := w.Size(), w.Rank(), sc.hidden
	ins := allInputs(sc, R)
	in := ins[me]
	x := payload[E](me, in.T, H)

	h, err := g.Dispatch(x, in.topk, in.weights)
	require.NoError(t, err)
	checkLayout(t, g, sc, ins, h.Layout())
	if mode == ep.LowLatency {
		checkLLRecv(t, h, sc, ins)
	} else {
		checkHTRecv(t, h, sc, ins)
	}
	// Identity experts, combined in place.
	out1 := make([]E, in.T*H)
	require.NoError(t, g.Combine(h, h.Recv(), out1, nil))
	checkIdentityCombine(t, mode, sc, in, out1)

	// A cached dispatch of other data (2x) lands in the same rows; combined
	// from a copy of Recv, it gives exactly twice the first result.
	x2 := make([]E, len(x))
	for i := range x {
		x2[i] = fromF32[E](2 * toF32(x[i]))
	}
	h2, err := g.DispatchCached(h, x2, nil)
	require.NoError(t, err)
	if mode == ep.LowLatency {
		assert.Equal(t, h.ExpertCounts(), h2.ExpertCounts())
	} else {
		assert.Equal(t, h.NumRecv(), h2.NumRecv())
	}
	out2 := make([]E, in.T*H)
	require.NoError(t, g.Combine(h2, slices.Clone(h2.Recv()), out2, nil))
	for i := range out1 {
		if toF32(out2[i]) != 2*toF32(out1[i]) {
			t.Fatalf("cached dispatch of 2x: out[%d] = %v, want 2 * %v", i, toF32(out2[i]), toF32(out1[i]))
		}
	}

	// Repeats are bit-identical: cached, through CombineBuffer, and a fresh
	// dispatch with layout.
	h3, err := g.DispatchCached(h, x, nil)
	require.NoError(t, err)
	copy(h3.CombineBuffer(), h3.Recv())
	out3 := make([]E, in.T*H)
	require.NoError(t, g.Combine(h3, h3.CombineBuffer(), out3, nil))
	assert.True(t, slices.Equal(out1, out3), "cached repeat through CombineBuffer differs")
	h4, err := g.Dispatch(x, in.topk, in.weights)
	require.NoError(t, err)
	out4 := make([]E, in.T*H)
	require.NoError(t, g.Combine(h4, h4.Recv(), out4, nil))
	assert.True(t, slices.Equal(out1, out4), "a repeated dispatch+combine differs")
}

func checkLayout[E ep.Element](t *testing.T, g *ep.Group[E], sc scenario, ins []input, got *ep.Layout) {
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

func checkLLRecv[E ep.Element](t *testing.T, h *ep.Handle[E], sc scenario, ins []input) {
	t.Helper()
	R, me, H := len(ins), mpitesting.World.Rank(), sc.hidden
	span := R * sc.maxTok
	exp := llExpected(sc, ins, me, R)
	recv, wts := h.Recv(), h.RecvWeights()
	require.Equal(t, len(exp)*span*H, len(recv))
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

func checkHTRecv[E ep.Element](t *testing.T, h *ep.Handle[E], sc scenario, ins []input) {
	t.Helper()
	R, me, H, K := len(ins), mpitesting.World.Rank(), sc.hidden, sc.topk
	L := sc.experts / R
	exp := htExpected(sc, ins, me, R)
	require.Equal(t, len(exp), h.NumRecv(), "rows received")
	recv, ids, wts := h.Recv(), h.RecvTopK(), h.RecvWeights()
	counts := make([]int, L)
	for r, want := range exp {
		x := payload[E](want.src, ins[want.src].T, H)
		if !rowsEqual(t, fmt.Sprintf("row %d (rank %d token %d)", r, want.src, want.tok), recv[r*H:(r+1)*H], x[want.tok*H:(want.tok+1)*H]) {
			return
		}
		src, tok, err := h.Source(r)
		require.NoError(t, err)
		assert.Equal(t, [2]int{want.src, want.tok}, [2]int{src, tok}, "source of row %d", r)
		from := ins[want.src]
		for k := 0; k < K; k++ {
			e := from.topk[want.tok*K+k]
			wantID, wantW := int32(-1), float32(0)
			if e >= 0 && int(e)/L == me {
				wantID, wantW = e-int32(me*L), from.weights[want.tok*K+k]
				counts[wantID]++
			}
			assert.Equal(t, wantID, ids[r*K+k], "local id of row %d slot %d", r, k)
			assert.Equal(t, wantW, wts[r*K+k], "weight of row %d slot %d", r, k)
		}
	}
	assert.Equal(t, counts, h.ExpertCounts(), "rows per local expert")
}

func checkIdentityCombine[E ep.Element](t *testing.T, mode ep.Mode, sc scenario, in input, out []E) {
	t.Helper()
	me, H := mpitesting.World.Rank(), sc.hidden
	for tok := 0; tok < in.T; tok++ {
		f := weightSum(sc, in, tok)
		if mode == ep.HighThroughput {
			f = float32(ranksHit(sc, in, tok, mpitesting.World.Size()))
		}
		if !rowsEqual(t, fmt.Sprintf("combined token %d (x * %v)", tok, f), out[tok*H:(tok+1)*H], scaled[E](me, tok, H, f)) {
			return
		}
	}
}

// Experts that scale by (expert+1)/4; the HT expert side applies the weights.
// float32 results are exact; bfloat16 ones within their rounding bound.
func TestNonIdentityExperts(t *testing.T) {
	w := mpitesting.World
	sc := scenarios(w.Size())[0]
	for _, mode := range modes {
		t.Run(mode.String()+"/f32", func(t *testing.T) { checkScaledExperts[float32](t, mode, sc, 0) })
		t.Run(mode.String()+"/bf16", func(t *testing.T) { checkScaledExperts[ep.BF16](t, mode, sc, 3.0/256) })
	}
}

func checkScaledExperts[E ep.Element](t *testing.T, mode ep.Mode, sc scenario, relTol float64) {
	w := mpitesting.World
	defer mpitesting.Agree(t, w)
	g := newGroup[E](t, sc.config(mode))
	R, me, H, K := w.Size(), w.Rank(), sc.hidden, sc.topk
	L := sc.experts / R
	in := sc.input(me, R)
	x := payload[E](me, in.T, H)
	h, err := g.Dispatch(x, in.topk, in.weights)
	require.NoError(t, err)
	recv := h.Recv()
	y := make([]E, len(recv))
	scale := func(e int) float32 { return float32(e+1) / 4 }
	if mode == ep.LowLatency {
		span := R * sc.maxTok
		for l := 0; l < L; l++ {
			for j := 0; j < h.ExpertCounts()[l]; j++ {
				r := l*span + j
				for c := 0; c < H; c++ {
					y[r*H+c] = fromF32[E](toF32(recv[r*H+c]) * scale(me*L+l))
				}
			}
		}
	} else {
		ids, wts := h.RecvTopK(), h.RecvWeights()
		for r := 0; r < h.NumRecv(); r++ {
			var f float32
			for k := 0; k < K; k++ {
				if ids[r*K+k] >= 0 {
					f += wts[r*K+k] * scale(me*L+int(ids[r*K+k]))
				}
			}
			for c := 0; c < H; c++ {
				y[r*H+c] = fromF32[E](toF32(recv[r*H+c]) * f)
			}
		}
	}
	out := make([]E, in.T*H)
	require.NoError(t, g.Combine(h, y, out, nil))
	for tok := 0; tok < in.T; tok++ {
		var f float64
		for k := 0; k < K; k++ {
			if e := in.topk[tok*K+k]; e >= 0 {
				f += float64(in.weights[tok*K+k]) * float64(scale(int(e)))
			}
		}
		for c := 0; c < H; c++ {
			want := float64(value(me, tok, c)) * f
			got := float64(toF32(out[tok*H+c]))
			if d := got - want; d > relTol*abs(want) || d < -relTol*abs(want) {
				t.Fatalf("token %d element %d = %v, want %v (relative tolerance %v)", tok, c, got, want, relTol)
			}
		}
	}
}

func abs(f float64) float64 {
	if f < 0 {
		return -f
	}
	return f
}

// Many consecutive LL calls with new routing each time, two in flight
// (d0 d1 c0 d2 c1 ...): the rows of call i must survive dispatch i+1.
func TestConsecutiveCallsBothBuffers(t *testing.T) {
	w := mpitesting.World
	R, me := w.Size(), w.Rank()
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) {
			defer mpitesting.Agree(t, w)
			base := scenarios(R)[0]
			g := newGroup[ep.BF16](t, base.config(mode))
			type call struct {
				sc  scenario
				ins []input
				h   *ep.Handle[ep.BF16]
			}
			var prev *call
			finish := func(c *call) {
				// The rows are still intact, then combine them.
				if mode == ep.LowLatency {
					checkLLRecv(t, c.h, c.sc, c.ins)
				}
				in := c.ins[me]
				out := make([]ep.BF16, in.T*c.sc.hidden)
				req, err := g.CombineSend(c.h, c.h.Recv(), out, nil)
				require.NoError(t, err)
				require.NoError(t, req.Wait())
				checkIdentityCombine(t, mode, c.sc, in, out)
			}
			for i := 0; i < 12; i++ {
				sc := base
				sc.seed = uint64(100 + i)
				c := &call{sc: sc, ins: allInputs(sc, R)}
				in := c.ins[me]
				req, err := g.DispatchSend(payload[ep.BF16](me, in.T, sc.hidden), in.topk, in.weights)
				require.NoError(t, err)
				if mode == ep.HighThroughput && prev != nil {
					t.Fatal("unreachable")
				}
				c.h, err = req.Wait()
				require.NoError(t, err)
				if mode == ep.LowLatency {
					checkLLRecv(t, c.h, sc, c.ins)
					if prev != nil {
						finish(prev)
					}
					prev = c
				} else {
					checkHTRecv(t, c.h, sc, c.ins)
					finish(c)
				}
			}
			if prev != nil {
				finish(prev)
			}
		})
	}
}

// Combine is the transpose of dispatch: for any x and y,
// sum over ranks <Dispatch(x), y> = sum over ranks <x, Combine(y)>, and the
// backward of a combine is a cached dispatch of the output gradient.
func TestBackwardIsTranspose(t *testing.T) {
	w := mpitesting.World
	R, me := w.Size(), w.Rank()
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) {
			defer mpitesting.Agree(t, w)
			sc := scenarios(R)[0]
			g := newGroup[float32](t, sc.config(mode))
			H, K := sc.hidden, sc.topk
			in := sc.input(me, R)
			small := func(i, salt int) float32 { return float32((i*7+salt*13+me*5)%9 - 4) }
			x := make([]float32, in.T*H)
			for i := range x {
				x[i] = small(i, 1)
			}
			h, err := g.Dispatch(x, in.topk, in.weights)
			require.NoError(t, err)
			recv := h.Recv()
			valid := validRows(h, sc, R)
			y := make([]float32, len(recv))
			var lhs float64
			for _, r := range valid {
				for c := 0; c < H; c++ {
					y[r*H+c] = small(r*H+c, 2)
					lhs += float64(recv[r*H+c]) * float64(y[r*H+c])
				}
			}
			var opts *ep.CombineOptions
			if mode == ep.LowLatency {
				ones := make([]float32, in.T*K)
				for i := range ones {
					ones[i] = 1
				}
				opts = &ep.CombineOptions{WeightsOverride: ones}
			}
			out := make([]float32, in.T*H)
			require.NoError(t, g.Combine(h, y, out, opts))
			var rhs float64
			for i := range x {
				rhs += float64(x[i]) * float64(out[i])
			}
			sums := make([]float64, 2)
			require.NoError(t, mpi.Allreduce(w, mpi.OpSum, []float64{lhs, rhs}, sums))
			assert.Equal(t, sums[0], sums[1], "<D x, y> = <x, C y> summed over ranks")

			// Backward of the combine: dispatch the output gradient with the same routing.
			gradOut := make([]float32, in.T*H)
			var lhs2 float64
			for i := range gradOut {
				gradOut[i] = small(i, 3)
				lhs2 += float64(out[i]) * float64(gradOut[i])
			}
			hb, err := g.DispatchCached(h, gradOut, nil)
			require.NoError(t, err)
			var rhs2 float64
			grecv := hb.Recv()
			for _, r := range validRows(hb, sc, R) {
				for c := 0; c < H; c++ {
					rhs2 += float64(y[r*H+c]) * float64(grecv[r*H+c])
				}
			}
			require.NoError(t, mpi.Allreduce(w, mpi.OpSum, []float64{lhs2, rhs2}, sums))
			assert.Equal(t, sums[0], sums[1], "<C y, g> = <y, D_cached g> summed over ranks")
			if mode == ep.LowLatency {
				require.NoError(t, g.Combine(hb, hb.Recv(), make([]float32, in.T*H), nil))
			}
		})
	}
}

// validRows lists the row indices of Recv that hold data.
func validRows[E ep.Element](h *ep.Handle[E], sc scenario, R int) []int {
	var rows []int
	if h.Mode() == ep.HighThroughput {
		for r := 0; r < h.NumRecv(); r++ {
			rows = append(rows, r)
		}
		return rows
	}
	span := R * sc.maxTok
	for l, n := range h.ExpertCounts() {
		for j := 0; j < n; j++ {
			rows = append(rows, l*span+j)
		}
	}
	return rows
}

// RowValues travel back to their (token, slot): the gradient of the gate.
func TestRowValuesReturnToSlots(t *testing.T) {
	w := mpitesting.World
	R, me := w.Size(), w.Rank()
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) {
			defer mpitesting.Agree(t, w)
			sc := scenarios(R)[0]
			g := newGroup[float32](t, sc.config(mode))
			H, K, L := sc.hidden, sc.topk, sc.experts/R
			in := sc.input(me, R)
			f := func(src, tok, expert int) float32 { return float32(src*10000 + tok*100 + expert) }
			h, err := g.Dispatch(payload[float32](me, in.T, H), in.topk, in.weights)
			require.NoError(t, err)
			var rowValues []float32
			if mode == ep.LowLatency {
				span := R * sc.maxTok
				rowValues = make([]float32, L*span)
				for _, r := range validRows(h, sc, R) {
					src, tok, err := h.Source(r)
					require.NoError(t, err)
					rowValues[r] = f(src, tok, me*L+r/span)
				}
			} else {
				rowValues = make([]float32, h.NumRecv()*K)
				ids := h.RecvTopK()
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
			slots := make([]float32, in.T*K)
			out := make([]float32, in.T*H)
			require.NoError(t, g.Combine(h, h.Recv(), out, &ep.CombineOptions{RowValues: rowValues, SlotValues: slots}))
			for tok := 0; tok < in.T; tok++ {
				for k := 0; k < K; k++ {
					want := float32(0)
					if e := in.topk[tok*K+k]; e >= 0 {
						want = f(me, tok, int(e))
					}
					assert.Equal(t, want, slots[tok*K+k], "slot value of token %d slot %d", tok, k)
				}
			}
		})
	}
}
