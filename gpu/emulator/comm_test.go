package emulator

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goep/goep/gpu"
	"github.com/goep/goep/internal/mpitesting"
	"github.com/goep/goep/mpi"
)

func newComm(t *testing.T, d *Device) *Comm {
	t.Helper()
	id, err := mpi.BootstrapID(mpitesting.World, 0, UniqueID)
	require.NoError(t, err)
	c, err := NewComm(d, mpitesting.World, id)
	require.NoError(t, err)
	assert.Equal(t, id, c.ID())
	t.Cleanup(func() { assert.NoError(t, c.Close()) })
	return c
}

func patternBytes(src, dst, k, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(src*31 + dst*7 + k*3 + i)
	}
	return b
}

// Every rank sends two transfers of pair-dependent sizes to every rank,
// itself included, in one group on a jittered stream; the bytes arrive in
// order once the stream has run the group.
func TestCommAllPairs(t *testing.T) {
	w := mpitesting.World
	defer mpitesting.Agree(t, w)
	d := testDevice(t)
	d.SetJitter(100 * time.Microsecond)
	c := newComm(t, d)
	R, me := c.Size(), c.Rank()
	size := func(src, dst, k int) int { return []int{1 + (src*5+dst)%23, 300 + src*7 + dst}[k] }
	s := stream(t, d)
	var sends, recvs []gpu.Transfer
	type want struct {
		p         gpu.DevicePtr
		src, k, n int
	}
	var wants []want
	for p := 0; p < R; p++ {
		for k := 0; k < 2; k++ {
			n := size(me, p, k)
			sp := alloc(t, d, n)
			require.NoError(t, d.MemcpyHtoD(sp, patternBytes(me, p, k, n)))
			sends = append(sends, gpu.Transfer{Peer: p, Ptr: sp, Bytes: n})
			n = size(p, me, k)
			rp := alloc(t, d, n)
			recvs = append(recvs, gpu.Transfer{Peer: p, Ptr: rp, Bytes: n})
			wants = append(wants, want{rp, p, k, n})
		}
	}
	require.NoError(t, c.SendRecv(s, sends, recvs))
	require.NoError(t, s.Synchronize())
	require.NoError(t, c.AsyncError())
	for _, x := range wants {
		assert.Equal(t, patternBytes(x.src, me, x.k, x.n), read(t, d, x.p, x.n), "transfer %d from rank %d", x.k, x.src)
	}
}

// Sizes that disagree between the two sides are an asynchronous error on
// the receiver; the stream goes on.
func TestCommSizeMismatchIsAsyncError(t *testing.T) {
	w := mpitesting.World
	if w.Size() < 2 {
		t.Skip("needs two ranks: run under mpirun")
	}
	defer mpitesting.Agree(t, w)
	d := testDevice(t)
	c := newComm(t, d)
	s := stream(t, d)
	p := alloc(t, d, 64)
	switch c.Rank() {
	case 0:
		require.NoError(t, c.SendRecv(s, []gpu.Transfer{{Peer: 1, Ptr: p, Bytes: 16}}, nil))
	case 1:
		require.NoError(t, c.SendRecv(s, nil, []gpu.Transfer{{Peer: 0, Ptr: p, Bytes: 32}}))
	}
	require.NoError(t, s.Synchronize())
	if c.Rank() == 1 {
		assert.ErrorContains(t, c.AsyncError(), "the message from rank 0 has 16 bytes, 32 were posted for it")
	} else {
		assert.NoError(t, c.AsyncError())
	}
	require.NoError(t, w.Barrier())
}

