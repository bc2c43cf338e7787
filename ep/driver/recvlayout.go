package driver

import (
	"fmt"
	"math/bits"
)

// RecvLayout is how a dispatch lays out the rows a rank receives
// (Config.Layout): NCCL EP's ncclEpLayout_t. It is chosen once per group,
// with the buffers it sizes, and holds for every dispatch of the group.
type RecvLayout int

// Receive layouts.
const (
	// LayoutDefault is the mode's own layout: LayoutExpertMajor in
	// LowLatency, LayoutFlat in HighThroughput.
	LayoutDefault RecvLayout = iota
	// LayoutExpertMajor groups the rows by local expert: one row per
	// (token, local expert) pair, so that a token sent to two experts of a
	// rank arrives twice. LowLatency: [L][Size*MaxTokensPerRank] blocks,
	// the first ExpertCounts()[l] rows of block l valid. HighThroughput:
	// packed zones, zone l at rows [ExpertOffsets()[l], ExpertOffsets()[l+1])
	// with its ExpertCounts()[l] valid rows first and zero rows after them
	// up to a multiple of Config.ExpertAlignment; one weight per row
	// (RecvWeights), no top-k ids. What a grouped GEMM consumes as it is.
	LayoutExpertMajor
	// LayoutRankMajor (LowLatency) groups the rows by source rank: a token
	// arrives once per rank that owns one of its experts, source s's rows
	// at [s*MaxTokensPerRank, s*MaxTokensPerRank+SourceCounts()[s]) in
	// token order, each with its top-k ids (RecvTopK) and weights
	// (RecvWeights, [rows][TopK]). The expert side applies the weights:
	// Combine sums the ranks' outputs unweighted, as in HighThroughput.
	LayoutRankMajor
	// LayoutFlat (HighThroughput) is NumRecv() rows packed by source rank,
	// then token, a token once per rank, each with its top-k ids
	// (RecvTopK) and weights (RecvWeights, [rows][TopK]).
	LayoutFlat
)

func (l RecvLayout) String() string {
	switch l {
	case LayoutDefault:
		return "default"
	case LayoutExpertMajor:
		return "expert-major"
	case LayoutRankMajor:
		return "rank-major"
	case LayoutFlat:
		return "flat"
	}
	return fmt.Sprintf("RecvLayout(%d)", int(l))
}

// ParseRecvLayout reads "default", "expert-major", "rank-major" or "flat".
func ParseRecvLayout(s string) (RecvLayout, error) {
	for l := LayoutDefault; l <= LayoutFlat; l++ {
		if s == l.String() {
			return l, nil
		}
	}
	return 0, fmt.Errorf("ep: unknown receive layout %q (want default, expert-major, rank-major or flat)", s)
}

// ExpertIDKind is how RecvTopK numbers the experts of a received row
// (Config.RecvIDs): NCCL EP's recv_topk_idx_kind. Either way -1 marks a
// top-k slot whose expert is on another rank (its weight zeroed).
type ExpertIDKind int

// Expert id kinds.
const (
	// LocalExpertIDs: an expert of this rank as its local index,
	// id - Rank()*LocalExperts().
	LocalExpertIDs ExpertIDKind = iota
	// GlobalExpertIDs: an expert of this rank as its global id.
	GlobalExpertIDs
)

func (k ExpertIDKind) String() string {
	switch k {
	case LocalExpertIDs:
		return "local"
	case GlobalExpertIDs:
		return "global"
	}
	return fmt.Sprintf("ExpertIDKind(%d)", int(k))
}

// layout is c's receive layout with the default resolved for its mode.
func (c Config) ResolvedLayout() RecvLayout {
	if c.Layout != LayoutDefault {
		return c.Layout
	}
	if c.Mode == HighThroughput {
		return LayoutFlat
	}
	return LayoutExpertMajor
}

// htExpertMajor says whether c is an HighThroughput group with expert-major
// zones.
func (c Config) HTExpertMajor() bool {
	return c.Mode == HighThroughput && c.ResolvedLayout() == LayoutExpertMajor
}

// llRankMajor says whether c is a LowLatency group with rank-major rows.
func (c Config) LLRankMajor() bool {
	return c.Mode == LowLatency && c.ResolvedLayout() == LayoutRankMajor
}

// weightedCombine says whether Combine applies the gate weights (LL
// expert-major) or sums what the expert side weighted (the other layouts).
func (c Config) WeightedCombine() bool {
	return c.Mode == LowLatency && c.ResolvedLayout() == LayoutExpertMajor
}

// alignment is the zone alignment of an HT expert-major group, in rows (1:
// none).
func (c Config) Alignment() int { return max(c.ExpertAlignment, 1) }

// validateLayout checks the layout fields of c.
func (c Config) validateLayout(bad func(string, ...any) error) error {
	l := c.ResolvedLayout()
	switch {
	case c.Layout < LayoutDefault || c.Layout > LayoutFlat:
		return bad("Layout = %v: choose ep.LayoutDefault, LayoutExpertMajor, LayoutRankMajor or LayoutFlat", c.Layout)
	case c.Mode == LowLatency && l == LayoutFlat:
		return bad("Layout = %v is for HighThroughput; LowLatency has LayoutExpertMajor (its default) or LayoutRankMajor", l)
	case c.Mode == HighThroughput && l == LayoutRankMajor:
		return bad("Layout = %v is for LowLatency; HighThroughput has LayoutFlat (its default) or LayoutExpertMajor", l)
	case c.ExpertAlignment < 0 || c.ExpertAlignment > 1<<20 || bits.OnesCount(uint(c.ExpertAlignment)) > 1:
		return bad("ExpertAlignment = %d: want a power of two up to 2^20 (or 0: no padding)", c.ExpertAlignment)
	case c.ExpertAlignment > 1 && !c.HTExpertMajor():
		return bad("ExpertAlignment = %d pads HighThroughput's expert-major zones; this group is %v %v", c.ExpertAlignment, c.Mode, l)
	case c.RecvIDs != LocalExpertIDs && c.RecvIDs != GlobalExpertIDs:
		return bad("RecvIDs = %v: choose ep.LocalExpertIDs or ep.GlobalExpertIDs", c.RecvIDs)
	case c.RecvIDs == GlobalExpertIDs && l == LayoutExpertMajor:
		return bad("RecvIDs = %v: an expert-major layout receives no top-k ids (a row's expert is its block)", c.RecvIDs)
	case c.MaskStalledRanks && l == LayoutRankMajor:
		return bad("MaskStalledRanks is not implemented with Layout = %v", l)
	case c.Overflow == OverflowDrop && c.HTExpertMajor():
		return bad("Overflow = %v is not implemented with Layout = %v (its zones are padded per expert; drop caps rows per rank)", c.Overflow, l)
	case c.CombineWire != WireNative && (l == LayoutRankMajor || c.HTExpertMajor()):
		return bad("CombineWire = %v is not implemented with %v Layout = %v", c.CombineWire, c.Mode, l)
	}
	return nil
}
