package mpi

import (
	"fmt"
	"os"
	"strconv"
)

// Launch describes how the process was started, as read from the launcher's
// environment before MPI is initialised.
type Launch struct {
	// Launcher is "mpirun", "srun", "pmix", "pmi" or "" when no launcher
	// variables were found.
	Launcher string
	// Rank, Size and LocalRank as the launcher assigned them; -1 if unknown.
	Rank, Size, LocalRank int
}

// launcherVars lists, in order of precedence, where each launcher puts the
// rank, the job size and the node-local rank.
var launcherVars = []struct {
	name                  string
	rank, size, localRank string
}{
	{"mpirun", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"},
	// SLURM_STEP_ID is set for srun steps and not in a batch script, where
	// SLURM_NTASKS describes the allocation, not this process.
	{"srun", "SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_LOCALID"},
	{"pmix", "PMIX_RANK", "PMIX_SIZE", "PMIX_LOCAL_RANK"},
	{"pmi", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"},
}

// DetectLaunch reads the launcher's environment variables.
func DetectLaunch() Launch {
	return detectLaunch(os.Getenv)
}

func detectLaunch(getenv func(string) string) Launch {
	for _, v := range launcherVars {
		rank, ok := envInt(getenv, v.rank)
		if !ok {
			continue
		}
		if v.name == "srun" && getenv("SLURM_STEP_ID") == "" {
			continue
		}
		size, ok := envInt(getenv, v.size)
		if !ok {
			size = -1
		}
		local, ok := envInt(getenv, v.localRank)
		if !ok {
			local = -1
		}
		return Launch{Launcher: v.name, Rank: rank, Size: size, LocalRank: local}
	}
	return Launch{Rank: -1, Size: -1, LocalRank: -1}
}

func envInt(getenv func(string) string, name string) (int, bool) {
	s := getenv(name)
	if s == "" {
		return 0, false
	}
	n, err := strconv.Atoi(s)
	if err != nil {
		return 0, false
	}
	return n, true
}

// singletonAllowed reports whether a process with no launcher may run as a
// job of one rank.
func singletonAllowed() bool { return os.Getenv("GOEP_ALLOW_SINGLETON") == "1" }

// checkLaunch compares what the launcher promised with what MPI reports.
// built tells whether the binary links MPI (the mpi build tag).
func checkLaunch(l Launch, worldSize int, built bool) error {
	switch {
	case l.Launcher == "" && !built:
		return nil // a plain single-rank build run as a plain program
	case l.Launcher == "" && !singletonAllowed():
		return fmt.Errorf("mpi: no MPI launcher found (none of OMPI_COMM_WORLD_RANK, SLURM_PROCID with SLURM_STEP_ID, PMIX_RANK, PMI_RANK is set): " +
			"start the program with mpirun -np N or srun -n N; to run it as a single rank on purpose, set GOEP_ALLOW_SINGLETON=1")
	case l.Size > 1 && !built:
		return fmt.Errorf("mpi: %s started %d processes, but this binary was built without the mpi build tag and would run as %d copies of rank 0 of 1: rebuild with go build -tags mpi",
			l.Launcher, l.Size, l.Size)
	case l.Size > 0 && worldSize != l.Size:
		hint := ""
		if l.Launcher == "srun" {
			hint = ": srun did not connect the tasks through MPI; use srun --mpi=pmix (or set MpiDefault=pmix in slurm.conf)"
		}
		return fmt.Errorf("mpi: %s started %d processes but MPI_COMM_WORLD has %d rank(s)%s", l.Launcher, l.Size, worldSize, hint)
	}
	return nil
}
