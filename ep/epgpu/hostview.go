package epgpu

import (
	"unsafe"

	"github.com/goep/goep/gpu"
)

// Views of host buffers (memory outside the Go heap, page-aligned) as
// numbers; off is in bytes and a multiple of the element's size.

func i32s(h gpu.HostBuffer, off, n int) []int32 {
	if n == 0 {
		return nil
	}
	b := h.Bytes()[off : off+4*n]
	return unsafe.Slice((*int32)(unsafe.Pointer(&b[0])), n)
}

func f32s(h gpu.HostBuffer, off, n int) []float32 {
	if n == 0 {
		return nil
	}
	b := h.Bytes()[off : off+4*n]
	return unsafe.Slice((*float32)(unsafe.Pointer(&b[0])), n)
}

func u64s(h gpu.HostBuffer, off, n int) []uint64 {
	if n == 0 {
		return nil
	}
	b := h.Bytes()[off : off+8*n]
	return unsafe.Slice((*uint64)(unsafe.Pointer(&b[0])), n)
}
