package study

import (
	"errors"
	"fmt"
	"math"
	"slices"
)

// Phases are the two measured calls.
var Phases = []string{"dispatch", "combine"}

// Shape is what the model needs to know about one configuration.
type Shape struct {
	Mode                          string // "ll" or "ht"
	Tokens, Hidden, TopK, Experts int
	ElemBytes                     int
	Ranks, Nodes                  int
}

// ShapeOf is the shape of a measured record.
func ShapeOf(r *Record) Shape {
	return Shape{Mode: r.Mode, Tokens: r.Tokens, Hidden: r.Hidden, TopK: r.TopK, Experts: r.Experts,
		ElemBytes: r.ElemBytes(), Ranks: r.Ranks, Nodes: r.Nodes}
}

// ranksPerNode is P.
func (s Shape) ranksPerNode() int {
	if s.Nodes < 1 {
		return s.Ranks
	}
	return s.Ranks / s.Nodes
}

// missAll is the probability that a token's k distinct experts, drawn
// uniformly from e, all avoid a given set of m experts: C(e-m, k) / C(e, k).
func missAll(e, m, k float64) float64 {
	p := 1.0
	for i := 0.0; i < k; i++ {
		if e-m-i <= 0 {
			return 0
		}
		p *= (e - m - i) / (e - i)
	}
	return p
}

// ExpectedBytes is the expected number of bytes a rank sends per call under
// uniform routing: one row per (token, expert) pair in LL, per (token,
// destination rank) pair in HT. It is what ep-bench reports as
// bytes_per_rank (for a random routing, up to sampling noise).
func (s Shape) ExpectedBytes() float64 {
	row := float64(s.Tokens * s.Hidden * s.ElemBytes)
	if s.Mode == "ll" {
		return row * float64(s.TopK)
	}
	e, r := float64(s.Experts), float64(s.Ranks)
	return row * r * (1 - missAll(e, e/r, float64(s.TopK)))
}

// InterNodeBytes is the expected number of bytes per rank that cross
// between nodes, given the bytes B the rank sends: in LL the share of its
// rows whose expert is on another node, (R-P)/R of B; in HT one row per
// (token, destination node other than its own), as ep's HT sends a token
// once per node and forwards it inside the node.
func (s Shape) InterNodeBytes(b float64) float64 {
	if s.Nodes <= 1 {
		return 0
	}
	r, p := float64(s.Ranks), float64(s.ranksPerNode())
	if s.Mode == "ll" {
		return b * (r - p) / r
	}
	e, n := float64(s.Experts), float64(s.Nodes)
	return float64(s.Tokens*s.Hidden*s.ElemBytes) * (n - 1) * (1 - missAll(e, e/n, float64(s.TopK)))
}

// Params are the fitted constants of one mode and phase. Times are in
// microseconds, bandwidths in GB/s per rank; a bandwidth of 0 means the fit
// found no cost per byte on that term (infinitely fast).
type Params struct {
	Alpha      float64 // fixed cost of a call
	PerPeer    float64 // cost per other rank (flags, counts, one block each)
	ShmGBps    float64 // bytes per rank through shared memory (every row is copied once in a node)
	NetAlpha   float64 // fixed extra cost of a call that spans nodes
	NetPerPeer float64 // cost per rank on another node (puts, flags)
	NetGBps    float64 // inter-node bytes per rank (the simulated or real network)
	// The cost of sharing cores, paid (f-1) times on a host with f ranks per
	// core and never on a cluster of one core per rank: a waiting rank's peer
	// must first be scheduled (OverAlpha), and copies contend for the cores
	// and their caches (OverGBps).
	OverAlpha  float64
	OverGBps   float64
	HasNet     bool // the net terms were fitted (there were multi-node runs)
	FitRuns    int  // single-node observations fitted
	FitRunsNet int  // multi-node observations fitted
}

// Model is a fitted latency-bandwidth model: Params per "mode/phase".
type Model struct {
	Params map[string]Params
	// CPUs and SharedHost describe the machine measured; see FitOptions.
	CPUs       int
	SharedHost bool
}

// Key names the Params of a mode and phase: "ll/dispatch".
func Key(mode, phase string) string { return mode + "/" + phase }

// FitOptions say how to read the measurements.
type FitOptions struct {
	// CPUs is the number of cores of each host. With more ranks on a host
	// than cores, ranks share cores: every cost is paid f = ranks/CPUs times
	// over, and sharing costs more (Params.OverAlpha, OverGBps). The fit
	// separates this from the costs of ep itself. 0: no correction (f = 1).
	CPUs int
	// SharedHost says every node of every run is on one host (simulated
	// nodes, as in the one-machine Slurm cluster): the ranks on a host are
	// then all the ranks, else the ranks of one node.
	SharedHost bool
	// Exclude leaves records out of the fit (held out for validation).
	Exclude func(*Record) bool
}

