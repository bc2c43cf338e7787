package ep

import (
	"fmt"
	"runtime"
	"sort"
	"unsafe"
)

// Handle is the result of a dispatch: the routing of its tokens and, once
// complete, views of the rows this rank received. It is needed to combine, and
// can be reused by DispatchCached while the routing is unchanged.
type Handle[E Element] struct {
	g       *Group[E]
	op      uint64 // sequence number of the dispatch
	parity  int    // LL buffer set
	T       int
	topk    []int32
	weights []float32
	rt      *routing
	ready   bool
	done    bool // combined (LL)

	// LowLatency: counts and offsets of every rank, [R*E].
	cnt, off     []int32
	expertCounts []int

	// HighThroughput.
	n       []int32 // [R][R+nodes]: tokens from s to each rank, then to each node
	recvOff []int   // [R+1]: where each source's rows start among this rank's
	sendOff []int   // [R]: where this rank's rows start at each destination
	fwd     []*fwdPlan
}

// fwdPlan is what a rank forwards inside its node for a rail peer on another
// node: for each staged row j, the ranks and rows it went to, CSR-style.
type fwdPlan struct {
	src   int     // the rail peer
	rows  int     // rows staged
	start []int32 // [rows+1]
	dst   []int32 // destination rank
	row   []int32 // row at the destination
}

// Mode of the dispatch that made the handle. Not collective.
func (h *Handle[E]) Mode() Mode { return h.g.cfg.Mode }

// NumTokens is the number of tokens this rank dispatched. Not collective.
func (h *Handle[E]) NumTokens() int { return h.T }

// Recv is the rows this rank received, in window memory, valid until the
// buffer is reused (see the package doc). LL: [LocalExperts][Size*MaxTokens
// PerRank][Hidden], the first ExpertCounts()[l] rows of expert l valid. HT:
// [NumRecv][Hidden]. Not collective.
func (h *Handle[E]) Recv() []E {
	if !h.ready {
		return nil
	}
	g := h.g
	if g.cfg.Mode == LowLatency {
		return view[E](g.at(g.rank, g.sl.llRecv[h.parity]), g.shape.L*g.size*g.cfg.MaxTokensPerRank*g.cfg.Hidden)
	}
	return view[E](g.at(g.rank, g.sl.htRecv), h.NumRecv()*g.cfg.Hidden)
}

// CombineBuffer is window memory laid out like Recv where the expert outputs
// can be written, so that Combine reads them without a copy. Not collective.
func (h *Handle[E]) CombineBuffer() []E {
	g := h.g
	if g.cfg.Mode == LowLatency {
		return view[E](g.at(g.rank, g.sl.llComb[h.parity]), g.shape.L*g.size*g.cfg.MaxTokensPerRank*g.cfg.Hidden)
	}
	return view[E](g.at(g.rank, g.sl.htComb), h.NumRecv()*g.cfg.Hidden)
}

// ExpertCounts is, per local expert, the number of received rows for it
// (HT: rows whose local top-k names it). Not collective.
func (h *Handle[E]) ExpertCounts() []int { return h.expertCounts }

// NumRecv is the number of rows received: HT, rows of Recv; LL, the sum of
// ExpertCounts. Not collective.
func (h *Handle[E]) NumRecv() int {
	if h.g.cfg.Mode == HighThroughput {
		return h.recvOff[h.g.size]
	}
	n := 0
	for _, c := range h.expertCounts {
		n += c
	}
	return n
}

// RecvWeights is the top-k weight of each received row. LL: [LocalExperts]
// [Size*MaxTokensPerRank], one per row. HT: [NumRecv][TopK], zero where the
// expert is elsewhere. Not collective.
func (h *Handle[E]) RecvWeights() []float32 {
	if !h.ready {
		return nil
	}
	g := h.g
	if g.cfg.Mode == LowLatency {
		return view[float32](g.at(g.rank, g.sl.llW[h.parity]), g.shape.L*g.size*g.cfg.MaxTokensPerRank)
	}
	return view[float32](g.at(g.rank, g.sl.htW), h.NumRecv()*g.cfg.TopK)
}

// RecvTopK is, in HT mode, the top-k expert ids of each received row made
// local to this rank ([NumRecv][TopK], -1 = an expert elsewhere); nil in LL
// mode, where a row's expert is its block. Not collective.
func (h *Handle[E]) RecvTopK() []int32 {
	if !h.ready || h.g.cfg.Mode != HighThroughput {
		return nil
	}
	return view[int32](h.g.at(h.g.rank, h.g.sl.htTopk), h.NumRecv()*h.g.cfg.TopK)
}

