package main

import (
	"fmt"
	"image/color"
	"io"
	"math"
	"path/filepath"
	"slices"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"

	"github.com/goep/goep/moe/serve"
)

// servedRun is one moe-serve trace.
type servedRun struct {
	label string
	res   *serve.Result
	info  *serve.TraceInfo
	fig   serve.Figures
	// Over the (decode step, rank) pairs of the ranks that took part, the
	// median microseconds in ep's waits (dispatch and combine Wait), in its
	// sends (DispatchSend, CombineSend) and in the rest (attention,
	// experts, output): what the overlap can hide is in the first two.
	// Medians, so that the steps a loaded machine stretched do not decide.
	waitUS, sendUS, computeUS float64
}

// decodeBreakdown finds the medians of the decode steps' phases.
func (r *servedRun) decodeBreakdown() {
	type key struct {
		step int64
		rank int
	}
	dec := map[int64]bool{}
	for i := range r.res.Steps {
		if s := &r.res.Steps[i]; s.Kind == "decode" {
			dec[s.Step] = true
		}
	}
	var sums [3]map[key]float64
	for i := range sums {
		sums[i] = map[key]float64{}
	}
	for _, e := range r.res.Events {
		if !dec[e.Step] {
			continue
		}
		k, d := key{e.Step, e.Rank}, e.FinishUS-e.StartUS
		switch e.Phase {
		case serve.PhaseDispatchWait, serve.PhaseCombineWait:
			sums[0][k] += d
		case serve.PhaseDispatchSend, serve.PhaseCombineSend:
			sums[1][k] += d
		default:
			sums[2][k] += d
		}
	}
	var out [3]float64
	for i, m := range sums {
		v := make([]float64, 0, len(m))
		for _, x := range m {
			v = append(v, x)
		}
		slices.Sort(v)
		out[i] = math.NaN()
		if len(v) > 0 {
			out[i] = v[len(v)/2]
		}
	}
	r.waitUS, r.sendUS, r.computeUS = out[0], out[1], out[2]
}

// serveTraces reads moe-serve traces and prints a Markdown table of what a
// service owner reads of each (step latency p50/p90/p99 of decode and
// prefill, time to first token, tokens per second in all and per rank,
// what masking dropped), with ratios against the first trace, and where a
// decode step's time goes on a rank (medians of ep's waits, its sends and
// the compute, from the trace's events); it draws
// the decode steps' latency distribution (serve-latency.png: the fraction
// of steps at most a given latency, per trace, and each step's latency
// against time, where a masked rank's wait shows). With -timeline STEP it
// prints the phases of that step of the first trace, rank by rank in time
// order, and draws them (serve-timeline.png): with the overlap, one
// micro-batch's dispatch or combine in flight while the other computes.
func serveTraces(stdout, stderr io.Writer, args []string) error {
	fs := newFlags("serve", stderr, "[flags] TRACE.h5...")
	dir := fs.String("o", ".", "directory of the charts")
	labels := fs.String("labels", "", "comma-separated labels of the traces (default: what each ran)")
	timeline := fs.Int64("timeline", 0, "also print and draw the phases of this step of the first trace (0: none)")
	width := fs.Float64("width", 10, "chart width, inches (at 96 dpi)")
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() == 0 {
		return usagef("want one or more moe-serve traces")
	}
	var names []string
	if *labels != "" {
		names = strings.Split(*labels, ",")
		if len(names) != fs.NArg() {
			return usagef("-labels has %d labels for %d traces", len(names), fs.NArg())
		}
	}
	var runs []*servedRun
	for i, path := range fs.Args() {
		res, info, err := serve.ReadTrace(path)
		if err != nil {
			return err
		}
		r := &servedRun{res: res, info: info, fig: res.Figures()}
		r.decodeBreakdown()
		r.label = describeServe(res, info)
		if names != nil {
			r.label = names[i]
		} else if fs.NArg() > 1 {
			r.label = filepath.Base(path) + ": " + r.label
		}
		runs = append(runs, r)
	}
	serveTable(stdout, runs)
	fig, err := serveLatencyFigure(runs)
	if err != nil {
		return err
	}
	out := filepath.Join(*dir, "serve-latency.png")
	w := vg.Length(*width) * vg.Inch
	if err := fig.save(out, w, w*0.42); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "ep-plot serve: wrote %s\n", out)
	if *timeline > 0 {
		r := runs[0]
		if *timeline > int64(len(r.res.Steps)) {
			return usagef("-timeline %d: the first trace has %d steps", *timeline, len(r.res.Steps))
		}
		timelineTable(stdout, r.res, *timeline)
		fig, err := timelineFigure(r, *timeline)
		if err != nil {
			return err
		}
		out := filepath.Join(*dir, "serve-timeline.png")
		if err := fig.save(out, w, w*0.45); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "ep-plot serve: wrote %s\n", out)
	}
	return nil
}

