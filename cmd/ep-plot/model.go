package main

import (
	"bytes"
	"fmt"
	"image/color"
	"io"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"

	"github.com/goep/goep/internal/study"
)

// parseBandwidth reads "50GB/s", "400Gb/s", "400Gbit/s" or a plain number of
// GB/s, and returns GB/s.
func parseBandwidth(s string) (float64, error) {
	t := strings.TrimSpace(s)
	div := 1.0
	for _, u := range []struct {
		suffix string
		div    float64
	}{{"Gbit/s", 8}, {"Gb/s", 8}, {"Gbps", 8}, {"GB/s", 1}, {"GBps", 1}} {
		if strings.HasSuffix(t, u.suffix) {
			t, div = strings.TrimSpace(strings.TrimSuffix(t, u.suffix)), u.div
			break
		}
	}
	v, err := strconv.ParseFloat(t, 64)
	if err != nil || v < 0 || math.IsInf(v, 0) || math.IsNaN(v) {
		return 0, fmt.Errorf("%q is not a bandwidth such as 50GB/s or 400Gb/s", s)
	}
	return v / div, nil
}

func model(stdout, stderr io.Writer, args []string) error {
	fs := newFlags("model", stderr, "[flags] STUDY.h5")
	holdout := fs.Int("holdout-ranks", -1, "validate on the runs with at least this many ranks, left out of the fit (-1: the largest rank count; 0: none)")
	netFlag := fs.String("net", "50GB/s", "network bandwidth per node for the predictions (GB/s, or Gb/s: 400Gb/s); 0: the fitted one per rank")
	shmFlag := fs.String("shm", "0", "shared-memory bandwidth per rank for the predictions (GB/s); 0: the fitted one")
	rpn := fs.Int("ranks-per-node", 8, "ranks per node for the predictions")
	ranksFlag := fs.String("ranks", "8,16,32,64,128,256,512,1024", "rank counts to predict")
	cpus := fs.Int("cpus", 0, "cores of the measured host (0: the study's host_cpus attribute)")
	shared := fs.String("shared-host", "auto", "true if all nodes of the study ran on one host (auto: the study's alloc_hosts attribute is 1, or it has no Slurm job)")
	write := fs.Bool("write", false, "store the model (fitted on every run) in the study file under /model")
	md := fs.String("md", "", "also write the report to this Markdown file")
	png := fs.String("png", "", "also write a chart of predicted against measured times to this PNG file")
	tableDType := fs.String("table-dtype", "", "list only this dtype in the validation table (its error summary covers every run)")
	allTokens := fs.Bool("all-tokens", false, "list every token count in the validation table, not only the largest of each mode")
	var llShape, htShape shapeFlag
	llShape = shapeFlag{study.Shape{Mode: "ll", Tokens: 128, Hidden: 7168, TopK: 8, Experts: 256, ElemBytes: 2}}
	htShape = shapeFlag{study.Shape{Mode: "ht", Tokens: 4096, Hidden: 7168, TopK: 8, Experts: 256, ElemBytes: 2}}
	fs.Var(&llShape, "ll", "LL shape to predict: tokens,hidden,topk,experts,dtype")
	fs.Var(&htShape, "ht", "HT shape to predict: tokens,hidden,topk,experts,dtype")
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return usagef("want one study file, got %d arguments", fs.NArg())
	}
	net, err := parseBandwidth(*netFlag)
	if err != nil {
		return usagef("-net: %v", err)
	}
	shm, err := parseBandwidth(*shmFlag)
	if err != nil {
		return usagef("-shm: %v", err)
	}
	predRanks, err := intList("ranks", *ranksFlag)
	if err != nil {
		return err
	}
	if *rpn < 1 {
		return usagef("-ranks-per-node %d: want at least 1", *rpn)
	}
	s, err := study.Read(fs.Arg(0))
	if err != nil {
		return err
	}
	if len(s.Records) == 0 {
		return fmt.Errorf("%s has no results", fs.Arg(0))
	}
	opt := study.FitOptions{CPUs: *cpus}
	if opt.CPUs == 0 {
		opt.CPUs = s.AttrInt("host_cpus", 0)
	}
	switch *shared {
	case "auto":
		opt.SharedHost = s.AttrInt("alloc_hosts", 0) == 1 || s.AttrString("slurm_job_id") == ""
	case "true", "false":
		opt.SharedHost = *shared == "true"
	default:
		return usagef("-shared-host %q: want auto, true or false", *shared)
	}
	var ranks []int
	for _, r := range s.Records {
		if !slices.Contains(ranks, r.Ranks) {
			ranks = append(ranks, r.Ranks)
		}
	}
	slices.Sort(ranks)
	if *holdout < 0 {
		*holdout = 0
		if len(ranks) > 2 {
			*holdout = ranks[len(ranks)-1]
		}
	}
	held := func(r *study.Record) bool { return *holdout > 0 && r.Ranks >= *holdout }
	valModel, err := study.Fit(s.Records, study.FitOptions{CPUs: opt.CPUs, SharedHost: opt.SharedHost, Exclude: held})
	if err != nil {
		return fmt.Errorf("fit without the held-out runs: %w", err)
	}
	full, err := study.Fit(s.Records, opt)
	if err != nil {
		return err
	}
	rows, err := study.Validate(valModel, s.Records, held)
	if err != nil {
		return err
	}
	fullRows, err := study.Validate(full, s.Records, nil)
	if err != nil {
		return err
	}

	r := modelRun{path: fs.Arg(0), records: len(s.Records), opt: opt, full: full, rows: rows, fullRows: fullRows,
		holdout: *holdout, tableDType: *tableDType, allTokens: *allTokens}
	b, err := r.report(study.Cluster{RanksPerNode: *rpn, NetGBps: net, ShmGBps: shm}, predRanks, llShape.Shape, htShape.Shape)
	if err != nil {
		return err
	}
	if _, err := stdout.Write(b.Bytes()); err != nil {
		return err
	}
	if *md != "" {
		if err := os.WriteFile(*md, b.Bytes(), 0o644); err != nil {
			return err
		}
	}
	if *png != "" {
		if err := validationChart(*png, rows, *holdout); err != nil {
			return err
		}
	}
	if *write {
		return study.WriteModel(fs.Arg(0), full, r.fitErrors())
	}
	return nil
}

