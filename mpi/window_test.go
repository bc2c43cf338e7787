package mpi_test

import (
	"encoding/binary"
	"runtime"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goep/goep/internal/mpitesting"
	"github.com/goep/goep/mpi"
)

func TestSharedWindowLoadStore(t *testing.T) {
	w := mpitesting.World
	topo, err := w.Topology()
	require.NoError(t, err)
	defer func() { require.NoError(t, topo.Free()) }()
	node := topo.NodeComm
	size := func(r int) int { return 64 * (r + 1) } // ranks pass different sizes
	win, err := node.AllocateShared(size(node.Rank()))
	require.NoError(t, err)
	require.Equal(t, size(node.Rank()), len(win.Local()))
	// Each rank stores into the next rank's segment, then everyone checks its own.
	next := (node.Rank() + 1) % node.Size()
	peer, err := win.Peer(next)
	require.NoError(t, err)
	require.Equal(t, size(next), len(peer))
	for r := 0; r < node.Size(); r++ { // where lines and pages laid out from a segment's start fall
		seg, err := win.Peer(r)
		require.NoError(t, err)
		assert.Zero(t, uintptr(unsafe.Pointer(unsafe.SliceData(seg)))%mpi.SegmentAlign, "rank %d's segment starts %d bytes into a page",
			r, uintptr(unsafe.Pointer(unsafe.SliceData(seg)))%mpi.SegmentAlign)
	}
	for i := range peer {
		peer[i] = pattern(node.Rank(), next, i)
	}
	require.NoError(t, win.Sync())
	require.NoError(t, node.Barrier())
	require.NoError(t, win.Sync())
	prev := (node.Rank() + node.Size() - 1) % node.Size()
	for i, b := range win.Local() {
		require.Equal(t, pattern(prev, node.Rank(), i), b, "byte %d stored by rank %d", i, prev)
	}
	_, err = win.Peer(node.Size())
	assert.Error(t, err, "a rank beyond the communicator")
	require.NoError(t, node.Barrier())
	require.NoError(t, win.Free())
	_, err = win.Peer(0)
	assert.Error(t, err, "use after free")
	mpitesting.Agree(t, w)
}

func TestWindowPutGetAtomics(t *testing.T) {
	w := mpitesting.World
	n, me := w.Size(), w.Rank()
	// Layout on every rank: [8-byte counter][n slots of 8 bytes][payload of 16*n bytes]
	win, err := w.AllocateWindow(8 + 8*n + 16*n)
	require.NoError(t, err)
	assert.Zero(t, uintptr(unsafe.Pointer(unsafe.SliceData(win.Local())))%mpi.SegmentAlign, "this rank's part starts %d bytes into a page",
		uintptr(unsafe.Pointer(unsafe.SliceData(win.Local())))%mpi.SegmentAlign)
	require.Error(t, win.Put([]byte{1}, 0, 0), "a put outside an epoch")
	require.NoError(t, win.LockAll())

	slot := make([]byte, 8)
	binary.LittleEndian.PutUint64(slot, uint64(1000+me))
	payload := make([]byte, 16*n)
	var blocks []mpi.Block
	for target := 0; target < n; target++ {
		require.NoError(t, win.Put(slot, target, 8+8*me))
		for i := 0; i < 16; i++ {
			payload[target*16+i] = pattern(me, target, i)
		}
		blocks = append(blocks, mpi.Block{SrcOffset: target * 16, Len: 16, Target: target, DstOffset: 8 + 8*n + 16*me})
		old, err := win.FetchAndOp(0, 0, uint64(me+1), mpi.FetchAdd)
		require.NoError(t, err)
		assert.Less(t, old, uint64(n*(n+1)/2*n), "old value of the counter")
	}
	require.NoError(t, win.PutBlocks(payload, blocks))
	require.NoError(t, win.Flush(0))
	require.NoError(t, w.Barrier())
	require.NoError(t, win.Sync())

	counter, err := win.FetchAndOp(0, 0, 0, mpi.FetchNoOp)
	require.NoError(t, err)
	assert.Equal(t, uint64(n*(n*(n+1)/2)), counter, "every rank added rank+1, n times")
	local := win.Local()
	for s := 0; s < n; s++ {
		assert.Equal(t, uint64(1000+s), binary.LittleEndian.Uint64(local[8+8*s:]), "slot written by rank %d", s)
		for i := 0; i < 16; i++ {
			require.Equal(t, pattern(s, me, i), local[8+8*n+16*s+i], "block from rank %d byte %d", s, i)
		}
	}
	got := make([]byte, 8)
	other := (me + 1) % n
	require.NoError(t, win.Get(got, other, 8+8*me))
	assert.Equal(t, uint64(1000+me), binary.LittleEndian.Uint64(got), "get back what this rank put at rank %d", other)

	require.NoError(t, w.Barrier()) // everyone has checked its slots
	old, err := win.FetchAndOp(other, 8+8*me, 7, mpi.FetchReplace)
	require.NoError(t, err)
	assert.Equal(t, uint64(1000+me), old)

	var arg *mpi.ArgError
	assert.ErrorAs(t, win.Put(make([]byte, 9), other, 8+8*n+16*n-8), &arg, "a put past the end of the target's window")
	assert.ErrorAs(t, win.Put(slot, -1, 0), &arg, "a negative target rank")
	_, err = win.FetchAndOp(0, 4, 1, mpi.FetchAdd)
	assert.ErrorAs(t, err, &arg, "a misaligned atomic")

	require.NoError(t, win.UnlockAll())
	require.NoError(t, win.Free())
	mpitesting.Agree(t, w)
}

