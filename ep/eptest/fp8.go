package eptest

import (
	"errors"
	"fmt"
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goep/goep/ep"
	"github.com/goep/goep/internal/fp8ref"
	"github.com/goep/goep/mpi"
)

var fp8Wires = []ep.WireFormat{ep.WireFP8, ep.WireFP8UE8M0}

// fp8Scenarios have hidden sizes with whole and partial groups of 128.
func fp8Scenarios(ranks int) []scenario {
	return []scenario{
		{name: "random-uneven-h200", experts: 4 * ranks, topk: 3, maxTok: 16, hidden: 200, seed: 11, tokens: unevenTokens, route: randomRoute(0.15)},
		{name: "full-h128", experts: 2 * ranks, topk: 2, maxTok: 16, hidden: 128, seed: 12, tokens: fullTokens, route: randomRoute(0)},
		{name: "all-to-one-h24", experts: 2 * ranks, topk: 2, maxTok: 16, hidden: 24, seed: 13, tokens: fullTokens, route: oneExpertRoute},
	}
}

// payloadFP8 is rank r's tokens for an FP8 dispatch: each group of 128
// elements of a row has its largest magnitude 448*2^k (so that its scale is
// 2^k in both scale kinds, and dequantized values times dyadic weights sum
// exactly), the others spread below it (they round in the cast), and one
// group in five is all zero.
func payloadFP8[E ep.Element](r, T, H int) []E {
	x := make([]E, T*H)
	for t := 0; t < T; t++ {
		for g := 0; g*ep.ScaleGroup < H; g++ {
			if (r+t+g)%5 == 4 {
				continue
			}
			amax := math.Ldexp(448, (r+2*t+3*g)%7-3)
			n := min(ep.ScaleGroup, H-g*ep.ScaleGroup)
			for c := 0; c < n; c++ {
				v := amax * float64((r*131+t*71+c*29)%255-127) / 128
				if c == (r+t+g)%n {
					v = amax
					if (t+g)%2 == 1 {
						v = -amax
					}
				}
				x[t*H+g*ep.ScaleGroup+c] = ep.ElementOf[E](float32(v))
			}
		}
	}
	return x
}

// fp8Row is the reference quantization of a row: its codes, scales and
// exact dequantized values.
type fp8Row struct {
	codes  []uint8
	scales []float32
	values []float64
}

func quantizeRef[E ep.Element](x []E, pow2 bool) fp8Row {
	f := make([]float32, len(x))
	for i, v := range x {
		f[i] = ep.Float32Of(v)
	}
	var r fp8Row
	r.codes, r.scales = fp8ref.Quantize(f, ep.ScaleGroup, pow2)
	r.values = make([]float64, len(x))
	for i, q := range r.codes {
		r.values[i] = fp8ref.Decode(q) * float64(r.scales[i/ep.ScaleGroup])
	}
	return r
}

// testFP8 checks FP8 dispatch (Config.Wire), which the backend declares
// (testFeatureRefusals checks its refusal where it does not).
func (s Suite) testFP8(t *testing.T) {
	for _, mode := range modes {
		for _, w := range fp8Wires {
			for i, sc := range fp8Scenarios(s.Comm.Size()) {
				t.Run(fmt.Sprintf("%v/%v/%s/bf16", mode, w, sc.name), func(t *testing.T) { checkFP8[ep.BF16](t, s, mode, w, sc) })
				if i == 0 {
					t.Run(fmt.Sprintf("%v/%v/%s/f32", mode, w, sc.name), func(t *testing.T) { checkFP8[float32](t, s, mode, w, sc) })
				}
			}
		}
	}
}

