package mpi

import (
	"errors"
	"fmt"
	"unsafe"
)

// SharedWindow is memory allocated collectively on a communicator whose ranks
// share memory (a node communicator from Topology): every rank can load from
// and store to every rank's segment directly. It is the CPU counterpart of
// NCCL's LSA (load/store accessible) window. The memory starts zeroed, is not
// on the Go heap, and stays valid until Free. Every segment starts at a
// multiple of SegmentAlign, in every process, so that what a caller lays out
// on cache lines or pages from a segment's start sits on them.
type SharedWindow struct {
	comm  *Comm
	h     winHandle
	peers [][]byte
	freed bool
}

// Local is this rank's segment. It is not collective.
func (w *SharedWindow) Local() []byte { return w.peers[w.comm.rank] }

// Peer is rank r's segment, mapped into this process. It is not collective.
func (w *SharedWindow) Peer(r int) ([]byte, error) {
	if w.freed {
		return nil, argErrorf("SharedWindow.Peer", "window has been freed")
	}
	if err := w.comm.checkRank("SharedWindow.Peer", "rank", r); err != nil {
		return nil, err
	}
	return w.peers[r], nil
}

// Free releases the window. It is collective.
func (w *SharedWindow) Free() error {
	if w.freed {
		return nil
	}
	w.freed = true
	return w.h.free()
}

// Window is memory allocated collectively for one-sided communication: ranks
// put into and atomically update other ranks' windows without their
// participation. It is the CPU counterpart of NCCL's GIN (put with signal).
// The memory starts zeroed, and every rank's part at a multiple of
// SegmentAlign.
// Put, Get and the atomics must be called inside a LockAll/UnlockAll epoch.
type Window struct {
	comm   *Comm
	h      winHandle
	local  []byte
	sizes  []int   // bytes on every rank
	skip   []int64 // where each rank's part starts in its MPI window: what a displacement adds
	locked bool
	freed  bool
}

// Local is this rank's part of the window. It is not collective.
func (w *Window) Local() []byte { return w.local }

// Block is one contiguous transfer of PutBlocks.
type Block struct {
	SrcOffset int // offset in the origin buffer
	Len       int // bytes
	Target    int // rank
	DstOffset int // offset in the target's window
}

// FetchOp is an atomic operation on a 64-bit word of a window.
type FetchOp int

// Atomic operations of FetchAndOp.
const (
	FetchAdd     FetchOp = iota + 1 // add the operand, return the old value
	FetchReplace                    // store the operand, return the old value
	FetchNoOp                       // only read the value, atomically
)

func (w *Window) check(call string) error {
	if w.freed {
		return argErrorf(call, "window has been freed")
	}
	if !w.locked {
		return argErrorf(call, "no LockAll epoch is open on this window")
	}
	return nil
}

func (w *Window) checkTarget(call string, target, offset, n int) error {
	if err := w.comm.checkRank(call, "target", target); err != nil {
		return err
	}
	if offset < 0 || n < 0 {
		return argErrorf(call, "offset %d and length %d must not be negative", offset, n)
	}
	if offset+n > w.sizes[target] {
		return argErrorf(call, "bytes [%d, %d) lie beyond rank %d's window of %d bytes", offset, offset+n, target, w.sizes[target])
	}
	return nil
}

// LockAll opens a passive-target access epoch to every rank
// (MPI_Win_lock_all with MPI_MODE_NOCHECK: a Window has no exclusive locks).
// It does not communicate, so it never waits for a peer, even one that is not
// calling MPI. It is not collective.
func (w *Window) LockAll() error {
	if w.freed {
		return argErrorf("Window.LockAll", "window has been freed")
	}
	if w.locked {
		return argErrorf("Window.LockAll", "an epoch is already open")
	}
	if err := w.h.lockAll(); err != nil {
		return err
	}
	w.locked = true
	return nil
}

