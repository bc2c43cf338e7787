package mpi_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goep/goep/internal/mpitesting"
	"github.com/goep/goep/mpi"
)

// Adopt wraps a communicator that the program owns (here the world, as a C
// program or mpi4py would pass MPI_COMM_WORLD) in a duplicate that works
// like any Comm, and freeing the duplicate leaves the original usable.
func TestAdoptDuplicatesTheCallersCommunicator(t *testing.T) {
	w := mpitesting.World
	if !mpi.Built {
		_, err := mpi.Adopt(1, "adopted", time.Second)
		require.ErrorContains(t, err, "built without the mpi build tag")
		return
	}
	defer mpitesting.Agree(t, w)
	R, me := w.Size(), w.Rank()
	for _, from := range []string{"world", "split"} {
		parent := w
		if from == "split" { // a communicator of the program's own, reversed
			var err error
			parent, err = w.Split(0, R-1-me, "reversed")
			require.NoError(t, err)
		}
		c, err := mpi.Adopt(parent.Raw(), "adopted", 30*time.Second)
		require.NoError(t, err, from)
		assert.Equal(t, parent.Rank(), c.Rank(), from)
		assert.Equal(t, R, c.Size(), from)
		assert.Equal(t, "adopted", c.Name(), from)
		assert.Equal(t, 30*time.Second, c.Timeout(), from)
		assert.NotEqual(t, parent.Raw(), c.Raw(), "%s: a duplicate, not the caller's handle", from)
		got := make([]int32, R)
		require.NoError(t, mpi.AllgatherSlice(c, []int32{int32(100 + c.Rank())}, got), from)
		for r := range got {
			assert.Equal(t, int32(100+r), got[r], "%s: rank %d's value", from, r)
		}
		require.NoError(t, c.Free(), from)
		require.NoError(t, parent.Barrier(), "%s: the caller's communicator still works", from)
		if parent != w {
			require.NoError(t, parent.Free())
		}
	}
}

func TestAdoptRefusesBadArguments(t *testing.T) {
	_, err := mpi.Adopt(0, "null", time.Second)
	require.ErrorContains(t, err, "communicator handle 0")
	_, err = mpi.Adopt(mpitesting.World.Raw()+1, "x", -time.Second)
	if mpi.Built {
		require.ErrorContains(t, err, "timeout -1s is negative")
	} else {
		require.Error(t, err)
	}
}

// A rank that does not call Adopt is named on the others within the
// timeout, not waited for forever.
func TestAdoptNamesARankThatDoesNotCall(t *testing.T) {
	w := mpitesting.World
	R, me := w.Size(), w.Rank()
	if !mpi.Built || R < 2 {
		t.Skip("needs a second rank that skips the call: run under mpirun with 2 or more ranks")
	}
	defer mpitesting.Agree(t, w)
	own, err := w.Split(0, me, "the program's")
	require.NoError(t, err)
	victim := R - 1
	// The ranks that call meet first, so that on a loaded machine none of
	// them comes to Adopt later than the timeout after another: only the
	// victim is missing.
	color := 0
	if me == victim {
		color = 1
	}
	callers, err := w.Split(color, me, "the callers")
	require.NoError(t, err)
	if me != victim {
		require.NoError(t, callers.Barrier())
		// A rank may learn of the missing one from another caller whose
		// timeout ran out first: the error, not the time waited, is checked.
		_, err := mpi.Adopt(own.Raw(), "adopted", 2*time.Second)
		var missing *mpi.MissingError
		require.ErrorAs(t, err, &missing)
		assert.Equal(t, victim, missing.Rank, "%v", err)
		assert.ErrorIs(t, err, mpi.ErrTimeout)
	}
	require.NoError(t, w.Barrier())
	require.NoError(t, callers.Free())
	require.NoError(t, own.Free())
}