// The received e4m3 rows and scales equal the reference quantization of
// the rows sent, bit for bit, in the layout and order of the mode (through
// a fresh, a cached and a repeated dispatch); dequantized, combined by
// identity experts, they give exactly the reference's combine; the
// statistics count codes and scales; Recv is empty and combining it is
// refused with a hint.
func checkFP8[E ep.Element](t *testing.T, s Suite, mode ep.Mode, w ep.WireFormat, sc scenario) {
	defer s.agree(t)
	cfg := sc.config(mode)
	cfg.Wire = w
	g := newGroup[E](t, s, s.Backend, cfg)
	R, me, H := s.Comm.Size(), s.Comm.Rank(), sc.hidden
	ins := allInputs(sc, R)
	in := ins[me]
	pow2 := w == ep.WireFP8UE8M0
	// refs[f][src][tok]: the reference rows of payload times f.
	refs := map[float32][][]fp8Row{}
	ref := func(f float32, src, tok int) fp8Row {
		if refs[f] == nil {
			refs[f] = make([][]fp8Row, R)
		}
		if refs[f][src] == nil {
			x := payloadFP8[E](src, ins[src].T, H)
			for i := range x {
				x[i] = ep.ElementOf[E](f * ep.Float32Of(x[i]))
			}
			refs[f][src] = make([]fp8Row, ins[src].T)
			for tk := range refs[f][src] {
				refs[f][src][tk] = quantizeRef(x[tk*H:(tk+1)*H], pow2)
			}
		}
		return refs[f][src][tok]
	}
	xh := payloadFP8[E](me, in.T, H)
	x := upload(t, g, xh)
	g.ResetStats()
	h, err := g.Dispatch(ep.Tokens(x, in.topk, in.weights))
	require.NoError(t, err)
	assert.True(t, h.Recv().IsZero(), "an FP8 group's Recv is empty")
	codes, scales := checkFP8Recv(t, s, h, sc, ins, func(src, tok int) fp8Row { return ref(1, src, tok) })
	out1 := combineDequantized(t, s, g, h, sc, in)
	checkFP8Combine(t, s, mode, sc, in, out1, func(tok int) fp8Row { return ref(1, me, tok) })
	checkFP8Stats(t, s, g, mode, sc, ins)

	// A cached dispatch of 2x: the same codes, scales doubled (zero groups
	// keep theirs), and exactly twice the combine.
	x2h := make([]E, len(xh))
	for i := range xh {
		x2h[i] = ep.ElementOf[E](2 * ep.Float32Of(xh[i]))
	}
	h2, err := g.Dispatch(ep.Reuse(h, upload(t, g, x2h), nil))
	require.NoError(t, err)
	checkFP8Recv(t, s, h2, sc, ins, func(src, tok int) fp8Row { return ref(2, src, tok) })
	out2 := combineDequantized(t, s, g, h2, sc, in)
	for i := range out1 {
		if ep.Float32Of(out2[i]) != 2*ep.Float32Of(out1[i]) {
			t.Errorf("cached FP8 dispatch of 2x: out[%d] = %v, want 2 * %v", i, ep.Float32Of(out2[i]), ep.Float32Of(out1[i]))
			break // (no Fatal: the other ranks go on with the calls below)
		}
	}

	// A repeated dispatch receives the same bytes.
	h3, err := g.Dispatch(ep.Tokens(x, in.topk, in.weights))
	require.NoError(t, err)
	codes3, scales3 := checkFP8Recv(t, s, h3, sc, ins, func(src, tok int) fp8Row { return ref(1, src, tok) })
	assert.Equal(t, codes, codes3, "a repeated FP8 dispatch's codes")
	assert.Equal(t, scales, scales3, "a repeated FP8 dispatch's scales")
	err = g.Combine(h3, h3.Recv(), zeros[E](t, g, in.T*H), nil)
	assert.ErrorIs(t, err, ep.ErrBadInput)
	assert.ErrorContains(t, err, "write the outputs into CombineBuffer()")
	require.NoError(t, g.Combine(h3, h3.CombineBuffer(), zeros[E](t, g, in.T*H), nil))
}