// modelRun is a fitted model and its validation, for the report.
type modelRun struct {
	path           string
	records        int
	opt            study.FitOptions
	full           *study.Model
	rows, fullRows []study.Row
	holdout        int
	tableDType     string
	allTokens      bool
}

// report is the Markdown report: the parameters, predicted against measured
// with the errors, and the predictions for the cluster cl.
func (r modelRun) report(cl study.Cluster, predRanks []int, ll, ht study.Shape) (bytes.Buffer, error) {
	var b bytes.Buffer
	fmt.Fprintf(&b, "# ep latency-bandwidth model: %s\n\n", r.path)
	fmt.Fprintf(&b, "t = f * (alpha + per_peer*(R-1) + B/shm + [N>1] * (net_alpha + net_per_peer*(R-P) + X/net)) + (f-1) * (over_alpha + B/over), "+
		"f = max(1, ranks per host / %d CPUs)%s; R ranks, P per node, N nodes; B bytes sent per rank, X of them across nodes. "+
		"Times in us, bandwidths in GB/s per rank; inf: no cost per byte found. See docs/scaling.md.\n\n",
		r.opt.CPUs, map[bool]string{true: " (every node of a run on one host)", false: ""}[r.opt.SharedHost])
	fmt.Fprintf(&b, "## Fitted on every run (%d)\n\n", r.records)
	paramsTable(&b, r.full)
	fmt.Fprintf(&b, "\n## Predicted against measured\n\n")
	if r.holdout > 0 {
		fmt.Fprintf(&b, "Fitted on the runs with fewer than %d ranks; the runs with %d or more (held out) are predictions.\n\n", r.holdout, r.holdout)
	} else {
		fmt.Fprintf(&b, "Fitted on every run (nothing held out).\n\n")
	}
	validationTable(&b, r.rows, r.tableDType, r.allTokens)
	fmt.Fprintln(&b)
	errLine := func(name string, rs []study.Row, keep func(*study.Row) bool) {
		for _, mode := range study.ModeLabels {
			var parts []string
			for _, ph := range study.Phases {
				st := study.Stats(rs, func(r *study.Row) bool { return r.Rec.Mode == mode && r.Phase == ph && (keep == nil || keep(r)) })
				if st.N > 0 {
					parts = append(parts, fmt.Sprintf("%s median %.0f%%, max %.0f%% (%d)", ph, 100*st.MedianAbs, 100*st.MaxAbs, st.N))
				}
			}
			if len(parts) > 0 {
				fmt.Fprintf(&b, "- %s, %s: %s\n", name, mode, strings.Join(parts, "; "))
			}
		}
	}
	fmt.Fprintf(&b, "Relative error |predicted - measured| / measured:\n\n")
	if r.holdout > 0 {
		errLine(fmt.Sprintf("held out (%d+ ranks)", r.holdout), r.rows, func(r *study.Row) bool { return r.Held })
		errLine("fitted runs", r.rows, func(r *study.Row) bool { return !r.Held })
	}
	errLine("all runs, model fitted on all", r.fullRows, nil)

	net := cl.NetGBps
	netText := fmt.Sprintf("network %.4g GB/s per node (%.4g Gb/s)", net, 8*net)
	if net == 0 {
		netText = "the network fitted on the simulated nodes"
	}
	for _, sh := range []study.Shape{ll, ht} {
		fmt.Fprintf(&b, "\n## Predicted: %s, %d tokens per rank, hidden %d, top-%d, %s; %d ranks per node, %s\n\n",
			strings.ToUpper(sh.Mode), sh.Tokens, sh.Hidden, sh.TopK, dtypeName(sh.ElemBytes), cl.RanksPerNode, netText)
		if err := predictTable(&b, r.full, sh, predRanks, cl); err != nil {
			fmt.Fprintf(&b, "(no prediction: %v)\n", err)
		}
	}
	return b, nil
}

