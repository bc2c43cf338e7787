package main

import (
	"fmt"
	"io"
	"os"
	"slices"

	"gonum.org/v1/plot/vg"

	"github.com/goep/goep/internal/study"
)

// latency reads the JSON lines of an ep-bench -latency -json sweep and
// prints, per tokens per rank, ep's round (one dispatch+combine back to
// back, as a decode loop runs them), the baseline's and the two floors
// measured beside them (the flag round trip, and the data round trip of
// the same rows), as a Markdown table; it draws the same as a chart with
// the target (a multiple of the flag round trip) as a line.
func latency(stdout, stderr io.Writer, args []string) error {
	fs := newFlags("latency", stderr, "[flags] SWEEP.jsonl")
	out := fs.String("o", "ll-round.png", "the chart (PNG)")
	target := fs.Float64("target", 3, "the target, as a multiple of the flag round trip (0: none)")
	width := fs.Float64("width", 7, "chart width, inches (at 96 dpi)")
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return usagef("want one ep-bench -latency -json output, got %d arguments", fs.NArg())
	}
	if *target < 0 {
		return usagef("-target %g is negative", *target)
	}
	f, err := os.Open(fs.Arg(0))
	if err != nil {
		return err
	}
	recs, err := study.ParseJSONL(f)
	f.Close()
	if err != nil {
		return fmt.Errorf("%s: %w", fs.Arg(0), err)
	}
	recs = filter(recs, func(r *study.Record) bool { return r.Mode == "ll" && r.SteadyRoundUS > 0 })
	if len(recs) == 0 {
		return fmt.Errorf("%s: no LL rows with a steady round (steady_round_us): was it ep-bench -latency -json?", fs.Arg(0))
	}
	recs, shape := sameShape(recs)
	slices.SortFunc(recs, func(a, b study.Record) int { return a.Tokens - b.Tokens })
	latencyTable(stdout, recs)
	fig, err := latencyChart(recs, shape, *target)
	if err != nil {
		return err
	}
	if err := fig.save(*out, vg.Length(*width)*vg.Inch, vg.Length(*width)*vg.Inch*0.62); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "ep-plot latency: wrote %s\n", *out)
	return nil
}

// latencyTable prints the sweep as a Markdown table ("-" where a run did
// not measure a floor or the baseline).
func latencyTable(w io.Writer, recs []study.Record) {
	fmt.Fprintln(w, "| tokens per rank | ep round (us) | x flag round trip | x data round trip | alltoallv round (us) | ep speedup | flag round trip (us) | data round trip (us) |")
	fmt.Fprintln(w, "| --- | --- | --- | --- | --- | --- | --- | --- |")
	for _, r := range recs {
		// of is ep's round as a multiple of floor t, and t ("-" twice where t was not measured).
		of := func(t float64) (string, string) {
			if t <= 0 {
				return "-", "-"
			}
			return fmt.Sprintf("%.2fx", r.SteadyRoundUS/t), fmt.Sprintf("%.2f", t)
		}
		flagX, flag := of(r.FlagRoundTripUS)
		dataX, data := of(r.DataRoundTripUS)
		base, speedup := "-", "-"
		if r.AlltoallvSteadyRoundUS > 0 {
			base, speedup = fmt.Sprintf("%.2f", r.AlltoallvSteadyRoundUS), fmt.Sprintf("%.2fx", r.AlltoallvSteadyRoundUS/r.SteadyRoundUS)
		}
		fmt.Fprintf(w, "| %d | %.2f | %s | %s | %s | %s | %s | %s |\n", r.Tokens, r.SteadyRoundUS, flagX, dataX, base, speedup, flag, data)
	}
}

// latencyChart draws ep's and the baseline's round against tokens per
// rank, with the flag round trip and the target as lines.
func latencyChart(recs []study.Record, shape string, target float64) (*figure, error) {
	r0 := recs[0]
	fig := newFigure(fmt.Sprintf("LL decode round (dispatch+combine): %d rank(s) on %d node(s), %s", r0.Ranks, r0.Nodes, shape))
	p := newPlot("", "tokens per rank", "time per round (us)", true, true)
	tok := func(r *study.Record) float64 { return float64(r.Tokens) }
	type line struct {
		name   string
		y      func(*study.Record) float64
		dashes []vg.Length
	}
	lines := []line{
		{"ep", func(r *study.Record) float64 { return r.SteadyRoundUS }, dashEP},
		{"alltoallv by hand", func(r *study.Record) float64 { return r.AlltoallvSteadyRoundUS }, dashA2AV},
		{"flag round trip", func(r *study.Record) float64 { return r.FlagRoundTripUS }, dashMemcpy},
	}
	if r0.DataRoundTripUS > 0 {
		lines = append(lines, line{"data round trip of the same rows", func(r *study.Record) float64 { return r.DataRoundTripUS }, dashMemcpy})
	}
	if target > 0 {
		lines = append(lines, line{fmt.Sprintf("%g x flag round trip (target)", target),
			func(r *study.Record) float64 { return target * r.FlagRoundTripUS }, dashA2AV})
	}
	for i, l := range lines {
		if err := addLine(p, &fig.legend, series(recs, tok, l.y), l.name, palette[i%len(palette)], l.dashes); err != nil {
			return nil, err
		}
	}
	decades(&p.Y)
	fig.panels = append(fig.panels, p)
	return fig, nil
}
