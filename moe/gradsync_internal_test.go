package moe

import (
	"math/rand/v2"
	"slices"
	"testing"
)

// kthLargest agrees with sorting, on arrays with many repeated values (the
// zeros of a sparse gradient) and without.
func TestKthLargest(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for trial := 0; trial < 300; trial++ {
		n := 1 + r.IntN(200)
		a := make([]float64, n)
		distinct := 1 + r.IntN(n+3)
		for i := range a {
			a[i] = float64(r.IntN(distinct))
		}
		sorted := slices.Clone(a)
		slices.Sort(sorted)
		slices.Reverse(sorted)
		k := 1 + r.IntN(n)
		if got := kthLargest(slices.Clone(a), k); got != sorted[k-1] {
			t.Fatalf("kthLargest(%v, %d) = %v, want %v", a, k, got, sorted[k-1])
		}
	}
}

// topKIndexes picks exactly k indexes, ascending, the largest magnitudes,
// ties to the lower index.
func TestTopKIndexes(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for trial := 0; trial < 200; trial++ {
		n := 1 + r.IntN(100)
		v := make([]float64, n)
		for i := range v {
			v[i] = float64(r.IntN(7) - 3)
		}
		k := 1 + r.IntN(n)
		_, _, got := topKIndexes(v, k, nil, nil, nil)
		idx := make([]int, n)
		for i := range idx {
			idx[i] = i
		}
		slices.SortStableFunc(idx, func(a, b int) int {
			ma, mb := magnitude(v[a]), magnitude(v[b])
			switch {
			case ma > mb:
				return -1
			case ma < mb:
				return 1
			}
			return 0
		})
		want := slices.Clone(idx[:k])
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Fatalf("topKIndexes(%v, %d) = %v, want %v", v, k, got, want)
		}
	}
}

// On gradients large enough for the sampled threshold (k > 128, n >> k), the
// selection is still exact: against sorting, for values of many kinds, and
// when the sample misleads the estimate (the sampled entries are the
// largest), which falls back to a selection over all entries.
func TestTopKIndexesSampled(t *testing.T) {
	const n, k = 60000, 300
	r := rand.New(rand.NewPCG(8, 9))
	stride := n / (64 * (n / k))
	for _, tc := range []struct {
		name string
		draw func(i int) float64
	}{
		{"normal", func(int) float64 { return r.NormFloat64() }},
		{"ties", func(int) float64 { return float64(r.IntN(9) - 4) }},
		{"mostly-zero", func(int) float64 {
			if r.IntN(100) == 0 {
				return r.NormFloat64()
			}
			return 0
		}},
		{"sample-misleads", func(i int) float64 {
			if i%stride == 0 {
				return 100 + r.Float64()
			}
			return r.NormFloat64()
		}},
	} {
		v := make([]float64, n)
		for i := range v {
			v[i] = tc.draw(i)
		}
		_, _, got := topKIndexes(v, k, nil, nil, nil)
		idx := make([]int, n)
		for i := range idx {
			idx[i] = i
		}
		slices.SortStableFunc(idx, func(a, b int) int {
			ma, mb := magnitude(v[a]), magnitude(v[b])
			switch {
			case ma > mb:
				return -1
			case ma < mb:
				return 1
			}
			return 0
		})
		want := slices.Clone(idx[:k])
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Errorf("%s: topKIndexes picked %d indexes, %d of them not the reference's", tc.name, len(got), len(got)-countCommon(got, want))
		}
	}
}

func countCommon(a, b []int) int {
	n := 0
	for _, x := range a {
		if _, ok := slices.BinarySearch(b, x); ok {
			n++
		}
	}
	return n
}
