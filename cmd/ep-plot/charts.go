package main

import (
	"cmp"
	"errors"
	"fmt"
	"image/color"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"

	"github.com/goep/goep/internal/study"
)

func charts(stdout, stderr io.Writer, args []string) error {
	fs := newFlags("charts", stderr, "[flags] STUDY.h5")
	dir := fs.String("o", ".", "directory for the PNG files")
	layout := fs.String("ll-layout", "", "LL chart: NODESxRANKS to show, e.g. 1x4 (default: the most ranks on one node within the host's CPUs)")
	htTokens := fs.Int("ht-tokens", 0, "HT chart: tokens per rank to show (default: the most)")
	width := fs.Float64("width", 9, "chart width, inches (at 96 dpi)")
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return usagef("want one study file, got %d arguments", fs.NArg())
	}
	s, err := study.Read(fs.Arg(0))
	if err != nil {
		return err
	}
	if err := os.MkdirAll(*dir, 0o755); err != nil {
		return err
	}
	w := vg.Length(*width) * vg.Inch
	made := 0
	for _, c := range []struct {
		name string
		make func() (*figure, error)
	}{
		{"ll-latency.png", func() (*figure, error) { return llLatency(s.Records, *layout, s.AttrInt("host_cpus", 0)) }},
		{"ht-bandwidth.png", func() (*figure, error) { return htBandwidth(s.Records, *htTokens) }},
	} {
		fig, err := c.make()
		if err != nil {
			var ue usageError
			if errors.As(err, &ue) {
				return err
			}
			fmt.Fprintf(stderr, "ep-plot charts: no %s: %v\n", c.name, err)
			continue
		}
		path := filepath.Join(*dir, c.name)
		if err := fig.save(path, w, w*0.4); err != nil {
			return err
		}
		fmt.Fprintln(stdout, "ep-plot charts:", path)
		made++
	}
	if made == 0 {
		return fmt.Errorf("%s: nothing to chart", fs.Arg(0))
	}
	return nil
}

// mostCommon returns the value of f that most records have (the smallest on a tie).
func mostCommon(recs []study.Record, f func(*study.Record) int) int {
	count := map[int]int{}
	for i := range recs {
		count[f(&recs[i])]++
	}
	best, n := 0, -1
	for v, c := range count {
		if c > n || (c == n && v < best) {
			best, n = v, c
		}
	}
	return best
}

// sameShape keeps the records whose hidden, topk and experts are the most
// common ones, and says which.
func sameShape(recs []study.Record) ([]study.Record, string) {
	h := mostCommon(recs, func(r *study.Record) int { return r.Hidden })
	k := mostCommon(recs, func(r *study.Record) int { return r.TopK })
	e := mostCommon(recs, func(r *study.Record) int { return r.Experts })
	var out []study.Record
	for _, r := range recs {
		if r.Hidden == h && r.TopK == k && r.Experts == e {
			out = append(out, r)
		}
	}
	return out, fmt.Sprintf("hidden %d, top-%d, %d experts", h, k, e)
}

func filter(recs []study.Record, keep func(*study.Record) bool) []study.Record {
	var out []study.Record
	for i := range recs {
		if keep(&recs[i]) {
			out = append(out, recs[i])
		}
	}
	return out
}

// series is one line: points sorted by x, a median of y where x repeats.
func series(recs []study.Record, x, y func(*study.Record) float64) plotter.XYs {
	byX := map[float64][]float64{}
	for i := range recs {
		if v := y(&recs[i]); v > 0 {
			byX[x(&recs[i])] = append(byX[x(&recs[i])], v)
		}
	}
	var xy plotter.XYs
	for xv, ys := range byX {
		slices.Sort(ys)
		xy = append(xy, plotter.XY{X: xv, Y: ys[len(ys)/2]})
	}
	slices.SortFunc(xy, func(a, b plotter.XY) int { return cmp.Compare(a.X, b.X) })
	return xy
}

// style of a line: ep solid, alltoallv dashed, memcpy dotted.
var (
	dashEP     []vg.Length
	dashA2AV   = []vg.Length{vg.Points(6), vg.Points(3)}
	dashMemcpy = []vg.Length{vg.Points(1.5), vg.Points(2.5)}
	palette    = []color.Color{
		color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 255}, color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 255},
		color.RGBA{R: 0x2c, G: 0xa0, B: 0x2c, A: 255}, color.RGBA{R: 0x94, G: 0x67, B: 0xbd, A: 255},
		color.RGBA{R: 0xff, G: 0x7f, B: 0x0e, A: 255}, color.RGBA{R: 0x8c, G: 0x56, B: 0x4b, A: 255},
	}
)

// addLine adds a line with its points to p, and to leg (if not nil) as label.
func addLine(p *plot.Plot, leg *plot.Legend, xy plotter.XYs, label string, c color.Color, dashes []vg.Length) error {
	if len(xy) == 0 {
		return nil
	}
	l, pts, err := plotter.NewLinePoints(xy)
	if err != nil {
		return err
	}
	l.Color, l.Dashes, l.Width = c, dashes, vg.Points(1.5)
	pts.Color, pts.Shape, pts.Radius = c, draw.CircleGlyph{}, vg.Points(2)
	p.Add(l, pts)
	if leg != nil {
		leg.Add(label, l)
	}
	return nil
}