// Oversubscription is the factor by which sharing cores slows a run down:
// max(1, ranks on a host / cpus); 1 when cpus is 0.
func Oversubscription(s Shape, cpus int, sharedHost bool) float64 {
	if cpus <= 0 {
		return 1
	}
	onHost := s.ranksPerNode()
	if sharedHost {
		onHost = s.Ranks
	}
	return max(1, float64(onHost)/float64(cpus))
}

// usPerByte turns a bandwidth in GB/s into microseconds per byte (0 for 0).
func usPerByte(gbps float64) float64 {
	if gbps <= 0 {
		return 0
	}
	return 1 / (gbps * 1e3)
}

// gbpsOf is the inverse of usPerByte.
func gbpsOf(usPerB float64) float64 {
	if usPerB <= 0 {
		return 0
	}
	return 1 / (usPerB * 1e3)
}

// time is the time of a call in microseconds, for a rank that sends b bytes
// of which x cross nodes, on a host with f ranks per core (f = 1: one core
// or more per rank).
func (p Params) time(s Shape, b, x, f float64) float64 {
	t := p.Alpha + p.PerPeer*float64(s.Ranks-1) + b*usPerByte(p.ShmGBps)
	if s.Nodes > 1 {
		t += p.NetAlpha + p.NetPerPeer*float64(s.Ranks-s.ranksPerNode()) + x*usPerByte(p.NetGBps)
	}
	return f*t + (f-1)*(p.OverAlpha+b*usPerByte(p.OverGBps))
}

// Time predicts the time of a measured configuration (its measured bytes per
// rank, the machine of the fit), in microseconds.
func (m *Model) Time(r *Record, phase string) (float64, error) {
	p, ok := m.Params[Key(r.Mode, phase)]
	if !ok {
		return 0, fmt.Errorf("study: no model for %s", Key(r.Mode, phase))
	}
	s := ShapeOf(r)
	if s.Nodes > 1 && !p.HasNet {
		return 0, fmt.Errorf("study: the %s model has no inter-node terms (no multi-node runs were fitted)", Key(r.Mode, phase))
	}
	f := Oversubscription(s, m.CPUs, m.SharedHost)
	return p.time(s, r.BytesPerRank, s.InterNodeBytes(r.BytesPerRank), f), nil
}

// Cluster describes a cluster to predict for.
type Cluster struct {
	RanksPerNode int     // P
	NetGBps      float64 // network bandwidth per node, GB/s, shared by its P ranks; 0: the fitted one per rank
	ShmGBps      float64 // shared-memory bandwidth per rank, GB/s; 0: the fitted one
}

// Predict predicts the time of a call on a cluster of s.Ranks ranks at
// c.RanksPerNode per node (s.Nodes is set from them), one core per rank,
// with the expected bytes of uniform routing. It returns microseconds.
func (m *Model) Predict(s Shape, phase string, c Cluster) (float64, error) {
	p, ok := m.Params[Key(s.Mode, phase)]
	if !ok {
		return 0, fmt.Errorf("study: no model for %s", Key(s.Mode, phase))
	}
	if c.RanksPerNode < 1 {
		return 0, errors.New("study: RanksPerNode must be at least 1")
	}
	s.Nodes = max(1, s.Ranks/c.RanksPerNode)
	if s.Nodes > 1 && !p.HasNet && c.NetGBps <= 0 {
		return 0, fmt.Errorf("study: the %s model has no inter-node terms and no network bandwidth was given", Key(s.Mode, phase))
	}
	if c.ShmGBps > 0 {
		p.ShmGBps = c.ShmGBps
	}
	if c.NetGBps > 0 {
		p.NetGBps = c.NetGBps / float64(s.ranksPerNode())
	}
	b := s.ExpectedBytes()
	return p.time(s, b, s.InterNodeBytes(b), 1), nil
}

// obs is one measured time and its features.
type obs struct {
	shape Shape
	b, x  float64 // bytes per rank, inter-node bytes per rank
	f     float64 // oversubscription factor
	t     float64 // measured microseconds
}

