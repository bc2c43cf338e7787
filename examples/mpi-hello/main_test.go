package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goep/goep/internal/mpitesting"
)

// buildMPI builds this command with the mpi tag into a temporary directory.
func buildMPI(t *testing.T) string {
	t.Helper()
	mpitesting.RequireTool(t, "mpirun", "pkg-config")
	bin := filepath.Join(t.TempDir(), "mpi-hello")
	out, err := exec.Command("go", "build", "-tags", "mpi", "-o", bin, ".").CombinedOutput()
	require.NoError(t, err, "go build -tags mpi: %s", out)
	return bin
}

func TestFourRanksShareOneID(t *testing.T) {
	bin := buildMPI(t)
	cmd := exec.Command("mpirun", append(mpitesting.MPIRunArgs(4), "-x", "GOEP_RANKS_PER_NODE=2", bin)...)
	cmd.Env = append(mpitesting.LauncherFreeEnv(), "GOEP_RANKS_PER_NODE=2")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	assert.Contains(t, string(out), "4 ranks on 2 node(s) (simulated)")
	row := regexp.MustCompile(`(?m)^\s*(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+mpirun\s+\S+\s+([0-9a-f]{12})$`)
	rows := row.FindAllStringSubmatch(string(out), -1)
	require.Len(t, rows, 4, "one line per rank in:\n%s", out)
	for r, m := range rows {
		assert.Equal(t, []string{strconv.Itoa(r), strconv.Itoa(r / 2), strconv.Itoa(r % 2), "2"}, m[1:5], "rank, node, local rank, node size")
		assert.Equal(t, rows[0][5], m[5], "every rank prints the same bootstrap ID digest")
	}
}

func TestNoLauncherIsRefused(t *testing.T) {
	bin := buildMPI(t)
	// Two plain copies, as a user might start them by hand: each must refuse
	// rather than run as rank 0 of 1.
	var cmds []*exec.Cmd
	var outs []*bytes.Buffer
	for i := 0; i < 2; i++ {
		cmd := exec.Command(bin)
		cmd.Env = mpitesting.LauncherFreeEnv()
		var b bytes.Buffer
		cmd.Stdout, cmd.Stderr = &b, &b
		require.NoError(t, cmd.Start())
		cmds, outs = append(cmds, cmd), append(outs, &b)
	}
	for i, cmd := range cmds {
		err := cmd.Wait()
		var exit *exec.ExitError
		require.ErrorAs(t, err, &exit, "copy %d must fail: %s", i, outs[i])
		assert.Equal(t, 1, exit.ExitCode())
		assert.Contains(t, outs[i].String(), "no MPI launcher found")
		assert.Contains(t, outs[i].String(), "mpirun -np N")
	}
}

func TestSingleRankBuildRefusesMpirun(t *testing.T) {
	mpitesting.RequireTool(t, "mpirun")
	bin := filepath.Join(t.TempDir(), "mpi-hello-single")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	require.NoError(t, err, "%s", out)
	cmd := exec.Command("mpirun", append(mpitesting.MPIRunArgs(2), bin)...)
	cmd.Env = mpitesting.LauncherFreeEnv()
	out, err = cmd.CombinedOutput()
	require.Error(t, err, "%s", out)
	assert.Contains(t, string(out), "built without the mpi build tag")
}

// TestOneSidedChoice launches mpirun as a user would: with no choice of Open
// MPI's one-sided components goep makes one (sm,ucx); any choice of the user's,
// on mpirun's command line, in the environment or in a parameter file, is
// kept. The value is Open MPI's own, read back through MPI_T.
func TestOneSidedChoice(t *testing.T) {
	bin := buildMPI(t)
	home := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(home, ".openmpi"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(home, ".openmpi", "mca-params.conf"), []byte("# mine\nosc = sm,rdma\n"), 0o644))
	named := filepath.Join(t.TempDir(), "site.conf")
	require.NoError(t, os.WriteFile(named, []byte("osc = ^pt2pt\n"), 0o644))
	line := regexp.MustCompile(`(?m)^one-sided components: osc="([^"]*)" chosen-by=(\w+): (.*)$`)
	for _, tc := range []struct {
		name     string
		flags    []string // mpirun's
		env      []string
		want, by string
		reason   string
	}{
		{name: "nobody chose", want: "sm,ucx", by: "goep", reason: "nobody chose"},
		{name: "mpirun --mca", flags: []string{"--mca", "osc", "sm,rdma"}, want: "sm,rdma", by: "user", reason: `OMPI_MCA_osc="sm,rdma"`},
		{name: "environment", env: []string{"OMPI_MCA_osc=^ucx,pt2pt"}, want: "^ucx,pt2pt", by: "user"},
		{name: "empty environment value", env: []string{"OMPI_MCA_osc="}, want: "", by: "user"},
		{name: "user's parameter file", env: []string{"HOME=" + home}, want: "sm,rdma", by: "user",
			reason: filepath.Join(home, ".openmpi", "mca-params.conf") + " sets osc = sm,rdma"},
		{name: "files the user names", env: []string{"OMPI_MCA_mca_base_param_files=" + named}, want: "^pt2pt", by: "user",
			reason: named + " sets osc = ^pt2pt"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append(append(mpitesting.MPIRunArgs(2), tc.flags...), bin)
			cmd := exec.Command("mpirun", args...)
			cmd.Env = append(mpitesting.LauncherFreeEnv(), tc.env...)
			out, err := cmd.CombinedOutput()
			require.NoError(t, err, "%s", out)
			m := line.FindStringSubmatch(string(out))
			require.NotNil(t, m, "no one-sided line in:\n%s", out)
			assert.Equal(t, tc.want, m[1], "Open MPI's osc parameter")
			assert.Equal(t, tc.by, m[2])
			assert.Contains(t, m[3], tc.reason)
			assert.Contains(t, string(out), "2 ranks on 1 node(s), MPI thread level 3", "reading the choice must not lower the thread level")
		})
	}
}