// Opening an epoch must not need the peers' MPI progress. Across hosts (Open
// MPI's osc/ucx over TCP) a lock taken with remote atomics completes only when
// the target next calls MPI, so a rank locking while its peers poll memory, as
// ep's waits do, would wait for them while they wait for it (docs/cluster.md). Here
// rank 0 locks while every other rank stays out of MPI for a while; LockAll
// must return before they come back.
func TestLockAllWhilePeersAreOutOfMPI(t *testing.T) {
	w := mpitesting.World
	defer mpitesting.Agree(t, w)
	win, err := w.AllocateWindow(8)
	require.NoError(t, err)
	defer func() { require.NoError(t, win.Free()) }()
	require.NoError(t, w.Barrier())
	const away = 1500 * time.Millisecond
	start := time.Now()
	if w.Rank() == 0 {
		require.NoError(t, win.LockAll())
		assert.Less(t, time.Since(start), away, "LockAll waited for ranks that were not calling MPI")
	} else {
		for time.Since(start) < away { // no MPI call here
			runtime.Gosched()
		}
		require.NoError(t, win.LockAll())
	}
	require.NoError(t, w.Barrier())
}

// A rank that polls its window for a peer's put must drive MPI progress
// (Window.Progress) while it waits: across hosts osc/ucx over TCP completes a
// put, and the origin's flush, only when the target calls MPI. Rank 0 puts a
// flag into every other rank's window; they poll it with loads, calling
// Progress between polls, and give up after a deadline.
func TestProgressWhilePollingServesPuts(t *testing.T) {
	w := mpitesting.World
	defer mpitesting.Agree(t, w)
	win, err := w.AllocateWindow(8)
	require.NoError(t, err)
	defer func() { require.NoError(t, win.Free()) }()
	require.NoError(t, win.LockAll())
	require.NoError(t, w.Barrier())
	const deadline = 20 * time.Second
	if w.Rank() == 0 {
		word := binary.LittleEndian.AppendUint64(nil, 1)
		var blocks []mpi.Block
		for r := 1; r < w.Size(); r++ {
			blocks = append(blocks, mpi.Block{Len: 8, Target: r})
		}
		require.NoError(t, win.PutBlocks(word, blocks))
	} else {
		flag := (*uint64)(unsafe.Pointer(&win.Local()[0]))
		start := time.Now()
		for atomic.LoadUint64(flag) != 1 {
			if time.Since(start) > deadline {
				t.Errorf("rank %d: rank 0's put did not arrive within %v", w.Rank(), deadline)
				break
			}
			require.NoError(t, win.Progress())
		}
	}
	require.NoError(t, w.Barrier())
}
