package ep

import (
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"
)

// referenceRouting is the layout computed the obvious way, to check the C
// kernel and its Go version for small batches against.
func referenceRouting(sh shape, topk []int32, T int) (*Routing, string) {
	r := &Routing{T: T, PerExpert: make([]int32, sh.E), PerRank: make([]int32, sh.R), PerNode: make([]int32, sh.nodes),
		PairOrd: make([]int32, T*sh.K), TokRankOrd: make([]int32, T*sh.R), TokNodeOrd: make([]int32, T*sh.nodes)}
	for i := range r.TokRankOrd {
		r.TokRankOrd[i] = -1
	}
	for i := range r.TokNodeOrd {
		r.TokNodeOrd[i] = -1
	}
	for t := 0; t < T; t++ {
		for k := 0; k < sh.K; k++ {
			e := topk[t*sh.K+k]
			if e < -1 || int(e) >= sh.E {
				return nil, "out of range"
			}
			if e >= 0 && slices.Contains(topk[t*sh.K:t*sh.K+k], e) {
				return nil, "twice"
			}
		}
		for k := 0; k < sh.K; k++ {
			e := topk[t*sh.K+k]
			if e < 0 {
				r.PairOrd[t*sh.K+k] = -1
				continue
			}
			r.PairOrd[t*sh.K+k] = r.PerExpert[e]
			r.PerExpert[e]++
		}
		for rank := 0; rank < sh.R; rank++ {
			for k := 0; k < sh.K; k++ {
				if e := topk[t*sh.K+k]; e >= 0 && int(e)/sh.L == rank {
					r.TokRankOrd[t*sh.R+rank] = r.PerRank[rank]
					r.PerRank[rank]++
					break
				}
			}
		}
		for n := 0; n < sh.nodes; n++ {
			for k := 0; k < sh.K; k++ {
				if e := topk[t*sh.K+k]; e >= 0 && int(sh.nodeOf[int(e)/sh.L]) == n {
					r.TokNodeOrd[t*sh.nodes+n] = r.PerNode[n]
					r.PerNode[n]++
					break
				}
			}
		}
	}
	return r, ""
}

// layoutCase builds a shape and top-k ids from raw numbers.
func layoutCase(ids []int32, k, ranks, local, PerNode uint8) (shape, []int32, int) {
	K, R, L := 1+int(k%6), 1+int(ranks%6), 1+int(local%4)
	P := 1 + int(PerNode)%R
	sh := shape{E: R * L, L: L, R: R, K: K, nodeOf: make([]int32, R), nodes: (R + P - 1) / P}
	for r := range sh.nodeOf {
		sh.nodeOf[r] = int32(r / P)
	}
	T := len(ids) / K
	return sh, ids[:T*K], T
}

// checkLayoutCase checks compute against the reference, and the C kernel
// and the Go layout against each other: the same code for the first bad
// entry, or the same routing (compute takes only one of them for a batch).
func checkLayoutCase(t *testing.T, sh shape, topk []int32, T int) {
	got := &Routing{}
	err := computeRouting(got, "test", sh, topk, T)
	want, wantErr := referenceRouting(sh, topk, T)
	fromC, fromGo := &Routing{}, &Routing{}
	require.NoError(t, computeRouting(fromC, "test", sh, nil, 0)) // sizes the outputs
	require.NoError(t, computeRouting(fromGo, "test", sh, nil, 0))
	for _, r := range []*Routing{fromC, fromGo} {
		r.T, r.PairOrd, r.TokRankOrd, r.TokNodeOrd = T, make([]int32, T*sh.K), make([]int32, T*sh.R), make([]int32, T*sh.nodes)
	}
	badC, badGo := routingC(fromC, sh, topk), routingGo(fromGo, sh, topk)
	require.Equal(t, badC, badGo, "the C and Go layouts' first bad entry: %v: %v", sh, topk)
	if wantErr != "" {
		require.GreaterOrEqual(t, badC, int64(0), "%v: %v", sh, topk)
		require.Error(t, err, "%v: %v", sh, topk)
		require.Contains(t, err.Error(), wantErr)
		return
	}
	require.NoError(t, err, "%v: %v", sh, topk)
	require.Equal(t, want, got, "%v: %v", sh, topk)
	require.Equal(t, want, fromC, "the C layout: %v: %v", sh, topk)
	require.Equal(t, want, fromGo, "the Go layout: %v: %v", sh, topk)
}