func newPlot(title, xlabel, ylabel string, logX, logY bool) *plot.Plot {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text, p.Y.Label.Text = xlabel, ylabel
	if logX {
		p.X.Scale, p.X.Tick.Marker = plot.LogScale{}, powTwoTicks{}
	}
	if logY {
		p.Y.Scale, p.Y.Tick.Marker = plot.LogScale{}, plot.LogTicks{Prec: -1}
	}
	p.Add(plotter.NewGrid())
	return p
}

// powTwoTicks labels a log axis at powers of two.
type powTwoTicks struct{}

func (powTwoTicks) Ticks(min, max float64) []plot.Tick {
	var t []plot.Tick
	for v := 1.0; v <= max*1.0001; v *= 2 {
		if v >= min*0.9999 {
			t = append(t, plot.Tick{Value: v, Label: fmt.Sprint(v)})
		}
	}
	return t
}

func dtypes(recs []study.Record) []string {
	var out []string
	for _, d := range study.DTypeLabels {
		if slices.ContainsFunc(recs, func(r study.Record) bool { return r.DType == d }) {
			out = append(out, d)
		}
	}
	return out
}

// llLatency: LL dispatch and combine time against tokens per rank, on one
// layout: ep, alltoallv and the memcpy time of the same bytes, per dtype.
// The default layout is the most ranks on one node that fit the host's
// cores (cpus; 0: unknown), else the most ranks on one node.
func llLatency(all []study.Record, layout string, cpus int) (*figure, error) {
	recs := filter(all, func(r *study.Record) bool { return r.Mode == "ll" && r.Tokens > 0 })
	if len(recs) == 0 {
		return nil, fmt.Errorf("no LL rows")
	}
	recs, shape := sameShape(recs)
	var nodes, ranks int
	if layout != "" {
		if _, err := fmt.Sscanf(layout, "%dx%d", &nodes, &ranks); err != nil {
			return nil, usagef("-ll-layout %q is not NODESxRANKS", layout)
		}
	} else {
		nodes = 1
		fits := 0
		for _, r := range recs {
			if r.Nodes == 1 {
				ranks = max(ranks, r.Ranks)
				if cpus > 0 && r.Ranks <= cpus {
					fits = max(fits, r.Ranks)
				}
			}
		}
		if fits > 0 {
			ranks = fits
		}
		if ranks == 0 { // no single-node run: the first layout
			nodes, ranks = recs[0].Nodes, recs[0].Ranks
		}
	}
	recs = filter(recs, func(r *study.Record) bool { return r.Nodes == nodes && r.Ranks == ranks })
	if len(recs) == 0 {
		return nil, fmt.Errorf("no LL rows on %d node(s) x %d ranks", nodes, ranks)
	}
	fig := newFigure(fmt.Sprintf("LL (low latency): %d rank(s) on %d node(s), %s; median of iterations, slowest rank", ranks, nodes, shape))
	tok := func(r *study.Record) float64 { return float64(r.Tokens) }
	for pi, phase := range study.Phases {
		p := newPlot(phase, "tokens per rank", "time per call (us)", true, true)
		leg := &fig.legend
		if pi > 0 {
			leg = nil
		}
		for i, d := range dtypes(recs) {
			rs := filter(recs, func(r *study.Record) bool { return r.DType == d })
			c := palette[i%len(palette)]
			ep, a2a := func(r *study.Record) float64 { return r.DispatchUS }, func(r *study.Record) float64 { return r.AlltoallvDispatchUS }
			if phase == "combine" {
				ep, a2a = func(r *study.Record) float64 { return r.CombineUS }, func(r *study.Record) float64 { return r.AlltoallvCombineUS }
			}
			memcpy := func(r *study.Record) float64 {
				if r.MemcpyGBps <= 0 {
					return 0
				}
				return r.BytesPerRank / (r.MemcpyGBps * 1e3)
			}
			for _, l := range []struct {
				name   string
				y      func(*study.Record) float64
				dashes []vg.Length
			}{{"ep " + d, ep, dashEP}, {"alltoallv by hand " + d, a2a, dashA2AV}, {"memcpy of the bytes " + d, memcpy, dashMemcpy}} {
				if err := addLine(p, leg, series(rs, tok, l.y), l.name, c, l.dashes); err != nil {
					return nil, err
				}
			}
		}
		decades(&p.Y)
		fig.panels = append(fig.panels, p)
	}
	return fig, nil
}

// decades widens a log axis to whole powers of ten, so that it carries
// labelled ticks at both ends.
func decades(a *plot.Axis) {
	if a.Min > 0 && a.Max > a.Min {
		a.Min = math.Pow(10, math.Floor(math.Log10(a.Min)))
		a.Max = math.Pow(10, math.Ceil(math.Log10(a.Max)))
	}
}

