//go:build mpi

package mpi

/*
#cgo pkg-config: ompi
#include <stdlib.h>
#include "shim_mpi.h"

static int goep_fetch_and_op(MPI_Win win, int target, int64_t off, uint64_t operand, int op, uint64_t *old) {
	MPI_Op mop = op == 1 ? MPI_SUM : (op == 2 ? MPI_REPLACE : MPI_NO_OP);
	int rc = MPI_Fetch_and_op(&operand, old, MPI_UINT64_T, target, (MPI_Aint)off, mop, win);
	if (rc != MPI_SUCCESS) return rc;
	return MPI_Win_flush(target, win);
}

static int goep_get(MPI_Win win, void *dst, int64_t n, int target, int64_t off) {
	int64_t done = 0;
	while (done < n) {
		int chunk = n - done > (1 << 30) ? (1 << 30) : (int)(n - done);
		int rc = MPI_Get((char *)dst + done, chunk, MPI_BYTE, target, (MPI_Aint)(off + done), chunk, MPI_BYTE, win);
		if (rc != MPI_SUCCESS) return rc;
		done += chunk;
	}
	return MPI_Win_flush(target, win);
}
*/
import "C"

import (
	"unsafe"
)

// Block must have goep_block's layout: four 8-byte ints.
var _ [unsafe.Sizeof(Block{}) - 32]byte
var _ [32 - unsafe.Sizeof(Block{})]byte
var _ [unsafe.Offsetof(Block{}.DstOffset) - 24]byte

type winHandle struct {
	w      C.MPI_Win
	comm   *Comm
	shared bool
}

func (c *Comm) newInfo(pairs ...string) (C.MPI_Info, error) {
	var info C.MPI_Info
	if rc := C.MPI_Info_create(&info); rc != C.MPI_SUCCESS {
		return info, mpiError("MPI_Info_create", rc)
	}
	for i := 0; i+1 < len(pairs); i += 2 {
		k, v := C.CString(pairs[i]), C.CString(pairs[i+1])
		rc := C.MPI_Info_set(info, k, v)
		C.free(unsafe.Pointer(k))
		C.free(unsafe.Pointer(v))
		if rc != C.MPI_SUCCESS {
			return info, mpiError("MPI_Info_set", rc)
		}
	}
	return info, nil
}

func (c *Comm) allocateShared(size int) (*SharedWindow, error) {
	if err := c.Barrier(); err != nil { // a missing peer fails here, with a timeout
		return nil, err
	}
	info, err := c.newInfo("alloc_shared_noncontig", "true")
	if err != nil {
		return nil, err
	}
	defer C.MPI_Info_free(&info)
	var base unsafe.Pointer
	var win C.MPI_Win
	if rc := C.MPI_Win_allocate_shared(C.MPI_Aint(size), 1, info, c.h.c, unsafe.Pointer(&base), &win); rc != C.MPI_SUCCESS {
		return nil, mpiError("MPI_Win_allocate_shared", rc)
	}
	h := winHandle{w: win, comm: c, shared: true}
	if rc := C.MPI_Win_set_errhandler(win, C.MPI_ERRORS_RETURN); rc != C.MPI_SUCCESS {
		return nil, mpiError("MPI_Win_set_errhandler", rc)
	}
	// A passive epoch for the window's lifetime makes MPI_Win_sync legal.
	if rc := C.MPI_Win_lock_all(C.MPI_MODE_NOCHECK, win); rc != C.MPI_SUCCESS {
		return nil, mpiError("MPI_Win_lock_all", rc)
	}
	w := &SharedWindow{comm: c, h: h, peers: make([][]byte, c.size)}
	for r := 0; r < c.size; r++ {
		var sz C.MPI_Aint
		var unit C.int
		var p unsafe.Pointer
		if rc := C.MPI_Win_shared_query(win, C.int(r), &sz, &unit, unsafe.Pointer(&p)); rc != C.MPI_SUCCESS {
			return nil, mpiError("MPI_Win_shared_query", rc)
		}
		if sz > 0 && p != nil {
			w.peers[r] = unsafe.Slice((*byte)(p), int(sz))
		} else {
			w.peers[r] = []byte{}
		}
	}
	return w, nil
}

