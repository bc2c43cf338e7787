package alltoallv

import (
	"math"

	"github.com/goep/goep/ep/driver"
	"github.com/goep/goep/internal/grow"
)

// The baseline's receive layouts other than the modes' own: it moves a row
// per (token, rank) as in HT's flat layout and unpacks it into the layout,
// as a program written by hand would (the permutation the CPU engine saves
// by writing rows into place). HT expert-major: each arriving row copied
// into the zone of each of its local experts, the combine sending back a
// row per pair, which the token's rank sums ranks in order, each rank's
// pairs in slot order (the CPU engine's order on one node). LL rank-major:
// source s's rows into block s, in arrival order.

// idBase is what is subtracted from a global expert id of this rank to give
// the id RecvTopK holds (Config.RecvIDs).
func (a *alltoallvEngine) idBase() int {
	if a.spec.RecvIDs == driver.GlobalExpertIDs {
		return 0
	}
	return a.me * a.L
}

// valuesPerRow is the row values of a received row: one per (token, expert)
// row, TopK per (token, rank) row.
func (a *alltoallvEngine) valuesPerRow() int {
	if a.spec.ResolvedLayout() == driver.LayoutExpertMajor {
		return 1
	}
	return a.K
}

// unpackZones lays the n arriving rows (by source, then token) out in
// expert-major zones.
func (a *alltoallvEngine) unpackZones(d *driver.Dispatch, st *a2aState, n int) {
	set := &a.sets[d.Set]
	K, L, R := a.K, a.L, a.R
	meta := a.metaWords()
	align := a.spec.Alignment()
	mine := func(e int32) bool { return e >= 0 && int(e)/L == a.me }
	st.backFrom, st.backTo = grow.To(st.backFrom, R), grow.To(st.backTo, R)
	clear(st.backFrom)
	s, left := 0, 0
	for r := 0; r < n; r++ {
		for left == 0 {
			left, s = st.recvCounts[s], s+1
		}
		left--
		w := set.recvMeta[r*meta:]
		for k := 0; k < K; k++ {
			if e := w[1+k]; mine(e) {
				l := int(e) - a.me*L
				st.source[(s-1)*L+l]++
				st.expert[l]++
				st.backFrom[s-1]++
			}
		}
	}
	st.zoneOff = grow.To(st.zoneOff, L+1)
	pairs, total := 0, 0
	for l, c := range st.expert {
		st.zoneOff[l] = total
		total += (c + align - 1) / align * align
		pairs += c
	}
	st.zoneOff[L] = total
	for r := range st.backTo { // a pair each back from every rank
		st.backTo[r] = 0
		for x := r * L; x < (r+1)*L; x++ {
			st.backTo[r] += int(d.Route.PerExpert[x])
		}
	}
	set.rows, set.area = a.layRows(set.rows, total)
	set.outputs = grow.To(set.outputs, total*a.rowBytes)
	set.tokens, set.weights = grow.To(set.tokens, total), grow.To(set.weights, total)
	clear(set.rows) // the padding is zero, its side data too
	clear(set.weights)
	for i := range set.tokens {
		set.tokens[i] = -1
	}
	next := grow.To(a.next, L)
	a.next = next
	copy(next, st.zoneOff[:L])
	st.slot = grow.To(st.slot, pairs)
	p := 0
	for r := 0; r < n; r++ {
		w := set.recvMeta[r*meta:]
		for k := 0; k < K; k++ {
			if e := w[1+k]; mine(e) {
				j := next[int(e)-a.me*L]
				next[int(e)-a.me*L]++
				copyRow(set.rows, set.area, j, set.in, set.inArea, r)
				set.tokens[j], set.weights[j] = w[0], math.Float32frombits(uint32(w[1+K+k]))
				st.slot[p] = int32(j)
				p++
			}
		}
	}
	d.Recv = driver.Received{Outputs: driver.Host(set.outputs[:total*a.rowBytes]),
		Weights: driver.Host(set.weights[:total]), Tokens: driver.Host(set.tokens[:total]), ExpertCounts: st.expert,
		ExpertOffsets: st.zoneOff, SourceCounts: st.source, NumRecv: total}
	received(d, set)
}

// unpackRankMajor puts source s's arriving rows into block s, in arrival
// (token) order, with their ids and weights as this rank keeps them.
func (a *alltoallvEngine) unpackRankMajor(d *driver.Dispatch, st *a2aState, n int) {
	set := &a.sets[d.Set]
	K, L, M := a.K, a.L, a.M
	meta := a.metaWords()
	st.slot = grow.To(st.slot, n)
	s, left, j := 0, 0, 0
	for r := 0; r < n; r++ {
		for left == 0 {
			left, s, j = st.recvCounts[s], s+1, 0
		}
		left--
		row := (s-1)*M + j
		j++
		st.source[s-1]++
		st.slot[r] = int32(row)
		w := set.recvMeta[r*meta:]
		copyRow(set.rows, set.area, row, set.in, set.inArea, r)
		set.tokens[row] = w[0]
		for k := 0; k < K; k++ {
			set.topk[row*K+k], set.weights[row*K+k] = -1, 0
			if e := int(w[1+k]); e >= 0 && e/L == a.me {
				set.topk[row*K+k] = int32(e - a.idBase())
				set.weights[row*K+k] = math.Float32frombits(uint32(w[1+K+k]))
				st.expert[e-a.me*L]++
			}
		}
	}
	d.Recv = driver.Received{Outputs: driver.Host(set.outputs), Weights: driver.Host(set.weights),
		TopK: driver.Host(set.topk), Tokens: driver.Host(set.tokens), ExpertCounts: st.expert, SourceCounts: st.source[:a.R],
		NumRecv: n}
	received(d, set)
}

// zoneSources lists, for an HT expert-major combine, each token's pairs
// back from every rank (first[r]: where rank r's start), ranks in order and
// each rank's pairs in slot order, and sets slots to their values.
func (a *alltoallvEngine) zoneSources(d *driver.Dispatch, first []int, rowAt func(int) ptr, backVals, slots []float32) {
	rt, K, L := d.Route, a.K, a.L
	next := grow.To(a.next, a.R) // rank r's pairs come back in (token, slot) order
	a.next = next
	copy(next, first[:a.R])
	a.idx = grow.To(a.idx, rt.T*K)
	for t := 0; t < rt.T; t++ {
		for k := 0; k < K; k++ {
			if e := d.TopK[t*K+k]; e >= 0 {
				a.idx[t*K+k] = int32(next[int(e)/L])
				next[int(e)/L]++
			}
		}
	}
	for t := 0; t < rt.T; t++ {
		a.start[t] = int32(a.src.Len())
		for r := 0; r < a.R; r++ {
			if rt.TokRankOrd[t*a.R+r] < 0 {
				continue
			}
			for k := 0; k < K; k++ {
				if e := d.TopK[t*K+k]; e >= 0 && int(e)/L == r {
					a.src.Add(rowAt(int(a.idx[t*K+k])))
					if slots != nil {
						slots[t*K+k] = backVals[a.idx[t*K+k]]
					}
				}
			}
		}
	}
}
