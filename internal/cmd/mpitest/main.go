// Command mpitest builds Go test binaries with the mpi build tag and runs them
// under mpirun at several rank counts and simulated node splits. A failure on
// any rank fails the run, and the harness prints which rank failed and why.
//
// Usage:
//
//	go run ./internal/cmd/mpitest [flags] ./pkg1 ./pkg2 ...
//
// For example, every rank count and a simulated 2-node split of 4 ranks:
//
//	go run ./internal/cmd/mpitest -np 1,2,4,8 -sim 4/2 ./mpi ./ep
//
// Across hosts (the emulated cluster of scripts/cluster, or a real one): -hosts
// lists layouts, each the ranks on every host (2x2 = 2 hosts of 2 ranks;
// 2+2+1 = 3 hosts of 2, 2 and 1 ranks), placed on the first hosts of
// -hostfile with mpirun --host; -mpirun names the launcher, and -workdir a
// directory every host sees (the test binaries and logs go there):
//
//	go run ./internal/cmd/mpitest -np "" -sim "" -hosts 2x2,4x1,2+2+1 \
//		-hostfile /run/goep-cluster/hostfile -mpirun scripts/cluster/mpirun -workdir out/mpitest ./mpi
//
// The ranks learn the layout from GOEP_TEST_HOSTS (ranks per host, e.g. 2,2,1),
// so that tests can check the topology they see against it. -run and -skip
// choose tests as go test's flags of those names do; -skip-one-node skips
// tests only where every rank is on one node (no -sim, no -hosts), for tests
// whose path differs from another's only across nodes.
//
// Every package's test binary is built by one go command before the first
// run, so that the compiler and linker keep every core busy.
//
// -race builds the test binaries with the race detector (which also checks
// unsafe pointer arithmetic, checkptr). The build inherits the environment,
// so GOFLAGS and GOEXPERIMENT reach it: cgo's strict pointer checks are
//
//	GOEXPERIMENT=cgocheck2 go run ./internal/cmd/mpitest -np 2 -sim "" ./ep
package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

func main() { os.Exit(run(os.Stdout, os.Stderr, os.Args[1:])) }

// config is one mpirun invocation: ranks, and ranks per simulated node (0:
// the real topology); or, across hosts, the ranks on each host.
type config struct {
	np, perNode int
	hosts       []int
}

func (c config) String() string {
	if len(c.hosts) > 0 {
		return "hosts=" + joinInts(c.hosts, "+")
	}
	if c.perNode == 0 {
		return fmt.Sprintf("np=%d", c.np)
	}
	return fmt.Sprintf("np=%d nodes=%dx%d", c.np, (c.np+c.perNode-1)/c.perNode, c.perNode)
}

