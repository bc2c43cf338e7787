package main

// -layout expert-major: what a user of HT's flat layout writes to feed a
// grouped GEMM, timed beside ep's expert-major layout, which needs none of
// it: the received rows grouped by local expert (zones padded to the
// alignment with zero rows, a weight per row), and, for the combine, each
// received row's expert outputs summed back into it.

import (
	"fmt"

	"github.com/goep/goep/ep"
)

// permutation is the user's own zones and their bookkeeping, reused from
// call to call.
type permutation[E ep.Element] struct {
	H, K, align int
	zones       []E       // the rows, zone by zone, padded
	weights     []float32 // each zone row's gate weight
	off, next   []int     // [L+1] zone starts; the next free row of each zone
	pos         []int32   // [rows][K]: the zone row of each (row, slot); -1 none
	acc, f32    []float32 // the un-permutation's sums; a zone row widened (bfloat16)
}

func newPermutation[E ep.Element](H, K, L, align int) *permutation[E] {
	return &permutation[E]{H: H, K: K, align: max(align, 1), off: make([]int, L+1), next: make([]int, L),
		acc: make([]float32, H), f32: make([]float32, H)}
}

// permute groups the n rows of a flat dispatch (recv, with their local
// top-k ids and weights, counts rows per expert) into zones, in the order
// ep's expert-major layout has them (by source, then token: the flat
// order).
func (p *permutation[E]) permute(h ep.Handle[E]) error {
	recv, ids, w := h.Recv().Host(), h.RecvTopK().Host(), h.RecvWeights().Host()
	if recv == nil {
		return fmt.Errorf("ep-bench: -layout expert-major: the flat comparison needs a backend on host memory")
	}
	n, H, K := h.NumRecv(), p.H, p.K
	total := 0
	for l, c := range h.ExpertCounts() {
		p.off[l], p.next[l] = total, total
		total += (c + p.align - 1) / p.align * p.align
	}
	p.off[len(p.next)] = total
	p.zones, p.weights = growSlice(p.zones, total*H), growSlice(p.weights, total)
	p.pos = growSlice(p.pos, n*K)
	for r := 0; r < n; r++ {
		for k := 0; k < K; k++ {
			p.pos[r*K+k] = -1
			if l := ids[r*K+k]; l >= 0 {
				j := p.next[l]
				p.next[l]++
				copy(p.zones[j*H:(j+1)*H], recv[r*H:(r+1)*H])
				p.weights[j], p.pos[r*K+k] = w[r*K+k], int32(j)
			}
		}
	}
	for l := range p.next { // the padding: zero rows
		clear(p.zones[p.next[l]*H : p.off[l+1]*H])
		clear(p.weights[p.next[l]:p.off[l+1]])
	}
	return nil
}

// unpermute sums, for each of the n flat rows, its zone rows (the experts'
// outputs, here the zones themselves) in slot order, in float32, into out.
func (p *permutation[E]) unpermute(out []E, n int) {
	H, K := p.H, p.K
	for r := 0; r < n; r++ {
		first := true
		for k := 0; k < K; k++ {
			j := int(p.pos[r*K+k])
			if j < 0 {
				continue
			}
			row := p.zones[j*H : (j+1)*H]
			if first {
				widen(p.acc, row)
				first = false
				continue
			}
			widen(p.f32, row)
			addTo(p.acc, p.f32)
		}
		narrow(out[r*H:(r+1)*H], p.acc)
	}
}

// widen sets dst to src in float32.
func widen[E ep.Element](dst []float32, src []E) {
	switch s := any(src).(type) {
	case []float32:
		copy(dst, s)
	case []ep.BF16:
		_ = ep.FromBF16(dst, s) // one C call a row
	}
}

// narrow rounds src into dst.
func narrow[E ep.Element](dst []E, src []float32) {
	switch d := any(dst).(type) {
	case []float32:
		copy(d, src)
	case []ep.BF16:
		_ = ep.ToBF16(d, src)
	}
}

// addTo adds src to dst, eight at a time.
func addTo(dst, src []float32) {
	i := 0
	for ; i+8 <= len(dst); i += 8 {
		d, s := dst[i:i+8:i+8], src[i:i+8:i+8]
		d[0] += s[0]
		d[1] += s[1]
		d[2] += s[2]
		d[3] += s[3]
		d[4] += s[4]
		d[5] += s[5]
		d[6] += s[6]
		d[7] += s[7]
	}
	for ; i < len(dst); i++ {
		dst[i] += src[i]
	}
}

// growSlice returns s with length n, reallocating only when it is too
// small.
func growSlice[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	return s[:n]
}

// checkSameZones compares the user's zones with what ep's expert-major
// dispatch delivered: the same offsets, rows and weights, bit for bit.
func (p *permutation[E]) checkSameZones(em ep.Handle[E]) error {
	off := em.ExpertOffsets()
	for l := range off {
		if off[l] != p.off[l] {
			return fmt.Errorf("validation: zone %d starts at row %d in ep's expert-major layout, %d in the permutation", l, off[l], p.off[l])
		}
	}
	rows, w := em.Recv().Host(), em.RecvWeights().Host()
	if rows == nil {
		return nil
	}
	for i := range rows {
		if rows[i] != p.zones[i] {
			return fmt.Errorf("validation: ep's expert-major row %d differs from the permutation's", i/p.H)
		}
	}
	for i := range w {
		if w[i] != p.weights[i] {
			return fmt.Errorf("validation: ep's expert-major weight of row %d differs from the permutation's", i)
		}
	}
	return nil
}
