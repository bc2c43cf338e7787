// Package mpitesting helps tests that run on every rank of an MPI job.
package mpitesting

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime/debug"
	"strconv"
	"strings"
	"testing"

	"github.com/goep/goep/mpi"
)

// World is the world communicator, set by Main.
var World *mpi.Comm

// Main initialises MPI, runs the tests and finalises MPI. Call it from
// TestMain. A rank whose tests fail exits non-zero, which makes mpirun end
// the whole job.
func Main(m *testing.M) {
	w, err := mpi.Init()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	World = w
	code := m.Run()
	if code == 0 {
		if err := mpi.Finalize(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			code = 1
		}
	}
	os.Exit(code)
}

// Agree fails t on every rank of c if it has failed on any rank, naming the
// ranks that failed, so that ranks stay in step after a failure. Call it at
// the end of a test, or defer it: deferred, it also reports a panic of the
// test (with its stack) instead of letting the failure hide it.
func Agree(t testing.TB, c *mpi.Comm) {
	t.Helper()
	if r := recover(); r != nil {
		t.Errorf("rank %d: panic: %v\n%s", c.Rank(), r, debug.Stack())
	}
	var mine error
	if t.Failed() {
		mine = fmt.Errorf("test failed")
	}
	var agreed *mpi.AgreedError
	if err := mpi.AgreeOnError(c, mine); errors.As(err, &agreed) {
		t.Fatalf("rank %d: test failed on rank(s) %v", c.Rank(), agreed.Failed)
	} else if err != nil {
		t.Fatalf("rank %d: agreeing on the outcome: %v", c.Rank(), err)
	}
}

// RequireTool skips t when the named program is not on PATH, unless
// GOEP_REQUIRE_TOOLS=1 (set by make test and CI), where a missing tool fails
// the test instead: CI can never pass by skipping.
func RequireTool(t testing.TB, names ...string) {
	t.Helper()
	for _, name := range names {
		if _, err := exec.LookPath(name); err != nil {
			if os.Getenv("GOEP_REQUIRE_TOOLS") == "1" {
				t.Fatalf("%s is required (GOEP_REQUIRE_TOOLS=1) but not found: run scripts/install-deps.sh", name)
			}
			t.Skipf("%s not found: run scripts/install-deps.sh (make test fails instead of skipping)", name)
		}
	}
}

// MPIRunArgs are the mpirun flags every launch in tests needs on one
// machine: more ranks than cores, and root inside containers and CI.
func MPIRunArgs(np int) []string {
	args := []string{"--oversubscribe", "-np", strconv.Itoa(np)}
	if os.Geteuid() == 0 {
		args = append([]string{"--allow-run-as-root"}, args...)
	}
	return args
}

// LauncherFreeEnv is this process's environment without any launcher or
// goep variable (OMPI_, PMIX_, PMI_, SLURM_, GOEP_): that of a shell with no
// mpirun, for starting programs as a user would by hand.
func LauncherFreeEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "OMPI_") || strings.HasPrefix(kv, "PMIX_") || strings.HasPrefix(kv, "PMI_") ||
			strings.HasPrefix(kv, "SLURM_") || strings.HasPrefix(kv, "GOEP_") {
			continue
		}
		env = append(env, kv)
	}
	return env
}

// HostLayout is the number of ranks on each host, in rank order, as the
// harness placed them (internal/cmd/mpitest -hosts passes GOEP_TEST_HOSTS, e.g.
// "2,2,1"); without it, one host holds all size ranks.
func HostLayout(size int) ([]int, error) {
	s := os.Getenv("GOEP_TEST_HOSTS")
	if s == "" {
		return []int{size}, nil
	}
	var out []int
	sum := 0
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(f)
		if err != nil || n < 1 {
			return nil, fmt.Errorf("GOEP_TEST_HOSTS=%q: %q is not a positive number of ranks", s, f)
		}
		out = append(out, n)
		sum += n
	}
	if sum != size {
		return nil, fmt.Errorf("GOEP_TEST_HOSTS=%q places %d ranks, the world has %d", s, sum, size)
	}
	return out, nil
}
