package emulator

import (
	"bytes"
	"errors"
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

// posted waits until c's last SendRecv is on its stream (AsyncError no
// longer gpu.ErrInProgress) and requires that nothing failed.
func posted(t *testing.T, c *Comm) {
	t.Helper()
	start := time.Now()
	for {
		err := c.AsyncError()
		if !errors.Is(err, gpu.ErrInProgress) {
			require.NoError(t, err)
			return
		}
		gpu.Backoff(time.Since(start))
	}
}

// connectAll makes every pair of ranks post a group together once (a byte
// each way), so that later groups need no connection.
func connectAll(t *testing.T, c *Comm, d *Device, s gpu.Stream) {
	t.Helper()
	p := alloc(t, d, 2*c.Size())
	var sends, recvs []gpu.Transfer
	for q := 0; q < c.Size(); q++ {
		sends = append(sends, gpu.Transfer{Peer: q, Ptr: p.Add(q), Bytes: 1})
		recvs = append(recvs, gpu.Transfer{Peer: q, Ptr: p.Add(c.Size() + q), Bytes: 1})
	}
	require.NoError(t, c.SendRecv(s, sends, recvs))
	posted(t, c)
	require.NoError(t, s.Synchronize())
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
	require.NoError(t, d.Synchronize(), "the synchronous copies land before the group reads them")
	require.NoError(t, c.SendRecv(s, sends, recvs))
	posted(t, c)
	require.NoError(t, s.Synchronize())
	require.NoError(t, c.AsyncError())
	for _, x := range wants {
		assert.Equal(t, patternBytes(x.src, me, x.k, x.n), read(t, d, x.p, x.n), "transfer %d from rank %d", x.k, x.src)
	}
}

// Sizes that disagree between the two sides hang, as NCCL's do (no error
// says so), until Abort; the stream then goes on.
func TestCommSizeMismatchHangs(t *testing.T) {
	w := mpitesting.World
	if w.Size() < 2 {
		t.Skip("needs two ranks: run under mpirun")
	}
	defer mpitesting.Agree(t, w)
	d := testDevice(t)
	c := newComm(t, d)
	s := stream(t, d)
	connectAll(t, c, d, s)
	p := alloc(t, d, 64)
	switch c.Rank() {
	case 0:
		require.NoError(t, c.SendRecv(s, []gpu.Transfer{{Peer: 1, Ptr: p, Bytes: 16}}, nil))
		posted(t, c)
		require.NoError(t, s.Synchronize(), "the send completes")
	case 1:
		require.NoError(t, c.SendRecv(s, nil, []gpu.Transfer{{Peer: 0, Ptr: p, Bytes: 32}}))
		posted(t, c)
		time.Sleep(50 * time.Millisecond)
		done, err := s.Done()
		require.NoError(t, err)
		assert.False(t, done, "a receive of another size than its send completed")
		assert.NoError(t, c.AsyncError(), "NCCL reports no error for it: it hangs")
		require.NoError(t, c.Abort())
		require.NoError(t, s.Synchronize())
		assert.ErrorIs(t, c.AsyncError(), ErrAborted)
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
	connectAll(t, c, d, s)
	p := alloc(t, d, 1<<20)
	if c.Rank() == 0 {
		last := c.Size() - 1
		require.NoError(t, c.SendRecv(s, []gpu.Transfer{{Peer: last, Ptr: p, Bytes: 1 << 20}},
			[]gpu.Transfer{{Peer: last, Ptr: p, Bytes: 64}}))
		posted(t, c)
		time.Sleep(50 * time.Millisecond)
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

// The communicator is non-blocking: a rank's first group with a peer
// reaches its stream only once that peer has posted its own, and until
// then AsyncError says gpu.ErrInProgress. Queuing work on the stream or
// posting another group meanwhile is what NCCL forbids: a misuse, which
// sticks.
func TestCommIsNonBlocking(t *testing.T) {
	w := mpitesting.World
	if w.Size() < 2 {
		t.Skip("needs two ranks: run under mpirun")
	}
	defer mpitesting.Agree(t, w)
	d := testDevice(t)
	id, err := mpi.BootstrapID(w, 0, UniqueID)
	require.NoError(t, err)
	c, err := NewComm(d, w, id)
	require.NoError(t, err)
	s := stream(t, d)
	p := alloc(t, d, 32)
	require.NoError(t, d.MemsetD8(p, byte(10+c.Rank()), 16))
	require.NoError(t, d.Synchronize())
	peer := 1 - c.Rank()
	group := func() error {
		return c.SendRecv(s, []gpu.Transfer{{Peer: peer, Ptr: p, Bytes: 16}}, []gpu.Transfer{{Peer: peer, Ptr: p.Add(16), Bytes: 16}})
	}
	switch c.Rank() {
	case 0:
		require.NoError(t, group())
		time.Sleep(20 * time.Millisecond)
		assert.ErrorIs(t, c.AsyncError(), gpu.ErrInProgress, "the peer has not posted: the group is not on the stream")
		done, err := s.Done()
		require.NoError(t, err)
		assert.True(t, done, "nothing is on the stream yet")
		assert.ErrorContains(t, s.MemsetD8Async(p, 0, 1), "work queued on a stream while an NCCL group is still being put on it")
		require.NoError(t, w.Barrier()) // rank 1 posts now
		for c.pending.Load() {          // AsyncError reports the misuse now, not the progress
			gpu.Backoff(time.Millisecond)
		}
		require.NoError(t, s.Synchronize())
		assert.Equal(t, bytes.Repeat([]byte{11}, 16), read(t, d, p.Add(16), 16), "the group ran once posted")
		assert.ErrorContains(t, c.AsyncError(), "work queued on a stream while", "a misuse sticks")
		assert.ErrorContains(t, c.Close(), "work queued on a stream while", "and Close reports it")
	case 1:
		require.NoError(t, w.Barrier())
		require.NoError(t, group())
		posted(t, c)
		require.NoError(t, s.Synchronize())
		assert.Equal(t, bytes.Repeat([]byte{10}, 16), read(t, d, p.Add(16), 16))
		require.NoError(t, c.Close())
	default:
		require.NoError(t, w.Barrier())
		require.NoError(t, c.Close())
	}
}

// A call made while another goroutine is inside one (an Abort from a
// watchdog during a wait's AsyncError, say) is a misuse, and sticks; so is
// a SendRecv while the previous one is in progress.
func TestCommOneGoroutineAtATime(t *testing.T) {
	w := mpitesting.World
	defer mpitesting.Agree(t, w)
	d := testDevice(t)
	id, err := mpi.BootstrapID(w, 0, UniqueID)
	require.NoError(t, err)
	c, err := NewComm(d, w, id)
	require.NoError(t, err)
	require.NoError(t, c.AsyncError())
	c.busy.Add(1) // another goroutine is inside a call
	err = c.Abort()
	c.busy.Add(-1)
	require.NoError(t, err, "Abort itself goes through")
	assert.ErrorIs(t, c.AsyncError(), ErrAborted)
	assert.ErrorContains(t, c.Close(), "Abort called while another goroutine was inside a call on the same communicator")

	c, err = NewComm(d, w, id)
	require.NoError(t, err)
	s := stream(t, d)
	p := alloc(t, d, 8)
	c.pending.Store(true) // a SendRecv still being put on its stream
	err = c.SendRecv(s, []gpu.Transfer{{Peer: c.Rank(), Ptr: p, Bytes: 4}}, []gpu.Transfer{{Peer: c.Rank(), Ptr: p.Add(4), Bytes: 4}})
	c.pending.Store(false)
	assert.ErrorContains(t, err, "SendRecv while the previous one was still in progress")
	assert.ErrorContains(t, c.AsyncError(), "SendRecv while the previous one")
	assert.ErrorContains(t, c.Close(), "SendRecv while the previous one")
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
	posted(t, c)
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
