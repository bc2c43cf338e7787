package main

import (
	"context"
	"fmt"
	"image/png"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/goep/goep/internal/mpitesting"
)

// stragglerTrace runs the real moe-train (built with -tags mpi) on 2 ranks
// for steps steps under mpirun, rank 1 a straggler (GOEP_MOE_STRAGGLER: it
// sleeps 5 ms between each step's forward and backward), and returns the
// trace's path.
func stragglerTrace(t *testing.T, dir string, steps int) string {
	t.Helper()
	mpitesting.RequireTool(t, "mpirun", "pkg-config", "h5dump")
	bin := filepath.Join(dir, "moe-train")
	if out, err := exec.Command("go", "build", "-tags", "mpi", "-o", bin, "../moe-train").CombinedOutput(); err != nil {
		t.Fatalf("go build -tags mpi ../moe-train: %v\n%s", err, out)
	}
	trace := filepath.Join(dir, "trace.h5")
	args := append(mpitesting.MPIRunArgs(2), "-x", "GOEP_MOE_STRAGGLER", bin, "-experts", "4", "-topk", "2", "-hidden", "16",
		"-ffn", "32", "-tokens", "32", "-timeout", "30s", "-steps", strconv.Itoa(steps), "-ckpt-dir", dir, "-trace", trace, "-progress-every", "0")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "mpirun", args...)
	cmd.Env = append(mpitesting.LauncherFreeEnv(), "GOEP_MOE_STRAGGLER=1:25ms") // far above what a loaded machine adds to each step
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	if out, err := cmd.CombinedOutput(); err != nil || ctx.Err() != nil {
		t.Fatalf("mpirun: %v %v\n%s", err, ctx.Err(), out)
	}
	return trace
}

// h5dumpWaits reads /trace/wait_us with h5dump (not the project's reader)
// and sums it over the steps: [i][j] for an n x n matrix.
func h5dumpWaits(t *testing.T, path string, n int) []float64 {
	t.Helper()
	out, err := exec.Command("h5dump", "-m", "%.17g", "-d", "/trace/wait_us", "-y", "-w", "0", path).CombinedOutput()
	if err != nil {
		t.Fatalf("h5dump: %v\n%s", err, out)
	}
	s := string(out)
	data := s[strings.Index(s, "DATA {")+len("DATA {"):]
	data = data[:strings.Index(data, "}")]
	sum := make([]float64, n*n)
	k := 0
	for _, f := range strings.Split(data, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		v, err := strconv.ParseFloat(f, 64)
		if err != nil {
			t.Fatalf("h5dump value %q: %v", f, err)
		}
		sum[k%(n*n)] += v
		k++
	}
	if k == 0 || k%(n*n) != 0 {
		t.Fatalf("h5dump gave %d values, not a whole number of %dx%d matrices", k, n, n)
	}
	return sum
}

// ep-plot waits on the trace of a real 2-rank moe-train run whose rank 1
// was a straggler: the matrix it prints is the trace's summed
// (read independently by h5dump), it names rank 1 and its host as the
// slowest, and waits.png is a PNG of the size asked for holding both ends
// of the palette (black: a rank never waits for itself; the most waited
// cell: white).
func TestWaitsFromRealRun(t *testing.T) {
	dir := t.TempDir()
	trace := stragglerTrace(t, dir, 120)
	code, out, errs := runCmd(t, "waits", "-o", dir, "-width", "6", trace)
	if code != 0 {
		t.Fatalf("waits: %d %q %q", code, out, errs)
	}
	t.Log("\n" + out)
	want := h5dumpWaits(t, trace, 2)
	for i := 0; i < 2; i++ {
		row := regexp.MustCompile(fmt.Sprintf(`(?m)^r%d +([0-9.]+) +([0-9.]+)$`, i)).FindStringSubmatch(out)
		if row == nil {
			t.Fatalf("no row r%d in:\n%s", i, out)
		}
		for j := 0; j < 2; j++ {
			got, _ := strconv.ParseFloat(row[1+j], 64)
			// h5dump prints every digit (-m %.17g; its default drops
			// some, which summed over the steps moves the last decimal
			// ep-plot prints); ep-plot rounds to 3 decimals a sum it
			// adds in its own order: half a unit of the last decimal.
			if d := got - want[i*2+j]/1e3; d > 0.0005+1e-9 || d < -0.0005-1e-9 {
				t.Errorf("[%d][%d]: ep-plot printed %.3f ms, h5dump's sum is %.4f ms", i, j, got, want[i*2+j]/1e3)
			}
		}
	}
	host, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "slowest rank 1 on host "+host+": ") {
		t.Errorf("rank 1 (the straggler) is not named the slowest:\n%s", out)
	}
	f, err := os.Open(filepath.Join(dir, "waits.png"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatal(err)
	}
	if b := img.Bounds(); b.Dx() != 6*96 {
		t.Errorf("waits.png is %v pixels, want %d wide", b, 6*96)
	}
	var black, white bool
	b := img.Bounds()
	for y := b.Min.Y; y < b.Max.Y; y++ {
		for x := b.Min.X; x < b.Max.X; x++ {
			r, g, bl, _ := img.At(x, y).RGBA()
			black = black || r+g+bl < 3*0x0800
			white = white || r+g+bl > 3*0xf000
		}
	}
	if !black || !white {
		t.Errorf("waits.png: black cells %v, white cells %v; want both", black, white)
	}

	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"waits"}, 2, "want one trace file, got 0"},
		{[]string{"waits", "-skip", "-1", trace}, 2, "-skip -1"},
		{[]string{"waits", "-skip", "200", trace}, 1, "no steps after the first 200"},
		{[]string{"waits", filepath.Join(dir, "missing.h5")}, 1, "missing.h5"},
		{[]string{"waits", "../../moe/runs/testdata/v2/trace.h5"}, 1, "trace schema version 2 has no wait matrix"},
	} {
		code, _, errs := runCmd(t, tc.args...)
		if code != tc.code || !strings.Contains(errs, tc.want) {
			t.Errorf("%q: exit %d, stderr %q; want %d and %q", tc.args, code, errs, tc.code, tc.want)
		}
	}
}