// Fit fits Params for every mode and phase present in recs. Single-node
// records fit Alpha, PerPeer, ShmGBps and the cost of sharing cores;
// multi-node records then fit the net terms to what the single-node part
// leaves unexplained. Both fits
// minimise the sum of absolute relative errors (each residual divided by the
// measured time, so small and large configurations weigh alike; absolute, not
// squared, so that a few runs slowed down by a busy machine do not drag the
// fit: see RobustNNLS), with every constant non-negative. A mode with no
// single-node records is an error.
func Fit(recs []Record, o FitOptions) (*Model, error) {
	m := &Model{Params: map[string]Params{}, CPUs: o.CPUs, SharedHost: o.SharedHost}
	var modes []string
	for i := range recs {
		if !slices.Contains(modes, recs[i].Mode) {
			modes = append(modes, recs[i].Mode)
		}
	}
	slices.Sort(modes)
	for _, mode := range modes {
		for _, phase := range Phases {
			var single, multi []obs
			for i := range recs {
				r := &recs[i]
				if r.Mode != mode || (o.Exclude != nil && o.Exclude(r)) {
					continue
				}
				s := ShapeOf(r)
				ob := obs{shape: s, b: r.BytesPerRank, x: s.InterNodeBytes(r.BytesPerRank),
					f: Oversubscription(s, o.CPUs, o.SharedHost), t: r.DispatchUS}
				if phase == "combine" {
					ob.t = r.CombineUS
				}
				if s.Nodes > 1 {
					multi = append(multi, ob)
				} else {
					single = append(single, ob)
				}
			}
			if len(single) == 0 && len(multi) == 0 {
				continue
			}
			if len(single) == 0 {
				return nil, fmt.Errorf("study: %s: no single-node runs to fit the shared-memory terms", Key(mode, phase))
			}
			p, err := fitParams(single, multi)
			if err != nil {
				return nil, fmt.Errorf("study: %s: %w", Key(mode, phase), err)
			}
			m.Params[Key(mode, phase)] = p
		}
	}
	if len(m.Params) == 0 {
		return nil, errors.New("study: nothing to fit")
	}
	return m, nil
}

func fitParams(single, multi []obs) (Params, error) {
	// Stage 1: t = f*(a + b*(R-1) + B*u_shm) + (f-1)*(o + B*u_over).
	a := make([][]float64, len(single))
	y := make([]float64, len(single))
	for i, o := range single {
		w := 1 / o.t // relative residuals: divide each row by the measured time
		f := o.f
		a[i] = []float64{w * f, w * f * float64(o.shape.Ranks-1), w * f * o.b, w * (f - 1), w * (f - 1) * o.b}
		y[i] = 1
	}
	c, err := RobustNNLS(a, y)
	if err != nil {
		return Params{}, err
	}
	p := Params{Alpha: c[0], PerPeer: c[1], ShmGBps: gbpsOf(c[2]), OverAlpha: c[3], OverGBps: gbpsOf(c[4]),
		FitRuns: len(single)}
	if len(multi) == 0 {
		return p, nil
	}
	// Stage 2: what stage 1 leaves of t = f*(c + d*(R-P) + X*u_net).
	a = make([][]float64, len(multi))
	y = make([]float64, len(multi))
	for i, o := range multi {
		w := 1 / o.t
		rest := o.t - p.time(Shape{Ranks: o.shape.Ranks, Nodes: 1}, o.b, 0, o.f)
		a[i] = []float64{w * o.f, w * o.f * float64(o.shape.Ranks-o.shape.ranksPerNode()), w * o.f * o.x}
		y[i] = w * rest
	}
	if c, err = RobustNNLS(a, y); err != nil {
		return Params{}, err
	}
	p.NetAlpha, p.NetPerPeer, p.NetGBps, p.HasNet, p.FitRunsNet = c[0], c[1], gbpsOf(c[2]), true, len(multi)
	return p, nil
}

// RobustNNLS solves min sum_i |(A x - y)_i| subject to x >= 0 (least
// absolute deviations: the fit follows the bulk of the rows and ignores a
// few far off, as a median does) by iteratively reweighted least squares:
// NNLS with each row weighted by 1/sqrt(max(|residual|, 1e-4)), 100
// rounds at most, from the least-squares solution. Exact data gives the
// same answer as NNLS.
func RobustNNLS(a [][]float64, y []float64) ([]float64, error) {
	x, err := NNLS(a, y)
	if err != nil {
		return nil, err
	}
	cost := func(x []float64) float64 {
		s := 0.0
		for i := range a {
			s += math.Abs(dot(a[i], x) - y[i])
		}
		return s
	}
	best, bestCost := x, cost(x)
	wa, wy := make([][]float64, len(a)), make([]float64, len(y))
	for iter := 0; iter < 100; iter++ {
		for i := range a {
			w := 1 / math.Sqrt(max(math.Abs(dot(a[i], x)-y[i]), 1e-4))
			wa[i] = make([]float64, len(a[i]))
			for j, v := range a[i] {
				wa[i][j] = w * v
			}
			wy[i] = w * y[i]
		}
		next, err := NNLS(wa, wy)
		if err != nil {
			return nil, err
		}
		c := cost(next)
		if c < bestCost {
			best, bestCost = next, c
		}
		moved := 0.0
		for j := range x {
			moved = max(moved, math.Abs(next[j]-x[j])/max(math.Abs(x[j]), 1e-12))
		}
		x = next
		if moved < 1e-9 {
			break
		}
	}
	return best, nil
}

