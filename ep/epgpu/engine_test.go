package epgpu

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goep/goep/ep"
	"github.com/goep/goep/gpu"
	"github.com/goep/goep/internal/mpitesting"
)

// openTestEngine opens an LL engine on the emulated device over the world.
func openTestEngine(t *testing.T, timeout time.Duration) *engine {
	t.Helper()
	w := mpitesting.World
	spec := ep.Spec{Config: ep.Config{Mode: ep.LowLatency, NumExperts: 2 * w.Size(), MaxTokensPerRank: 4, Hidden: 8,
		TopK: 2, Timeout: timeout}, Elem: ep.Float32, RowBytes: 32, Name: "test"}
	e, err := openEngine(w, spec, func() (gpu.Device, gpu.Comm, error) { return openEmulated(w, EmulatorOptions{}, nil) })
	if e != nil {
		t.Cleanup(func() { assert.NoError(t, e.Close()) })
	}
	require.NoError(t, err)
	return e
}

// failingComm is a communicator whose state turns to a failure, as NCCL's
// does when a peer's connection breaks (which the emulated one cannot
// provoke): the wait returns the transport's error, not a timeout, and
// aborts the communicator.
type failingComm struct {
	gpu.Comm
	fail    error
	aborted bool
}

func (c *failingComm) AsyncError() error {
	if c.fail != nil {
		return c.fail
	}
	return c.Comm.AsyncError()
}

func (c *failingComm) Abort() error { c.aborted = true; return c.Comm.Abort() }

func TestWaitReportsTransportFailure(t *testing.T) {
	w := mpitesting.World
	defer mpitesting.Agree(t, w)
	e := openTestEngine(t, 20*time.Second)
	fc := &failingComm{Comm: e.comm}
	e.comm = fc
	ev, err := e.event()
	require.NoError(t, err)
	slow, err := e.alloc(8 << 20)
	require.NoError(t, err)
	require.NoError(t, e.k.CopyRows(e.ks, gpu.CopyRowsArgs{Dst: slow, DstRows: 1 << 18, Src: slow, SrcRows: 1 << 18,
		SrcIdx: 0, N: 1 << 18, RowBytes: 16}))
	require.NoError(t, e.ks.Record(ev))
	fc.fail = errors.New("NCCL: remote process exited or there was a network error")
	err = e.wait("test", "the rows", ev, headers{})
	require.Error(t, err)
	assert.NotErrorIs(t, err, ep.ErrTimeout)
	assert.ErrorContains(t, err, "epgpu: test: waiting for the rows: the transport failed: NCCL: remote process exited")
	assert.True(t, fc.aborted, "the failed communicator was aborted")
	assert.ErrorContains(t, e.sendRecv("next", e.cs, nil, nil), "epgpu: next: the group's communicator was aborted after an earlier failure")
}

// A send and a receive of different sizes hang, as NCCL's do: the wait
// ends in a timeout after the group's, naming the silent side where the
// headers can tell.
func TestMismatchedTransferTimesOut(t *testing.T) {
	w := mpitesting.World
	if w.Size() < 2 {
		t.Skip("needs two ranks: run under mpirun")
	}
	defer mpitesting.Agree(t, w)
	e := openTestEngine(t, 300*time.Millisecond)
	buf, err := e.alloc(64)
	require.NoError(t, err)
	ev, err := e.event()
	require.NoError(t, err)
	var sends, recvs []gpu.Transfer
	switch e.rank {
	case 0:
		sends = []gpu.Transfer{{Peer: 1, Ptr: buf, Bytes: 8}}
	case 1:
		recvs = []gpu.Transfer{{Peer: 0, Ptr: buf, Bytes: 16}}
	}
	require.NoError(t, e.sendRecv("test", e.cs, sends, recvs))
	require.NoError(t, e.cs.Record(ev))
	err = e.wait("test", "a mismatched transfer", ev, headers{})
	if e.rank == 1 {
		var te *ep.TimeoutError
		require.ErrorAs(t, err, &te)
		assert.Equal(t, 300*time.Millisecond, te.After)
	} else {
		assert.NoError(t, err)
	}
	require.NoError(t, w.Barrier())
}