// Source is the rank and token index that a received row came from. LL rows
// are numbered l*Size*MaxTokensPerRank + j; HT rows 0..NumRecv-1. Not
// collective.
func (h *Handle[E]) Source(row int) (rank, token int, err error) {
	if !h.ready {
		return 0, 0, fmt.Errorf("ep: Source: the dispatch has not completed")
	}
	g := h.g
	if g.cfg.Mode == HighThroughput {
		if row < 0 || row >= h.NumRecv() {
			return 0, 0, fmt.Errorf("ep: Source: row %d out of range [0, %d)", row, h.NumRecv())
		}
		s := sort.Search(g.size, func(s int) bool { return h.recvOff[s+1] > row })
		return s, int(view[int32](g.at(g.rank, g.sl.htTok), h.NumRecv())[row]), nil
	}
	span := g.size * g.cfg.MaxTokensPerRank
	l, j := row/span, row%span
	if row < 0 || l >= g.shape.L || j >= h.expertCounts[l] {
		return 0, 0, fmt.Errorf("ep: Source: row %d is not a valid received row", row)
	}
	e := g.rank*g.shape.L + l
	s := sort.Search(g.size, func(s int) bool { return int(h.off[s*g.shape.E+e]+h.cnt[s*g.shape.E+e]) > j })
	return s, int(view[int32](g.at(g.rank, g.sl.llTok[h.parity]), g.shape.L*span)[row]), nil
}

// Layout is the routing of the dispatched tokens. Not collective.
func (h *Handle[E]) Layout() *Layout {
	g := h.g
	return h.rt.layout(g.size)
}

// checkTokens validates the inputs of a dispatch on this rank.
func (g *Group[E]) checkTokens(op string, x []E, topk []int32, weights []float32) (int, error) {
	H, K := g.cfg.Hidden, g.cfg.TopK
	if len(topk)%K != 0 {
		return 0, inputErrorf(op, "len(topk) = %d is not a multiple of TopK = %d", len(topk), K)
	}
	T := len(topk) / K
	if T > g.cfg.MaxTokensPerRank {
		return 0, inputErrorf(op, "%d tokens exceed MaxTokensPerRank = %d", T, g.cfg.MaxTokensPerRank)
	}
	if len(x) != T*H {
		return 0, inputErrorf(op, "len(x) = %d, want tokens*Hidden = %d*%d = %d", len(x), T, H, T*H)
	}
	if len(weights) != T*K {
		return 0, inputErrorf(op, "len(weights) = %d, want tokens*TopK = %d*%d = %d", len(weights), T, K, T*K)
	}
	return T, nil
}

func (g *Group[E]) checkHandle(op string, h *Handle[E]) error {
	if h == nil {
		return inputErrorf(op, "nil handle")
	}
	if h.g != g {
		return inputErrorf(op, "the handle belongs to another group")
	}
	if !h.ready {
		return inputErrorf(op, "the handle's dispatch has not completed (call Wait)")
	}
	return nil
}

// pinned pins the first element of a caller slice for the duration of a cgo
// call whose pointer tables hold its address, and returns that address.
func pinned[T any](p *runtime.Pinner, s []T) unsafe.Pointer {
	if len(s) == 0 {
		return nil
	}
	p.Pin(unsafe.SliceData(s))
	return unsafe.Pointer(unsafe.SliceData(s))
}

// CombineOptions adjusts a Combine; nil means none.
type CombineOptions struct {
	// WeightsOverride replaces, in LL mode, the top-k weights given to
	// Dispatch ([tokens][TopK]); all ones make the combine an unweighted sum
	// (the backward of dispatch). Must be nil in HT mode, where the expert
	// side applies the weights.
	WeightsOverride []float32
	// RowValues and SlotValues carry one float per received row and slot back
	// to the token's (token, slot): LL, RowValues is [LocalExperts][Size*
	// MaxTokensPerRank] and SlotValues[t*TopK+k] gets the value of the row of
	// pair (t,k) (0 where masked); HT, RowValues is [NumRecv][TopK] and
	// SlotValues[t*TopK+k] gets the sum over the ranks that received token t.
	// Either both are set on every rank or neither is.
	RowValues, SlotValues []float32
}