func run(stdout, stderr io.Writer, args []string) int {
	fs := flag.NewFlagSet("mpitest", flag.ContinueOnError)
	fs.SetOutput(stderr)
	nps := fs.String("np", "1,2,4,8", "comma-separated rank counts")
	sims := fs.String("sim", "4/2", "comma-separated NP/PERNODE runs with GOEP_RANKS_PER_NODE=PERNODE (empty: none)")
	timeout := fs.Duration("timeout", 10*time.Minute, "limit for one mpirun")
	collTimeout := fs.String("coll-timeout", "60s", "GOEP_MPI_TIMEOUT for the ranks")
	runExpr := fs.String("run", "", "only tests matching this regexp (go test -run)")
	skipExpr := fs.String("skip", "", "not the tests matching this regexp (go test -skip)")
	skipOneNode := fs.String("skip-one-node", "", "also not these tests where every rank is on one node (no -sim or -hosts)")
	bench := fs.String("bench", "", "also run benchmarks matching this regexp (go test -bench)")
	benchtime := fs.String("benchtime", "10x", "iterations of each benchmark: must be a count (Nx), the same on every rank")
	hosts := fs.String("hosts", "", "comma-separated layouts across hosts: HxR (H hosts of R ranks) or R1+R2+... (ranks per host); needs -hostfile")
	hostfile := fs.String("hostfile", "", "the hosts for -hosts, in Open MPI's hostfile format (the first word of each line)")
	mpirunCmd := fs.String("mpirun", "mpirun", "the mpirun command (e.g. scripts/cluster/mpirun; its -np and -sim runs go where its default hostfile puts them)")
	workdir := fs.String("workdir", "", "directory for the test binaries and rank logs (default: a new temporary one); across hosts, one every host sees")
	keep := fs.Bool("keep", false, "keep the build and log directory")
	verbose := fs.Bool("v", false, "print every rank's output")
	race := fs.Bool("race", false, "build the test binaries with the race detector (go test -race)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if strings.Contains(*skipExpr+*skipOneNode, "/") && *skipOneNode != "" {
		fmt.Fprintln(stderr, "mpitest: with -skip-one-node, -skip and -skip-one-node name top-level tests (no /): they are joined as alternatives")
		return 2
	}
	if !strings.HasSuffix(*benchtime, "x") {
		fmt.Fprintf(stderr, "mpitest: -benchtime %q must be a count such as 10x: a duration would let ranks run different numbers of collective iterations\n", *benchtime)
		return 2
	}
	pkgs := fs.Args()
	if len(pkgs) == 0 {
		fmt.Fprintln(stderr, "mpitest: name at least one package, e.g. ./mpi")
		return 2
	}
	configs, err := parseConfigs(*nps, *sims)
	if err != nil {
		fmt.Fprintln(stderr, "mpitest:", err)
		return 2
	}
	layouts, err := parseLayouts(*hosts)
	if err != nil {
		fmt.Fprintln(stderr, "mpitest:", err)
		return 2
	}
	var hostNames []string
	if len(layouts) > 0 {
		if *hostfile == "" {
			fmt.Fprintln(stderr, "mpitest: -hosts needs -hostfile (the hosts to place ranks on)")
			return 2
		}
		if hostNames, err = readHostfile(*hostfile); err != nil {
			fmt.Fprintln(stderr, "mpitest:", err)
			return 2
		}
		for _, l := range layouts {
			if len(l.hosts) > len(hostNames) {
				fmt.Fprintf(stderr, "mpitest: -hosts %s needs %d hosts, %s lists %d\n", l, len(l.hosts), *hostfile, len(hostNames))
				return 2
			}
		}
		configs = append(configs, layouts...)
	}
	if len(configs) == 0 {
		fmt.Fprintln(stderr, "mpitest: nothing to run: give -np, -sim or -hosts")
		return 2
	}
	launcher, err := exec.LookPath(*mpirunCmd)
	if err != nil {
		fmt.Fprintf(stderr, "mpitest: %s not found: run scripts/install-deps.sh (or module load an MPI): %v\n", *mpirunCmd, err)
		return 2
	}
	if launcher, err = filepath.Abs(launcher); err != nil { // runs in the package's directory
		fmt.Fprintln(stderr, "mpitest:", err)
		return 2
	}
	var dir string
	if *workdir != "" {
		if err = os.MkdirAll(*workdir, 0o755); err == nil {
			dir, err = os.MkdirTemp(*workdir, "mpitest-")
		}
	} else {
		dir, err = os.MkdirTemp("", "mpitest-")
	}
	if err != nil {
		fmt.Fprintln(stderr, "mpitest:", err)
		return 2
	}
	if dir, err = filepath.Abs(dir); err != nil {
		fmt.Fprintln(stderr, "mpitest:", err)
		return 2
	}
	if *keep {
		fmt.Fprintln(stdout, "mpitest: logs in", dir)
	} else {
		defer os.RemoveAll(dir)
	}
	run := runner{mpirun: launcher, hosts: hostNames, timeout: *timeout, collTimeout: *collTimeout,
		runExpr: *runExpr, skipExpr: *skipExpr, skipOneNode: *skipOneNode, bench: *bench, benchtime: *benchtime}

	bins := filepath.Join(dir, "bin")
	build := buildCommand(pkgs, bins, *race)
	build.Stdout, build.Stderr = stderr, stderr
	if err := build.Run(); err != nil {
		fmt.Fprintf(stdout, "FAIL %s: %s: %v\n", strings.Join(pkgs, " "), strings.Join(build.Args[1:], " "), err)
		return 1
	}
	failed := 0
	for _, pkg := range pkgs {
		name := strings.ReplaceAll(strings.Trim(filepath.Clean(pkg), "./"), "/", "_")
		bin := filepath.Join(bins, testBinary(pkg))
		if _, err := os.Stat(bin); err != nil { // a package without tests
			fmt.Fprintf(stdout, "---- %s: no test files\n", pkg)
			continue
		}
		for _, cfg := range configs {
			r := run.one(pkg, bin, dir, name, cfg)
			r.print(stdout, *verbose)
			if !r.ok {
				failed++
			}
		}
	}
	if failed > 0 {
		fmt.Fprintf(stdout, "mpitest: %d run(s) failed\n", failed)
		return 1
	}
	return 0
}

