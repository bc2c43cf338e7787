package grow

import "testing"

func TestTo(t *testing.T) {
	for _, c := range []struct {
		name    string
		s       []int
		n       int
		reuse   bool // the result shares s's array
		wantCap int
	}{
		{"nil to zero", nil, 0, false, 0},
		{"nil to some", nil, 3, false, 3},
		{"shrinks in place", make([]int, 5, 8), 2, true, 8},
		{"grows within capacity", make([]int, 2, 8), 7, true, 8},
		{"grows past capacity", make([]int, 2, 4), 9, false, 9},
		{"empty but not nil", make([]int, 0, 4), 0, true, 4},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := To(c.s, c.n)
			if got == nil {
				t.Fatal("To returned nil")
			}
			if len(got) != c.n || cap(got) != c.wantCap {
				t.Fatalf("len %d cap %d, want len %d cap %d", len(got), cap(got), c.n, c.wantCap)
			}
			shared := cap(c.s) > 0 && cap(got) > 0 && &got[:1][0] == &c.s[:1][0]
			if shared != c.reuse {
				t.Fatalf("shares the input's array: %v, want %v", shared, c.reuse)
			}
		})
	}
}
