package main

import (
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goep/goep/ep"
	"github.com/goep/goep/internal/mpitesting"
)

// A rank that dies ends the whole job with the default settings, long
// before the group's timeout: a rank that panics exits without
// MPI_Finalize, which mpirun answers by ending every rank. A rank that
// returns after MPI_Finalize without closing the group leaves the others
// waiting until the group's timeout: they name it, their Close returns at
// once (it waits for no rank, one being gone) and they end too. The bound on
// each run is a deadline for a hang, far from what the run takes.
func TestDeadRankEndsTheJob(t *testing.T) {
	mpitesting.RequireTool(t, "mpirun", "pkg-config")
	bin := filepath.Join(t.TempDir(), "deadrank")
	out, err := exec.Command("go", "build", "-tags", "mpi", "-o", bin, ".").CombinedOutput()
	require.NoError(t, err, "go build -tags mpi: %s", out)
	for _, c := range []struct {
		name     string
		args     []string
		deadline time.Duration
		want     []string
	}{
		{"panic, default timeout", []string{"-die", "1", "-how", "panic"}, ep.DefaultTimeout * 3 / 4, []string{"rank 1 dies"}},
		{"finalize, 3s timeout", []string{"-die", "1", "-how", "finalize", "-timeout", "3s"}, ep.DefaultTimeout * 3 / 4,
			[]string{"rank 1 returns", "rank 1 on host", "did not arrive within 3s", "Close took", ": <nil>"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), c.deadline)
			defer cancel()
			cmd := exec.CommandContext(ctx, "mpirun", append(mpitesting.MPIRunArgs(2), append([]string{bin}, c.args...)...)...)
			cmd.Env = mpitesting.LauncherFreeEnv()
			out, err := cmd.CombinedOutput()
			require.NoError(t, ctx.Err(), "the job did not end within %v:\n%s", c.deadline, out)
			assert.Error(t, err, "the job fails")
			for _, w := range c.want {
				assert.Contains(t, string(out), w)
			}
			assert.False(t, strings.Contains(string(out), "every round done"))
		})
	}
}
