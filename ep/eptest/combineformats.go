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

// combineFormats are the combine formats of the table other than the FP8
// ones (FP8Combine checks those), with the LowLatency feature each asks for.
func combineFormats() map[ep.WireFormat]ep.Feature {
	fs := map[ep.WireFormat]ep.Feature{}
	for _, w := range ep.Wires() {
		info, _ := w.Info()
		if f := info.Combine[ep.LowLatency]; f != 0 && !w.FP8() {
			fs[w] = f
		}
	}
	return fs
}

// combineRefs are the test's own definitions of the combine formats: a row
// of element values to the float32 values its reader sums. A format of the
// table without one here fails the suite.
var combineRefs = map[ep.WireFormat]func(x []float32) []float32{
	ep.WireNVFP4: nvfp4Ref,
}

// testCombineFormats checks every such format the backend declares against
// the test's definition.
func (s Suite) testCombineFormats(t *testing.T) {
	for w, f := range combineFormats() {
		if !s.declares(f) {
			continue
		}
		require.Contains(t, combineRefs, w, "the suite has no definition of combine format %v", w)
		for i, sc := range forwardScenarios(s.Comm.Size()) {
			t.Run(fmt.Sprintf("%v/%s/bf16", w, sc.name), func(t *testing.T) { checkCombineFormat[ep.BF16](t, s, w, sc) })
			if i == 0 {
				t.Run(fmt.Sprintf("%v/%s/f32", w, sc.name), func(t *testing.T) { checkCombineFormat[float32](t, s, w, sc) })
			}
		}
	}
}

// nvfp4Ref is WireNVFP4's values of a row, from its definition: a row scale
// g = amax/2688, per 16 elements an e4m3 scale nearest to amax_b/6/g and its
// effective scale es = e4m3*g, each element the e2m1 value nearest to x/es
// (ties to the even code), times es; all in float32.
func nvfp4Ref(x []float32) []float32 {
	var amax float32
	for _, v := range x {
		amax = max(amax, float32(math.Abs(float64(v))))
	}
	g := amax / 2688
	out := make([]float32, len(x))
	if g == 0 {
		return out
	}
	mags := []float32{0, 0.5, 1, 1.5, 2, 3, 4, 6}
	for b := 0; b < len(x); b += 16 {
		var bmax float32
		for _, v := range x[b : b+16] {
			bmax = max(bmax, float32(math.Abs(float64(v))))
		}
		es := float32(float32(fp8ref.Decode(fp8ref.Round(float64(bmax/6/g)))) * g)
		for i := b; i < b+16; i++ {
			if es == 0 {
				continue
			}
			a := float32(math.Abs(float64(x[i] / es)))
			best := 0
			for k := range mags { // nearest, the even code (k even) on a tie
				d, bd := math.Abs(float64(mags[k]-a)), math.Abs(float64(mags[best]-a))
				if d < bd || d == bd && k%2 == 0 {
					best = k
				}
			}
			v := float32(mags[best] * es)
			if x[i] < 0 {
				v = -v
			}
			out[i] = v
		}
	}
	return out
}

// An LL combine in format w is exactly its definition: each token's result
// is the float32 sum, in top-k order, of weight times its expert outputs'
// values by the format (combineRefs), rounded once to the element type.
func checkCombineFormat[E ep.Element](t *testing.T, s Suite, w ep.WireFormat, sc scenario) {
	defer s.agree(t)
	cfg := sc.config(ep.LowLatency)
	cfg.CombineWire = w
	g := newGroup[E](t, s, s.Backend, cfg)
	R, me, H, K := s.Comm.Size(), s.Comm.Rank(), sc.hidden, sc.topk
	in, x, out := llExpertRound(t, s, g, sc)

	ref := combineRefs[w]
	yk := make([]float32, H)
	for tok := 0; tok < in.T; tok++ {
		var acc []float32
		for k := 0; k < K; k++ {
			e := in.topk[tok*K+k]
			if e < 0 {
				continue
			}
			for c := range yk {
				yk[c] = ep.Float32Of(ep.ElementOf[E](expertFactor(e) * ep.Float32Of(x[tok*H+c])))
			}
			v, wk := ref(yk), in.weights[tok*K+k]
			if acc == nil {
				acc = make([]float32, H)
				for c := range acc {
					acc[c] = float32(wk * v[c])
				}
				continue
			}
			for c := range acc {
				acc[c] = float32(acc[c] + float32(wk*v[c]))
			}
		}
		for c := 0; c < H; c++ {
			var want E
			if acc != nil {
				want = ep.ElementOf[E](acc[c])
			}
			if got := out[tok*H+c]; got != want {
				t.Errorf("token %d element %d: %v, want %v by the definition", tok, c, ep.Float32Of(got), ep.Float32Of(want))
				return
			}
		}
	}
	// Its statistics count the rows of the format a combine moves back.
	info, _ := w.Info()
	st := g.Stats()
	rows := rowsBetween(sc, allInputs(sc, R), ep.LowLatency, R)
	wire := int64(info.RowBytes(H, 0) + info.SideBytes(H))
	elem := int64(H * ep.DTypeOf[E]().Size())
	for p := 0; p < R; p++ {
		assert.Equal(t, rows[me][p]*elem+rows[p][me]*wire, st.SentBytes[p], "bytes sent to rank %d", p)
	}
}
