package study

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"
)

// synthetic makes the records a machine following want exactly would
// measure (times scaled by 1+noise*N(0,1)), over layouts nodes x ranks.
func synthetic(want map[string]Params, cpus int, shared bool, noise float64, seed uint64) []Record {
	rng := rand.New(rand.NewPCG(seed, 0))
	layouts := [][2]int{{1, 1}, {1, 2}, {1, 4}, {1, 8}, {2, 2}, {2, 4}, {2, 8}, {4, 8}}
	var recs []Record
	for _, mode := range []string{"ll", "ht"} {
		for _, dt := range []string{"f32", "bf16"} {
			for _, l := range layouts {
				for _, tok := range []int{16, 32, 64, 128, 256} {
					r := Record{Mode: mode, DType: dt, Nodes: l[0], Ranks: l[1], Tokens: tok, Hidden: 256,
						TopK: 2, Experts: 8, Iters: 10, MemcpyGBps: 5}
					s := ShapeOf(&r)
					r.BytesPerRank = s.ExpectedBytes()
					f := Oversubscription(s, cpus, shared)
					x := s.InterNodeBytes(r.BytesPerRank)
					r.DispatchUS = want[Key(mode, "dispatch")].time(s, r.BytesPerRank, x, f) * (1 + noise*rng.NormFloat64())
					r.CombineUS = want[Key(mode, "combine")].time(s, r.BytesPerRank, x, f) * (1 + noise*rng.NormFloat64())
					recs = append(recs, r)
				}
			}
		}
	}
	return recs
}

var knownParams = map[string]Params{
	"ll/dispatch": {Alpha: 20, PerPeer: 3, ShmGBps: 2, NetAlpha: 50, NetPerPeer: 10, NetGBps: 0.5, OverAlpha: 150, OverGBps: 1, HasNet: true},
	"ll/combine":  {Alpha: 15, PerPeer: 2, ShmGBps: 4, NetAlpha: 30, NetPerPeer: 5, NetGBps: 1, OverAlpha: 40, OverGBps: 0, HasNet: true},
	"ht/dispatch": {Alpha: 40, PerPeer: 4, ShmGBps: 1.5, NetAlpha: 80, NetPerPeer: 0, NetGBps: 0.25, OverAlpha: 0, OverGBps: 3, HasNet: true},
	"ht/combine":  {Alpha: 35, PerPeer: 0, ShmGBps: 3, NetAlpha: 60, NetPerPeer: 8, NetGBps: 0.75, OverAlpha: 70, OverGBps: 5, HasNet: true},
}

func near(got, want, rel float64) bool {
	if want == 0 {
		return math.Abs(got) <= rel
	}
	return math.Abs(got-want) <= rel*math.Abs(want)
}

// checkParams compares m with knownParams; the cost of sharing cores only
// when the data had shared cores (over).
func checkParams(t *testing.T, m *Model, rel float64, over bool) {
	t.Helper()
	for key, w := range knownParams {
		g, ok := m.Params[key]
		if !ok {
			t.Fatalf("%s not fitted", key)
		}
		pairs := []struct {
			name      string
			got, want float64
		}{{"Alpha", g.Alpha, w.Alpha}, {"PerPeer", g.PerPeer, w.PerPeer}, {"ShmGBps", g.ShmGBps, w.ShmGBps},
			{"NetAlpha", g.NetAlpha, w.NetAlpha}, {"NetPerPeer", g.NetPerPeer, w.NetPerPeer}, {"NetGBps", g.NetGBps, w.NetGBps}}
		if over {
			pairs = append(pairs, []struct {
				name      string
				got, want float64
			}{{"OverAlpha", g.OverAlpha, w.OverAlpha}, {"OverGBps", g.OverGBps, w.OverGBps}}...)
		} else if g.OverAlpha != 0 || g.OverGBps != 0 {
			t.Errorf("%s: cost of sharing cores %g us, %g GB/s fitted on data with no sharing", key, g.OverAlpha, g.OverGBps)
		}
		for _, p := range pairs {
			// Bandwidths compare as costs per byte (0 GB/s: no cost), on the
			// scale of the shared-memory cost; a true 0 on the scale of Alpha.
			got, want, tol := p.got, p.want, rel*math.Abs(p.want)
			if strings.HasSuffix(p.name, "GBps") {
				got, want = usPerByte(got), usPerByte(want)
				tol = rel * max(want, usPerByte(w.ShmGBps))
			} else if want == 0 {
				tol = rel * w.Alpha
			}
			if math.Abs(got-want) > tol {
				t.Errorf("%s %s = %.4g, want %.4g (within %.0f%%)", key, p.name, p.got, p.want, 100*rel)
			}
		}
		if !g.HasNet || g.FitRuns != 2*5*4 || g.FitRunsNet != 2*5*4 {
			t.Errorf("%s: HasNet %v, fitted %d + %d runs, want true, 40 + 40", key, g.HasNet, g.FitRuns, g.FitRunsNet)
		}
	}
}