func (c *Comm) allocateWindow(size int) (*Window, error) {
	if err := c.Barrier(); err != nil {
		return nil, err
	}
	var base unsafe.Pointer
	var win C.MPI_Win
	if rc := C.MPI_Win_allocate(C.MPI_Aint(size), 1, C.MPI_INFO_NULL, c.h.c, unsafe.Pointer(&base), &win); rc != C.MPI_SUCCESS {
		return nil, mpiError("MPI_Win_allocate", rc)
	}
	if rc := C.MPI_Win_set_errhandler(win, C.MPI_ERRORS_RETURN); rc != C.MPI_SUCCESS {
		return nil, mpiError("MPI_Win_set_errhandler", rc)
	}
	w := &Window{comm: c, h: winHandle{w: win, comm: c}, local: []byte{}}
	if size > 0 && base != nil {
		w.local = unsafe.Slice((*byte)(base), size)
	}
	return w, nil
}

func (h winHandle) free() error {
	if h.shared {
		if rc := C.MPI_Win_unlock_all(h.w); rc != C.MPI_SUCCESS {
			return mpiError("MPI_Win_unlock_all", rc)
		}
	}
	if err := h.comm.Barrier(); err != nil { // MPI_Win_free blocks on every peer
		return err
	}
	w := h.w
	if rc := C.MPI_Win_free(&w); rc != C.MPI_SUCCESS {
		return mpiError("MPI_Win_free", rc)
	}
	return nil
}

// lockAll opens the epoch with MPI_MODE_NOCHECK. The assertion holds: Window
// has no exclusive locks, so no lock can conflict with this shared one. It
// matters across hosts: without it Open MPI's osc/ucx takes a shared lock on
// every target with remote atomics, which over TCP complete only when the
// target next calls MPI, so lock_all waits for ranks that poll window memory
// without calling MPI, as ep's waits do (docs/cluster.md). With it, lock_all does
// not communicate at all, and unlock_all only flushes.
func (h winHandle) lockAll() error {
	if rc := C.MPI_Win_lock_all(C.MPI_MODE_NOCHECK, h.w); rc != C.MPI_SUCCESS {
		return mpiError("MPI_Win_lock_all", rc)
	}
	return nil
}

func (h winHandle) unlockAll() error {
	if rc := C.MPI_Win_unlock_all(h.w); rc != C.MPI_SUCCESS {
		return mpiError("MPI_Win_unlock_all", rc)
	}
	return nil
}

func (h winHandle) putBlocks(origin []byte, blocks []Block, skip []int64) error {
	if len(blocks) == 0 {
		return nil
	}
	// Block is goep_block (four int64s in the same order): no copy.
	r := int64(C.goep_put_blocks(h.w, ptr(origin), (*C.goep_block)(unsafe.Pointer(&blocks[0])), C.int(len(blocks)),
		(*C.int64_t)(unsafe.Pointer(&skip[0]))))
	if r == 0 {
		return nil
	}
	if r>>32 == 0 {
		return mpiError("MPI_Win_flush_all", C.int(r))
	}
	return mpiError("MPI_Put", C.int(uint32(r)))
}

func (h winHandle) get(dst []byte, target, offset int) error {
	if rc := C.goep_get(h.w, ptr(dst), C.int64_t(len(dst)), C.int(target), C.int64_t(offset)); rc != C.MPI_SUCCESS {
		return mpiError("MPI_Get", rc)
	}
	return nil
}

func (h winHandle) fetchAndOp(target, offset int, operand uint64, op FetchOp) (uint64, error) {
	var old C.uint64_t
	if rc := C.goep_fetch_and_op(h.w, C.int(target), C.int64_t(offset), C.uint64_t(operand), C.int(op), &old); rc != C.MPI_SUCCESS {
		return 0, mpiError("MPI_Fetch_and_op", rc)
	}
	return uint64(old), nil
}

func (h winHandle) flush(target int) error {
	if rc := C.MPI_Win_flush(C.int(target), h.w); rc != C.MPI_SUCCESS {
		return mpiError("MPI_Win_flush", rc)
	}
	return nil
}

func (h winHandle) sync() error {
	if rc := C.MPI_Win_sync(h.w); rc != C.MPI_SUCCESS {
		return mpiError("MPI_Win_sync", rc)
	}
	return nil
}

func (h winHandle) progress() error {
	if rc := C.goep_iprobe_any(h.comm.h.c); rc != C.MPI_SUCCESS {
		return mpiError("MPI_Iprobe", rc)
	}
	return nil
}

func (h winHandle) raw() uintptr { return uintptr(unsafe.Pointer(h.w)) }

// Sync is MPI_Win_sync on the shared window: a full memory barrier that
// orders this rank's loads and stores on the window.
func (w *SharedWindow) Sync() error { return w.h.sync() }

// Raw is the MPI_Win handle as an integer, for cgo code in other packages.
func (w *SharedWindow) Raw() uintptr { return w.h.raw() }
