package mpi_test

import (
	"errors"
	"fmt"
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

// CheckSameID passes a bootstrapped ID, and fails on every rank, naming
// the last rank and both digests, when that rank holds another one.
func TestCheckSameID(t *testing.T) {
	w := mpitesting.World
	defer mpitesting.Agree(t, w)
	id, err := mpi.BootstrapID(w, 0, mpi.HostID)
	require.NoError(t, err)
	require.NoError(t, mpi.CheckSameID(w, 0, id))
	last := w.Size() - 1
	other := id
	if w.Rank() == last {
		other[7] ^= 1
	}
	err = mpi.CheckSameID(w, 0, other)
	if w.Size() == 1 {
		require.NoError(t, err, "one rank: its ID is root's")
	} else {
		require.Error(t, err)
		assert.Equal(t, fmt.Sprintf("mpi: CheckSameID: rank %d holds ID %s, root rank 0 holds %s: the ranks were not given one ID",
			last, func() mpi.UniqueID { o := id; o[7] ^= 1; return o }().Digest(), id.Digest()), err.Error())
	}
	assert.ErrorContains(t, mpi.CheckSameID(w, w.Size(), id), "out of range")
}
