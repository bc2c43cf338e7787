package ep

import (
	"fmt"
	"sort"

	"github.com/goep/goep/ep/driver"
)

// Handle is the result of a dispatch: the routing of its tokens and, once
// complete, views of the rows this rank received. It is needed to combine,
// and can be reused (DispatchInput.Reuse) while the routing is unchanged. It is
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

// Recv is the rows this rank received, laid out as Config.Layout says:
//
//   - LL expert-major (its default): [LocalExperts][Size*MaxTokensPerRank]
//     [Hidden], the first ExpertCounts()[l] rows of expert l valid, by source
//     rank then token;
//   - LL rank-major: [Size][MaxTokensPerRank][Hidden], the first
//     SourceCounts()[s] rows of source s valid, in token order;
//   - HT flat (its default): [NumRecv][Hidden], by source rank then token;
//   - HT expert-major: [NumRecv][Hidden], expert l's zone at rows
//     [ExpertOffsets()[l], ExpertOffsets()[l+1]): its ExpertCounts()[l]
//     rows by source rank then token, then zero rows up to the alignment.
//
// A group with a Packed Wire receives RecvWire instead (an FP8 one also
// RecvFP8 and RecvScales): its Recv is the zero Tensor. Not collective.
func (h Handle[E]) Recv() Tensor[E] {
	if !h.valid() || h.s.g.spec.Wire.Packed() {
		return Tensor[E]{}
	}
	return driver.MustFromBytes[E](h.s.d.Recv.Rows)
}

// RecvFP8 is, in a group with an FP8 Wire, the rows this rank received as
// e4m3 codes, laid out as Recv would be ([rows][Hidden]); the zero Tensor
// otherwise. Dequantize (with RecvScales) turns them into numbers. Not
// collective.
func (h Handle[E]) RecvFP8() Tensor[E4M3] {
	if !h.valid() || !h.s.g.spec.Wire.FP8() {
		return Tensor[E4M3]{}
	}
	return driver.MustFromBytes[E4M3](h.s.d.Recv.Rows)
}

// RecvScales is, in a group with an FP8 Wire, the float32 scales of
// RecvFP8's rows, ScaleGroups(Hidden) per row and laid out like them
// ([rows][ScaleGroups(Hidden)]): element c of a row is its code times
// scale c/ScaleGroup. The zero Tensor otherwise. Not collective.
func (h Handle[E]) RecvScales() Tensor[float32] {
	if !h.valid() || !h.s.g.spec.Wire.FP8() {
		return Tensor[float32]{}
	}
	return driver.MustFromBytes[float32](h.s.d.Recv.Side)
}

// RecvWire is, in a group with a Packed Wire, the rows this rank received
// as they travelled, laid out as Recv would be: rows, [rows][RowBytes] of
// the format (Spec.WireRowBytes), and their scales, [rows][SideBytes]
// (the zero Tensor for a format without side data). DecodeRows turns a
// row into numbers. The zero Tensors otherwise. Not collective.
func (h Handle[E]) RecvWire() (rows, scales Tensor[byte]) {
	if !h.valid() || !h.s.g.spec.Wire.Packed() {
		return Tensor[byte]{}, Tensor[byte]{}
	}
	return h.s.d.Recv.Rows, h.s.d.Recv.Side
}

// CombineBuffer is memory of the group laid out like Recv (in the element
// type, also with an FP8 Wire) where the expert outputs can be written, so
// that Combine reads them without a copy. Not collective.
func (h Handle[E]) CombineBuffer() Tensor[E] {
	if !h.valid() {
		return Tensor[E]{}
	}
	return driver.MustFromBytes[E](h.s.d.Recv.Outputs)
}

// ExpertCounts is, per local expert, the number of received rows for it
// (flat and rank-major layouts: rows whose top-k names it; HT expert-major:
// the valid rows of its zone, padding left out). Host memory. Not
// collective.
func (h Handle[E]) ExpertCounts() []int {
	if !h.valid() {
		return nil
	}
	return h.s.d.Recv.ExpertCounts
}

// ExpertOffsets is, in an HT expert-major group, where each local expert's
// zone starts among the rows of Recv, and last the padded total
// ([LocalExperts+1]; ExpertOffsets()[l+1]-ExpertOffsets()[l] is
// ExpertCounts()[l] rounded up to Config.ExpertAlignment): with
// ExpertCounts, what a grouped GEMM takes. nil in other layouts. Host
// memory. Not collective.
func (h Handle[E]) ExpertOffsets() []int {
	if !h.valid() {
		return nil
	}
	return h.s.d.Recv.ExpertOffsets
}

