package epgpu

import (
	"fmt"

	"github.com/goep/goep/ep/driver"
	"github.com/goep/goep/gpu"
)

// memory is a device's memory as package ep sees it: tensors are device
// addresses, moved to and from the host only by copies that first wait for
// the work queued on the device's streams, and that have landed when they
// return (a synchronous copy to the device lands later, on the legacy
// stream, which the engine's streams do not wait for). It is a value: tensors compare
// memories with ==, and two memories of one device are equal.
type memory struct{ dev gpu.Device }

func (m memory) String() string { return m.dev.String() }

// Alloc returns n zeroed bytes of device memory.
func (m memory) Alloc(n int) (driver.Tensor[byte], error) {
	if n < 0 {
		return driver.Tensor[byte]{}, fmt.Errorf("epgpu: %v: Alloc of %d bytes", m, n)
	}
	p, err := m.dev.MemAlloc(n)
	if err != nil {
		return driver.Tensor[byte]{}, err
	}
	if err := m.dev.MemsetD8(p, 0, n); err != nil {
		return driver.Tensor[byte]{}, err
	}
	if err := m.dev.Synchronize(); err != nil {
		return driver.Tensor[byte]{}, err
	}
	return driver.OnDevice[byte](m, uint64(p), n), nil
}

// Free releases memory that Alloc returned, once the work queued on the
// device has run.
func (m memory) Free(t driver.Tensor[byte]) error {
	if err := m.mine("Free", t); err != nil {
		return err
	}
	if err := m.dev.Synchronize(); err != nil {
		return err
	}
	return m.dev.MemFree(ptrOf(t))
}

// Upload copies src into dst once the work queued on the device has run,
// and returns once the bytes are there.
func (m memory) Upload(dst driver.Tensor[byte], src []byte) error {
	if err := m.mine("Upload", dst); err != nil {
		return err
	}
	if dst.Len() != len(src) {
		return fmt.Errorf("epgpu: %v: Upload of %d bytes into %d", m, len(src), dst.Len())
	}
	if err := m.dev.Synchronize(); err != nil {
		return err
	}
	if err := m.dev.MemcpyHtoD(ptrOf(dst), src); err != nil {
		return err
	}
	return m.dev.Synchronize()
}

// Download copies src into dst once the work queued on the device has run.
func (m memory) Download(dst []byte, src driver.Tensor[byte]) error {
	if err := m.mine("Download", src); err != nil {
		return err
	}
	if src.Len() != len(dst) {
		return fmt.Errorf("epgpu: %v: Download of %d bytes into %d", m, src.Len(), len(dst))
	}
	if err := m.dev.Synchronize(); err != nil {
		return err
	}
	return m.dev.MemcpyDtoH(dst, ptrOf(src))
}

func (m memory) mine(op string, t driver.Tensor[byte]) error {
	if t.Memory() != driver.Memory(m) {
		return fmt.Errorf("epgpu: %v: %s of %v", m, op, t)
	}
	return nil
}

// CopyOnDevice copies src into dst, two tensors of the same length in the
// memory of a GPU group's device, once the work queued there has run, and
// waits for the copy (cuMemcpyDtoD on a CUDA device): the reference that
// ep-bench compares a GPU group's bandwidth with.
func CopyOnDevice(dst, src driver.Tensor[byte]) error {
	m, ok := dst.Memory().(memory)
	if !ok || src.Memory() != dst.Memory() {
		return fmt.Errorf("epgpu: CopyOnDevice: %v and %v are not in one GPU device's memory", dst, src)
	}
	if dst.Len() != src.Len() {
		return fmt.Errorf("epgpu: CopyOnDevice: %d bytes into %d", src.Len(), dst.Len())
	}
	if err := m.dev.Synchronize(); err != nil {
		return err
	}
	if err := m.dev.MemcpyDtoD(ptrOf(dst), ptrOf(src), dst.Len()); err != nil {
		return err
	}
	return m.dev.Synchronize()
}