// describeServe says what a run ran.
func describeServe(r *serve.Result, info *serve.TraceInfo) string {
	c := r.Config
	s := fmt.Sprintf("%d ranks", r.Ranks)
	if info.Nodes > 1 {
		s += fmt.Sprintf(" on %d nodes", info.Nodes)
	}
	s += fmt.Sprintf(", overlap %s, prefill %v", map[bool]string{true: "on", false: "off"}[c.Overlap], c.Prefill)
	if c.MaskStalled {
		s += ", masking"
	}
	return s
}

// serveTable prints the runs' figures as a Markdown table.
func serveTable(w io.Writer, runs []*servedRun) {
	ms := func(us float64) string {
		if math.IsNaN(us) || us == 0 {
			return "-"
		}
		return fmt.Sprintf("%.3g", us/1e3)
	}
	fmt.Fprintln(w, "| trace | decode steps | decode p50 / p90 / p99 (ms) | prefill steps | prefill p50 / p99 (ms) | TTFT p50 / p99 (ms) | tokens/s | per rank | tokens/s vs first | decode p50 vs first | decode step and rank, medians: waits / sends / compute (ms) | pairs dropped |")
	fmt.Fprintln(w, "| --- | ---: | --- | ---: | --- | --- | ---: | ---: | ---: | ---: | --- | ---: |")
	first := runs[0].fig
	for _, r := range runs {
		f := r.fig
		fmt.Fprintf(w, "| %s | %d | %s / %s / %s | %d | %s / %s | %s / %s | %.0f | %.0f | %.2fx | %.2fx | %s / %s / %s | %d |\n",
			r.label, f.Decode.N, ms(f.Decode.P50), ms(f.Decode.P90), ms(f.Decode.P99), f.Prefill.N, ms(f.Prefill.P50), ms(f.Prefill.P99),
			ms(f.TTFT.P50), ms(f.TTFT.P99), f.TokensPerSecond, f.TokensPerSecond/float64(r.res.Ranks),
			f.TokensPerSecond/first.TokensPerSecond, f.Decode.P50/first.Decode.P50, ms(r.waitUS), ms(r.sendUS), ms(r.computeUS), f.DroppedPairs)
	}
}

// serveLatencyFigure: the decode steps' latency distribution per run (the
// fraction of steps at most x, x on a log scale), and each decode step's
// latency against the time it ended.
func serveLatencyFigure(runs []*servedRun) (*figure, error) {
	fig := newFigure("moe-serve: decode step latency (the slowest rank's time per step): its distribution, dashed p50 and p99; and against time")
	cdf := newPlot("", "latency (ms)", "fraction of steps at most this latency", false, false)
	cdf.X.Scale, cdf.X.Tick.Marker = plot.LogScale{}, logTicks125{}
	cdf.Y.Min, cdf.Y.Max = 0, 1
	series := newPlot("", "seconds into serving (when the step ended)", "latency (ms)", false, true)
	series.Y.Tick.Marker = logTicks125{}
	for i, r := range runs {
		c := palette[i%len(palette)]
		var lat, at []float64
		for j := range r.res.Steps {
			s := &r.res.Steps[j]
			if s.Kind != "decode" {
				continue
			}
			l := s.LatencyUS()
			if math.IsNaN(l) || l <= 0 {
				continue
			}
			end := math.Inf(-1)
			for _, v := range s.FinishUS {
				if !math.IsNaN(v) {
					end = max(end, v)
				}
			}
			lat, at = append(lat, l/1e3), append(at, end/1e6)
		}
		if len(lat) == 0 {
			continue
		}
		sorted := slices.Clone(lat)
		slices.Sort(sorted)
		xy := make(plotter.XYs, len(sorted))
		for j, v := range sorted {
			xy[j] = plotter.XY{X: v, Y: float64(j+1) / float64(len(sorted))}
		}
		if err := addCurve(cdf, &fig.legend, xy, r.label, c, dashEP); err != nil {
			return nil, err
		}
		pts := make(plotter.XYs, len(lat))
		for j := range lat {
			pts[j] = plotter.XY{X: at[j], Y: lat[j]}
		}
		sc, err := plotter.NewScatter(pts)
		if err != nil {
			return nil, err
		}
		sc.Color, sc.Radius = c, vg.Points(1.3)
		series.Add(sc)
		for _, p := range []float64{r.fig.Decode.P50, r.fig.Decode.P99} { // p50 and p99 as vertical marks
			l, err := plotter.NewLine(plotter.XYs{{X: p / 1e3, Y: 0}, {X: p / 1e3, Y: 1}})
			if err != nil {
				return nil, err
			}
			l.Color, l.Dashes, l.Width = c, dashA2AV, vg.Points(0.8)
			cdf.Add(l)
		}
	}
	fig.panels = append(fig.panels, cdf, series)
	return fig, nil
}