// UnlockAll closes the epoch, completing every operation. It is not
// collective.
func (w *Window) UnlockAll() error {
	if err := w.check("Window.UnlockAll"); err != nil {
		return err
	}
	w.locked = false
	return w.h.unlockAll()
}

// Put writes src into target's window at offset. It returns once src may be
// reused; the data is visible at the target after Flush.
func (w *Window) Put(src []byte, target, offset int) error {
	if err := w.check("Window.Put"); err != nil {
		return err
	}
	if err := w.checkTarget("Window.Put", target, offset, len(src)); err != nil {
		return err
	}
	return w.PutBlocks(src, []Block{{SrcOffset: 0, Len: len(src), Target: target, DstOffset: offset}})
}

// PutBlocks does every transfer of blocks from origin in one call and flushes
// them: when it returns, the data is in the targets' windows.
func (w *Window) PutBlocks(origin []byte, blocks []Block) error {
	if err := w.check("Window.PutBlocks"); err != nil {
		return err
	}
	for i, b := range blocks {
		if err := w.checkTarget("Window.PutBlocks", b.Target, b.DstOffset, b.Len); err != nil {
			return fmt.Errorf("block %d: %w", i, err)
		}
		if b.SrcOffset < 0 || b.SrcOffset+b.Len > len(origin) {
			return argErrorf("Window.PutBlocks", "block %d reads origin[%d:%d] beyond len(origin) = %d", i, b.SrcOffset, b.SrcOffset+b.Len, len(origin))
		}
	}
	return w.h.putBlocks(origin, blocks, w.skip)
}

// Get reads len(dst) bytes of target's window at offset into dst, and returns
// when they are there.
func (w *Window) Get(dst []byte, target, offset int) error {
	if err := w.check("Window.Get"); err != nil {
		return err
	}
	if err := w.checkTarget("Window.Get", target, offset, len(dst)); err != nil {
		return err
	}
	return w.h.get(dst, target, offset+int(w.skip[target]))
}

// FetchAndOp applies op with operand to the 64-bit word at offset in target's
// window, atomically, and returns the value it held. offset must be a
// multiple of 8.
func (w *Window) FetchAndOp(target, offset int, operand uint64, op FetchOp) (uint64, error) {
	if err := w.check("Window.FetchAndOp"); err != nil {
		return 0, err
	}
	if err := w.checkTarget("Window.FetchAndOp", target, offset, 8); err != nil {
		return 0, err
	}
	if offset%8 != 0 {
		return 0, argErrorf("Window.FetchAndOp", "offset %d is not a multiple of 8", offset)
	}
	if op < FetchAdd || op > FetchNoOp {
		return 0, argErrorf("Window.FetchAndOp", "unknown operation %d", op)
	}
	return w.h.fetchAndOp(target, offset+int(w.skip[target]), operand, op)
}

// Flush completes every operation this rank issued to target (MPI_Win_flush).
func (w *Window) Flush(target int) error {
	if err := w.check("Window.Flush"); err != nil {
		return err
	}
	if err := w.comm.checkRank("Window.Flush", "target", target); err != nil {
		return err
	}
	return w.h.flush(target)
}

// Sync makes this rank's view of its own window memory consistent with
// completed remote updates (MPI_Win_sync), before polling it with loads.
func (w *Window) Sync() error {
	if err := w.check("Window.Sync"); err != nil {
		return err
	}
	return w.h.sync()
}

// Progress lets MPI make progress on the window's communicator without
// waiting for anything (MPI_Iprobe). A rank that polls its window memory for
// a peer's data must call it now and then: with some transports (Open MPI's
// osc/ucx over TCP, between hosts) a put, a get, an atomic and the origin's
// flush complete only while the target calls MPI. It is not collective.
func (w *Window) Progress() error {
	if w.freed {
		return argErrorf("Window.Progress", "window has been freed")
	}
	return w.h.progress()
}

