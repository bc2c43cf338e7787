package emulator

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goep/goep/gpu"
	"github.com/goep/goep/internal/mpitesting"
	"github.com/goep/goep/mpi"
)

// IPC between the ranks of a host: an allocation exported by one process
// and opened by another is the same memory, both ways; a process cannot
// open its own handle; IPCClose unmaps.
func TestIPCSharesMemoryBetweenProcesses(t *testing.T) {
	w := mpitesting.World
	defer mpitesting.Agree(t, w)
	d := testDevice(t)
	p := alloc(t, d, 256)
	require.NoError(t, d.MemcpyHtoD(p, bytes.Repeat([]byte{byte(w.Rank() + 1)}, 256)))
	require.NoError(t, d.Synchronize())
	h, off, err := d.IPCExport(p.Add(16))
	require.NoError(t, err)
	assert.Equal(t, 16, off)
	_, err = d.IPCOpen(h)
	assert.ErrorContains(t, err, "a handle of this process itself")
	if w.Size() < 2 {
		return
	}
	all := make([]byte, len(h)*w.Size())
	require.NoError(t, w.Allgather(h[:], all))
	next := (w.Rank() + 1) % w.Size()
	var nh gpu.IPCHandle
	copy(nh[:], all[next*len(h):])
	q, err := d.IPCOpen(nh)
	require.NoError(t, err)
	assert.Equal(t, bytes.Repeat([]byte{byte(next + 1)}, 256), read(t, d, q, 256), "the next rank's memory, mapped here")
	require.NoError(t, w.Barrier())
	require.NoError(t, d.MemsetD8(q.Add(100), 0xee, 4)) // into the next rank's memory
	require.NoError(t, d.Synchronize())
	require.NoError(t, w.Barrier())
	got := read(t, d, p, 256)
	assert.Equal(t, []byte{0xee, 0xee, 0xee, 0xee}, got[100:104], "the previous rank wrote into this rank's memory")
	require.NoError(t, d.IPCClose(q))
	assert.ErrorContains(t, d.IPCClose(q), "not a mapping IPCOpen made")
}

// newNodeComm is a NodeComm over the world on d, with the emulated NCCL
// between simulated nodes.
func newNodeComm(t *testing.T, d *Device, timeout time.Duration) *gpu.NodeComm {
	t.Helper()
	w := mpitesting.World
	topo, err := w.Topology()
	require.NoError(t, err)
	var inner gpu.Comm
	if topo.Nodes > 1 {
		id, err := mpi.BootstrapID(w, 0, UniqueID)
		require.NoError(t, err)
		inner, err = NewComm(d, w, id)
		require.NoError(t, err)
	}
	require.NoError(t, topo.Free())
	c, err := gpu.NewNodeComm(w, d, inner, timeout)
	require.NoError(t, err)
	return c
}

