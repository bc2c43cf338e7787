package mpi

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestMPIFailureIsError(t *testing.T) {
	w, err := Init()
	require.NoError(t, err)
	err = w.badRootForTest()
	var e *Error
	require.ErrorAs(t, err, &e)
	assert.Equal(t, "MPI_Bcast", e.Call)
	assert.Contains(t, err.Error(), "MPI_Bcast failed")
	if Built {
		assert.NotEmpty(t, e.Msg, "the MPI error string")
		require.NoError(t, w.Barrier(), "a returned MPI error must leave the communicator usable")
	}
}

func TestDetectLaunch(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  map[string]string
		want Launch
	}{
		{"none", nil, Launch{Rank: -1, Size: -1, LocalRank: -1}},
		{"mpirun", map[string]string{"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "1"},
			Launch{Launcher: "mpirun", Rank: 3, Size: 4, LocalRank: 1}},
		{"srun", map[string]string{"SLURM_PROCID": "2", "SLURM_STEP_NUM_TASKS": "8", "SLURM_LOCALID": "0", "SLURM_STEP_ID": "0"},
			Launch{Launcher: "srun", Rank: 2, Size: 8, LocalRank: 0}},
		{"sbatch script is not a launch", map[string]string{"SLURM_PROCID": "0", "SLURM_NTASKS": "8"},
			Launch{Rank: -1, Size: -1, LocalRank: -1}},
		{"mpirun inside srun wins", map[string]string{"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2",
			"SLURM_PROCID": "0", "SLURM_STEP_ID": "1", "SLURM_STEP_NUM_TASKS": "1"},
			Launch{Launcher: "mpirun", Rank: 1, Size: 2, LocalRank: -1}},
		{"pmix", map[string]string{"PMIX_RANK": "5"}, Launch{Launcher: "pmix", Rank: 5, Size: -1, LocalRank: -1}},
		{"garbage is ignored", map[string]string{"OMPI_COMM_WORLD_RANK": "x"}, Launch{Rank: -1, Size: -1, LocalRank: -1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := detectLaunch(func(k string) string { return tc.env[k] })
			assert.Equal(t, tc.want, got)
		})
	}
}

func TestCheckLaunch(t *testing.T) {
	t.Setenv("GOEP_ALLOW_SINGLETON", "")
	none := Launch{Rank: -1, Size: -1, LocalRank: -1}
	for _, tc := range []struct {
		name      string
		l         Launch
		worldSize int
		built     bool
		wantErr   string
	}{
		{"plain single-rank build", none, 1, false, ""},
		{"mpi build with no launcher", none, 1, true, "no MPI launcher found"},
		{"mpirun -np 4 of a build without MPI", Launch{Launcher: "mpirun", Rank: 0, Size: 4}, 1, false, "built without the mpi build tag"},
		{"srun without pmix", Launch{Launcher: "srun", Rank: 2, Size: 4}, 1, true, "use srun --mpi=pmix"},
		{"mpirun ok", Launch{Launcher: "mpirun", Rank: 2, Size: 4}, 4, true, ""},
		{"mpirun -np 1 of a build without MPI", Launch{Launcher: "mpirun", Rank: 0, Size: 1}, 1, false, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := checkLaunch(tc.l, tc.worldSize, tc.built)
			if tc.wantErr == "" {
				assert.NoError(t, err)
			} else {
				assert.ErrorContains(t, err, tc.wantErr)
			}
		})
	}
	t.Setenv("GOEP_ALLOW_SINGLETON", "1")
	assert.NoError(t, checkLaunch(none, 1, true), "GOEP_ALLOW_SINGLETON=1 allows a run with no launcher")
}
