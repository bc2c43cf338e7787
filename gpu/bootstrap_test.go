package gpu

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goep/goep/internal/mpitesting"
	"github.com/goep/goep/mpi"
)

// These tests run on every rank under mpirun (make test-mpi), with no GPU:
// the MPI half of the NCCL bootstrap.

// TestBootstrapMissingNCCLFailsEveryRank: with the NCCL library missing on
// the root, BootstrapID with the NCCL generator fails on every rank with the
// root's "library missing" error (naming the file and the variable).
func TestBootstrapMissingNCCLFailsEveryRank(t *testing.T) {
	w := mpitesting.World
	t.Setenv("GOEP_TEST_NCCL_LIB", "/nonexistent/libnccl.so.2")
	missing := &library{what: "NCCL", name: "libnccl.so.2", env: "GOEP_TEST_NCCL_LIB", open: ncclLib.open}
	gen := func() (mpi.UniqueID, error) { return ncclUniqueID(missing) }
	for _, root := range []int{0, w.Size() - 1} {
		_, err := mpi.BootstrapID(w, root, gen)
		require.Error(t, err)
		assert.Contains(t, err.Error(), fmt.Sprintf("root rank %d", root))
		assert.Contains(t, err.Error(), "libnccl.so.2")
		assert.Contains(t, err.Error(), "GOEP_TEST_NCCL_LIB")
		assert.Contains(t, err.Error(), "could not be loaded")
	}
	mpitesting.Agree(t, w)
}

// TestBootstrapNCCLID runs the real generator: every rank gets the same ID
// when rank 0 has NCCL, and the same library error when it has not.
func TestBootstrapNCCLID(t *testing.T) {
	w := mpitesting.World
	id, err := mpi.BootstrapID(w, 0, NCCLUniqueID)
	rootHasNCCL := []int32{0}
	if w.Rank() == 0 && ncclLib.load() == nil {
		rootHasNCCL[0] = 1
	}
	require.NoError(t, mpi.BcastSlice(w, rootHasNCCL, 0))
	if rootHasNCCL[0] == 1 {
		require.NoError(t, err)
		assert.NotEqual(t, mpi.UniqueID{}, id)
		all := make([]byte, mpi.UniqueIDBytes*w.Size())
		require.NoError(t, w.Allgather(id[:], all))
		for r := 0; r < w.Size(); r++ {
			assert.Equal(t, id[:], all[r*mpi.UniqueIDBytes:(r+1)*mpi.UniqueIDBytes], "rank %d's ID", r)
		}
	} else {
		require.Error(t, err)
		assert.Contains(t, err.Error(), "root rank 0")
		assert.Contains(t, err.Error(), "libnccl.so.2")
		assert.Contains(t, err.Error(), "GOEP_NCCL_LIB")
	}
	mpitesting.Agree(t, w)
}

// TestNewNCCLCommFailsTogether: where a rank lacks the driver, a device or
// NCCL (this machine, CI), NewNCCLComm and NewNCCLCommWithID fail on every rank, naming the
// lowest failing rank and its cause, instead of leaving ranks inside NCCL.
func TestNewNCCLCommFailsTogether(t *testing.T) {
	w := mpitesting.World
	ok := []int32{0}
	if n, err := DeviceCount(); err == nil && n > 0 && ncclLib.load() == nil {
		ok[0] = 1
	}
	all := make([]int32, w.Size())
	require.NoError(t, mpi.AllgatherSlice(w, ok, all))
	for _, v := range all {
		if v == 1 {
			t.Skip("a rank has a GPU and NCCL: the gpu-tagged tests create real communicators")
		}
	}
	c, err := NewNCCLComm(w, -1)
	require.Error(t, err)
	assert.Nil(t, c)
	assert.Contains(t, err.Error(), "NewNCCLComm: rank 0")
	assert.True(t, errors.Is(err, ErrLibraryMissing) || w.Rank() != 0 || errors.Is(err, ErrNoDevice),
		"rank 0 keeps its error's type: %v", err)
	// Every rank reports the same cause.
	msg := make([]byte, 512)
	copy(msg, err.Error()[len(err.Error())-min(len(err.Error()), 100):])
	all0 := make([]byte, 512*w.Size())
	require.NoError(t, w.Allgather(msg, all0))
	for r := 1; r < w.Size(); r++ {
		assert.Equal(t, string(all0[:512]), string(all0[r*512:(r+1)*512]), "rank %d's error ends as rank 0's", r)
	}
	// With the ID made beforehand (at a job's start), the same agreement
	// comes first: no rank reaches the ID check or NCCL.
	id, err := mpi.HostID()
	require.NoError(t, err)
	c, err = NewNCCLCommWithID(w, -1, id)
	require.Error(t, err)
	assert.Nil(t, c)
	assert.Contains(t, err.Error(), "gpu: NewNCCLCommWithID: rank 0: ")
	assert.NotContains(t, err.Error(), "CheckSameID")
	mpitesting.Agree(t, w)
}

// TestAgree: one failing rank makes every rank fail with its message.
func TestAgree(t *testing.T) {
	w := mpitesting.World
	require.NoError(t, agree(w, "op", nil))
	last := w.Size() - 1
	var mine error
	if w.Rank() == last {
		mine = errors.New("disk on fire")
	}
	err := agree(w, "op", mine)
	require.Error(t, err)
	assert.Contains(t, err.Error(), fmt.Sprintf("op: rank %d", last))
	assert.Contains(t, err.Error(), "disk on fire")
	if w.Rank() == last {
		assert.ErrorIs(t, err, mine)
	}
	mpitesting.Agree(t, w)
}

// TestLocalRank: the ranks of one host get distinct local ranks 0, 1, ...,
// simulated nodes (GOEP_RANKS_PER_NODE) or not, so that they pick distinct
// devices.
func TestLocalRank(t *testing.T) {
	w := mpitesting.World
	local, err := localRank(w)
	require.NoError(t, err)
	host, err := hostLocalRank(w)
	require.NoError(t, err)
	topo, err := w.Topology()
	require.NoError(t, err)
	if topo.Simulated {
		assert.Equal(t, host, local)
	} else {
		assert.Equal(t, topo.LocalRank, local)
	}
	require.NoError(t, topo.Free())
	mpitesting.Agree(t, w)
}
