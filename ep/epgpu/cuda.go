package epgpu

import (
	"fmt"
	"sync"

	"github.com/goep/goep/gpu"
	"github.com/goep/goep/mpi"
)

// The CUDA device and NCCL communicator: package gpu behind the Device and
// Comm interfaces. Only a machine with a GPU runs this file's code; CI
// builds it, and the gpu-tagged conformance test (make test-gpu) runs it.

// cudaDevice is a CUDA device; it keeps the Buffers its addresses came
// from, to free them.
type cudaDevice struct {
	d       *gpu.Device
	mu      sync.Mutex
	buffers map[gpu.DevicePtr]*gpu.Buffer
}

var (
	cudaMu      sync.Mutex
	cudaDevices = map[*gpu.Device]*cudaDevice{}
)

// cudaDeviceOf is the Device of a CUDA device: one value per device, so
// that its Memory is one value too.
func cudaDeviceOf(d *gpu.Device) *cudaDevice {
	cudaMu.Lock()
	defer cudaMu.Unlock()
	if c := cudaDevices[d]; c != nil {
		return c
	}
	c := &cudaDevice{d: d, buffers: map[gpu.DevicePtr]*gpu.Buffer{}}
	cudaDevices[d] = c
	return c
}

func (c *cudaDevice) String() string { return c.d.String() }

func (c *cudaDevice) Alloc(n int) (gpu.DevicePtr, error) {
	b, err := c.d.Alloc(max(n, 1)) // a 0-byte Buffer has no address
	if err != nil {
		return 0, err
	}
	c.mu.Lock()
	c.buffers[b.Ptr()] = b
	c.mu.Unlock()
	return b.Ptr(), nil
}

func (c *cudaDevice) Free(p gpu.DevicePtr) error {
	c.mu.Lock()
	b := c.buffers[p]
	delete(c.buffers, p)
	c.mu.Unlock()
	if b == nil {
		return fmt.Errorf("epgpu: Free(%#x): not an allocation of %v", uint64(p), c.d)
	}
	return b.Free()
}

func (c *cudaDevice) AllocHost(n int) (HostBuffer, error) { return c.d.AllocHost(n) }

func (c *cudaDevice) NewStream() (Stream, error) {
	s, err := c.d.NewStream()
	if err != nil {
		return nil, err
	}
	return cudaStream{s}, nil
}

func (c *cudaDevice) NewEvent() (Event, error) {
	e, err := c.d.NewEvent()
	if err != nil {
		return nil, err
	}
	return e, nil
}

func (c *cudaDevice) Kernels() (*gpu.Kernels, error)             { return c.d.Kernels() }
func (c *cudaDevice) MemcpyHtoD(p gpu.DevicePtr, b []byte) error { return c.d.MemcpyHtoD(p, b) }
func (c *cudaDevice) MemcpyDtoH(b []byte, p gpu.DevicePtr) error { return c.d.MemcpyDtoH(b, p) }
func (c *cudaDevice) MemcpyDtoD(dst, src gpu.DevicePtr, n int) error {
	return c.d.MemcpyDtoD(dst, src, n)
}
func (c *cudaDevice) MemsetD8(p gpu.DevicePtr, v byte, n int) error { return c.d.MemsetD8(p, v, n) }
func (c *cudaDevice) Synchronize() error                            { return c.d.Synchronize() }

// cudaStream is a CUDA stream.
type cudaStream struct{ s *gpu.Stream }

func (s cudaStream) Queue() gpu.Queue     { return s.s }
func (s cudaStream) Synchronize() error   { return s.s.Synchronize() }
func (s cudaStream) Done() (bool, error)  { return s.s.Done() }
func (s cudaStream) Close() error         { return s.s.Close() }
func (s cudaStream) Record(e Event) error { return e.(*gpu.Event).Record(s.s) }
func (s cudaStream) WaitEvent(e Event) error {
	return s.s.WaitEvent(e.(*gpu.Event))
}

func (s cudaStream) MemcpyHtoDAsync(dst gpu.DevicePtr, src HostBuffer, off, n int) error {
	return s.s.MemcpyHtoDAsync(dst, src.(*gpu.HostBuffer), off, n)
}

func (s cudaStream) MemcpyDtoHAsync(dst HostBuffer, off int, src gpu.DevicePtr, n int) error {
	return s.s.MemcpyDtoHAsync(dst.(*gpu.HostBuffer), off, src, n)
}

func (s cudaStream) MemcpyDtoDAsync(dst, src gpu.DevicePtr, n int) error {
	return s.s.MemcpyDtoDAsync(dst, src, n)
}

func (s cudaStream) MemsetD8Async(dst gpu.DevicePtr, v byte, n int) error {
	return s.s.MemsetD8Async(dst, v, n)
}

// ncclComm is an NCCL communicator.
type ncclComm struct{ c *gpu.NCCLComm }

func (c ncclComm) SendRecv(s Stream, sends, recvs []gpu.Transfer) error {
	cs, ok := s.(cudaStream)
	if !ok {
		return fmt.Errorf("epgpu: an NCCL communicator's transfers need a CUDA stream, not %T", s)
	}
	return c.c.SendRecv(cs.s, sends, recvs)
}

func (c ncclComm) AsyncError() error { return c.c.AsyncError() }
func (c ncclComm) Abort() error      { return c.c.Abort() }
func (c ncclComm) Close() error      { return c.c.Close() }

// openCUDA opens this rank's device and an NCCL communicator over comm:
// from id when set (gpu.NewNCCLCommWithID), else from an ID made on rank 0
// and handed over MPI now (gpu.NewNCCLComm). A rank without a device or
// NCCL makes every rank fail, naming it. It is collective.
func openCUDA(comm *mpi.Comm, device int, id *mpi.UniqueID) (Device, Comm, error) {
	var c *gpu.NCCLComm
	var err error
	if id != nil {
		c, err = gpu.NewNCCLCommWithID(comm, device, *id)
	} else {
		c, err = gpu.NewNCCLComm(comm, device)
	}
	if err != nil {
		return nil, nil, err
	}
	return cudaDeviceOf(c.Device()), ncclComm{c}, nil
}
