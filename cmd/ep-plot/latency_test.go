package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestLatency reads a sweep that ep-bench -latency -json printed (2 ranks,
// hidden 128, top-2, 8 experts) and checks every table row against the
// numbers read from the same lines with encoding/json, and the chart.
func TestLatency(t *testing.T) {
	const sweep = "testdata/latency.jsonl"
	png := filepath.Join(t.TempDir(), "round.png")
	code, out, errs := runCmd(t, "latency", "-o", png, sweep)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	f, err := os.Open(sweep)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rows := 0
	for sc := bufio.NewScanner(f); sc.Scan(); rows++ {
		var r struct {
			Tokens                 int     `json:"tokens"`
			SteadyRoundUS          float64 `json:"steady_round_us"`
			AlltoallvSteadyRoundUS float64 `json:"alltoallv_steady_round_us"`
			FlagRoundTripUS        float64 `json:"flag_round_trip_us"`
			DataRoundTripUS        float64 `json:"data_round_trip_us"`
		}
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatal(err)
		}
		want := fmt.Sprintf("| %d | %.2f | %.2fx | %.2fx | %.2f | %.2fx | %.2f | %.2f |", r.Tokens, r.SteadyRoundUS,
			r.SteadyRoundUS/r.FlagRoundTripUS, r.SteadyRoundUS/r.DataRoundTripUS, r.AlltoallvSteadyRoundUS,
			r.AlltoallvSteadyRoundUS/r.SteadyRoundUS, r.FlagRoundTripUS, r.DataRoundTripUS)
		if !strings.Contains(out, want+"\n") {
			t.Errorf("no row %q in\n%s", want, out)
		}
	}
	if rows < 2 || strings.Count(out, "\n| ") != rows+1 { // the rows and the separator
		t.Errorf("%d sweep lines, table:\n%s", rows, out)
	}
	checkPNG(t, png)
}

func TestLatencyRefuses(t *testing.T) {
	dir := t.TempDir()
	study := writeSteps(t, dir)[0] // ep-bench -json without -latency: no steady round
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"latency"}, 2, "want one ep-bench -latency -json output"},
		{[]string{"latency", "-target", "-1", "testdata/latency.jsonl"}, 2, "-target -1 is negative"},
		{[]string{"latency", "-o", filepath.Join(dir, "x.png"), study}, 1, "no LL rows with a steady round"},
		{[]string{"latency", filepath.Join(dir, "missing.jsonl")}, 1, "no such file"},
	} {
		code, _, errs := runCmd(t, tc.args...)
		if code != tc.code || !strings.Contains(errs, tc.want) {
			t.Errorf("%q: exit %d, stderr %q; want %d and %q", tc.args, code, errs, tc.code, tc.want)
		}
	}
}
