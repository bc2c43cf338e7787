package ep

import (
	"fmt"

	"github.com/goep/goep/ep/internal/hostrows"
	"github.com/goep/goep/internal/grow"
)

// Layout is the routing of a batch of tokens, as DeepEP's get_dispatch_layout
// computes it: how many tokens go to each expert, rank and node.
type Layout struct {
	NumTokens       int
	TokensPerExpert []int  // (token, expert) pairs per expert
	TokensPerRank   []int  // tokens sent to each rank (once per rank)
	TokensPerNode   []int  // tokens sent to each node (once per node)
	TokenInRank     []bool // [NumTokens][ranks]: whether token t goes to rank r
}

// shape is what the layout kernel needs to know about the group.
type shape struct {
	E, L, R, K int
	nodeOf     []int32
	nodes      int
}

func (sh shape) String() string {
	return fmt.Sprintf("%d experts on %d ranks (%d each), top-%d, %d nodes", sh.E, sh.R, sh.L, sh.K, sh.nodes)
}

// compute runs the layout kernel on the T tokens of topk ([T][K]) into r,
// reusing r's storage; op names the call in errors. A small batch (at most
// smallLayout pairs, a decode step) is laid out in Go: a cgo call costs more
// than the whole layout of a few tokens.
func computeRouting(r *Routing, op string, sh shape, topk []int32, T int) error {
	if len(topk) != T*sh.K {
		return inputErrorf(op, "len(topk) = %d, want tokens*TopK = %d*%d", len(topk), T, sh.K)
	}
	r.T = T
	r.PerExpert = grow.To(r.PerExpert, sh.E)
	r.PerRank = grow.To(r.PerRank, sh.R)
	r.PerNode = grow.To(r.PerNode, sh.nodes)
	r.PairOrd = grow.To(r.PairOrd, T*sh.K)
	r.TokRankOrd = grow.To(r.TokRankOrd, T*sh.R)
	r.TokNodeOrd = grow.To(r.TokNodeOrd, T*sh.nodes)
	var bad int64
	if len(topk) <= smallLayout {
		bad = routingGo(r, sh, topk)
	} else {
		bad = routingC(r, sh, topk)
	}
	if bad >= 0 {
		kind, i := bad%4, bad/4
		t, k := int(i)/sh.K, int(i)%sh.K
		if kind == 1 {
			return inputErrorf(op, "topk[%d][%d] = %d is out of range [-1, %d)", t, k, topk[i], sh.E)
		}
		return inputErrorf(op, "token %d names expert %d twice (top-k slot %d repeats an earlier slot)", t, topk[i], k)
	}
	return nil
}

// smallLayout is the most (token, expert) pairs laid out in Go.
const smallLayout = 256

// layoutC is the layout kernel (ep_layout): it fills r's counts and
// places, sized for the T tokens of topk, and returns ep_layout's code.
func routingC(r *Routing, sh shape, topk []int32) int64 {
	return hostrows.RouteTokens(topk, r.T, sh.K, sh.E, sh.L, sh.R, sh.nodeOf, sh.nodes, r.PerExpert, r.PerRank, r.PerNode,
		r.PairOrd, r.TokRankOrd, r.TokNodeOrd)
}

// layoutGo is ep_layout written in Go, for small batches: the same results
// and the same code for the first bad entry (4*(t*K+k) + 1 for an id out of
// range, + 2 for a repeated one), -1 when every id is good.
func routingGo(r *Routing, sh shape, topk []int32) int64 {
	K, L, R, N := sh.K, int32(sh.L), sh.R, sh.nodes
	clear(r.PerExpert)
	clear(r.PerRank)
	clear(r.PerNode)
	for t := 0; t < r.T; t++ {
		ids := topk[t*K : (t+1)*K]
		ranks, nodes := r.TokRankOrd[t*R:(t+1)*R], r.TokNodeOrd[t*N:(t+1)*N]
		for i := range ranks {
			ranks[i] = -1
		}
		for i := range nodes {
			nodes[i] = -1
		}
		for k, e := range ids {
			if e == -1 {
				r.PairOrd[t*K+k] = -1
				continue
			}
			if e < -1 || int(e) >= sh.E {
				return int64(4*(t*K+k) + 1)
			}
			for _, prev := range ids[:k] {
				if prev == e {
					return int64(4*(t*K+k) + 2)
				}
			}
			r.PairOrd[t*K+k] = r.PerExpert[e]
			r.PerExpert[e]++
			if rk := e / L; ranks[rk] < 0 { // the token's first pair on this rank
				ranks[rk] = r.PerRank[rk]
				r.PerRank[rk]++
				if n := sh.nodeOf[rk]; nodes[n] < 0 {
					nodes[n] = r.PerNode[n]
					r.PerNode[n]++
				}
			}
		}
	}
	return -1
}

// copyFrom makes r a copy of src, reusing r's storage.
func copyRouting(r *Routing, src *Routing) {
	r.T = src.T
	r.PerExpert = append(r.PerExpert[:0], src.PerExpert...)
	r.PerRank = append(r.PerRank[:0], src.PerRank...)
	r.PerNode = append(r.PerNode[:0], src.PerNode...)
	r.PairOrd = append(r.PairOrd[:0], src.PairOrd...)
	r.TokRankOrd = append(r.TokRankOrd[:0], src.TokRankOrd...)
	r.TokNodeOrd = append(r.TokNodeOrd[:0], src.TokNodeOrd...)
}

// layout is the user-facing summary of r.
func layoutOf(r *Routing, ranks int) *Layout {
	l := &Layout{NumTokens: r.T, TokensPerExpert: ints(r.PerExpert), TokensPerRank: ints(r.PerRank),
		TokensPerNode: ints(r.PerNode), TokenInRank: make([]bool, r.T*ranks)}
	for i, o := range r.TokRankOrd[:r.T*ranks] {
		l.TokenInRank[i] = o >= 0
	}
	return l
}

func ints(s []int32) []int {
	out := make([]int, len(s))
	for i, v := range s {
		out[i] = int(v)
	}
	return out
}
