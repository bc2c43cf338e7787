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
		_, got := topKIndexes(v, k, nil, nil)
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
