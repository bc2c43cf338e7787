package eptest

import (
	"math/rand/v2"

	"github.com/goep/goep/ep"
)

// A scenario is a routing that every rank regenerates for every rank from a
// shared seed, so each can compute what it must receive and combine.
type scenario struct {
	name                          string
	experts, topk, maxTok, hidden int
	seed                          uint64
	tokens                        func(rank, ranks int) int
	// route fills the top-k ids of one token (distinct, -1 = masked).
	route func(rng *rand.Rand, rank, t int, ids []int32, experts int)
}

func (sc scenario) config(mode ep.Mode) ep.Config {
	return ep.Config{Mode: mode, NumExperts: sc.experts, MaxTokensPerRank: sc.maxTok, Hidden: sc.hidden, TopK: sc.topk}
}

// input is one rank's dispatch input.
type input struct {
	T       int
	topk    []int32
	weights []float32
}

func (sc scenario) input(rank, ranks int) input {
	T := sc.tokens(rank, ranks)
	rng := rand.New(rand.NewPCG(sc.seed, uint64(rank)))
	in := input{T: T, topk: make([]int32, T*sc.topk), weights: make([]float32, T*sc.topk)}
	for t := 0; t < T; t++ {
		sc.route(rng, rank, t, in.topk[t*sc.topk:(t+1)*sc.topk], sc.experts)
		for k := 0; k < sc.topk; k++ {
			// dyadic weights: products and sums with small integers are exact
			in.weights[t*sc.topk+k] = float32(1+(rank+3*t+k)%8) / 8
		}
	}
	return in
}

func allInputs(sc scenario, ranks int) []input {
	ins := make([]input, ranks)
	for r := range ins {
		ins[r] = sc.input(r, ranks)
	}
	return ins
}

// value is element c of token t of rank r: column 0 is the rank, column 1
// the token index, the rest small integers, all exact in bfloat16.
func value(r, t, c int) float32 {
	switch c {
	case 0:
		return float32(r + 1)
	case 1:
		return float32(t)
	}
	return float32((r*7+t*3+c)%32 - 16)
}

func payload[E ep.Element](r, T, H int) []E {
	x := make([]E, T*H)
	for t := 0; t < T; t++ {
		for c := 0; c < H; c++ {
			x[t*H+c] = ep.ElementOf[E](value(r, t, c))
		}
	}
	return x
}

// routes

func randomRoute(mask float64) func(*rand.Rand, int, int, []int32, int) {
	return func(rng *rand.Rand, _, _ int, ids []int32, experts int) {
		perm := rng.Perm(experts)
		for k := range ids {
			ids[k] = int32(perm[k])
			if rng.Float64() < mask {
				ids[k] = -1
			}
		}
	}
}

func oneExpertRoute(_ *rand.Rand, _, _ int, ids []int32, _ int) {
	for k := range ids {
		ids[k] = -1
	}
	ids[len(ids)-1] = 0
}

func unevenTokens(rank, ranks int) int {
	// rank 1 sends nothing; the others differ.
	if rank == 1 {
		return 0
	}
	return []int{16, 5, 9, 1, 13, 16, 2, 11}[rank%8]
}

func fullTokens(int, int) int { return 16 }

// manyTokens gives most ranks more tokens than an engine moves in one piece
// (the CPU engine's HT sends and forwards rows across nodes, and returns
// their sums from a node of several ranks, in chunks of 128 tokens), so that
// the offsets of the chunks past the first are checked: with top-k as large
// as the ranks (up to 8) of 2 experts a rank, about 3 tokens in 4 go to each
// rank. One rank sends one token. At most 256 tokens, so that every token
// index (a column of the payload) is exact in bfloat16.
func manyTokens(rank, _ int) int { return []int{256, 131, 200, 1, 250, 129, 256, 140}[rank%8] }

func scenarios(ranks int) []scenario {
	return []scenario{
		{name: "random-uneven", experts: 4 * ranks, topk: 3, maxTok: 16, hidden: 24, seed: 1, tokens: unevenTokens, route: randomRoute(0.15)},
		{name: "full-no-mask", experts: 2 * ranks, topk: 2, maxTok: 16, hidden: 8, seed: 2, tokens: fullTokens, route: randomRoute(0)},
		{name: "all-to-one-expert", experts: 2 * ranks, topk: 2, maxTok: 16, hidden: 16, seed: 3, tokens: fullTokens, route: oneExpertRoute},
		{name: "mostly-masked", experts: ranks, topk: 1, maxTok: 16, hidden: 8, seed: 4, tokens: unevenTokens, route: randomRoute(0.7)},
		{name: "many-tokens", experts: 2 * ranks, topk: min(ranks, 8), maxTok: 256, hidden: 8, seed: 5, tokens: manyTokens, route: randomRoute(0.1)},
	}
}