// buildCommand builds the test binaries of pkgs with the mpi tag into dir
// (testBinary names each), with the race detector if race, in one go
// command; it inherits the environment (GOFLAGS, GOEXPERIMENT).
func buildCommand(pkgs []string, dir string, race bool) *exec.Cmd {
	args := []string{"test", "-c", "-tags", "mpi"}
	if race {
		args = append(args, "-race")
	}
	return exec.Command("go", append(append(args, "-o", dir+string(filepath.Separator)), pkgs...)...)
}

// testBinary is the name go test -c -o DIR/ gives pkg's test binary: the
// last element of its path.
func testBinary(pkg string) string {
	return filepath.Base(filepath.Clean(pkg)) + ".test"
}

func parseConfigs(nps, sims string) ([]config, error) {
	var out []config
	for _, f := range strings.Split(nps, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil || n < 1 {
			return nil, fmt.Errorf("-np: %q is not a positive rank count", f)
		}
		out = append(out, config{np: n})
	}
	for _, f := range strings.Split(sims, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		a, b, ok := strings.Cut(f, "/")
		n, err1 := strconv.Atoi(a)
		k, err2 := strconv.Atoi(b)
		if !ok || err1 != nil || err2 != nil || n < 1 || k < 1 || k > n {
			return nil, fmt.Errorf("-sim: %q is not NP/PERNODE with 1 <= PERNODE <= NP", f)
		}
		out = append(out, config{np: n, perNode: k})
	}
	return out, nil
}

// parseLayouts reads -hosts: HxR or R1+R2+... per layout.
func parseLayouts(s string) ([]config, error) {
	var out []config
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		var per []int
		if h, r, ok := strings.Cut(f, "x"); ok {
			nh, err1 := strconv.Atoi(h)
			nr, err2 := strconv.Atoi(r)
			if err1 != nil || err2 != nil || nh < 1 || nr < 1 {
				return nil, fmt.Errorf("-hosts: %q is not HOSTSxRANKS with both at least 1", f)
			}
			for i := 0; i < nh; i++ {
				per = append(per, nr)
			}
		} else {
			for _, p := range strings.Split(f, "+") {
				n, err := strconv.Atoi(p)
				if err != nil || n < 1 {
					return nil, fmt.Errorf("-hosts: %q is not R1+R2+... with every count at least 1", f)
				}
				per = append(per, n)
			}
		}
		np := 0
		for _, n := range per {
			np += n
		}
		out = append(out, config{np: np, hosts: per})
	}
	return out, nil
}

// readHostfile returns the host names of an Open MPI hostfile: the first word
// of each line that is not blank or a comment.
func readHostfile(path string) ([]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("-hostfile: %w", err)
	}
	var hosts []string
	for _, line := range strings.Split(string(b), "\n") {
		if i := strings.IndexByte(line, '#'); i >= 0 {
			line = line[:i]
		}
		if f := strings.Fields(line); len(f) > 0 {
			hosts = append(hosts, f[0])
		}
	}
	if len(hosts) == 0 {
		return nil, fmt.Errorf("-hostfile %s lists no hosts", path)
	}
	return hosts, nil
}

func joinInts(v []int, sep string) string {
	s := make([]string, len(v))
	for i, n := range v {
		s[i] = strconv.Itoa(n)
	}
	return strings.Join(s, sep)
}

