package ep

/*
#include "kernels.h"
*/
import "C"

import (
	"fmt"
	"unsafe"
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

// routing is the layout kernel's full result.
type routing struct {
	T          int
	perExpert  []int32 // [E]
	perRank    []int32 // [R]
	perNode    []int32 // [nodes]
	pairOrd    []int32 // [T*K]: place of pair (t,k) among its expert's pairs, -1 if masked
	tokRankOrd []int32 // [T*R]: place of token t among tokens to rank r, -1 if not sent
	tokNodeOrd []int32 // [T*nodes]
}

// shape is what the layout kernel needs to know about the group.
type shape struct {
	E, L, R, K int
	nodeOf     []int32
	nodes      int
}

func i32p(s []int32) *C.int32_t {
	if len(s) == 0 {
		return nil
	}
	return (*C.int32_t)(unsafe.Pointer(&s[0]))
}

func f32p(s []float32) *C.float {
	if len(s) == 0 {
		return nil
	}
	return (*C.float)(unsafe.Pointer(&s[0]))
}

// computeRouting runs the layout kernel on T tokens; op names the call in
// errors.
func computeRouting(op string, sh shape, topk []int32, T int) (*routing, error) {
	if len(topk) != T*sh.K {
		return nil, inputErrorf(op, "len(topk) = %d, want tokens*TopK = %d*%d", len(topk), T, sh.K)
	}
	r := &routing{T: T, perExpert: make([]int32, sh.E), perRank: make([]int32, sh.R), perNode: make([]int32, sh.nodes),
		pairOrd: make([]int32, T*sh.K), tokRankOrd: make([]int32, T*sh.R), tokNodeOrd: make([]int32, T*sh.nodes)}
	var kind C.int
	bad := C.ep_layout(i32p(topk), C.int64_t(T), C.int(sh.K), C.int(sh.E), C.int(sh.L), C.int(sh.R),
		i32p(sh.nodeOf), C.int(sh.nodes), i32p(r.perExpert), i32p(r.perRank), i32p(r.perNode),
		i32p(r.pairOrd), i32p(r.tokRankOrd), i32p(r.tokNodeOrd), &kind)
	if bad >= 0 {
		t, k := int(bad)/sh.K, int(bad)%sh.K
		if kind == 1 {
			return nil, inputErrorf(op, "topk[%d][%d] = %d is out of range [-1, %d)", t, k, topk[bad], sh.E)
		}
		return nil, inputErrorf(op, "token %d names expert %d twice (top-k slot %d repeats an earlier slot)", t, topk[bad], k)
	}
	return r, nil
}

// Layout computes the routing of topk ([tokens][TopK] expert ids, -1 =
// none). It is local: no communication.
func (g *Group[E]) Layout(topk []int32) (*Layout, error) {
	if err := g.usable("Layout"); err != nil {
		return nil, err
	}
	if len(topk)%g.cfg.TopK != 0 {
		return nil, inputErrorf("Layout", "len(topk) = %d is not a multiple of TopK = %d", len(topk), g.cfg.TopK)
	}
	T := len(topk) / g.cfg.TopK
	r, err := computeRouting("Layout", g.shape, topk, T)
	if err != nil {
		return nil, err
	}
	return r.layout(g.size), nil
}

func (r *routing) layout(ranks int) *Layout {
	l := &Layout{NumTokens: r.T, TokensPerExpert: ints(r.perExpert), TokensPerRank: ints(r.perRank),
		TokensPerNode: ints(r.perNode), TokenInRank: make([]bool, r.T*ranks)}
	for i, o := range r.tokRankOrd {
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

func (sh shape) String() string {
	return fmt.Sprintf("%d experts on %d ranks (%d each), top-%d, %d nodes", sh.E, sh.R, sh.L, sh.K, sh.nodes)
}