// A peer that never sends stalls the stream, as NCCL would; Abort ends the
// group, the stream goes on, and AsyncError says so.
func TestCommAbortEndsAStalledGroup(t *testing.T) {
	w := mpitesting.World
	if w.Size() < 2 {
		t.Skip("needs two ranks: run under mpirun")
	}
	defer mpitesting.Agree(t, w)
	d := testDevice(t)
	c := newComm(t, d)
	s := stream(t, d)
	p := alloc(t, d, 1<<20)
	if c.Rank() == 0 {
		last := c.Size() - 1
		require.NoError(t, c.SendRecv(s, []gpu.Transfer{{Peer: last, Ptr: p, Bytes: 1 << 20}},
			[]gpu.Transfer{{Peer: last, Ptr: p, Bytes: 64}}))
		time.Sleep(100 * time.Millisecond)
		done, err := s.Done()
		require.NoError(t, err)
		assert.False(t, done, "a group waiting for a silent peer completed")
		require.NoError(t, c.AsyncError())
		require.NoError(t, c.Abort())
		require.NoError(t, s.Synchronize())
		assert.ErrorIs(t, c.AsyncError(), ErrAborted)
		assert.ErrorIs(t, c.SendRecv(s, nil, nil), ErrAborted)
	}
	require.NoError(t, w.Barrier())
}

func TestCommRefusesBadTransfers(t *testing.T) {
	w := mpitesting.World
	defer mpitesting.Agree(t, w)
	d := testDevice(t)
	c := newComm(t, d)
	s := stream(t, d)
	p := alloc(t, d, 16)
	me := c.Rank()
	for _, x := range []struct {
		sends, recvs []gpu.Transfer
		want         string
	}{
		{[]gpu.Transfer{{Peer: c.Size(), Ptr: p, Bytes: 4}}, nil, "bad transfer"},
		{nil, []gpu.Transfer{{Peer: me, Ptr: p, Bytes: 17}}, "not inside an allocation"},
		{[]gpu.Transfer{{Peer: me, Ptr: p, Bytes: 4}}, nil, "1 sends to this rank itself and 0 receives"},
		{[]gpu.Transfer{{Peer: me, Ptr: p, Bytes: 4}}, []gpu.Transfer{{Peer: me, Ptr: p.Add(4), Bytes: 8}}, "has 4 bytes, its receive 8"},
	} {
		assert.ErrorContains(t, c.SendRecv(s, x.sends, x.recvs), x.want)
	}
	assert.ErrorContains(t, c.SendRecv(nil, nil, nil), "needs a stream")
	require.NoError(t, s.Synchronize(), "a refused transfer is no device error")
}

// A communicator is made from one ID that every rank holds: an ID that
// UniqueID did not make (NCCL's, or none), or one rank's own ID, fails
// NewComm on every rank, naming the rank, instead of waiting for ever.
func TestNewCommNeedsOneSharedID(t *testing.T) {
	w := mpitesting.World
	defer mpitesting.Agree(t, w)
	d := testDevice(t)
	a, err := UniqueID()
	require.NoError(t, err)
	b, err := UniqueID()
	require.NoError(t, err)
	assert.NotEqual(t, a, b, "two IDs differ")
	assert.Equal(t, "goepemu", string(a[:7]))

	last := w.Size() - 1
	id, err := mpi.BootstrapID(w, 0, UniqueID)
	require.NoError(t, err)
	bad := id
	if w.Rank() == last {
		bad = mpi.UniqueID{} // not made by UniqueID
	}
	_, err = NewComm(d, w, bad)
	require.Error(t, err)
	assert.Contains(t, err.Error(), fmt.Sprintf("emulator: NewComm: rank %d: ID %s was not made by emulator.UniqueID (its first bytes are 00 00", last, mpi.UniqueID{}.Digest()))

	mine := id
	if w.Rank() == last {
		mine = b
	}
	c, err := NewComm(d, w, mine)
	if w.Size() == 1 {
		require.NoError(t, err, "one rank: its ID is rank 0's")
		require.NoError(t, c.Close())
		return
	}
	require.Error(t, err)
	assert.Contains(t, err.Error(), fmt.Sprintf("emulator: NewComm: mpi: CheckSameID: rank %d holds ID ", last))
	assert.Contains(t, err.Error(), fmt.Sprintf(", root rank 0 holds %s: the ranks were not given one ID", id.Digest()))
	if w.Rank() == last {
		assert.Contains(t, err.Error(), "holds ID "+b.Digest(), "the last rank's own ID")
	}
}
