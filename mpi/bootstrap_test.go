package mpi_test

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goep/goep/internal/mpitesting"
	"github.com/goep/goep/mpi"
)

func TestBootstrapIDSameOnEveryRank(t *testing.T) {
	w := mpitesting.World
	for _, root := range []int{0, w.Size() - 1} {
		calls := 0
		gen := func() (mpi.UniqueID, error) { calls++; return mpi.HostID() }
		id, err := mpi.BootstrapID(w, root, gen)
		require.NoError(t, err)
		assert.NotEqual(t, mpi.UniqueID{}, id)
		all := make([]byte, mpi.UniqueIDBytes*w.Size())
		require.NoError(t, w.Allgather(id[:], all))
		for r := 0; r < w.Size(); r++ {
			require.Equal(t, id[:], all[r*mpi.UniqueIDBytes:(r+1)*mpi.UniqueIDBytes], "ID of rank %d", r)
		}
		total := make([]int32, 1)
		require.NoError(t, mpi.Allreduce(w, mpi.OpSum, []int32{int32(calls)}, total))
		assert.Equal(t, int32(1), total[0], "the generator runs on the root only")
		if w.Rank() == root {
			assert.Equal(t, 1, calls)
		}
		assert.Len(t, id.Digest(), 12)
	}
	mpitesting.Agree(t, w)
}

func TestBootstrapIDGeneratorFailureReachesEveryRank(t *testing.T) {
	w := mpitesting.World
	gen := func() (mpi.UniqueID, error) { return mpi.UniqueID{}, errors.New("no GPU library here") }
	_, err := mpi.BootstrapID(w, 0, gen)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "no GPU library here")
	assert.Contains(t, err.Error(), "root rank 0")

	_, err = mpi.BootstrapID(w, -1, mpi.HostID)
	assert.ErrorContains(t, err, "root -1 out of range")
	_, err = mpi.BootstrapID(w, 0, nil)
	assert.ErrorContains(t, err, "nil ID generator")
	mpitesting.Agree(t, w)
}

func TestHostIDsDiffer(t *testing.T) {
	a, err := mpi.HostID()
	require.NoError(t, err)
	b, err := mpi.HostID()
	require.NoError(t, err)
	assert.NotEqual(t, a, b)
	assert.NotEqual(t, a.Digest(), b.Digest())
}
