package moe

import "math"

// Adam is the Adam optimiser (Kingma and Ba) over a Params, with bias
// correction. Its state (the moments M and V and the step count T) is what a
// checkpoint saves.
type Adam struct {
	LR, Beta1, Beta2, Eps float64
	T                     int64  // updates done
	M, V                  Params // first and second moments, laid out like the parameters
}

// NewAdam returns Adam with the usual constants (0.9, 0.999, 1e-8) and zero
// moments laid out like p.
func NewAdam(lr float64, p *Params) *Adam {
	z := p.Clone()
	z.Zero()
	v := z.Clone()
	return &Adam{LR: lr, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, M: z, V: v}
}

// Step updates p with the gradient g:
// m = b1*m + (1-b1)*g, v = b2*v + (1-b2)*g^2,
// p -= lr * (m/(1-b1^t)) / (sqrt(v/(1-b2^t)) + eps).
func (a *Adam) Step(p, g *Params) {
	a.T++
	c1 := 1 - math.Pow(a.Beta1, float64(a.T))
	c2 := 1 - math.Pow(a.Beta2, float64(a.T))
	ps, gs, ms, vs := p.slices(), g.slices(), a.M.slices(), a.V.slices()
	for i := range ps {
		pp, gg, mm, vv := ps[i], gs[i], ms[i], vs[i]
		for j, gj := range gg {
			mm[j] = a.Beta1*mm[j] + (1-a.Beta1)*gj
			vv[j] = a.Beta2*vv[j] + (1-a.Beta2)*gj*gj
			pp[j] -= a.LR * (mm[j] / c1) / (math.Sqrt(vv[j]/c2) + a.Eps)
		}
	}
}
