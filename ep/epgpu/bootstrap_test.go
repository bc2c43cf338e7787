package epgpu_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goep/goep/ep"
	"github.com/goep/goep/ep/epgpu"
	"github.com/goep/goep/gpu"
	"github.com/goep/goep/internal/mpitesting"
	"github.com/goep/goep/mpi"
)

// Bootstrap on the emulated device: one ID, made on rank 0 by
// emulator.UniqueID and held by every rank; the first group made with the
// bound backend runs on a communicator made from it, and a second one is
// refused on every rank (an ID makes one communicator).
func TestBootstrapEmulated(t *testing.T) {
	w := mpitesting.World
	defer mpitesting.Agree(t, w)
	b, err := epgpu.Bootstrap(w, epgpu.Emulated)
	require.NoError(t, err)
	assert.Equal(t, "emulator.UniqueID", b.Generator)
	assert.Equal(t, w.Size(), b.Ranks)
	assert.Equal(t, "goepemu", string(b.ID[:7]), "the emulator's mark")
	assert.Equal(t, "emulated:0", b.Device.Name)
	assert.Empty(t, b.Device.Driver)
	assert.Equal(t, epgpu.Emulated.Name(), b.Backend.Name())
	id := b.ID // (a copy: cgo takes no pointer into a struct that holds Go pointers)
	all := make([]byte, mpi.UniqueIDBytes*w.Size())
	require.NoError(t, w.Allgather(id[:], all))
	for r := 0; r < w.Size(); r++ {
		assert.Equal(t, id[:], all[r*mpi.UniqueIDBytes:(r+1)*mpi.UniqueIDBytes], "rank %d's ID", r)
	}
	again, err := epgpu.Bootstrap(w, epgpu.Emulated)
	require.NoError(t, err)
	assert.NotEqual(t, b.ID, again.ID, "each bootstrap makes a new ID")

	// A group of each mode, each on a communicator of its own ID.
	newRig(t, b.Backend, ep.LowLatency).round(t, "LL round on the bootstrapped communicator")
	newRig(t, again.Backend, ep.HighThroughput).round(t, "HT round on the bootstrapped communicator")

	cfg := ep.Config{Mode: ep.LowLatency, NumExperts: 2 * w.Size(), MaxTokensPerRank: 4, Hidden: 4, TopK: 2, Backend: b.Backend}
	g, err := ep.NewGroup[float32](w, cfg)
	require.Error(t, err, "the ID has made its communicator")
	assert.Nil(t, g)
	assert.Contains(t, err.Error(), "the unique ID "+b.ID.Digest()+" (Bootstrap) has made a group's communicator already")

	_, err = epgpu.Bootstrap(w, b.Backend)
	assert.ErrorContains(t, err, "is bound to ID "+b.ID.Digest()+" already")
	_, err = epgpu.Bootstrap(w, ep.CPU)
	assert.ErrorContains(t, err, `backend "cpu" is not one of package epgpu's`)
}

// Where no rank has a GPU and NCCL (this machine, CI), Bootstrap of the
// CUDA backend fails on every rank, before any ID is made, naming rank 0
// and each thing it lacks; the gpu-tagged tests bootstrap real devices.
func TestBootstrapCUDAWithoutDevice(t *testing.T) {
	w := mpitesting.World
	defer mpitesting.Agree(t, w)
	ok := []int32{0}
	if n, err := gpu.DeviceCount(); err == nil && n > 0 {
		ok[0] = 1
	}
	some := make([]int32, 1)
	require.NoError(t, mpi.Allreduce(w, mpi.OpMax, ok, some))
	if some[0] == 1 {
		t.Skip("a rank has a GPU: the gpu-tagged tests bootstrap it")
	}
	b, err := epgpu.Bootstrap(w, epgpu.CUDA)
	require.Error(t, err)
	assert.Nil(t, b)
	msg := err.Error()
	assert.Contains(t, msg, "epgpu: Bootstrap: gpu:cuda: rank 0: this rank cannot run the CUDA backend (it lacks ")
	if _, derr := gpu.DriverVersion(); derr != nil {
		assert.Regexp(t, `\(it lacks the CUDA driver( and|,|\))`, msg, "the missing driver is named first")
		assert.Contains(t, msg, "libcuda.so.1")
		assert.Equal(t, 1, strings.Count(msg, "(libcuda.so.1) could not be loaded"), "said once: %s", msg)
	}
	if _, nerr := gpu.NCCLVersion(); nerr != nil {
		assert.Contains(t, msg, "libnccl.so.2", "the missing NCCL is named")
	}
	assert.NotContains(t, msg, "\n", "one line")
}