// SourceCounts is how many rows came from each source rank: expert-major
// layouts [Size][LocalExperts] (rows of local expert l from rank s at
// s*LocalExperts()+l), flat and rank-major layouts [Size]. Host memory. Not
// collective.
func (h Handle[E]) SourceCounts() []int {
	if !h.valid() {
		return nil
	}
	return h.s.d.Recv.SourceCounts
}

// NumRecv is the number of rows received: HT, the rows of Recv (in the
// expert-major layout, padding included); LL expert-major, the sum of
// ExpertCounts; LL rank-major, the sum of SourceCounts. Not collective.
func (h Handle[E]) NumRecv() int {
	if !h.valid() {
		return 0
	}
	return h.s.d.Recv.NumRecv
}

// RecvWeights is the gate weight of each received row. Expert-major
// layouts, one per row: LL [LocalExperts][Size*MaxTokensPerRank], HT
// [NumRecv] (0 on padding). Flat and rank-major layouts, the token's top-k
// weights, zero where the expert is elsewhere: HT [NumRecv][TopK], LL
// [Size][MaxTokensPerRank][TopK]. Not collective.
func (h Handle[E]) RecvWeights() Tensor[float32] {
	if !h.valid() {
		return Tensor[float32]{}
	}
	return h.s.d.Recv.Weights
}

// RecvTopK is, in the flat (HT) and rank-major (LL) layouts, the top-k
// expert ids of each received row, laid out like RecvWeights: an expert of
// this rank as its local or global id (Config.RecvIDs), -1 an expert
// elsewhere. The zero Tensor in expert-major layouts, where a row's expert
// is its block or zone. Not collective.
func (h Handle[E]) RecvTopK() Tensor[int32] {
	if !h.valid() {
		return Tensor[int32]{}
	}
	return h.s.d.Recv.TopK
}

// Source is the rank and token index that a received row came from, the
// row numbered as in Recv (LL expert-major l*Size*MaxTokensPerRank + j, LL
// rank-major s*MaxTokensPerRank + j, HT 0..NumRecv-1); a padding row of an
// HT expert-major zone is an error. On a device backend it reads the token
// index from the device. Not collective.
func (h Handle[E]) Source(row int) (rank, token int, err error) {
	if !h.valid() {
		return 0, 0, fmt.Errorf("ep: Source: the handle is zero, stale, or its dispatch has not completed")
	}
	g, recv := h.s.g, &h.s.d.Recv
	var s int
	switch {
	case g.spec.HTExpertMajor():
		L, off := g.sh.L, recv.ExpertOffsets
		if row < 0 || row >= recv.NumRecv {
			return 0, 0, fmt.Errorf("ep: Source: row %d out of range [0, %d)", row, recv.NumRecv)
		}
		l := sort.Search(L, func(l int) bool { return off[l+1] > row })
		j := row - off[l]
		if j >= recv.ExpertCounts[l] {
			return 0, 0, fmt.Errorf("ep: Source: row %d is padding of expert %d's zone", row, l)
		}
		s = sort.Search(g.size, func(s int) bool { return prefix(recv.SourceCounts, L, s+1, l) > j })
	case g.spec.LLRankMajor():
		M := g.spec.MaxTokensPerRank
		if row < 0 || row >= g.size*M || row%M >= recv.SourceCounts[row/M] {
			return 0, 0, fmt.Errorf("ep: Source: row %d is not a valid received row", row)
		}
		s = row / M
	case h.s.mode == HighThroughput:
		if row < 0 || row >= recv.NumRecv {
			return 0, 0, fmt.Errorf("ep: Source: row %d out of range [0, %d)", row, recv.NumRecv)
		}
		s = sort.Search(g.size, func(s int) bool { return prefix(recv.SourceCounts, 1, s+1, 0) > row })
	default:
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
	return layoutOf(&h.s.rt, h.s.g.size)
}

// Waiting reports an LL handle whose dispatch completed and whose combine
// has not run: it holds its buffer set until it is combined or released.
// Not collective.
func (h Handle[E]) Waiting() bool {
	return h.valid() && h.s.mode == LowLatency && !h.s.done
}
