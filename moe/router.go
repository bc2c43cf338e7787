package moe

import (
	"math"

	"gonum.org/v1/gonum/blas"
)

// router is the gate's forward pass over T tokens, kept for the backward.
type router struct {
	T    int
	x    []float64 // [T][H] the layer input (a copy)
	p    []float64 // [T][E] softmax(x·Gate)
	topk []int32   // [T][K] chosen experts, by decreasing probability
	sum  []float64 // [T] sum of the chosen probabilities
	w    []float32 // [T][K] weights sent with the tokens: p[chosen]/sum
}

// route computes the router probabilities, the top-k experts and their
// renormalised weights for the tokens x ([T][H]).
func (r *router) route(gate, x []float64, T, H, E, K int) {
	r.T = T
	r.x = append(r.x[:0], x...)
	r.p = grow(r.p, T*E)
	clear(r.p)
	gemm(blas.NoTrans, blas.NoTrans, 1, dense(T, H, r.x), dense(H, E, gate), 0, dense(T, E, r.p))
	for t := 0; t < T; t++ {
		softmax(r.p[t*E : (t+1)*E])
	}
	if cap(r.topk) < T*K {
		r.topk, r.w = make([]int32, T*K), make([]float32, T*K)
	}
	r.topk, r.w = r.topk[:T*K], r.w[:T*K]
	r.sum = grow(r.sum, T)
	for t := 0; t < T; t++ {
		p, ids := r.p[t*E:(t+1)*E], r.topk[t*K:(t+1)*K]
		topK(p, ids)
		s := 0.0
		for _, e := range ids {
			s += p[e]
		}
		r.sum[t] = s
		for k, e := range ids {
			r.w[t*K+k] = float32(p[e] / s)
		}
	}
}

// softmax replaces v by softmax(v).
func softmax(v []float64) {
	m := math.Inf(-1)
	for _, x := range v {
		m = max(m, x)
	}
	s := 0.0
	for i, x := range v {
		v[i] = math.Exp(x - m)
		s += v[i]
	}
	for i := range v {
		v[i] /= s
	}
}

// topK writes into ids the indices of the len(ids) largest values of p, by
// decreasing value; ties go to the lower index. The ids are distinct.
func topK(p []float64, ids []int32) {
	for k := range ids {
		best := -1
		for e, v := range p {
			taken := false
			for _, c := range ids[:k] {
				if int(c) == e {
					taken = true
					break
				}
			}
			if !taken && (best < 0 || v > p[best]) {
				best = e
			}
		}
		ids[k] = int32(best)
	}
}

// backward adds to gGate and gx the gradient of the loss given gw, its
// gradient with respect to the weights ([T][K]), and gp, its gradient with
// respect to the probabilities that does not pass through the weights (the
// load-balancing loss; [E], the same for every token). dp is scratch.
func (r *router) backward(gate []float64, gw []float64, gp []float64, H, E, K int, gGate, gx []float64, dp *[]float64) {
	T := r.T
	*dp = grow(*dp, T*E)
	d := *dp
	for t := 0; t < T; t++ {
		row, p := d[t*E:(t+1)*E], r.p[t*E:(t+1)*E]
		copy(row, gp)
		// w_k = p[e_k]/S with S = sum_j p[e_j]: dL/dp[e_k] += (gw_k - sum_j gw_j w_j)/S.
		dot := 0.0
		for k := 0; k < K; k++ {
			dot += gw[t*K+k] * float64(p[r.topk[t*K+k]]/r.sum[t])
		}
		for k := 0; k < K; k++ {
			row[r.topk[t*K+k]] += (gw[t*K+k] - dot) / r.sum[t]
		}
		// Softmax: dL/dlogit_e = p_e * (dL/dp_e - sum_j p_j dL/dp_j).
		s := 0.0
		for e := range row {
			s += p[e] * row[e]
		}
		for e := range row {
			row[e] = p[e] * (row[e] - s)
		}
	}
	gemm(blas.Trans, blas.NoTrans, 1, dense(T, H, r.x), dense(T, E, d), 1, dense(H, E, gGate))
	gemm(blas.NoTrans, blas.Trans, 1, dense(T, E, d), dense(H, E, gate), 1, dense(T, H, gx))
}
