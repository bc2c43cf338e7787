package eptest

import "github.com/goep/goep/ep"

// The reference: what rank `me` must receive, computed by brute force from
// every rank's input, with no knowledge of the implementation.

// row identifies a received row by its origin.
type row struct {
	src, tok, slot int
	weight         float32
}

// llExpected lists, per local expert of rank me, the (token, slot) pairs it
// receives: by source rank, then token.
func llExpected(sc scenario, ins []input, me, ranks int) [][]row {
	L := sc.experts / ranks
	out := make([][]row, L)
	for l := 0; l < L; l++ {
		e := int32(me*L + l)
		for s, in := range ins {
			for t := 0; t < in.T; t++ {
				for k := 0; k < sc.topk; k++ {
					if in.topk[t*sc.topk+k] == e {
						out[l] = append(out[l], row{src: s, tok: t, slot: k, weight: in.weights[t*sc.topk+k]})
					}
				}
			}
		}
	}
	return out
}

// htExpected lists the tokens rank me receives: by source rank, then token.
func htExpected(sc scenario, ins []input, me, ranks int) []row {
	L := sc.experts / ranks
	var out []row
	for s, in := range ins {
		for t := 0; t < in.T; t++ {
			for k := 0; k < sc.topk; k++ {
				if e := in.topk[t*sc.topk+k]; e >= 0 && int(e)/L == me {
					out = append(out, row{src: s, tok: t})
					break
				}
			}
		}
	}
	return out
}

// ranksHit is the number of distinct ranks token t's experts live on.
func ranksHit(sc scenario, in input, t, ranks int) int {
	L := sc.experts / ranks
	seen := map[int]bool{}
	for k := 0; k < sc.topk; k++ {
		if e := in.topk[t*sc.topk+k]; e >= 0 {
			seen[int(e)/L] = true
		}
	}
	return len(seen)
}

// weightSum is the sum of token t's unmasked weights, in slot order.
func weightSum(sc scenario, in input, t int) float32 {
	var s float32
	for k := 0; k < sc.topk; k++ {
		if in.topk[t*sc.topk+k] >= 0 {
			s += in.weights[t*sc.topk+k]
		}
	}
	return s
}

// scaled is x(r, t) times f, rounded once to E.
func scaled[E ep.Element](r, t, H int, f float32) []E {
	out := make([]E, H)
	for c := range out {
		out[c] = ep.ElementOf[E](value(r, t, c) * f)
	}
	return out
}

// validRows lists the row indices of Recv that hold data.
func validRows(mode ep.Mode, counts []int, numRecv, span int) []int {
	var rows []int
	if mode == ep.HighThroughput {
		for r := 0; r < numRecv; r++ {
			rows = append(rows, r)
		}
		return rows
	}
	for l, n := range counts {
		for j := 0; j < n; j++ {
			rows = append(rows, l*span+j)
		}
	}
	return rows
}

// zone is one local expert's zone of an HT expert-major dispatch as the
// reference lays it out: its rows (by source rank, then token) from row
// off, then zero rows up to off+padded.
type zone struct {
	off, padded int
	rows        []row
}

// htZonesExpected lays out what rank me receives in HT's expert-major
// layout with zones aligned to align rows: a row per (token, local expert)
// pair, zone by zone.
func htZonesExpected(sc scenario, ins []input, me, ranks, align int) []zone {
	pairs := llExpected(sc, ins, me, ranks) // the same pairs, in the same order, per expert
	zones := make([]zone, len(pairs))
	off := 0
	for l, rows := range pairs {
		padded := (len(rows) + align - 1) / align * align
		zones[l] = zone{off: off, padded: padded, rows: rows}
		off += padded
	}
	return zones
}

// tokenRow is a token as a flat or rank-major layout receives it: its
// origin and its top-k ids and weights as the receiver sees them.
type tokenRow struct {
	src, tok int
	ids      []int32 // -1 elsewhere; local or global
	weights  []float32
}

// tokensExpected lists, per source rank, the tokens rank me receives once
// each (HT flat, LL rank-major), in token order, with their ids as the
// receiver keeps them (global: the global id; else the local one).
func tokensExpected(sc scenario, ins []input, me, ranks int, global bool) [][]tokenRow {
	L, K := sc.experts/ranks, sc.topk
	out := make([][]tokenRow, ranks)
	for s, in := range ins {
		for t := 0; t < in.T; t++ {
			r := tokenRow{src: s, tok: t, ids: make([]int32, K), weights: make([]float32, K)}
			mine := false
			for k := 0; k < K; k++ {
				r.ids[k] = -1
				if e := in.topk[t*K+k]; e >= 0 && int(e)/L == me {
					mine = true
					r.ids[k], r.weights[k] = e, in.weights[t*K+k]
					if !global {
						r.ids[k] -= int32(me * L)
					}
				}
			}
			if mine {
				out[s] = append(out[s], r)
			}
		}
	}
	return out
}

// pairsOf is the number of token t's (unmasked) experts.
func pairsOf(sc scenario, in input, t int) int {
	n := 0
	for k := 0; k < sc.topk; k++ {
		if in.topk[t*sc.topk+k] >= 0 {
			n++
		}
	}
	return n
}
