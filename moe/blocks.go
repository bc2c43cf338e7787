package moe

// The layer's building blocks, for other programs that run a MoE layer's
// forward pass their own way (package moe/serve decodes with them).

// Route computes, for the tokens x ([T][hidden]), the gate's choice as
// Layer.Forward makes it: the top k experts of softmax(x · gate) ([T][k] in
// topk, by decreasing probability, ties to the lower index) and their
// probabilities renormalised over the k (in w, [T][k]). gate is
// [hidden][experts]. Each token's result depends on its own row alone.
func Route(gate, x []float64, hidden, experts, k int, topk []int32, w []float32) {
	var r router
	T := len(x) / hidden
	r.route(gate, x, T, hidden, experts, k)
	copy(topk, r.topk)
	copy(w, r.w)
}

// ExpertForward runs expert i of p (0-based among the experts p holds) on
// the rows u ([n][Hidden]) and writes its outputs into out ([n][Hidden]):
// act(u·W1 + b1)·W2 + b2, as Layer.Forward runs it. Each row's output
// depends on that row alone.
func (p *Params) ExpertForward(c Config, i int, u, out []float64) {
	mc := mlpCache{n: len(u) / c.Hidden, u: u}
	mlpForward(p.expert(c, i), c.Act, c.Hidden, c.FFN, &mc)
	copy(out, mc.o)
}

// SharedForward runs the shared expert of p (Config.SharedFFN > 0) on the
// rows u ([n][Hidden]) and writes its outputs into out ([n][Hidden]).
func (p *Params) SharedForward(c Config, u, out []float64) {
	mc := mlpCache{n: len(u) / c.Hidden, u: u}
	mlpForward(p.shared(), c.Act, c.Hidden, c.SharedFFN, &mc)
	copy(out, mc.o)
}

// TeacherParams returns the gate, the shared expert and experts [first,
// first+n) of the teacher of cfg's shape from seed (NewTeacher), without
// making the others: a rank's share of a random MoE layer. Expert e is the
// same whichever share it is drawn in.
func TeacherParams(cfg Config, seed uint64, first, n int) Params {
	p := newParams(cfg, n)
	initParams(&p, cfg, seed, first, teacherInit)
	return p
}