func dot(a, b []float64) float64 {
	s := 0.0
	for i := range a {
		s += a[i] * b[i]
	}
	return s
}

// NNLS solves min |A x - y|^2 subject to x >= 0 for a few unknowns (up to
// about 10), exactly: it solves the unconstrained least-squares problem on
// every subset of the columns and keeps the best solution that is
// non-negative (the optimum is the unconstrained optimum on its support).
// Columns are scaled to unit norm first; a subset whose columns are linearly
// dependent is skipped. Unknowns outside the best subset are 0.
func NNLS(a [][]float64, y []float64) ([]float64, error) {
	if len(a) == 0 || len(a) != len(y) {
		return nil, fmt.Errorf("NNLS: %d rows and %d values", len(a), len(y))
	}
	n := len(a[0])
	if n == 0 || n > 16 {
		return nil, fmt.Errorf("NNLS: %d unknowns, want 1 to 16", n)
	}
	scale := make([]float64, n)
	for j := 0; j < n; j++ {
		for i := range a {
			if len(a[i]) != n {
				return nil, fmt.Errorf("NNLS: row %d has %d columns, want %d", i, len(a[i]), n)
			}
			scale[j] += a[i][j] * a[i][j]
		}
		scale[j] = math.Sqrt(scale[j])
	}
	best, bestRes := make([]float64, n), sumSq(y) // the empty subset: x = 0
	for mask := 1; mask < 1<<n; mask++ {
		var cols []int
		for j := 0; j < n; j++ {
			if mask&(1<<j) != 0 && scale[j] > 0 {
				cols = append(cols, j)
			}
		}
		if len(cols) == 0 || len(cols) != popcount(mask) {
			continue
		}
		x, ok := lstsq(a, y, cols, scale)
		if !ok {
			continue
		}
		feasible := true
		for _, v := range x {
			if v < 0 {
				feasible = false
			}
		}
		if !feasible {
			continue
		}
		full := make([]float64, n)
		for k, j := range cols {
			full[j] = x[k]
		}
		if res := residual(a, y, full); res < bestRes*(1-1e-12) {
			best, bestRes = full, res
		}
	}
	return best, nil
}

func popcount(m int) int {
	c := 0
	for ; m != 0; m &= m - 1 {
		c++
	}
	return c
}

func sumSq(v []float64) float64 {
	s := 0.0
	for _, x := range v {
		s += x * x
	}
	return s
}

func residual(a [][]float64, y, x []float64) float64 {
	s := 0.0
	for i := range a {
		d := -y[i]
		for j, v := range x {
			d += a[i][j] * v
		}
		s += d * d
	}
	return s
}

// lstsq solves the least-squares problem on the columns cols (scaled by
// 1/scale) through the normal equations, by Gaussian elimination with
// partial pivoting; ok is false when they are (nearly) dependent.
func lstsq(a [][]float64, y []float64, cols []int, scale []float64) ([]float64, bool) {
	k := len(cols)
	m := make([][]float64, k) // [A^T A | A^T y]
	for p := 0; p < k; p++ {
		m[p] = make([]float64, k+1)
		for q := 0; q < k; q++ {
			for i := range a {
				m[p][q] += a[i][cols[p]] / scale[cols[p]] * a[i][cols[q]] / scale[cols[q]]
			}
		}
		for i := range a {
			m[p][k] += a[i][cols[p]] / scale[cols[p]] * y[i]
		}
	}
	for c := 0; c < k; c++ {
		piv := c
		for r := c + 1; r < k; r++ {
			if math.Abs(m[r][c]) > math.Abs(m[piv][c]) {
				piv = r
			}
		}
		if math.Abs(m[piv][c]) < 1e-10 { // unit-norm columns: the Gram matrix's scale is 1
			return nil, false
		}
		m[c], m[piv] = m[piv], m[c]
		for r := 0; r < k; r++ {
			if r == c {
				continue
			}
			f := m[r][c] / m[c][c]
			for q := c; q <= k; q++ {
				m[r][q] -= f * m[c][q]
			}
		}
	}
	x := make([]float64, k)
	for c := 0; c < k; c++ {
		x[c] = m[c][k] / m[c][c] / scale[cols[c]]
	}
	return x, true
}
