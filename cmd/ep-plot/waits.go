package main

import (
	"fmt"
	"image/color"
	"io"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/palette/moreland"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"

	"github.com/goep/goep/moe/runs"
)

// waitMatrix is a trace's wait_us summed over its steps: [i][j] (row-major,
// n x n) the microseconds rank i waited for rank j in ep calls.
type waitMatrix struct {
	n     int
	us    []float64
	steps int
	hosts []string // per rank, from the latest segment ("" where unknown)
}

// sumWaits adds up the trace's wait matrices from row skip on; NaN (not
// measured, or past a segment's ranks) counts as nothing.
func sumWaits(d *runs.TraceData, skip int) (*waitMatrix, error) {
	if d.Version < 4 {
		return nil, fmt.Errorf("%s: trace schema version %d has no wait matrix (version 4 added wait_us)", d.Path, d.Version)
	}
	W := d.RankColumns
	m := &waitMatrix{n: W, us: make([]float64, W*W), hosts: make([]string, W)}
	for s := skip; s < len(d.Step); s++ {
		m.steps++
		for k, v := range d.WaitUS[s*W*W : (s+1)*W*W] {
			if !math.IsNaN(v) {
				m.us[k] += v
			}
		}
	}
	if m.steps == 0 {
		return nil, fmt.Errorf("%s: no steps after the first %d", d.Path, skip)
	}
	r := 0
	for _, part := range strings.Split(d.Segments[len(d.Segments)-1].Hosts, ",") {
		i := strings.LastIndexByte(part, ':')
		if i < 0 {
			break
		}
		k, err := strconv.Atoi(part[i+1:])
		if err != nil {
			break
		}
		for ; k > 0 && r < W; k-- {
			m.hosts[r] = part[:i]
			r++
		}
	}
	return m, nil
}

// waits prints a trace's wait matrix summed over its steps, names the
// straggler (runs.FindStraggler) and draws waits.png.
func waits(stdout, stderr io.Writer, args []string) error {
	fs := newFlags("waits", stderr, "[flags] TRACE.h5")
	dir := fs.String("o", ".", "directory for waits.png")
	skip := fs.Int("skip", 0, "steps at the start left out (warm-up)")
	title := fs.String("title", "", "a line under the chart's title (e.g. the machine and network)")
	width := fs.Float64("width", 7, "chart width, inches (at 96 dpi)")
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return usagef("want one trace file, got %d arguments", fs.NArg())
	}
	if *skip < 0 {
		return usagef("-skip %d: want >= 0", *skip)
	}
	d, err := runs.ReadTrace(fs.Arg(0))
	if err != nil {
		return err
	}
	m, err := sumWaits(d, *skip)
	if err != nil {
		return err
	}
	m.print(stdout)
	if err := os.MkdirAll(*dir, 0o755); err != nil {
		return err
	}
	p, err := m.chart(fmt.Sprintf("time waited in ep calls, %d steps of run %s", m.steps, d.RunID), *title)
	if err != nil {
		return err
	}
	path := filepath.Join(*dir, "waits.png")
	w := vg.Length(*width) * vg.Inch
	fig := newFigure("")
	fig.panels = append(fig.panels, p)
	if err := fig.save(path, w, w*0.85); err != nil {
		return err
	}
	fmt.Fprintln(stdout, "ep-plot waits:", path)
	return nil
}

