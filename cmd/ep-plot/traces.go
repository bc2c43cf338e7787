package main

import (
	"bytes"
	"cmp"
	"fmt"
	"image/color"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"

	"github.com/goep/goep/moe/runs"
)

// trainRun is one moe-train trace, read and reduced to what the charts and the
// table compare.
type trainRun struct {
	label string
	d     *runs.TraceData
	// Per step: the wall time since the run's start (segments laid end to
	// end), and the means over ranks of what each rank sent and spent.
	wall, syncBytes, epBytes, syncUS []float64
	// quiet says, per step, whether the machine had no other work while the
	// step ran (nil: not known; see quietSteps).
	quiet []bool
}

func readRun(path, label string) (*trainRun, error) {
	d, err := runs.ReadTrace(path)
	if err != nil {
		return nil, err
	}
	if len(d.Step) == 0 {
		return nil, fmt.Errorf("%s: no steps", path)
	}
	if label == "" {
		label = d.Config.GradSync.String()
	}
	r := &trainRun{label: label, d: d}
	W, offset, last := d.RankColumns, 0.0, 0.0
	for i := range d.Step {
		if i > 0 && d.WallTime[i] < d.WallTime[i-1] { // a new segment's clock
			offset = last
		}
		last = offset + d.WallTime[i]
		r.wall = append(r.wall, last)
		ranks := float64(d.Segments[d.SegmentOf(i)].WorldSize)
		var sb, eb, us float64
		for c := 0; c < int(ranks); c++ {
			sb += float64(d.SyncBytes[i*W+c]) / ranks
			eb += float64(d.BytesSent[i*W+c]) / ranks
			us += d.SyncUS[i*W+c] / ranks
		}
		r.syncBytes, r.epBytes, r.syncUS = append(r.syncBytes, sb), append(r.epBytes, eb), append(r.syncUS, us)
	}
	return r, nil
}

// traces compares moe-train traces: the grad sync study's charts and table.
func traces(stdout, stderr io.Writer, args []string) error {
	fs := newFlags("traces", stderr, "[flags] TRACE.h5 ... (the first is the reference of the ratios)")
	dir := fs.String("o", ".", "directory for the PNG files")
	labels := fs.String("labels", "", "comma-separated names of the traces (default: each trace's grad sync)")
	smooth := fs.Int("smooth", 0, "loss curves: mean over this many steps (0: a 40th of the steps)")
	skip := fs.Int("skip", 5, "steps at the start of each run left out of the time medians (warm-up)")
	md := fs.String("md", "", "also write the table to this Markdown file")
	title := fs.String("title", "", "a line under the charts' titles (e.g. the machine and network)")
	width := fs.Float64("width", 10, "chart width, inches (at 96 dpi)")
	busy := fs.String("busy", "", "comma-separated files of samples of others' work on the machine (lines \"UNIX_TIME ... COUNT\", as gradsync.sbatch writes them), one per trace or one for all: the table adds the times of the quiet steps")
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() == 0 {
		return usagef("want at least one trace file")
	}
	names := strList(*labels)
	if len(names) > 0 && len(names) != fs.NArg() {
		return usagef("-labels has %d names for %d traces", len(names), fs.NArg())
	}
	busyFiles := strList(*busy)
	if len(busyFiles) > 1 && len(busyFiles) != fs.NArg() {
		return usagef("-busy has %d files for %d traces (give one per trace, or one for all)", len(busyFiles), fs.NArg())
	}
	if *smooth < 0 || *skip < 0 {
		return usagef("-smooth %d, -skip %d: want >= 0", *smooth, *skip)
	}
	var runs []*trainRun
	for i, p := range fs.Args() {
		label := ""
		if len(names) > 0 {
			label = names[i]
		}
		r, err := readRun(p, label)
		if err != nil {
			return err
		}
		if len(busyFiles) > 0 {
			samples, err := readBusy(busyFiles[min(i, len(busyFiles)-1)])
			if err != nil {
				return err
			}
			r.quiet = quietSteps(r, samples)
		}
		runs = append(runs, r)
	}
	var table bytes.Buffer
	tracesTable(&table, runs, *skip)
	fmt.Fprint(stdout, table.String())
	if *md != "" {
		if err := os.WriteFile(*md, table.Bytes(), 0o644); err != nil {
			return err
		}
	}
	if err := os.MkdirAll(*dir, 0o755); err != nil {
		return err
	}
	w := vg.Length(*width) * vg.Inch
	for _, c := range []struct {
		name string
		fig  func() (*figure, error)
	}{
		{"loss.png", func() (*figure, error) { return lossFigure(runs, *smooth, *title) }},
		{"cost.png", func() (*figure, error) { return costFigure(runs, *smooth, *title) }},
	} {
		fig, err := c.fig()
		if err != nil {
			return err
		}
		path := filepath.Join(*dir, c.name)
		if err := fig.save(path, w, w*0.42); err != nil {
			return err
		}
		fmt.Fprintln(stdout, "ep-plot traces:", path)
	}
	return nil
}