// checkFP8Recv compares every valid received row with the reference
// quantization of the row it came from, and returns copies of the valid
// rows' codes and scales. Like the other local checks, it reports a
// difference with Errorf, not Fatal, so that this rank goes on with the
// collective calls of its test as the others do.
func checkFP8Recv[E ep.Element](t *testing.T, s Suite, h ep.Handle[E], sc scenario, ins []input, ref func(src, tok int) fp8Row) ([]ep.E4M3, []float32) {
	t.Helper()
	me, H := s.Comm.Rank(), sc.hidden
	G := ep.ScaleGroups(H)
	require.True(t, h.Recv().IsZero(), "Recv of an FP8 group")
	codes, scales := host(t, h.RecvFP8()), host(t, h.RecvScales())
	require.Equal(t, len(codes)/H*G, len(scales), "one scale per group of 128 of every row")
	want, rows := expectedRows(t, h, sc, ins, me)
	if h.Mode() == ep.LowLatency {
		require.Equal(t, sc.experts*sc.maxTok*H, len(codes))
	}
	deq := make([]E, len(codes))
	require.NoError(t, ep.Dequantize(deq, codes, scales, H))
	var validCodes []ep.E4M3
	var validScales []float32
	for i, r := range rows {
		validCodes = append(validCodes, codes[r*H:(r+1)*H]...)
		validScales = append(validScales, scales[r*G:(r+1)*G]...)
		src, tok, err := h.Source(r)
		require.NoError(t, err)
		require.Equal(t, [2]int{want[i].src, want[i].tok}, [2]int{src, tok}, "source of row %d", r)
		ref := ref(src, tok)
		for g := 0; g < G; g++ {
			if scales[r*G+g] != ref.scales[g] {
				t.Errorf("row %d (rank %d token %d): scale of group %d = %g, want %g", r, src, tok, g, scales[r*G+g], ref.scales[g])
				return validCodes, validScales
			}
		}
		for c := 0; c < H; c++ {
			if uint8(codes[r*H+c]) != ref.codes[c] {
				t.Errorf("row %d (rank %d token %d): element %d: code %#x, want %#x", r, src, tok, c, uint8(codes[r*H+c]), ref.codes[c])
				return validCodes, validScales
			}
			if want := ep.ElementOf[E](float32(ref.values[c])); deq[r*H+c] != want {
				t.Errorf("row %d element %d dequantized to %v, want %v", r, c, ep.Float32Of(deq[r*H+c]), ep.Float32Of(want))
				return validCodes, validScales
			}
		}
	}
	return validCodes, validScales
}

// expectedRows is, for a handle of the mode's default layout, the rows
// this rank must have received (source and token) and where each is.
func expectedRows[E ep.Element](t *testing.T, h ep.Handle[E], sc scenario, ins []input, me int) (want []row, at []int) {
	t.Helper()
	R := len(ins)
	if h.Mode() == ep.LowLatency {
		span := R * sc.maxTok
		for l, rs := range llExpected(sc, ins, me, R) {
			require.Equal(t, len(rs), h.ExpertCounts()[l], "rows of local expert %d", l)
			for j, r := range rs {
				want, at = append(want, r), append(at, l*span+j)
			}
		}
		return want, at
	}
	want = htExpected(sc, ins, me, R)
	require.Equal(t, len(want), h.NumRecv(), "rows received")
	for r := range want {
		at = append(at, r)
	}
	return want, at
}

// combineDequantized runs identity experts on the dequantized rows (written
// into CombineBuffer) and returns the combined tokens.
func combineDequantized[E ep.Element](t *testing.T, s Suite, g *ep.Group[E], h ep.Handle[E], sc scenario, in input) []E {
	t.Helper()
	codes, scales := host(t, h.RecvFP8()), host(t, h.RecvScales())
	y := make([]E, len(codes))
	require.NoError(t, ep.Dequantize(y, codes, scales, sc.hidden))
	require.NoError(t, ep.Upload(h.CombineBuffer(), y))
	out := zeros[E](t, g, in.T*sc.hidden)
	require.NoError(t, g.Combine(h, h.CombineBuffer(), out, nil))
	return host(t, out)
}

// checkFP8Combine: LL, out[t] = dequantized x[t] times the sum of its
// weights; HT, times the ranks it reached; exact, then rounded once.
func checkFP8Combine[E ep.Element](t *testing.T, s Suite, mode ep.Mode, sc scenario, in input, out []E, ref func(tok int) fp8Row) {
	t.Helper()
	H := sc.hidden
	for tok := 0; tok < in.T; tok++ {
		f := float64(weightSum(sc, in, tok))
		if mode == ep.HighThroughput {
			f = float64(ranksHit(sc, in, tok, s.Comm.Size()))
		}
		r := ref(tok)
		for c := 0; c < H; c++ {
			// (values compared, so +0 is -0: a token with every slot masked sums to +0)
			if want := ep.ElementOf[E](float32(r.values[c] * f)); ep.Float32Of(out[tok*H+c]) != ep.Float32Of(want) {
				t.Errorf("combined token %d element %d = %v, want %v (dequantized %v times %v)", tok, c, ep.Float32Of(out[tok*H+c]),
					ep.Float32Of(want), r.values[c], f)
				return
			}
		}
	}
}