// Exact data: the fit must return the constants that made it.
func TestFitExact(t *testing.T) {
	for _, tc := range []struct {
		cpus   int
		shared bool
	}{{0, false}, {2, true}, {4, false}} {
		recs := synthetic(knownParams, tc.cpus, tc.shared, 0, 1)
		m, err := Fit(recs, FitOptions{CPUs: tc.cpus, SharedHost: tc.shared})
		if err != nil {
			t.Fatal(err)
		}
		checkParams(t, m, 1e-6, tc.cpus > 0)
		rows, err := Validate(m, recs, nil)
		if err != nil {
			t.Fatal(err)
		}
		if s := Stats(rows, nil); s.N != 2*len(recs) || s.MaxAbs > 1e-9 {
			t.Errorf("cpus %d: %d rows, max |error| %g, want %d and 0", tc.cpus, s.N, s.MaxAbs, 2*len(recs))
		}
	}
}

// checkPredictions compares m's predictions for clusters of 8 to 512 ranks
// with those of knownParams.
func checkPredictions(t *testing.T, m *Model, rel float64) {
	t.Helper()
	want := &Model{Params: knownParams}
	for _, mode := range []string{"ll", "ht"} {
		for _, r := range []int{8, 64, 512} {
			s := Shape{Mode: mode, Tokens: 128, Hidden: 512, TopK: 4, Experts: max(64, r), ElemBytes: 2, Ranks: r}
			for _, ph := range Phases {
				g, err1 := m.Predict(s, ph, Cluster{RanksPerNode: 8})
				w, err2 := want.Predict(s, ph, Cluster{RanksPerNode: 8})
				if err1 != nil || err2 != nil || !near(g, w, rel) {
					t.Errorf("%s %s %d ranks: predicted %.0f us, want %.0f (within %.0f%%) %v %v", mode, ph, r, g, w, 100*rel, err1, err2)
				}
			}
		}
	}
}

// 2% noise: the predictions for clusters up to 64 times larger come back within 25%, the
// constants within 50% (the cost per peer, a small part of every time
// measured, is the least certain), the measured times within a few %.
func TestFitNoisy(t *testing.T) {
	recs := synthetic(knownParams, 2, true, 0.02, 7)
	m, err := Fit(recs, FitOptions{CPUs: 2, SharedHost: true})
	if err != nil {
		t.Fatal(err)
	}
	checkParams(t, m, 0.5, true)
	checkPredictions(t, m, 0.25)
	rows, _ := Validate(m, recs, nil)
	if s := Stats(rows, nil); s.MedianAbs > 0.03 {
		t.Errorf("median |error| %.3f, want <= 0.03", s.MedianAbs)
	}
}