// median of v[skip:] (of all of v if that leaves nothing), NaN ignored.
func median(v []float64, skip int) float64 {
	if skip >= len(v) {
		skip = 0
	}
	s := slices.DeleteFunc(slices.Clone(v[skip:]), math.IsNaN)
	if len(s) == 0 {
		return math.NaN()
	}
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// tailLoss is the mean loss over the last tenth of the steps (at least one).
func tailLoss(loss []float64) float64 {
	n := max(1, len(loss)/10)
	t := 0.0
	for _, l := range loss[len(loss)-n:] {
		t += l / float64(n)
	}
	return t
}

// lossAt is the mean loss of the steps that ended within the tenth of
// seconds before t (at least the step that ended last before t).
func lossAt(r *trainRun, t float64) float64 {
	end := 0
	for end < len(r.wall) && r.wall[end] <= t {
		end++
	}
	if end == 0 {
		return math.NaN()
	}
	start := end - 1
	for start > 0 && r.wall[start-1] > 0.9*t {
		start--
	}
	s := 0.0
	for _, l := range r.d.Loss[start:end] {
		s += l
	}
	return s / float64(end-start)
}

// tracesTable writes the comparison: per run its configuration, loss,
// times and bytes, and the ratios against the first run.
func tracesTable(w io.Writer, runs []*trainRun, skip int) {
	minWall := math.Inf(1)
	for _, r := range runs {
		minWall = min(minWall, r.wall[len(r.wall)-1])
	}
	ref := runs[0]
	refStep := median(ref.d.StepUS, skip)
	refSync := median(ref.syncUS, skip)
	fmt.Fprintf(w, "| run | ranks | steps | loss: first | last 10%% | at %s | step time (median) | vs %s | sync time (median) | vs %s | sync bytes per rank per step | vs %s | ep bytes per rank per step | wall time |\n",
		seconds(minWall), ref.label, ref.label, ref.label)
	fmt.Fprintln(w, "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
	for _, r := range runs {
		d := r.d
		st, sy := median(d.StepUS, skip), median(r.syncUS, skip)
		sb := median(r.syncBytes, 0)
		fmt.Fprintf(w, "| %s | %d | %d | %.4g | %.4g | %.4g | %.1f ms | %s | %.1f ms | %s | %s | %s | %s | %s |\n",
			r.label, d.WorldSize, len(d.Step), d.Loss[0], tailLoss(d.Loss), lossAt(r, minWall),
			st/1e3, ratio(refStep, st), sy/1e3, ratio(refSync, sy), bytesText(sb), ratio(median(ref.syncBytes, 0), sb),
			bytesText(median(r.epBytes, 0)), seconds(r.wall[len(r.wall)-1]))
	}
	fmt.Fprintf(w, "\nTimes are medians over steps %d.. of the mean over ranks (sync) or rank 0's (step); a sync's time includes its wait for the slowest rank. \"vs\" is %s's figure divided by the run's: above 1, the run is faster (or sends less).\n", skip+1, ref.label)
	if ref.quiet == nil {
		return
	}
	fmt.Fprintf(w, "\n| run | quiet steps | step time, quiet (median) | vs %s | sync time, quiet (median) | vs %s |\n", ref.label, ref.label)
	fmt.Fprintln(w, "| --- | ---: | ---: | ---: | ---: | ---: |")
	refStep, refSync = median(quietOnly(ref.d.StepUS, ref.quiet), skip), median(quietOnly(ref.syncUS, ref.quiet), skip)
	for _, r := range runs {
		st, sy := median(quietOnly(r.d.StepUS, r.quiet), skip), median(quietOnly(r.syncUS, r.quiet), skip)
		n := 0
		for i, q := range r.quiet {
			if q && i >= skip {
				n++
			}
		}
		fmt.Fprintf(w, "| %s | %d of %d | %s | %s | %s | %s |\n", r.label, n, max(0, len(r.quiet)-skip),
			millis(st), ratio(refStep, st), millis(sy), ratio(refSync, sy))
	}
	fmt.Fprintln(w, "\nA quiet step is one during which, and at the samples on either side of it, no other work ran on the machine (-busy).")
}

// quietOnly is v with NaN in place of the steps that were not quiet, so that
// median leaves them out (and keeps the step numbering for its skip).
func quietOnly(v []float64, quiet []bool) []float64 {
	out := slices.Clone(v)
	for i := range out {
		if i >= len(quiet) || !quiet[i] {
			out[i] = math.NaN()
		}
	}
	return out
}

// busySample is one look at the machine: at unix time t, n running
// processes that were not the run's.
type busySample struct {
	t float64
	n int
}

// readBusy reads samples of others' work: a line per sample, its first field
// the unix time in seconds, its last the number of others' running processes
// (gradsync.sbatch's contention files). Blank lines and lines starting with #
// are skipped; the samples are returned in time order. A file without
// samples is no error: no step is then known to be quiet.
func readBusy(path string) ([]busySample, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var out []busySample
	for i, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || strings.HasPrefix(f[0], "#") {
			continue
		}
		t, err1 := strconv.ParseFloat(f[0], 64)
		n, err2 := strconv.Atoi(f[len(f)-1])
		if len(f) < 2 || err1 != nil || err2 != nil || n < 0 || !(t > 0) {
			return nil, fmt.Errorf("%s:%d: %q: want \"UNIX_TIME ... COUNT\" (seconds since 1970, then a count of processes)", path, i+1, line)
		}
		out = append(out, busySample{t, n})
	}
	slices.SortFunc(out, func(a, b busySample) int { return cmp.Compare(a.t, b.t) })
	return out, nil
}

// quietSteps says, per step of r, whether it ran on an otherwise quiet
// machine: the step ends at its segment's start plus its wall time and
// begins its step time earlier; it is quiet when the last sample at or before
// its beginning, the first at or after its end and every sample between saw
// no other work. A step that no sample precedes or follows is not quiet
// (nothing is known of it).
func quietSteps(r *trainRun, samples []busySample) []bool {
	d := r.d
	quiet := make([]bool, len(d.Step))
	for i := range d.Step {
		seg := d.Segments[d.SegmentOf(i)]
		end := float64(seg.Start.UnixNano())/1e9 + d.WallTime[i]
		begin := end - d.StepUS[i]/1e6
		if math.IsNaN(begin) || math.IsNaN(end) {
			continue
		}
		// j: the last sample at or before begin; k: the first at or after end.
		j := sort.Search(len(samples), func(x int) bool { return samples[x].t > begin }) - 1
		k := sort.Search(len(samples), func(x int) bool { return samples[x].t >= end })
		if j < 0 || k >= len(samples) {
			continue
		}
		quiet[i] = !slices.ContainsFunc(samples[j:k+1], func(s busySample) bool { return s.n > 0 })
	}
	return quiet
}

// millis formats microseconds as milliseconds, "-" for none (NaN).
func millis(us float64) string {
	if math.IsNaN(us) {
		return "-"
	}
	return fmt.Sprintf("%.1f ms", us/1e3)
}

// seconds formats a wall time to three significant digits.
func seconds(s float64) string { return fmt.Sprintf("%.3g s", s) }

func ratio(ref, v float64) string {
	if v <= 0 || math.IsNaN(v) || math.IsNaN(ref) {
		return "-"
	}
	return fmt.Sprintf("%.3gx", ref/v)
}

// bytesText formats a byte count with a binary unit.
func bytesText(b float64) string {
	switch {
	case math.IsNaN(b) || b < 0:
		return "?"
	case b >= 1<<20:
		return fmt.Sprintf("%.1f MiB", b/(1<<20))
	case b >= 1<<10:
		return fmt.Sprintf("%.1f KiB", b/(1<<10))
	}
	return fmt.Sprintf("%.0f B", b)
}

// smoothed is the trailing mean of y over window points, against x.
func smoothed(x, y []float64, window int) plotter.XYs {
	var xy plotter.XYs
	sum, n := 0.0, 0
	for i := range y {
		if !math.IsNaN(y[i]) {
			sum += y[i]
			n++
		}
		if j := i - window; j >= 0 && !math.IsNaN(y[j]) {
			sum -= y[j]
			n--
		}
		if n > 0 && i >= window-1 {
			xy = append(xy, plotter.XY{X: x[i], Y: sum / float64(n)})
		}
	}
	return xy
}

func window(runs []*trainRun, smooth int) int {
	if smooth > 0 {
		return smooth
	}
	n := 0
	for _, r := range runs {
		n = max(n, len(r.d.Step))
	}
	return max(1, n/40)
}

func steps(d *runs.TraceData) []float64 {
	x := make([]float64, len(d.Step))
	for i, s := range d.Step {
		x[i] = float64(s)
	}
	return x
}

// describe is the runs' shared configuration, for titles.
func describe(runs []*trainRun) string {
	c := runs[0].d.Config
	ranks := map[int]bool{}
	for _, r := range runs {
		ranks[r.d.WorldSize] = true
	}
	var rs []string
	for n := range ranks {
		rs = append(rs, fmt.Sprint(n))
	}
	slices.Sort(rs)
	return fmt.Sprintf("%s rank(s), hidden %d, shared FFN %d, %d experts of FFN %d, %d tokens per rank",
		strings.Join(rs, "/"), c.Hidden, c.SharedFFN, c.Experts, c.FFN, c.Tokens)
}

// titled is a chart's title: what it shows, then the runs' configuration
// and extra on a second line.
func titled(base string, runs []*trainRun, extra string) string {
	t := base + "\n" + describe(runs)
	if extra != "" {
		t += "; " + extra
	}
	return t
}

// runColours gives each run its curves' colour and its legend entry: repeats
// of one configuration, labelled "NAME #K" (as gradsync.sbatch names them),
// share NAME's colour and one legend entry, NAME; other runs get a colour and
// an entry each.
func runColours(runs []*trainRun) (colours []color.Color, legend []string) {
	group := map[string]int{}
	for _, r := range runs {
		name := repeatOf(r.label)
		g, ok := group[name]
		if !ok {
			g = len(group)
			group[name] = g
		}
		entry := ""
		if !ok {
			entry = name
		}
		colours, legend = append(colours, palette[g%len(palette)]), append(legend, entry)
	}
	return colours, legend
}

// repeatOf is label without a trailing " #K" (K digits): the configuration a
// repeated run belongs to.
func repeatOf(label string) string {
	i := strings.LastIndex(label, " #")
	if i < 0 || i+2 == len(label) || strings.Trim(label[i+2:], "0123456789") != "" {
		return label
	}
	return label[:i]
}

// lossFigure: the loss against step and against wall time, one line per run.
func lossFigure(runs []*trainRun, smooth int, extra string) (*figure, error) {
	win := window(runs, smooth)
	fig := newFigure(titled(fmt.Sprintf("Loss (mean over %d steps)", win), runs, extra))
	byStep := newPlot("against step", "step", "loss", false, true)
	byTime := newPlot("against wall time", "seconds", "loss", false, true)
	byStep.Y.Tick.Marker, byTime.Y.Tick.Marker = logTicks125{}, logTicks125{}
	colours, entries := runColours(runs)
	for i, r := range runs {
		c := colours[i]
		if err := addCurve(byStep, legendFor(&fig.legend, entries[i]), smoothed(steps(r.d), r.d.Loss, win), entries[i], c, dashEP); err != nil {
			return nil, err
		}
		if err := addCurve(byTime, nil, smoothed(r.wall, r.d.Loss, win), r.label, c, dashEP); err != nil {
			return nil, err
		}
	}
	fig.panels = append(fig.panels, byStep, byTime)
	return fig, nil
}

// costFigure: bytes sent per rank per step (the grad sync's, and ep's
// dispatch and combine for scale) and time per step (the step's and its
// sync's), one colour per run.
func costFigure(runs []*trainRun, smooth int, extra string) (*figure, error) {
	win := window(runs, smooth)
	fig := newFigure(titled("Cost per step", runs, extra))
	bytesP := newPlot("bytes sent per rank per step", "step", "bytes", false, true)
	bytesP.Y.Tick.Marker = byteTicks{}
	timeP := newPlot(fmt.Sprintf("time per step (mean over %d steps)", win), "step", "milliseconds", false, true)
	timeP.Y.Tick.Marker = logTicks125{}
	ms := func(us []float64) []float64 {
		out := make([]float64, len(us))
		for j, v := range us {
			out[j] = v / 1e3
		}
		return out
	}
	colours, entries := runColours(runs)
	for i, r := range runs {
		c := colours[i]
		x := steps(r.d)
		sb := slices.Clone(r.syncBytes)
		for j := range sb {
			sb[j] = max(sb[j], 1) // one byte on a log scale: nothing sent (one rank)
		}
		for _, l := range []struct {
			p      *plot.Plot
			leg    *plot.Legend
			xy     plotter.XYs
			dashes []vg.Length
		}{
			{bytesP, legendFor(&fig.legend, entries[i]), smoothed(x, sb, 1), dashEP},
			{bytesP, nil, smoothed(x, r.epBytes, 1), dashA2AV},
			{timeP, nil, smoothed(x, ms(r.d.StepUS), win), dashEP},
			{timeP, nil, smoothed(x, ms(r.syncUS), win), dashA2AV},
		} {
			if err := addCurve(l.p, l.leg, l.xy, entries[i], c, l.dashes); err != nil {
				return nil, err
			}
		}
	}
	gray := color.Gray{Y: 90}
	for _, k := range []struct {
		label  string
		dashes []vg.Length
	}{{"solid: grad sync bytes (left), step time (right)", dashEP}, {"dashed: ep's bytes (left), sync time (right)", dashA2AV}} {
		l, err := plotter.NewLine(plotter.XYs{{X: 0, Y: 1}})
		if err != nil {
			return nil, err
		}
		l.Color, l.Dashes, l.Width = gray, k.dashes, vg.Points(1.5)
		fig.legend.Add(k.label, l)
	}
	fig.panels = append(fig.panels, bytesP, timeP)
	return fig, nil
}

// legendFor is leg where entry is to be shown, nil where it is not (a repeat
// whose configuration is already in the legend).
func legendFor(leg *plot.Legend, entry string) *plot.Legend {
	if entry == "" {
		return nil
	}
	return leg
}

// addCurve adds a line without point marks (hundreds of steps) to p, and to
// leg (if not nil) as label.
func addCurve(p *plot.Plot, leg *plot.Legend, xy plotter.XYs, label string, c color.Color, dashes []vg.Length) error {
	if len(xy) == 0 {
		return nil
	}
	l, err := plotter.NewLine(xy)
	if err != nil {
		return err
	}
	l.Color, l.Dashes, l.Width = c, dashes, vg.Points(1.5)
	p.Add(l)
	if leg != nil {
		leg.Add(label, l)
	}
	return nil
}

// logTicks125 labels a log axis at 1, 2 and 5 times the powers of ten; where
// that gives fewer than three labels (a range narrower than a decade, such as
// a loss falling from 3.5 to 1.2), at finer steps of each decade, so that the
// axis can be read.
type logTicks125 struct{}

// logTickMantissas are the label positions within a decade, coarsest first.
var logTickMantissas = [][]float64{
	{1, 2, 5},
	{1, 1.5, 2, 3, 5, 7},
	{1, 1.2, 1.4, 1.6, 1.8, 2, 2.5, 3, 3.5, 4, 5, 6, 7, 8, 9},
}

func (logTicks125) Ticks(lo, hi float64) []plot.Tick {
	var t []plot.Tick
	if !(lo > 0) || !(hi > lo) {
		return t
	}
	for _, ms := range logTickMantissas {
		t = t[:0]
		for e := math.Floor(math.Log10(lo)); e <= math.Ceil(math.Log10(hi)); e++ {
			for _, m := range ms {
				v := m * math.Pow(10, e)
				if v >= lo*0.999 && v <= hi*1.001 {
					t = append(t, plot.Tick{Value: v, Label: fmt.Sprintf("%g", v)})
				}
			}
		}
		if len(t) >= 3 {
			break
		}
	}
	return t
}

// byteTicks labels a log axis of bytes at the powers of ten, in SI units.
type byteTicks struct{}

func (byteTicks) Ticks(lo, hi float64) []plot.Tick {
	var t []plot.Tick
	if !(lo > 0) || !(hi > lo) {
		return t
	}
	units := []string{"B", "kB", "MB", "GB", "TB"}
	for e := math.Floor(math.Log10(lo)); e <= math.Ceil(math.Log10(hi)); e++ {
		v := math.Pow(10, e)
		if v < lo*0.999 || v > hi*1.001 || e < 0 {
			continue
		}
		u := min(int(e)/3, len(units)-1)
		t = append(t, plot.Tick{Value: v, Label: fmt.Sprintf("%g %s", v/math.Pow(10, float64(3*u)), units[u])})
	}
	return t
}
