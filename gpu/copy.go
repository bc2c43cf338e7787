package gpu

/*
#include "shim.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"unsafe"
)

// Memory and copies by address: the counterparts of Buffer's methods for
// code that keeps device addresses (DevicePtr) rather than Buffers, such as
// an engine that carves its buffers out of a few allocations, and the part
// of the Device and Stream interfaces that CUDA implements. The synchronous
// copies are methods of CUDADevice with the driver's own synchronization
// (Device says which complete before they return: only MemcpyDtoH); the
// asynchronous ones are queued on a CUDAStream.

// MemAlloc returns the address of n bytes of device memory, not
// initialised (cuMemAlloc; n = 0 allocates one byte, so that every
// allocation has an address), to be released by MemFree.
func (d *CUDADevice) MemAlloc(n int) (DevicePtr, error) {
	if n < 0 {
		return 0, fmt.Errorf("gpu: MemAlloc: negative size %d", n)
	}
	var p C.uint64_t
	if err := cuErr("cuMemAlloc", C.goep_cu_mem_alloc(d.ctx, &p, C.size_t(max(n, 1)))); err != nil {
		return 0, fmt.Errorf("%w (allocating %d bytes on %v)", err, n, d)
	}
	return DevicePtr(p), nil
}

// MemFree releases memory that MemAlloc returned (cuMemFree, which waits
// for the device's queued work first).
func (d *CUDADevice) MemFree(p DevicePtr) error {
	if p == 0 {
		return errors.New("gpu: MemFree: address 0")
	}
	if err := cuErr("cuMemFree", C.goep_cu_mem_free(d.ctx, C.uint64_t(p))); err != nil {
		return fmt.Errorf("%w (freeing %#x on %v)", err, uint64(p), d)
	}
	return nil
}

// MemcpyHtoD copies src to device address dst (cuMemcpyHtoD): it returns
// once src has been read; the bytes land when the legacy stream gets to
// them.
func (d *CUDADevice) MemcpyHtoD(dst DevicePtr, src []byte) error {
	if len(src) == 0 {
		return nil
	}
	if dst == 0 {
		return errors.New("gpu: MemcpyHtoD: destination address 0")
	}
	return cuErr("cuMemcpyHtoD", C.goep_cu_memcpy_htod(d.ctx, C.uint64_t(dst), unsafe.Pointer(&src[0]), C.size_t(len(src))))
}

// MemcpyDtoH copies len(dst) bytes from device address src (cuMemcpyDtoH),
// after the legacy stream's earlier work.
func (d *CUDADevice) MemcpyDtoH(dst []byte, src DevicePtr) error {
	if len(dst) == 0 {
		return nil
	}
	if src == 0 {
		return errors.New("gpu: MemcpyDtoH: source address 0")
	}
	return cuErr("cuMemcpyDtoH", C.goep_cu_memcpy_dtoh(d.ctx, unsafe.Pointer(&dst[0]), C.uint64_t(src), C.size_t(len(dst))))
}

// MemcpyDtoD queues a copy of n bytes from src to dst on the legacy stream
// (cuMemcpyDtoD).
func (d *CUDADevice) MemcpyDtoD(dst, src DevicePtr, n int) error {
	if err := checkAddrs("MemcpyDtoD", dst, src, n); err != nil || n == 0 {
		return err
	}
	return cuErr("cuMemcpyDtoD", C.goep_cu_memcpy_dtod(d.ctx, C.uint64_t(dst), C.uint64_t(src), C.size_t(n)))
}

// MemsetD8 queues setting n bytes at dst to v on the legacy stream
// (cuMemsetD8).
func (d *CUDADevice) MemsetD8(dst DevicePtr, v byte, n int) error {
	if err := checkAddrs("MemsetD8", dst, dst, n); err != nil || n == 0 {
		return err
	}
	return cuErr("cuMemsetD8", C.goep_cu_memset_d8(d.ctx, C.uint64_t(dst), C.uchar(v), C.size_t(n)))
}

func checkAddrs(op string, dst, src DevicePtr, n int) error {
	switch {
	case n < 0:
		return fmt.Errorf("gpu: %s: negative size %d", op, n)
	case n > 0 && (dst == 0 || src == 0):
		return fmt.Errorf("gpu: %s: address 0", op)
	}
	return nil
}

// checkStream refuses the nil (default) stream, on which asynchronous
// copies by address are not offered: an engine orders its work on its own
// streams.
func (s *CUDAStream) checkStream(op string) error {
	if s == nil || s.s == nil {
		return fmt.Errorf("gpu: %s: needs a stream from NewStream, not the default or a closed one", op)
	}
	return nil
}

// hostRange is n bytes of h, pinned memory of a CUDA device, from off.
func hostRange(op string, h HostBuffer, off, n int) (unsafe.Pointer, error) {
	ch, err := cudaHost(op, h)
	if err != nil {
		return nil, err
	}
	return ch.hostRange(op, off, n)
}

func (h *CUDAHostBuffer) hostRange(op string, off, n int) (unsafe.Pointer, error) {
	if off < 0 || n < 0 || off+n > h.n {
		return nil, fmt.Errorf("gpu: %s: bytes [%d, %d) out of range of %d pinned bytes", op, off, off+n, h.n)
	}
	return unsafe.Add(h.p, off), nil
}

// MemcpyHtoDAsync queues a copy of n bytes of pinned memory src from byte
// off to device address dst (cuMemcpyHtoDAsync). src must not change until
// the copy has run.
func (s *CUDAStream) MemcpyHtoDAsync(dst DevicePtr, src HostBuffer, off, n int) error {
	const op = "MemcpyHtoDAsync"
	if err := s.checkStream(op); err != nil {
		return err
	}
	p, err := hostRange(op, src, off, n)
	if err != nil || n == 0 {
		return err
	}
	if dst == 0 {
		return fmt.Errorf("gpu: %s: destination address 0", op)
	}
	return cuErr("cuMemcpyHtoDAsync", C.goep_cu_memcpy_htod_async(s.dev.ctx, C.uint64_t(dst), p, C.size_t(n), s.s))
}

// MemcpyDtoHAsync queues a copy of n bytes at device address src into
// pinned memory dst from byte off (cuMemcpyDtoHAsync): dst holds them once
// the stream has run it.
func (s *CUDAStream) MemcpyDtoHAsync(dst HostBuffer, off int, src DevicePtr, n int) error {
	const op = "MemcpyDtoHAsync"
	if err := s.checkStream(op); err != nil {
		return err
	}
	p, err := hostRange(op, dst, off, n)
	if err != nil || n == 0 {
		return err
	}
	if src == 0 {
		return fmt.Errorf("gpu: %s: source address 0", op)
	}
	return cuErr("cuMemcpyDtoHAsync", C.goep_cu_memcpy_dtoh_async(s.dev.ctx, p, C.uint64_t(src), C.size_t(n), s.s))
}

// MemcpyDtoDAsync queues a device-to-device copy of n bytes
// (cuMemcpyDtoDAsync).
func (s *CUDAStream) MemcpyDtoDAsync(dst, src DevicePtr, n int) error {
	const op = "MemcpyDtoDAsync"
	if err := s.checkStream(op); err != nil {
		return err
	}
	if err := checkAddrs(op, dst, src, n); err != nil || n == 0 {
		return err
	}
	return cuErr("cuMemcpyDtoDAsync", C.goep_cu_memcpy_dtod_async(s.dev.ctx, C.uint64_t(dst), C.uint64_t(src), C.size_t(n), s.s))
}

// MemsetD8Async queues setting n bytes at dst to v (cuMemsetD8Async).
func (s *CUDAStream) MemsetD8Async(dst DevicePtr, v byte, n int) error {
	const op = "MemsetD8Async"
	if err := s.checkStream(op); err != nil {
		return err
	}
	if err := checkAddrs(op, dst, dst, n); err != nil || n == 0 {
		return err
	}
	return cuErr("cuMemsetD8Async", C.goep_cu_memset_d8_async(s.dev.ctx, C.uint64_t(dst), C.uchar(v), C.size_t(n), s.s))
}