// result is the outcome of one mpirun.
type result struct {
	pkg     string
	cfg     config
	ok      bool
	elapsed time.Duration
	why     string
	ranks   []rankLog
	mpirun  []byte
}

type rankLog struct {
	rank           int
	stdout, stderr []byte
	passed, failed []string
	skipped        []string
	panicked       bool
	finished       bool // printed the final PASS or FAIL line
}

// runner holds what every mpirun of a harness run shares.
type runner struct {
	mpirun                                           string   // the launcher, an absolute path
	hosts                                            []string // for host layouts
	timeout                                          time.Duration
	collTimeout, runExpr, skipExpr, bench, benchtime string
	skipOneNode                                      string // skipped too where every rank is on one node
}

// skipFor is the -test.skip of a run in cfg.
func (rn runner) skipFor(cfg config) string {
	oneNode := cfg.perNode == 0 && len(cfg.hosts) == 0
	switch {
	case !oneNode || rn.skipOneNode == "":
		return rn.skipExpr
	case rn.skipExpr == "":
		return rn.skipOneNode
	}
	return rn.skipExpr + "|" + rn.skipOneNode
}

func (rn runner) one(pkg, bin, dir, name string, cfg config) result {
	out := filepath.Join(dir, fmt.Sprintf("%s-np%d-sim%d", name, cfg.np, cfg.perNode))
	if len(cfg.hosts) > 0 {
		out = filepath.Join(dir, fmt.Sprintf("%s-hosts%s", name, joinInts(cfg.hosts, "_")))
	}
	args := []string{"--oversubscribe", "-np", strconv.Itoa(cfg.np), "--output-filename", out,
		"-x", "GOEP_MPI_TIMEOUT=" + rn.collTimeout}
	if os.Geteuid() == 0 {
		args = append([]string{"--allow-run-as-root"}, args...)
	}
	if cfg.perNode > 0 {
		args = append(args, "-x", "GOEP_RANKS_PER_NODE="+strconv.Itoa(cfg.perNode))
	}
	if v, ok := os.LookupEnv("GOEP_REQUIRE_TOOLS"); ok { // ranks on other hosts do not inherit it
		args = append(args, "-x", "GOEP_REQUIRE_TOOLS="+v)
	}
	if len(cfg.hosts) > 0 {
		var place []string
		for i, n := range cfg.hosts {
			place = append(place, fmt.Sprintf("%s:%d", rn.hosts[i], n))
		}
		args = append(args, "--host", strings.Join(place, ","), "--map-by", "slot",
			"-x", "GOEP_TEST_HOSTS="+joinInts(cfg.hosts, ","))
	}
	args = append(args, bin, "-test.v", "-test.timeout", rn.timeout.String())
	if rn.runExpr != "" {
		args = append(args, "-test.run", rn.runExpr)
	}
	if skip := rn.skipFor(cfg); skip != "" {
		args = append(args, "-test.skip", skip)
	}
	if rn.bench != "" {
		args = append(args, "-test.bench", rn.bench, "-test.benchmem", "-test.benchtime", rn.benchtime)
	}
	timeout := rn.timeout
	ctx, cancel := context.WithTimeout(context.Background(), timeout+30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, rn.mpirun, args...)
	cmd.Dir = pkg
	cmd.Env = os.Environ()
	if cfg.perNode == 0 {
		cmd.Env = append(cmd.Env, "GOEP_RANKS_PER_NODE=")
	}
	if len(cfg.hosts) == 0 {
		cmd.Env = append(cmd.Env, "GOEP_TEST_HOSTS=")
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	var combined bytes.Buffer
	cmd.Stdout, cmd.Stderr = &combined, &combined
	start := time.Now()
	err := cmd.Run()
	r := result{pkg: pkg, cfg: cfg, elapsed: time.Since(start), mpirun: combined.Bytes(), ok: err == nil}
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		r.ok, r.why = false, fmt.Sprintf("mpirun did not finish within %v: killed", timeout+30*time.Second)
	} else if err != nil {
		r.why = "mpirun: " + err.Error()
	}
	for rank := 0; rank < cfg.np; rank++ {
		rl := rankLog{rank: rank}
		rl.stdout, _ = os.ReadFile(filepath.Join(out, "1", fmt.Sprintf("rank.%d", rank), "stdout"))
		rl.stderr, _ = os.ReadFile(filepath.Join(out, "1", fmt.Sprintf("rank.%d", rank), "stderr"))
		rl.parse()
		if len(rl.failed) > 0 || rl.panicked || !rl.finished {
			r.ok = false
		}
		r.ranks = append(r.ranks, rl)
	}
	return r
}

