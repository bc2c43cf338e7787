//go:build !mpi

package mpi

import (
	"sync/atomic"
	"syscall"
	"unsafe"
)

// winHandle is anonymous mapped memory: outside the Go heap, like MPI's.
type winHandle struct{ mem []byte }

func mapMemory(size int) (winHandle, error) {
	if size == 0 {
		return winHandle{mem: []byte{}}, nil
	}
	mem, err := syscall.Mmap(-1, 0, size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		return winHandle{}, &Error{Call: "mmap", Code: -1, Msg: err.Error()}
	}
	return winHandle{mem: mem}, nil
}

func (c *Comm) allocateShared(size int) (*SharedWindow, error) {
	h, err := mapMemory(size)
	if err != nil {
		return nil, err
	}
	return &SharedWindow{comm: c, h: h, peers: [][]byte{h.mem}}, nil
}

func (c *Comm) allocateWindow(size int) (*Window, error) {
	h, err := mapMemory(size)
	if err != nil {
		return nil, err
	}
	return &Window{comm: c, h: h, local: h.mem}, nil
}

func (h winHandle) free() error {
	if len(h.mem) == 0 {
		return nil
	}
	return syscall.Munmap(h.mem)
}

func (h winHandle) lockAll() error   { return nil }
func (h winHandle) unlockAll() error { return nil }
func (h winHandle) progress() error  { return nil }

func (h winHandle) putBlocks(origin []byte, blocks []Block, skip []int64) error {
	for _, b := range blocks {
		at := int(skip[b.Target]) + b.DstOffset
		if at+b.Len > len(h.mem) {
			return &Error{Call: "MPI_Put", Code: -1, Msg: "target range beyond the window"}
		}
		copy(h.mem[at:at+b.Len], origin[b.SrcOffset:b.SrcOffset+b.Len])
	}
	return nil
}

func (h winHandle) get(dst []byte, target, offset int) error {
	if offset+len(dst) > len(h.mem) {
		return &Error{Call: "MPI_Get", Code: -1, Msg: "target range beyond the window"}
	}
	copy(dst, h.mem[offset:])
	return nil
}

func (h winHandle) fetchAndOp(target, offset int, operand uint64, op FetchOp) (uint64, error) {
	if offset+8 > len(h.mem) {
		return 0, &Error{Call: "MPI_Fetch_and_op", Code: -1, Msg: "target range beyond the window"}
	}
	p := (*uint64)(unsafe.Pointer(&h.mem[offset]))
	switch op {
	case FetchAdd:
		return atomic.AddUint64(p, operand) - operand, nil
	case FetchReplace:
		return atomic.SwapUint64(p, operand), nil
	}
	return atomic.LoadUint64(p), nil
}

func (h winHandle) flush(target int) error { return nil }
func (h winHandle) sync() error            { return nil }
func (h winHandle) raw() uintptr           { return 0 }

// Sync orders loads and stores on the window (a no-op with one rank).
func (w *SharedWindow) Sync() error { return nil }

// Raw is zero: there is no MPI_Win without the mpi build tag.
func (w *SharedWindow) Raw() uintptr { return 0 }