// print writes the matrix in milliseconds, each rank's total waited for,
// and the straggler line.
func (m *waitMatrix) print(w io.Writer) {
	fmt.Fprintf(w, "ms waited in ep calls over %d steps: row = the waiting rank, column = the rank waited for\n", m.steps)
	fmt.Fprintf(w, "%-10s", "")
	for j := 0; j < m.n; j++ {
		fmt.Fprintf(w, " %9s", "r"+strconv.Itoa(j))
	}
	fmt.Fprintln(w)
	col := make([]float64, m.n)
	for i := 0; i < m.n; i++ {
		fmt.Fprintf(w, "%-10s", "r"+strconv.Itoa(i))
		for j := 0; j < m.n; j++ {
			fmt.Fprintf(w, " %9.3f", m.us[i*m.n+j]/1e3)
			if i != j {
				col[j] += m.us[i*m.n+j]
			}
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintf(w, "%-10s", "waited for")
	for _, v := range col {
		fmt.Fprintf(w, " %9.3f", v/1e3)
	}
	fmt.Fprintln(w)
	s, ok := runs.FindStraggler(m.us, m.n)
	host := ""
	if m.hosts[s.Rank] != "" {
		host = " on host " + m.hosts[s.Rank]
	}
	if ok {
		fmt.Fprintf(w, "slowest rank %d%s: the others waited %.3f ms for it, %.0f%% of all waiting between ranks (%.1fx the mean for another rank)\n",
			s.Rank, host, s.WaitedUS/1e3, 100*s.Share, s.WaitedUS/max(s.OthersMeanUS, 1e-9))
	} else {
		fmt.Fprintf(w, "no rank stands out: the most waited for was rank %d%s, %.3f ms, %.0f%% of all waiting between ranks\n",
			s.Rank, host, s.WaitedUS/1e3, 100*s.Share)
	}
}

// waitGrid is the matrix as a heat map's grid: column c the rank waited
// for, row r the waiting rank, in milliseconds.
type waitGrid struct{ *waitMatrix }

func (g waitGrid) Dims() (c, r int)   { return g.n, g.n }
func (g waitGrid) Z(c, r int) float64 { return g.us[r*g.n+c] / 1e3 }
func (g waitGrid) X(c int) float64    { return float64(c) }
func (g waitGrid) Y(r int) float64    { return float64(r) }

// chart draws the matrix as a heat map (black: no waiting, white: the
// most), each cell labelled with its milliseconds when there are at most
// 16 ranks.
func (m *waitMatrix) chart(title, extra string) (*plot.Plot, error) {
	if extra != "" {
		title += "\n" + extra
	}
	p := newPlot(title, "rank waited for", "waiting rank", false, false)
	hi := 0.0
	for _, v := range m.us {
		hi = max(hi, v/1e3)
	}
	cm := moreland.ExtendedBlackBody()
	cm.SetMin(0)
	cm.SetMax(max(hi, 1e-9))
	h := plotter.NewHeatMap(waitGrid{m}, cm.Palette(256))
	h.Min, h.Max = 0, max(hi, 1e-9)
	p.Add(h)
	if m.n <= 16 {
		var xy plotter.XYLabels
		for r := 0; r < m.n; r++ {
			for c := 0; c < m.n; c++ {
				v := m.us[r*m.n+c] / 1e3
				xy.XYs = append(xy.XYs, plotter.XY{X: float64(c), Y: float64(r)})
				xy.Labels = append(xy.Labels, fmt.Sprintf("%.1f ms", v))
			}
		}
		labels, err := plotter.NewLabels(xy)
		if err != nil {
			return nil, err
		}
		for i := range labels.TextStyle { // dark text on the light cells, light on the dark
			labels.TextStyle[i].XAlign, labels.TextStyle[i].YAlign = -0.5, -0.5
			labels.TextStyle[i].Color = color.White
			if labels.XYs[i].X >= 0 && m.us[int(labels.XYs[i].Y)*m.n+int(labels.XYs[i].X)]/1e3 > hi/2 {
				labels.TextStyle[i].Color = color.Black
			}
		}
		p.Add(labels)
	}
	var ticks []plot.Tick
	step := max(1, m.n/16)
	for r := 0; r < m.n; r += step {
		ticks = append(ticks, plot.Tick{Value: float64(r), Label: strconv.Itoa(r)})
	}
	p.X.Tick.Marker, p.Y.Tick.Marker = plot.ConstantTicks(ticks), plot.ConstantTicks(ticks)
	p.X.Min, p.X.Max, p.Y.Min, p.Y.Max = -0.5, float64(m.n)-0.5, -0.5, float64(m.n)-0.5
	return p, nil
}