// One run in five slowed down 5 to 20 times (a busy machine): the fit
// follows the others, as well as with 2% noise alone.
func TestFitOutliers(t *testing.T) {
	recs := synthetic(knownParams, 2, true, 0.01, 9)
	rng := rand.New(rand.NewPCG(10, 0))
	for i := range recs {
		if i%5 == 2 {
			recs[i].DispatchUS *= 5 + 15*rng.Float64()
			recs[i].CombineUS *= 5 + 15*rng.Float64()
		}
	}
	m, err := Fit(recs, FitOptions{CPUs: 2, SharedHost: true})
	if err != nil {
		t.Fatal(err)
	}
	checkParams(t, m, 0.5, true)
	checkPredictions(t, m, 0.25)
}

// Held-out records are not fitted, and are predicted.
func TestFitExclude(t *testing.T) {
	recs := synthetic(knownParams, 0, false, 0, 1)
	held := func(r *Record) bool { return r.Ranks == 8 }
	m, err := Fit(recs, FitOptions{Exclude: held})
	if err != nil {
		t.Fatal(err)
	}
	if p := m.Params["ll/dispatch"]; p.FitRuns != 2*5*3 || p.FitRunsNet != 2*5*2 {
		t.Errorf("fitted %d + %d runs, want 30 + 20", p.FitRuns, p.FitRunsNet)
	}
	rows, _ := Validate(m, recs, held)
	if s := Stats(rows, func(r *Row) bool { return r.Held }); s.N != 2*2*2*3*5 || s.MaxAbs > 1e-9 {
		t.Errorf("held out: %+v", s)
	}
}