// htBandwidth: HT algorithm bandwidth per rank against ranks, one line per
// dtype and node count, beside alltoallv, and memcpy's bandwidth per rank.
func htBandwidth(all []study.Record, tokens int) (*figure, error) {
	recs := filter(all, func(r *study.Record) bool { return r.Mode == "ht" && r.Tokens > 0 })
	if len(recs) == 0 {
		return nil, fmt.Errorf("no HT rows")
	}
	recs, shape := sameShape(recs)
	if tokens == 0 {
		for _, r := range recs {
			tokens = max(tokens, r.Tokens)
		}
	}
	recs = filter(recs, func(r *study.Record) bool { return r.Tokens == tokens })
	if len(recs) == 0 {
		return nil, fmt.Errorf("no HT rows with %d tokens per rank", tokens)
	}
	var nodeCounts []int
	for _, r := range recs {
		if !slices.Contains(nodeCounts, r.Nodes) {
			nodeCounts = append(nodeCounts, r.Nodes)
		}
	}
	slices.Sort(nodeCounts)
	fig := newFigure(fmt.Sprintf("HT (high throughput): %d tokens per rank, %s; algorithm bandwidth per rank", tokens, shape))
	rk := func(r *study.Record) float64 { return float64(r.Ranks) }
	for pi, phase := range study.Phases {
		p := newPlot(phase, "ranks", "bandwidth per rank (GB/s)", true, false)
		leg := &fig.legend
		if pi > 0 {
			leg = nil
		}
		ci := 0
		for _, d := range dtypes(recs) {
			for _, n := range nodeCounts {
				rs := filter(recs, func(r *study.Record) bool { return r.DType == d && r.Nodes == n })
				if len(rs) == 0 {
					continue
				}
				c := palette[ci%len(palette)]
				ci++
				ep, a2a := func(r *study.Record) float64 { return r.DispatchGBps }, func(r *study.Record) float64 { return r.AlltoallvDispatchGBps }
				if phase == "combine" {
					ep, a2a = func(r *study.Record) float64 { return r.CombineGBps }, func(r *study.Record) float64 { return r.AlltoallvCombineGBps }
				}
				where := fmt.Sprintf("%s, %d node", d, n)
				if n > 1 {
					where += "s"
				}
				if err := addLine(p, leg, series(rs, rk, ep), "ep "+where, c, dashEP); err != nil {
					return nil, err
				}
				if err := addLine(p, leg, series(rs, rk, a2a), "alltoallv by hand "+where, c, dashA2AV); err != nil {
					return nil, err
				}
				if n == nodeCounts[0] {
					mc := func(r *study.Record) float64 { return r.MemcpyGBps }
					if err := addLine(p, leg, series(rs, rk, mc), "memcpy "+d+" (bound)", c, dashMemcpy); err != nil {
						return nil, err
					}
				}
			}
		}
		p.Y.Min = 0
		fig.panels = append(fig.panels, p)
	}
	return fig, nil
}

// figure is panels side by side under one title, with one legend at the right.
type figure struct {
	title  string
	panels []*plot.Plot
	legend plot.Legend
}

func newFigure(title string) *figure {
	f := &figure{title: title, legend: plot.NewLegend()}
	f.legend.Top, f.legend.Left = true, true
	f.legend.TextStyle.Font.Size = vg.Points(9)
	f.legend.ThumbnailWidth = vg.Points(28)
	return f
}

// save draws the figure into a PNG of width w and height h at 96 dpi.
func (f *figure) save(path string, w, h vg.Length) error {
	img := vgimg.NewWith(vgimg.UseWH(w, h), vgimg.UseDPI(96))
	dc := draw.New(img)
	ts := draw.TextStyle{Color: color.Black, Font: plot.DefaultFont, Handler: plot.DefaultTextHandler}
	ts.Font.Size = vg.Points(12)
	ts.XAlign, ts.YAlign = draw.XCenter, draw.YTop
	ts.Font = plot.DefaultFont
	ts.Font.Size = vg.Points(12)
	titleH := vg.Length(0)
	if f.title != "" { // one line per line of the title
		for i, line := range strings.Split(f.title, "\n") {
			dc.FillText(ts, vg.Point{X: w / 2, Y: h - vg.Points(4) - vg.Length(i)*vg.Points(16)}, line)
			titleH = vg.Points(22) + vg.Length(i)*vg.Points(16)
		}
	}
	legendW := vg.Length(0)
	if f.legend.Rectangle(dc).Size().X > 0 {
		legendW = f.legend.Rectangle(dc).Size().X + vg.Points(16)
	}
	area := draw.Crop(dc, 0, -legendW, 0, -titleH)
	tiles := draw.Tiles{Rows: 1, Cols: len(f.panels), PadX: vg.Points(14), PadTop: vg.Points(2), PadBottom: vg.Points(4),
		PadLeft: vg.Points(4), PadRight: vg.Points(4)}
	canvases := plot.Align([][]*plot.Plot{f.panels}, tiles, area)
	for i, p := range f.panels {
		p.Draw(canvases[0][i])
	}
	if legendW > 0 {
		f.legend.Draw(draw.Crop(dc, w-legendW+vg.Points(8), 0, 0, -titleH-vg.Points(24)))
	}
	out, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(out); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