// A peer that never posts its side: the wait aborts the communicator past
// the timeout, and names the peer whose header word did not arrive.
func TestWaitNamesTheSilentPeer(t *testing.T) {
	w := mpitesting.World
	if w.Size() < 2 {
		t.Skip("needs two ranks: run under mpirun")
	}
	defer mpitesting.Agree(t, w)
	const timeout = 300 * time.Millisecond
	e := openTestEngine(t, timeout)
	R, last := e.size, e.size-1
	hdr, err := e.alloc(4 * R)
	require.NoError(t, err)
	require.NoError(t, e.dev.MemsetD8(hdr, 0, 4*R))
	word, err := e.alloc(4)
	require.NoError(t, err)
	require.NoError(t, e.dev.MemcpyHtoD(word, []byte{7, 0, 0, 0}))
	require.NoError(t, e.dev.Synchronize(), "the synchronous copies land before the group reads them")
	ev, err := e.event()
	require.NoError(t, err)
	if e.rank != last {
		var sends, recvs []gpu.Transfer
		for _, p := range e.others() {
			sends = append(sends, gpu.Transfer{Peer: p, Ptr: word, Bytes: 4})
			recvs = append(recvs, gpu.Transfer{Peer: p, Ptr: hdr + gpu.DevicePtr(4*p), Bytes: 4})
		}
		require.NoError(t, e.sendRecv("test", e.cs, sends, recvs))
		require.NoError(t, e.cs.Record(ev))
		start := time.Now()
		err := e.wait("test", "the headers", ev, headers{at: hdr, stride: 4, peers: e.others(), op: 7})
		var te *ep.TimeoutError
		require.ErrorAs(t, err, &te)
		assert.Equal(t, last, te.Peer, "%v", err)
		assert.Equal(t, timeout, te.After)
		assert.GreaterOrEqual(t, time.Since(start), timeout)
		assert.Less(t, time.Since(start), 5*time.Second)
		require.NoError(t, drain(e.cs, time.Minute), "the aborted group ended, and its stream ran on")
	}
	require.NoError(t, w.Barrier())
}

// The memory of a device: zeroed allocations, copies that wait for the
// streams, refusals of other memories.
func TestMemory(t *testing.T) {
	e := openTestEngine(t, 10*time.Second)
	m := e.Memory()
	assert.True(t, m == ep.Memory(memory{e.dev}), "one Memory per device: every group's memory of it is equal (==)")
	x, err := ep.Alloc[float32](m, 5)
	require.NoError(t, err)
	got := make([]float32, 5)
	require.NoError(t, ep.Download(got, x))
	assert.Equal(t, make([]float32, 5), got, "Alloc zeroes, though the device's memory is not")
	require.NoError(t, ep.Upload(x, []float32{1, 2, 3, 4, 5}))
	y, err := ep.Alloc[float32](m, 5)
	require.NoError(t, err)
	require.NoError(t, CopyOnDevice(ep.AsBytes(y), ep.AsBytes(x)))
	require.NoError(t, ep.Download(got, y))
	assert.Equal(t, []float32{1, 2, 3, 4, 5}, got)
	assert.ErrorContains(t, CopyOnDevice(ep.AsBytes(y), ep.AsBytes(x.Slice(0, 4))), "16 bytes into 20")
	assert.ErrorContains(t, CopyOnDevice(ep.Host(make([]byte, 4)), ep.AsBytes(x.Slice(0, 1))), "not in one GPU device's memory")
	assert.ErrorContains(t, m.Upload(ep.Host(make([]byte, 4)), make([]byte, 4)), "Upload of ep.Tensor(4 x 1 bytes in host)")
	assert.ErrorContains(t, m.Download(make([]byte, 3), ep.AsBytes(x)), "Download of 20 bytes into 3")
	require.NoError(t, ep.Free(x))
	require.NoError(t, ep.Free(y))
	assert.ErrorContains(t, ep.Free(x), "not an allocation")
}
