//go:build mpi

package mpi_test

import (
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goep/goep/internal/mpitesting"
	"github.com/goep/goep/mpi"
)

// TestOneSidedChoiceIsOpenMPIs checks goep's choice of one-sided components
// against what Open MPI itself read (MPI_T), on every rank alike. Where the
// launch left the choice open, goep must have made it; examples/mpi-hello's
// tests launch mpirun with and without a user's choice.
func TestOneSidedChoiceIsOpenMPIs(t *testing.T) {
	w := mpitesting.World
	defer mpitesting.Agree(t, w)
	c := mpi.OneSided()
	env, set := os.LookupEnv("OMPI_MCA_osc")
	switch {
	case c.ByGoep:
		assert.Equal(t, mpi.OneSidedComponents, env, "goep's choice, in the environment")
		assert.Equal(t, mpi.OneSidedComponents, c.Components, "Open MPI's osc parameter (MPI_T)")
		assert.Contains(t, c.Reason, "nobody chose")
	case set:
		assert.Equal(t, env, c.Components, "Open MPI's osc parameter (MPI_T) is the launch's choice")
		assert.Contains(t, c.Reason, "OMPI_MCA_osc=")
	default:
		assert.Contains(t, c.Reason, " sets osc = "+c.Components, "a parameter file's choice")
	}
	const n = 64
	mine := make([]byte, n)
	copy(mine, c.Components)
	all := make([]byte, n*w.Size())
	require.NoError(t, w.Allgather(mine, all))
	for r := 0; r < w.Size(); r++ {
		assert.Equal(t, string(mine), string(all[r*n:(r+1)*n]), "rank %d's components", r)
	}
}