// fitErrors are the model's median errors, stored with it (-write).
func (r modelRun) fitErrors() map[string]any {
	extra := map[string]any{"fit_runs": r.records, "holdout_ranks": r.holdout}
	for _, mode := range study.ModeLabels {
		for _, ph := range study.Phases {
			keep := func(row *study.Row) bool { return row.Rec.Mode == mode && row.Phase == ph }
			if st := study.Stats(r.fullRows, keep); st.N > 0 {
				extra["median_abs_err_"+mode+"_"+ph] = st.MedianAbs
			}
			if st := study.Stats(r.rows, func(row *study.Row) bool { return keep(row) && row.Held }); st.N > 0 {
				extra["heldout_median_abs_err_"+mode+"_"+ph] = st.MedianAbs
			}
		}
	}
	return extra
}

func dtypeName(elemBytes int) string {
	if elemBytes == 4 {
		return "f32"
	}
	return "bf16"
}

// shapeFlag parses tokens,hidden,topk,experts,dtype.
type shapeFlag struct{ study.Shape }

func (f *shapeFlag) String() string {
	return fmt.Sprintf("%d,%d,%d,%d,%s", f.Tokens, f.Hidden, f.TopK, f.Experts, dtypeName(f.ElemBytes))
}

func (f *shapeFlag) Set(s string) error {
	p := strings.Split(s, ",")
	if len(p) != 5 || (p[4] != "f32" && p[4] != "bf16") {
		return fmt.Errorf("%q is not tokens,hidden,topk,experts,f32|bf16", s)
	}
	var v [4]int
	for i := range v {
		n, err := strconv.Atoi(p[i])
		if err != nil || n < 1 {
			return fmt.Errorf("%q: %q is not a positive whole number", s, p[i])
		}
		v[i] = n
	}
	f.Tokens, f.Hidden, f.TopK, f.Experts = v[0], v[1], v[2], v[3]
	f.ElemBytes = map[string]int{"f32": 4, "bf16": 2}[p[4]]
	return nil
}