// stepEvents are the events of one step, by rank then start.
func stepEvents(r *serve.Result, step int64) []serve.Event {
	var out []serve.Event
	for _, e := range r.Events {
		if e.Step == step {
			out = append(out, e)
		}
	}
	slices.SortStableFunc(out, func(a, b serve.Event) int {
		if a.Rank != b.Rank {
			return a.Rank - b.Rank
		}
		switch {
		case a.StartUS < b.StartUS:
			return -1
		case a.StartUS > b.StartUS:
			return 1
		}
		return 0
	})
	return out
}

// timelineTable prints a step's phases, rank by rank, in time order.
func timelineTable(w io.Writer, r *serve.Result, step int64) {
	s := &r.Steps[step-1]
	fmt.Fprintf(w, "\nstep %d (%s; tokens per rank %v): phases in time order, microseconds from the step's start on each rank\n\n", step, s.Kind, s.Rows)
	fmt.Fprintln(w, "| rank | layer | micro-batch | phase | start | end |")
	fmt.Fprintln(w, "| ---: | ---: | ---: | --- | ---: | ---: |")
	for _, e := range stepEvents(r, step) {
		t0 := s.StartUS[e.Rank]
		fmt.Fprintf(w, "| %d | %d | %d | %v | %.1f | %.1f |\n", e.Rank, e.Layer, e.MB, e.Phase, e.StartUS-t0, e.FinishUS-t0)
	}
}

// phaseColours colour the phases: compute warm, communication cool.
var phaseColours = map[serve.Phase]color.Color{
	serve.PhaseAttention:    color.RGBA{R: 230, G: 120, B: 40, A: 255},
	serve.PhaseDispatchSend: color.RGBA{R: 40, G: 90, B: 200, A: 255},
	serve.PhaseDispatchWait: color.RGBA{R: 130, G: 170, B: 240, A: 255},
	serve.PhaseExperts:      color.RGBA{R: 200, G: 50, B: 50, A: 255},
	serve.PhaseCombineSend:  color.RGBA{R: 30, G: 140, B: 90, A: 255},
	serve.PhaseCombineWait:  color.RGBA{R: 130, G: 210, B: 160, A: 255},
	serve.PhaseOutput:       color.RGBA{R: 120, G: 120, B: 120, A: 255},
}

// timelineFigure draws a step's phases: one lane per rank and
// micro-batch, one bar per phase.
func timelineFigure(r *servedRun, step int64) (*figure, error) {
	s := &r.res.Steps[step-1]
	fig := newFigure(fmt.Sprintf("moe-serve step %d (%s), %s: each micro-batch's phases", step, s.Kind, r.label))
	p := newPlot("", "microseconds from the step's start", "rank / micro-batch", false, false)
	mbs := 1
	if r.res.Config.Overlap {
		mbs = 2
	}
	var ticks []plot.Tick
	lane := func(rank, mb int) float64 { return float64((r.res.Ranks-1-rank)*(mbs+1) + (mbs - 1 - mb)) }
	for rank := 0; rank < r.res.Ranks; rank++ {
		for mb := 0; mb < mbs; mb++ {
			ticks = append(ticks, plot.Tick{Value: lane(rank, mb), Label: fmt.Sprintf("rank %d / %d", rank, mb)})
		}
	}
	p.Y.Tick.Marker = plot.ConstantTicks(ticks)
	seen := map[serve.Phase]*plotter.Polygon{}
	for _, e := range stepEvents(r.res, step) {
		t0, y := s.StartUS[e.Rank], lane(e.Rank, e.MB)
		x0, x1 := e.StartUS-t0, max(e.FinishUS-t0, e.StartUS-t0+0.05)
		poly, err := plotter.NewPolygon(plotter.XYs{{X: x0, Y: y - 0.4}, {X: x1, Y: y - 0.4}, {X: x1, Y: y + 0.4}, {X: x0, Y: y + 0.4}})
		if err != nil {
			return nil, err
		}
		poly.Color, poly.LineStyle.Width = phaseColours[e.Phase], 0
		p.Add(poly)
		if seen[e.Phase] == nil {
			seen[e.Phase] = poly
		}
	}
	for _, ph := range []serve.Phase{serve.PhaseAttention, serve.PhaseDispatchSend, serve.PhaseDispatchWait, serve.PhaseExperts,
		serve.PhaseCombineSend, serve.PhaseCombineWait, serve.PhaseOutput} {
		if poly := seen[ph]; poly != nil {
			fig.legend.Add(ph.String(), poly)
		}
	}
	fig.panels = append(fig.panels, p)
	return fig, nil
}
