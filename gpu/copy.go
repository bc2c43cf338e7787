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

// Copies by address: the counterparts of Buffer's methods for code that
// keeps device addresses (DevicePtr) rather than Buffers, such as an engine
// that carves its buffers out of a few allocations. The synchronous ones
// are methods of Device and, like cuMemcpy, complete before they return;
// the asynchronous ones are queued on a Stream.

// MemcpyHtoD copies src to device address dst (cuMemcpyHtoD).
func (d *Device) MemcpyHtoD(dst DevicePtr, src []byte) error {
	if len(src) == 0 {
		return nil
	}
	if dst == 0 {
		return errors.New("gpu: MemcpyHtoD: destination address 0")
	}
	return cuErr("cuMemcpyHtoD", C.goep_cu_memcpy_htod(d.ctx, C.uint64_t(dst), unsafe.Pointer(&src[0]), C.size_t(len(src))))
}

// MemcpyDtoH copies len(dst) bytes from device address src (cuMemcpyDtoH).
func (d *Device) MemcpyDtoH(dst []byte, src DevicePtr) error {
	if len(dst) == 0 {
		return nil
	}
	if src == 0 {
		return errors.New("gpu: MemcpyDtoH: source address 0")
	}
	return cuErr("cuMemcpyDtoH", C.goep_cu_memcpy_dtoh(d.ctx, unsafe.Pointer(&dst[0]), C.uint64_t(src), C.size_t(len(dst))))
}

// MemcpyDtoD copies n bytes from src to dst on the device (cuMemcpyDtoD).
func (d *Device) MemcpyDtoD(dst, src DevicePtr, n int) error {
	if err := checkAddrs("MemcpyDtoD", dst, src, n); err != nil || n == 0 {
		return err
	}
	return cuErr("cuMemcpyDtoD", C.goep_cu_memcpy_dtod(d.ctx, C.uint64_t(dst), C.uint64_t(src), C.size_t(n)))
}

// MemsetD8 sets n bytes at dst to v (cuMemsetD8).
func (d *Device) MemsetD8(dst DevicePtr, v byte, n int) error {
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
func (s *Stream) checkStream(op string) error {
	if s == nil || s.s == nil {
		return fmt.Errorf("gpu: %s: needs a stream from NewStream, not the default or a closed one", op)
	}
	return nil
}

// hostRange is n bytes of h from off.
func (h *HostBuffer) hostRange(op string, off, n int) (unsafe.Pointer, error) {
	if off < 0 || n < 0 || off+n > h.n {
		return nil, fmt.Errorf("gpu: %s: bytes [%d, %d) out of range of %d pinned bytes", op, off, off+n, h.n)
	}
	return unsafe.Add(h.p, off), nil
}

// MemcpyHtoDAsync queues a copy of n bytes of pinned memory src from byte
// off to device address dst (cuMemcpyHtoDAsync). src must not change until
// the copy has run.
func (s *Stream) MemcpyHtoDAsync(dst DevicePtr, src *HostBuffer, off, n int) error {
	const op = "MemcpyHtoDAsync"
	if err := s.checkStream(op); err != nil {
		return err
	}
	p, err := src.hostRange(op, off, n)
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
func (s *Stream) MemcpyDtoHAsync(dst *HostBuffer, off int, src DevicePtr, n int) error {
	const op = "MemcpyDtoHAsync"
	if err := s.checkStream(op); err != nil {
		return err
	}
	p, err := dst.hostRange(op, off, n)
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
func (s *Stream) MemcpyDtoDAsync(dst, src DevicePtr, n int) error {
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
func (s *Stream) MemsetD8Async(dst DevicePtr, v byte, n int) error {
	const op = "MemsetD8Async"
	if err := s.checkStream(op); err != nil {
		return err
	}
	if err := checkAddrs(op, dst, dst, n); err != nil || n == 0 {
		return err
	}
	return cuErr("cuMemsetD8Async", C.goep_cu_memset_d8_async(s.dev.ctx, C.uint64_t(dst), C.uchar(v), C.size_t(n), s.s))
}