func gbps(g float64) string {
	if g <= 0 {
		return "inf"
	}
	return fmt.Sprintf("%.3g", g)
}

func paramsTable(w io.Writer, m *study.Model) {
	fmt.Fprintln(w, "| mode/phase | alpha (us) | per peer (us) | shm (GB/s per rank) | net alpha (us) | net per remote peer (us) | net (GB/s per rank) | sharing cores: over alpha (us) | over (GB/s) | runs (1 node + more) |")
	fmt.Fprintln(w, "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
	var keys []string
	for _, mode := range study.ModeLabels {
		for _, ph := range study.Phases {
			if _, ok := m.Params[study.Key(mode, ph)]; ok {
				keys = append(keys, study.Key(mode, ph))
			}
		}
	}
	for _, k := range keys {
		p := m.Params[k]
		net := [3]string{"-", "-", "-"}
		if p.HasNet {
			net = [3]string{fmt.Sprintf("%.1f", p.NetAlpha), fmt.Sprintf("%.2f", p.NetPerPeer), gbps(p.NetGBps)}
		}
		fmt.Fprintf(w, "| %s | %.1f | %.2f | %s | %s | %s | %s | %.0f | %s | %d + %d |\n", k, p.Alpha, p.PerPeer, gbps(p.ShmGBps),
			net[0], net[1], net[2], p.OverAlpha, gbps(p.OverGBps), p.FitRuns, p.FitRunsNet)
	}
}

// validationTable lists dispatch and combine, measured and predicted, per run.
func validationTable(w io.Writer, rows []study.Row, dtype string, allTokens bool) {
	maxTok := map[string]int{}
	for _, r := range rows {
		maxTok[r.Rec.Mode] = max(maxTok[r.Rec.Mode], r.Rec.Tokens)
	}
	type pair struct{ d, c *study.Row }
	var order []*study.Record
	byRec := map[*study.Record]*pair{}
	for i := range rows {
		r := &rows[i]
		if (dtype != "" && r.Rec.DType != dtype) || (!allTokens && r.Rec.Tokens != maxTok[r.Rec.Mode]) {
			continue
		}
		p := byRec[r.Rec]
		if p == nil {
			p = &pair{}
			byRec[r.Rec] = p
			order = append(order, r.Rec)
		}
		if r.Phase == "dispatch" {
			p.d = r
		} else {
			p.c = r
		}
	}
	slices.SortStableFunc(order, func(a, b *study.Record) int {
		if a.Mode != b.Mode {
			return strings.Compare(b.Mode, a.Mode) // ll first
		}
		if a.DType != b.DType {
			return strings.Compare(b.DType, a.DType) // f32 first
		}
		if a.Nodes != b.Nodes {
			return a.Nodes - b.Nodes
		}
		if a.Ranks != b.Ranks {
			return a.Ranks - b.Ranks
		}
		return a.Tokens - b.Tokens
	})
	fmt.Fprintln(w, "| mode | dtype | nodes x ranks | tokens | dispatch measured (us) | predicted | error | combine measured (us) | predicted | error |")
	fmt.Fprintln(w, "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
	for _, rec := range order {
		p := byRec[rec]
		if p.d == nil || p.c == nil {
			continue
		}
		mark := ""
		if p.d.Held {
			mark = " (held out)"
		}
		fmt.Fprintf(w, "| %s | %s | %dx%d%s | %d | %.0f | %.0f | %+.0f%% | %.0f | %.0f | %+.0f%% |\n", rec.Mode, rec.DType,
			rec.Nodes, rec.Ranks, mark, rec.Tokens, p.d.Measured, p.d.Predicted, 100*p.d.RelErr,
			p.c.Measured, p.c.Predicted, 100*p.c.RelErr)
	}
}

func predictTable(w io.Writer, m *study.Model, sh study.Shape, ranks []int, cl study.Cluster) error {
	var lines []string
	for _, r := range ranks {
		s := sh
		s.Ranks = r
		// ep spreads experts evenly: at least one per rank, a multiple of the ranks.
		s.Experts = max(s.Experts, r)
		s.Experts = (s.Experts + r - 1) / r * r
		d, err := m.Predict(s, "dispatch", cl)
		if err != nil {
			return err
		}
		c, err := m.Predict(s, "combine", cl)
		if err != nil {
			return err
		}
		s.Nodes = max(1, r/cl.RanksPerNode)
		bytes := s.ExpectedBytes()
		lines = append(lines, fmt.Sprintf("| %d | %d | %d | %.2f | %.2f | %.0f | %.0f | %.2f | %.2f |", r, s.Nodes, s.Experts,
			bytes/1e6, s.InterNodeBytes(bytes)/1e6, d, c, bytes/d/1e3, bytes/c/1e3))
	}
	fmt.Fprintln(w, "| ranks | nodes | experts | MB sent per rank | of it across nodes | dispatch (us) | combine (us) | dispatch GB/s per rank | combine GB/s per rank |")
	fmt.Fprintln(w, "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
	for _, l := range lines {
		fmt.Fprintln(w, l)
	}
	return nil
}

// validationChart plots predicted against measured time, log-log, one colour
// per mode and phase, held-out runs as crosses.
func validationChart(path string, rows []study.Row, holdout int) error {
	fig := newFigure("ep latency-bandwidth model: predicted against measured, per call")
	p := newPlot("", "measured (us, log scale)", "predicted (us, log scale)", false, false)
	p.X.Scale, p.X.Tick.Marker = plot.LogScale{}, plot.LogTicks{Prec: -1}
	p.Y.Scale, p.Y.Tick.Marker = plot.LogScale{}, plot.LogTicks{Prec: -1}
	lo, hi := math.Inf(1), 0.0
	i := 0
	for _, mode := range study.ModeLabels {
		for _, ph := range study.Phases {
			for _, isHeld := range []bool{false, true} {
				var xy plotter.XYs
				for _, r := range rows {
					if r.Rec.Mode == mode && r.Phase == ph && r.Held == isHeld && r.Predicted > 0 {
						xy = append(xy, plotter.XY{X: r.Measured, Y: r.Predicted})
						lo, hi = min(lo, r.Measured, r.Predicted), max(hi, r.Measured, r.Predicted)
					}
				}
				if len(xy) == 0 {
					continue
				}
				sc, err := plotter.NewScatter(xy)
				if err != nil {
					return err
				}
				sc.Color = palette[i%len(palette)]
				sc.Shape, sc.Radius = draw.CircleGlyph{}, vg.Points(2.5)
				label := mode + " " + ph
				if isHeld {
					sc.Shape, sc.Radius = draw.CrossGlyph{}, vg.Points(4)
					label += fmt.Sprintf(", held out (%d+ ranks)", holdout)
				}
				p.Add(sc)
				fig.legend.Add(label, sc)
			}
			i++
		}
	}
	if hi == 0 {
		return fmt.Errorf("nothing to plot")
	}
	// Guides: predicted = measured, and a factor of 2 either way.
	a, b := lo/1.2, hi*1.2
	for _, g := range []struct {
		xy     plotter.XYs
		label  string
		dashes []vg.Length
	}{
		{plotter.XYs{{X: a, Y: a}, {X: b, Y: b}}, "predicted = measured", dashA2AV},
		{plotter.XYs{{X: a, Y: 2 * a}, {X: b / 2, Y: b}}, "a factor of 2 off", dashMemcpy},
		{plotter.XYs{{X: 2 * a, Y: a}, {X: b, Y: b / 2}}, "", dashMemcpy},
	} {
		l, err := plotter.NewLine(g.xy)
		if err != nil {
			return err
		}
		l.Color, l.Dashes = color.Gray{Y: 0x60}, g.dashes
		p.Add(l)
		if g.label != "" {
			fig.legend.Add(g.label, l)
		}
	}
	decades(&p.X)
	decades(&p.Y)
	fig.panels = []*plot.Plot{p}
	return fig.save(path, 8*vg.Inch, 5*vg.Inch)
}