// A property test over many random cases, valid and not.
func TestLayoutKernelAgainstReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	for i := 0; i < 3000; i++ {
		k, r, l, p := uint8(rng.IntN(256)), uint8(rng.IntN(256)), uint8(rng.IntN(256)), uint8(rng.IntN(256))
		sh, _, _ := layoutCase(make([]int32, 6), k, r, l, p)
		n := rng.IntN(40) * sh.K
		ids := make([]int32, n)
		for j := range ids {
			switch {
			case i%10 == 0: // sometimes invalid
				ids[j] = int32(rng.IntN(sh.E+4) - 2)
			case rng.IntN(5) == 0:
				ids[j] = -1
			default:
				ids[j] = int32(rng.IntN(sh.E))
			}
		}
		if i%10 != 0 { // mostly valid: make ids distinct within each token
			for tok := 0; tok < n/sh.K; tok++ {
				perm := rng.Perm(sh.E)
				for kk := 0; kk < sh.K && kk < sh.E; kk++ {
					if ids[tok*sh.K+kk] >= 0 {
						ids[tok*sh.K+kk] = int32(perm[kk])
					}
				}
			}
		}
		sh, topk, T := layoutCase(ids, k, r, l, p)
		t.Run(strconv.Itoa(i), func(t *testing.T) { checkLayoutCase(t, sh, topk, T) })
	}
}

func FuzzLayout(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4, 5, 255, 1}, uint8(2), uint8(3), uint8(2), uint8(1))
	f.Add([]byte{7, 7, 1, 2}, uint8(1), uint8(1), uint8(3), uint8(0))
	f.Fuzz(func(t *testing.T, raw []byte, k, ranks, local, PerNode uint8) {
		ids := make([]int32, len(raw))
		for i, b := range raw {
			ids[i] = int32(b%32) - 2 // -2 .. 29: covers invalid ids too
		}
		sh, topk, T := layoutCase(ids, k, ranks, local, PerNode)
		checkLayoutCase(t, sh, topk, T)
	})
}

// The C conversion against BF16From, over every class of float32.
func TestBF16ConversionMatchesGo(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 5))
	src := []float32{0, -0, 1, -1, 1.00390625, 1.01171875, 3.4e38, -3.4e38, 1e-40, -1e-40,
		float32(math.Inf(1)), float32(math.Inf(-1)), float32(math.NaN())}
	for i := 0; i < 10000; i++ {
		src = append(src, math.Float32frombits(rng.Uint32()))
	}
	dst := make([]BF16, len(src))
	require.NoError(t, ToBF16(dst, src))
	back := make([]float32, len(src))
	require.NoError(t, FromBF16(back, dst))
	for i, f := range src {
		want := BF16From(f)
		require.Equal(t, want, dst[i], "ToBF16(%v) (bits %#x)", f, math.Float32bits(f))
		require.Equal(t, math.Float32bits(want.Float32()), math.Float32bits(back[i]), "FromBF16 of %#x", uint16(want))
		if f == f && !math.IsInf(float64(f), 0) && math.Abs(float64(f)) < 3e38 {
			require.LessOrEqual(t, math.Abs(float64(back[i]-f)), math.Abs(float64(f))/256+1e-38, "rounding bound for %v", f)
		}
	}
	require.Error(t, ToBF16(dst[:1], src))
}