func (rl *rankLog) parse() {
	sc := bufio.NewScanner(bytes.NewReader(append(append([]byte{}, rl.stdout...), rl.stderr...)))
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "--- PASS: "):
			rl.passed = append(rl.passed, testName(line))
		case strings.HasPrefix(line, "--- FAIL: "):
			rl.failed = append(rl.failed, testName(line))
		case strings.HasPrefix(line, "--- SKIP: "):
			rl.skipped = append(rl.skipped, testName(line))
		case strings.HasPrefix(line, "panic: "), strings.HasPrefix(line, "fatal error: "):
			rl.panicked = true
		case line == "PASS" || line == "FAIL": // the test binary's last line
			rl.finished = true
		}
	}
}

func testName(line string) string {
	f := strings.Fields(line)
	if len(f) >= 3 {
		return f[2]
	}
	return line
}

func (r result) print(w io.Writer, verbose bool) {
	r0 := r.ranks[0]
	if r.ok {
		msg := fmt.Sprintf("ok   %-8s %-16s %3d tests passed on all %d rank(s)", r.pkg, r.cfg, len(r0.passed), r.cfg.np)
		if len(r0.skipped) > 0 {
			msg += fmt.Sprintf(", %d skipped: %s", len(r0.skipped), strings.Join(r0.skipped, " "))
		}
		fmt.Fprintf(w, "%s (%.1fs)\n", msg, r.elapsed.Seconds())
	} else {
		fmt.Fprintf(w, "FAIL %-8s %-16s (%.1fs) %s\n", r.pkg, r.cfg, r.elapsed.Seconds(), r.why)
		shown := 0 // output tails of the first two failing ranks; one line for the rest
		for _, rl := range r.ranks {
			switch {
			case rl.panicked:
				fmt.Fprintf(w, "  rank %d panicked\n", rl.rank)
			case len(rl.failed) > 0:
				fmt.Fprintf(w, "  rank %d failed: %s\n", rl.rank, strings.Join(rl.failed, " "))
			case !rl.finished:
				fmt.Fprintf(w, "  rank %d did not finish (killed, hung or crashed)\n", rl.rank)
			default:
				continue
			}
			if shown++; shown <= 2 || verbose {
				tail(w, fmt.Sprintf("rank %d stdout, passes left out", rl.rank), withoutPasses(rl.stdout), 60)
				tail(w, fmt.Sprintf("rank %d stderr", rl.rank), rl.stderr, 20)
			}
		}
		tail(w, "mpirun", r.mpirun, 15)
	}
	if verbose {
		for _, rl := range r.ranks {
			fmt.Fprintf(w, "==== rank %d ====\n%s%s", rl.rank, rl.stdout, rl.stderr)
		}
	}
}

// withoutPasses drops go test -v's lines of tests that started or passed,
// which would push a failure's own lines out of the tail.
func withoutPasses(b []byte) []byte {
	var out []byte
	for _, l := range strings.SplitAfter(string(b), "\n") {
		t := strings.TrimSpace(l)
		if strings.HasPrefix(t, "=== ") || strings.HasPrefix(t, "--- PASS") {
			continue
		}
		out = append(out, l...)
	}
	return out
}

func tail(w io.Writer, title string, b []byte, n int) {
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) == 1 && lines[0] == "" {
		return
	}
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	fmt.Fprintf(w, "  ---- %s (last %d lines)\n", title, len(lines))
	for _, l := range lines {
		fmt.Fprintf(w, "  | %s\n", l)
	}
}
