package moe

import "math/rand/v2"

// Teacher is the synthetic task's answer: a fixed random MoE of the same
// shape as the student (its own seed, a sharper gate and larger weights; see
// the package doc), evaluated in float64 on every rank with all its experts,
// with no communication.
type Teacher struct {
	cfg    Config
	p      Params // all Experts experts
	r      router
	caches []mlpCache
	shared mlpCache
}

// NewTeacher builds the teacher of cfg's shape from seed.
func NewTeacher(cfg Config, seed uint64) *Teacher {
	t := &Teacher{cfg: cfg, p: newParams(cfg, cfg.Experts), caches: make([]mlpCache, cfg.Experts)}
	initParams(&t.p, cfg, seed, 0, teacherInit)
	return t
}

// Params returns the teacher's parameters (all experts, in global order).
func (t *Teacher) Params() *Params { return &t.p }

// Forward returns the teacher's outputs for x ([T][Hidden]): for each token,
// sum over its top-k experts of the renormalised weight times the expert's
// output, plus the shared expert's output if it has one, as the student
// computes it.
func (t *Teacher) Forward(x []float64) []float64 {
	c := t.cfg
	H, E, K, F := c.Hidden, c.Experts, c.TopK, c.FFN
	T := len(x) / H
	t.r.route(t.p.Gate, x, T, H, E, K)
	out := make([]float64, T*H)
	rows := make([][]int, E) // tokens of each expert, and the slot
	slots := make([][]int, E)
	for i, e := range t.r.topk {
		rows[e] = append(rows[e], i/K)
		slots[e] = append(slots[e], i)
	}
	for e := 0; e < E; e++ {
		mc := &t.caches[e]
		mc.n = len(rows[e])
		mc.u = grow(mc.u, mc.n*H)
		for i, tok := range rows[e] {
			copy(mc.u[i*H:(i+1)*H], x[tok*H:(tok+1)*H])
		}
		mlpForward(t.p.expert(c, e), c.Act, H, F, mc)
		for i, tok := range rows[e] {
			w := t.r.p[tok*E+e] / t.r.sum[tok]
			o := mc.o[i*H : (i+1)*H]
			for j, v := range o {
				out[tok*H+j] += w * v
			}
		}
	}
	if c.SharedFFN > 0 {
		sharedForward(t.p.shared(), c, x, T, &t.shared, out)
	}
	return out
}

// Batch is the data of one training step on one rank of ranks: tokens drawn
// from a standard normal distribution, and the teacher's outputs for them.
//
// The data is one endless stream of tokens numbered from 0. Token i's values
// come from a PCG seeded by (seed, i) alone, so the stream does not depend on
// how it is cut. The global batch of step s (s >= 1) is the G = cfg.Tokens *
// ranks tokens [(s-1)*G, s*G), and rank r takes the contiguous share
// [(s-1)*G + r*cfg.Tokens, (s-1)*G + (r+1)*cfg.Tokens). A run resumed on
// another number of ranks, with tokens per rank scaled to keep G, therefore
// trains on the same tokens; and a run needs no data generator state to
// resume.
func Batch(cfg Config, teacher *Teacher, seed uint64, step int64, rank, ranks int) (x, target []float64) {
	T, H := cfg.Tokens, cfg.Hidden
	first := uint64(step-1)*uint64(T)*uint64(ranks) + uint64(rank)*uint64(T)
	x = make([]float64, T*H)
	src := rand.NewPCG(0, 0)
	r := rand.New(src)
	for t := 0; t < T; t++ {
		seedToken(src, seed, first+uint64(t))
		normal(r, x[t*H:(t+1)*H], 1)
	}
	return x, teacher.Forward(x)
}
