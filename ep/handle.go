package ep

import (
	"fmt"
	"sort"
)

// Handle is the result of a dispatch: the routing of its tokens and, once
// complete, views of the rows this rank received. It is needed to combine,
// and can be reused by DispatchCached while the routing is unchanged. It is
// a small value: copy it freely. A handle goes stale when handleRing (8)
// newer dispatches have been made on its group; a stale handle's views are
// empty and calls refuse it. The zero Handle is no handle.
//
// The views point into the group's buffers, in Memory(): LL rows stay valid
// until the second dispatch after this one, HT rows until the next dispatch
// (see the package doc).
type Handle[E Element] struct {
	s   *handleState[E]
	gen uint64
}

// valid reports a handle whose dispatch completed and whose record is its own.
func (h Handle[E]) valid() bool { return h.s != nil && h.s.gen == h.gen && h.s.ready }

// Mode of the dispatch that made the handle. Not collective.
func (h Handle[E]) Mode() Mode {
	if h.s == nil {
		return 0
	}
	return h.s.mode
}

// NumTokens is the number of tokens this rank dispatched. Not collective.
func (h Handle[E]) NumTokens() int {
	if !h.valid() {
		return 0
	}
	return h.s.rt.T
}

// Recv is the rows this rank received. LL: [LocalExperts][Size*MaxTokens
// PerRank][Hidden], the first ExpertCounts()[l] rows of expert l valid, by
// source rank then token. HT: [NumRecv][Hidden], by source rank then token.
// A group with an FP8 Wire receives RecvFP8 and RecvScales instead: its
// Recv is the zero Tensor. Not collective.
func (h Handle[E]) Recv() Tensor[E] {
	if !h.valid() || h.s.g.spec.Wire.FP8() {
		return Tensor[E]{}
	}
	return mustFromBytes[E](h.s.d.Recv.Rows)
}

// RecvFP8 is, in a group with an FP8 Wire, the rows this rank received as
// e4m3 codes, laid out as Recv would be ([rows][Hidden]); the zero Tensor
// otherwise. Dequantize (with RecvScales) turns them into numbers. Not
// collective.
func (h Handle[E]) RecvFP8() Tensor[E4M3] {
	if !h.valid() || !h.s.g.spec.Wire.FP8() {
		return Tensor[E4M3]{}
	}
	return mustFromBytes[E4M3](h.s.d.Recv.Rows)
}

// RecvScales is, in a group with an FP8 Wire, the float32 scales of
// RecvFP8's rows, ScaleGroups(Hidden) per row and laid out like them
// ([rows][ScaleGroups(Hidden)]): element c of a row is its code times
// scale c/ScaleGroup. The zero Tensor otherwise. Not collective.
func (h Handle[E]) RecvScales() Tensor[float32] {
	if !h.valid() || !h.s.g.spec.Wire.FP8() {
		return Tensor[float32]{}
	}
	return h.s.d.Recv.Scales
}

// CombineBuffer is memory of the group laid out like Recv (in the element
// type, also with an FP8 Wire) where the expert outputs can be written, so
// that Combine reads them without a copy. Not collective.
func (h Handle[E]) CombineBuffer() Tensor[E] {
	if !h.valid() {
		return Tensor[E]{}
	}
	return mustFromBytes[E](h.s.d.Recv.Outputs)
}

// ExpertCounts is, per local expert, the number of received rows for it
// (HT: rows whose local top-k names it). Host memory. Not collective.
func (h Handle[E]) ExpertCounts() []int {
	if !h.valid() {
		return nil
	}
	return h.s.d.Recv.ExpertCounts
}

// NumRecv is the number of rows received: HT, the rows of Recv; LL, the sum
// of ExpertCounts. Not collective.
func (h Handle[E]) NumRecv() int {
	if !h.valid() {
		return 0
	}
	return h.s.d.Recv.NumRecv
}

// RecvWeights is the top-k weight of each received row. LL: [LocalExperts]
// [Size*MaxTokensPerRank], one per row. HT: [NumRecv][TopK], zero where the
// expert is elsewhere. Not collective.
func (h Handle[E]) RecvWeights() Tensor[float32] {
	if !h.valid() {
		return Tensor[float32]{}
	}
	return h.s.d.Recv.Weights
}

// RecvTopK is, in HT mode, the top-k expert ids of each received row made
// local to this rank ([NumRecv][TopK], -1 = an expert elsewhere); the zero
// Tensor in LL mode, where a row's expert is its block. Not collective.
func (h Handle[E]) RecvTopK() Tensor[int32] {
	if !h.valid() {
		return Tensor[int32]{}
	}
	return h.s.d.Recv.TopK
}

// Source is the rank and token index that a received row came from. LL rows
// are numbered l*Size*MaxTokensPerRank + j; HT rows 0..NumRecv-1. On a
// device backend it reads the token index from the device. Not collective.
func (h Handle[E]) Source(row int) (rank, token int, err error) {
	if !h.valid() {
		return 0, 0, fmt.Errorf("ep: Source: the handle is zero, stale, or its dispatch has not completed")
	}
	g, recv := h.s.g, &h.s.d.Recv
	var s int
	if h.s.mode == HighThroughput {
		if row < 0 || row >= recv.NumRecv {
			return 0, 0, fmt.Errorf("ep: Source: row %d out of range [0, %d)", row, recv.NumRecv)
		}
		s = sort.Search(g.size, func(s int) bool { return prefix(recv.SourceCounts, 1, s+1, 0) > row })
	} else {
		span, L := g.size*g.spec.MaxTokensPerRank, g.sh.L
		l, j := row/span, row%span
		if row < 0 || l >= L || j >= recv.ExpertCounts[l] {
			return 0, 0, fmt.Errorf("ep: Source: row %d is not a valid received row", row)
		}
		s = sort.Search(g.size, func(s int) bool { return prefix(recv.SourceCounts, L, s+1, l) > j })
	}
	tok := make([]int32, 1)
	if err := Download(tok, recv.Tokens.Slice(row, row+1)); err != nil {
		return 0, 0, fmt.Errorf("ep: Source: %w", err)
	}
	return s, int(tok[0]), nil
}

// prefix sums column col of the first n rows of a [rows][width] table.
func prefix(table []int, width, n, col int) int {
	sum := 0
	for r := 0; r < n; r++ {
		sum += table[r*width+col]
	}
	return sum
}

// Layout is the routing of the dispatched tokens. Not collective.
func (h Handle[E]) Layout() *Layout {
	if h.s == nil || h.s.gen != h.gen {
		return nil
	}
	return h.s.rt.layout(h.s.g.size)
}
