package driver

// Routing is the layout kernel's whole result for one dispatch: the counts
// of Layout and the place of every pair and token in its group. Engines read
// it; the Group computes it (and checks the expert ids) before any engine
// sees a call.
type Routing struct {
	T          int     // tokens
	PerExpert  []int32 // [experts]: (token, expert) pairs per expert
	PerRank    []int32 // [ranks]: tokens per rank, once per rank
	PerNode    []int32 // [nodes]: tokens per node, once per node
	PairOrd    []int32 // [T][TopK]: place of pair (t,k) among its expert's pairs in token order; -1 if masked
	TokRankOrd []int32 // [T][ranks]: place of token t among the tokens to rank r; -1 if not sent
	TokNodeOrd []int32 // [T][nodes]: the same per node
}