// Raw is the MPI_Win handle as an integer, for cgo code in other packages
// linked against the same MPI (zero without the mpi build tag).
func (w *Window) Raw() uintptr { return w.h.raw() }

// Free releases the window (closing an open epoch first). It is collective.
func (w *Window) Free() error {
	if w.freed {
		return nil
	}
	if w.locked {
		w.locked = false
		if err := w.h.unlockAll(); err != nil {
			return err
		}
	}
	w.freed = true
	return w.h.free()
}

// SegmentAlign is where a SharedWindow's segments and a Window's parts
// start: at a multiple of it (a page).
const SegmentAlign = 4096

// toAlign is how many bytes of mem come before its first multiple of
// SegmentAlign.
func toAlign(mem []byte) int {
	return int(-uintptr(unsafe.Pointer(unsafe.SliceData(mem)))) & (SegmentAlign - 1)
}

// AllocateShared allocates size bytes on every rank of c, which must share
// memory (use Topology().NodeComm). Ranks may pass different sizes. It is
// collective.
func (c *Comm) AllocateShared(size int) (*SharedWindow, error) {
	if err := c.checkUsable("AllocateShared"); err != nil {
		return nil, err
	}
	if size < 0 {
		return nil, argErrorf("AllocateShared", "size %d is negative", size)
	}
	sizes := make([]int64, c.size)
	if err := AllgatherSlice(c, []int64{int64(size)}, sizes); err != nil {
		return nil, err
	}
	w, err := c.allocateShared(size + SegmentAlign)
	if err != nil {
		return nil, err
	}
	// MPI may report segments rounded up to a page, and may start them
	// anywhere (Open MPI: 264 bytes into a page, so that a "64-byte" line
	// laid out from the start spans two and shares one with its
	// neighbour): keep what was asked for, from the first multiple of
	// SegmentAlign. A segment is mapped at the same offset in a page in
	// every process, so every process skips the same bytes.
	for r, n := range sizes {
		seg := w.peers[r]
		skip := toAlign(seg)
		if skip+int(n) > len(seg) { // the same on every rank: so is the Free
			return nil, errors.Join(fmt.Errorf("mpi: AllocateShared: rank %d's segment is %d bytes, want %d from byte %d", r, len(seg), n, skip), w.h.free())
		}
		w.peers[r] = seg[skip : skip+int(n) : skip+int(n)]
	}
	clear(w.Local())
	if err := c.Barrier(); err != nil { // nobody stores before everyone has cleared
		return nil, err
	}
	return w, nil
}

// AllocateWindow allocates size bytes on every rank of c for one-sided
// communication. Ranks may pass different sizes. It is collective.
func (c *Comm) AllocateWindow(size int) (*Window, error) {
	if err := c.checkUsable("AllocateWindow"); err != nil {
		return nil, err
	}
	if size < 0 {
		return nil, argErrorf("AllocateWindow", "size %d is negative", size)
	}
	sizes := make([]int64, c.size)
	if err := AllgatherSlice(c, []int64{int64(size)}, sizes); err != nil {
		return nil, err
	}
	w, err := c.allocateWindow(size + SegmentAlign)
	if err != nil {
		return nil, err
	}
	// As AllocateShared's segments: MPI may start a rank's part anywhere
	// (Open MPI: 8 or 40 bytes past a cache line, differing between ranks).
	// Each rank's part starts at its first multiple of SegmentAlign, and
	// every rank learns where, to add it to its displacements there.
	skip := toAlign(w.local)
	w.local = w.local[skip : skip+size : skip+size]
	w.skip = make([]int64, c.size)
	if err := AllgatherSlice(c, []int64{int64(skip)}, w.skip); err != nil {
		return nil, errors.Join(err, w.h.free())
	}
	w.sizes = make([]int, c.size)
	for r, n := range sizes {
		w.sizes[r] = int(n)
	}
	clear(w.local)
	if err := c.Barrier(); err != nil { // nobody writes before everyone has cleared
		return nil, err
	}
	return w, nil
}