// settle waits until c's group is done and requires that it did not fail.
func settle(t *testing.T, c gpu.Comm) {
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

// Every rank sends every rank two blocks of 4 KiB of which only a
// rank-pair dependent prefix carries data. Rank 0 posts them in two groups,
// one block each way per group, as a rank that refused a call posts its
// headers, then the rest; the others post everything in one group. The
// prefixes arrive, and the node's IPC moved only them.
func TestNodeCommMovesOnlyTheUsedBytesAcrossGroups(t *testing.T) {
	w := mpitesting.World
	defer mpitesting.Agree(t, w)
	d := testDevice(t)
	d.SetJitter(50 * time.Microsecond)
	defer d.SetJitter(0)
	c := newNodeComm(t, d, time.Minute)
	defer func() { assert.NoError(t, c.Close()) }()
	R, me := w.Size(), w.Rank()
	const block = 4096
	used := func(src, dst, k int) int { return 64 * (1 + (3*src+5*dst+k)%7) }
	s := stream(t, d)
	src, dst := alloc(t, d, 2*R*block), alloc(t, d, 2*R*block)
	for p := 0; p < R; p++ {
		for k := 0; k < 2; k++ {
			require.NoError(t, d.MemcpyHtoD(src.Add((2*p+k)*block), patternBytes(me, p, k, block)))
		}
	}
	require.NoError(t, d.MemsetD8(dst, 0, 2*R*block))
	require.NoError(t, d.Synchronize())
	var sends, recvs [2][]gpu.Transfer // by block
	for p := 0; p < R; p++ {
		for k := 0; k < 2; k++ {
			sends[k] = append(sends[k], gpu.Transfer{Peer: p, Ptr: src.Add((2*p + k) * block), Bytes: block, Partial: p != me, Used: used(me, p, k)})
			recvs[k] = append(recvs[k], gpu.Transfer{Peer: p, Ptr: dst.Add((2*p + k) * block), Bytes: block})
		}
	}
	if me == 0 {
		for k := 0; k < 2; k++ {
			require.NoError(t, c.SendRecv(s, sends[k], recvs[k]))
			settle(t, c)
		}
	} else {
		// Between two ranks the k-th send meets the k-th receive: block 0
		// to every rank first, then block 1.
		require.NoError(t, c.SendRecv(s, append(sends[0], sends[1]...), append(recvs[0], recvs[1]...)))
		settle(t, c)
	}
	require.NoError(t, s.Synchronize())
	got := read(t, d, dst, 2*R*block)
	for p := 0; p < R; p++ {
		for k := 0; k < 2; k++ {
			n := block
			if p != me {
				n = used(p, me, k)
			}
			want := patternBytes(p, me, k, block)[:n]
			assert.Equal(t, want, got[(2*p+k)*block:][:n], "block %d from rank %d", k, p)
		}
	}
	moved, full := c.Moved()
	topo, err := w.Topology()
	require.NoError(t, err)
	var wantMoved, wantFull int64
	for p := 0; p < R; p++ {
		if p != me && topo.NodeOf[p] == topo.Node {
			wantMoved += int64(used(p, me, 0) + used(p, me, 1))
			wantFull += 2 * block
		}
	}
	require.NoError(t, topo.Free())
	assert.Equal(t, wantMoved, moved, "bytes copied from node peers")
	assert.Equal(t, wantFull, full, "bytes fixed-size transfers would have moved")
}

// A send and its receive that disagree in size fail the receiver's group,
// naming both sizes, instead of hanging.
func TestNodeCommSizesMustAgree(t *testing.T) {
	w := mpitesting.World
	if w.Size() < 2 {
		t.Skip("needs two ranks: run under mpirun")
	}
	defer mpitesting.Agree(t, w)
	topo, err := w.Topology()
	require.NoError(t, err)
	same := topo.NodeOf[0] == topo.NodeOf[1]
	require.NoError(t, topo.Free())
	if !same {
		t.Skip("ranks 0 and 1 are on different nodes")
	}
	d := testDevice(t)
	c := newNodeComm(t, d, time.Minute)
	s := stream(t, d)
	p := alloc(t, d, 64)
	switch w.Rank() {
	case 0:
		require.NoError(t, c.SendRecv(s, []gpu.Transfer{{Peer: 1, Ptr: p, Bytes: 16}}, nil))
		for c.WaitingFor() != 1 { // published: it waits for rank 1 to consume it, which it will not
			time.Sleep(time.Millisecond)
		}
		require.NoError(t, c.Abort())
	case 1:
		require.NoError(t, c.SendRecv(s, nil, []gpu.Transfer{{Peer: 0, Ptr: p, Bytes: 32}}))
		var err error
		start := time.Now()
		for err = c.AsyncError(); errors.Is(err, gpu.ErrInProgress); err = c.AsyncError() {
			gpu.Backoff(time.Since(start))
		}
		assert.ErrorContains(t, err, "transfer 0 from rank 0 has 16 bytes, its receive here 32")
		require.NoError(t, c.Abort())
	}
	require.NoError(t, c.Close())
}

// A peer that never posts holds the group: WaitingFor names it; Abort ends
// the group and every later call fails.
func TestNodeCommNamesTheSilentPeer(t *testing.T) {
	w := mpitesting.World
	if w.Size() < 2 {
		t.Skip("needs two ranks: run under mpirun")
	}
	defer mpitesting.Agree(t, w)
	topo, err := w.Topology()
	require.NoError(t, err)
	last := w.Size() - 1
	same := topo.NodeOf[0] == topo.NodeOf[last]
	require.NoError(t, topo.Free())
	if !same {
		t.Skip("rank 0 and the last rank are on different nodes")
	}
	d := testDevice(t)
	c := newNodeComm(t, d, time.Minute)
	s := stream(t, d)
	p := alloc(t, d, 64)
	if w.Rank() == 0 {
		require.NoError(t, c.SendRecv(s, nil, []gpu.Transfer{{Peer: last, Ptr: p, Bytes: 8}}))
		time.Sleep(30 * time.Millisecond)
		assert.ErrorIs(t, c.AsyncError(), gpu.ErrInProgress)
		assert.Equal(t, last, c.WaitingFor())
		require.NoError(t, c.Abort())
		assert.ErrorContains(t, c.AsyncError(), "aborted")
		assert.ErrorContains(t, c.SendRecv(s, nil, nil), "aborted")
	}
	require.NoError(t, c.Close())
}