// checkFP8Stats: a dispatch's rows count their codes and scales, the
// combine's their elements.
func checkFP8Stats[E ep.Element](t *testing.T, s Suite, g *ep.Group[E], mode ep.Mode, sc scenario, ins []input) {
	t.Helper()
	R, me, H := s.Comm.Size(), s.Comm.Rank(), sc.hidden
	rows := rowsBetween(sc, ins, mode, R)
	wire := int64(H + 4*ep.ScaleGroups(H))
	elem := int64(H * ep.DTypeOf[E]().Size())
	st := g.Stats()
	for p := 0; p < R; p++ {
		assert.Equal(t, rows[me][p]*wire+rows[p][me]*elem, st.SentBytes[p], "bytes sent to rank %d", p)
		assert.Equal(t, rows[p][me]*wire+rows[me][p]*elem, st.RecvBytes[p], "bytes received from rank %d", p)
	}
}

// rowsBetween is, for every pair of ranks (s, d), the rows s sends d in a
// dispatch: one per (token, expert) pair in LL, per (token, rank) in HT.
func rowsBetween(sc scenario, ins []input, mode ep.Mode, R int) [][]int64 {
	K, L := sc.topk, sc.experts/R
	rows := make([][]int64, R)
	for src, sin := range ins {
		rows[src] = make([]int64, R)
		for tk := 0; tk < sin.T; tk++ {
			hit := make([]bool, R)
			for k := 0; k < K; k++ {
				if e := sin.topk[tk*K+k]; e >= 0 {
					d := int(e) / L
					if mode == ep.LowLatency {
						rows[src][d]++
					} else if !hit[d] {
						hit[d] = true
						rows[src][d]++
					}
				}
			}
		}
	}
	return rows
}

// incapable is a Backend with the same engines that declares no feature.
type incapable struct{ b ep.Backend }

func (i incapable) Name() string { return i.b.Name() }
func (i incapable) Open(comm *mpi.Comm, spec ep.Spec) (ep.Engine, error) {
	return i.b.Open(comm, spec)
}

// configAsks sets, for each Feature a Config asks for, the field that asks.
var configAsks = map[ep.Feature]func(*ep.Config){
	ep.FeatureMaskStalledRanks: func(c *ep.Config) { c.MaskStalledRanks = true },
	ep.FeatureOverflowDrop:     func(c *ep.Config) { c.Mode, c.Overflow = ep.HighThroughput, ep.OverflowDrop },
}

// askFor is how a Config asks for f: configAsks' entry, or the first wire
// format of the table that needs f as Config.Wire or, in some mode, as
// Config.CombineWire (with a Hidden the format takes).
func askFor(f ep.Feature) (func(*ep.Config), bool) {
	if ask, ok := configAsks[f]; ok {
		return ask, true
	}
	for _, w := range ep.Wires() {
		info, _ := w.Info()
		if info.Dispatch && info.DispatchFeature == f {
			return func(c *ep.Config) { c.Wire, c.Hidden = w, 64 }, true
		}
		for _, mode := range modes {
			if cf, ok := info.Combine[mode]; ok && cf == f {
				return func(c *ep.Config) { c.Mode, c.CombineWire, c.Hidden = mode, w, 64 }, true
			}
		}
	}
	return nil, false
}

// A backend that does not declare a feature a Config asks for (FP8
// dispatch, masking stalled ranks) is refused it on every rank, before it
// opens anything, with an error naming it and the feature; a declaring one
// gets a group (whose engine NewGroup has checked for the feature's
// interface). The backend under test is also wrapped so that it declares
// nothing, so both sides are checked whatever it declares.
func (s Suite) testFeatureRefusals(t *testing.T) {
	defer s.agree(t)
	for _, f := range ep.Features() {
		ask, ok := askFor(f)
		if !ok {
			continue // not asked for by a Config: checked by what the engines do
		}
		cfg := scenarios(s.Comm.Size())[1].config(ep.LowLatency)
		cfg.Timeout = testTimeout
		ask(&cfg)
		for _, b := range []ep.Backend{incapable{s.Backend}, s.Backend} {
			cfg.Backend = b
			g, err := ep.NewGroup[ep.BF16](s.Comm, cfg)
			if !ep.Supports(b, f) {
				require.Error(t, err, "%v on a backend that does not declare it", f)
				assert.True(t, errors.Is(err, ep.ErrUnsupported), "errors.Is(%v, ErrUnsupported)", err)
				assert.ErrorContains(t, err, "the "+b.Name()+" backend does not implement "+f.String())
				continue
			}
			require.NoError(t, err, "%v, declared by the %s backend", f, b.Name())
			require.NoError(t, g.Close())
		}
	}
}