// Without multi-node runs the model has no net terms and says so.
func TestFitSingleNodeOnly(t *testing.T) {
	var recs []Record
	for _, r := range synthetic(knownParams, 0, false, 0, 1) {
		if r.Nodes == 1 {
			recs = append(recs, r)
		}
	}
	m, err := Fit(recs, FitOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if m.Params["ht/combine"].HasNet {
		t.Error("HasNet with no multi-node runs")
	}
	multi := Record{Mode: "ll", DType: "f32", Nodes: 2, Ranks: 4, Tokens: 8, Hidden: 8, TopK: 1, Experts: 4, Iters: 1}
	if _, err := m.Time(&multi, "dispatch"); err == nil {
		t.Error("Time of a 2-node run with no net terms: no error")
	}
	s := Shape{Mode: "ll", Tokens: 128, Hidden: 7168, TopK: 8, Experts: 256, ElemBytes: 2, Ranks: 64}
	if _, err := m.Predict(s, "dispatch", Cluster{RanksPerNode: 8}); err == nil {
		t.Error("Predict across nodes with no net terms and no bandwidth: no error")
	}
	if _, err := m.Predict(s, "dispatch", Cluster{RanksPerNode: 8, NetGBps: 50}); err != nil {
		t.Error(err)
	}
	if _, err := Fit(nil, FitOptions{}); err == nil {
		t.Error("Fit of nothing: no error")
	}
}

// Predict by hand: LL, 2 nodes of 4 ranks, network given per node.
func TestPredict(t *testing.T) {
	p := Params{Alpha: 10, PerPeer: 1, ShmGBps: 1, NetAlpha: 100, NetPerPeer: 2, NetGBps: 0.1, HasNet: true}
	m := &Model{Params: map[string]Params{"ll/dispatch": p}}
	s := Shape{Mode: "ll", Tokens: 100, Hidden: 1000, TopK: 2, Experts: 8, ElemBytes: 2, Ranks: 8}
	got, err := m.Predict(s, "dispatch", Cluster{RanksPerNode: 4, NetGBps: 2})
	if err != nil {
		t.Fatal(err)
	}
	b := 100.0 * 1000 * 2 * 2 // 400 kB
	x := b / 2                // half the experts are on the other node
	want := 10 + 1*7 + b/1e3 + 100 + 2*4 + x/(2.0/4*1e3)
	if !near(got, want, 1e-12) {
		t.Errorf("Predict = %g, want %g", got, want)
	}
	// One node: no net terms.
	got, _ = m.Predict(s, "dispatch", Cluster{RanksPerNode: 8})
	if want := 10 + 7 + b/1e3; !near(got, want, 1e-12) {
		t.Errorf("Predict on one node = %g, want %g", got, want)
	}
}

// The expected bytes of uniform routing match a simulation of it.
func TestExpectedBytes(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for _, s := range []Shape{
		{Mode: "ht", Tokens: 4000, Hidden: 1, TopK: 2, Experts: 8, ElemBytes: 1, Ranks: 4, Nodes: 2},
		{Mode: "ht", Tokens: 4000, Hidden: 1, TopK: 8, Experts: 64, ElemBytes: 1, Ranks: 16, Nodes: 4},
		{Mode: "ht", Tokens: 4000, Hidden: 1, TopK: 3, Experts: 6, ElemBytes: 1, Ranks: 6, Nodes: 3},
		{Mode: "ll", Tokens: 4000, Hidden: 1, TopK: 4, Experts: 16, ElemBytes: 1, Ranks: 8, Nodes: 2},
	} {
		L, P := s.Experts/s.Ranks, s.Ranks/s.Nodes
		var bytes, inter float64
		for tok := 0; tok < s.Tokens; tok++ {
			ranks, nodes := map[int]bool{}, map[int]bool{}
			for _, e := range rng.Perm(s.Experts)[:s.TopK] {
				r := e / L
				if s.Mode == "ll" {
					bytes++
					if r/P != 0 { // this rank is rank 0, on node 0
						inter++
					}
				}
				ranks[r], nodes[r/P] = true, true
			}
			if s.Mode == "ht" {
				bytes += float64(len(ranks))
				inter += float64(len(nodes))
				if nodes[0] {
					inter--
				}
			}
		}
		if b := s.ExpectedBytes(); !near(bytes, b, 0.03) {
			t.Errorf("%+v: simulated %g bytes, expected %g", s, bytes, b)
		}
		if x := s.InterNodeBytes(s.ExpectedBytes()); !near(inter, x, 0.03) {
			t.Errorf("%+v: simulated %g inter-node bytes, expected %g", s, inter, x)
		}
	}
}

// NNLS: a non-negative truth is found exactly; a negative unconstrained
// optimum is clamped to the constrained optimum (checked by its KKT
// conditions: zero gradient on the support, non-negative gradient off it).
func TestNNLS(t *testing.T) {
	a := [][]float64{{1, 0, 1}, {1, 1, 2}, {1, 2, 3.5}, {1, 3, 4}, {1, 4, 6}}
	x := []float64{2, 0.5, 1.5}
	y := make([]float64, len(a))
	for i := range a {
		for j := range x {
			y[i] += a[i][j] * x[j]
		}
	}
	got, err := NNLS(a, y)
	if err != nil {
		t.Fatal(err)
	}
	for j := range x {
		if !near(got[j], x[j], 1e-9) {
			t.Errorf("x[%d] = %g, want %g", j, got[j], x[j])
		}
	}
	// y falls with the second column: its unconstrained coefficient is negative.
	y = []float64{10, 9, 8.5, 7, 6}
	got, err = NNLS(a, y)
	if err != nil {
		t.Fatal(err)
	}
	for j := range got {
		g := 0.0 // d/dx_j of |Ax-y|^2 / 2
		for i := range a {
			r := -y[i]
			for k := range got {
				r += a[i][k] * got[k]
			}
			g += a[i][j] * r
		}
		if got[j] < 0 || (got[j] > 0 && math.Abs(g) > 1e-9) || (got[j] == 0 && g < -1e-9) {
			t.Errorf("x = %v: KKT fails at %d (gradient %g)", got, j, g)
		}
	}
	if _, err := NNLS(nil, nil); err == nil {
		t.Error("NNLS of nothing: no error")
	}
	if _, err := NNLS([][]float64{{1, 2}, {1}}, []float64{1, 2}); err == nil {
		t.Error("ragged NNLS: no error")
	}
	// Dependent columns: still a solution, no panic.
	got, err = NNLS([][]float64{{1, 2}, {2, 4}, {3, 6}}, []float64{1, 2, 3})
	if err != nil || !near(got[0]+2*got[1], 1, 1e-9) {
		t.Errorf("dependent columns: %v, %v", got, err)
	}
}
