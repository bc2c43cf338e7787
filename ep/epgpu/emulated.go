package epgpu

import (
	"fmt"
	"sync"

	"github.com/goep/goep/gpu"
	"github.com/goep/goep/gpu/emulator"
	"github.com/goep/goep/mpi"
)

// The emulated device and communicator: package gpu/emulator behind the
// Device and Comm interfaces.

// emuDevice is an emulated device.
type emuDevice struct{ d *emulator.Device }

var (
	emuMu      sync.Mutex
	emuDevices = map[*emulator.Device]*emuDevice{}
)

// emulatedDevice is the Device of an emulated device: one value per
// device, so that its Memory is one value too.
func emulatedDevice(d *emulator.Device) *emuDevice {
	emuMu.Lock()
	defer emuMu.Unlock()
	if e := emuDevices[d]; e != nil {
		return e
	}
	e := &emuDevice{d: d}
	emuDevices[d] = e
	return e
}

func (e *emuDevice) String() string                             { return e.d.String() }
func (e *emuDevice) Alloc(n int) (gpu.DevicePtr, error)         { return e.d.Alloc(n) }
func (e *emuDevice) Free(p gpu.DevicePtr) error                 { return e.d.Free(p) }
func (e *emuDevice) Kernels() (*gpu.Kernels, error)             { return e.d.Kernels(), nil }
func (e *emuDevice) MemcpyHtoD(p gpu.DevicePtr, b []byte) error { return e.d.MemcpyHtoD(p, b) }
func (e *emuDevice) MemcpyDtoH(b []byte, p gpu.DevicePtr) error { return e.d.MemcpyDtoH(b, p) }
func (e *emuDevice) MemcpyDtoD(dst, src gpu.DevicePtr, n int) error {
	return e.d.MemcpyDtoD(dst, src, n)
}
func (e *emuDevice) MemsetD8(p gpu.DevicePtr, v byte, n int) error { return e.d.MemsetD8(p, v, n) }
func (e *emuDevice) Synchronize() error                            { return e.d.Synchronize() }

func (e *emuDevice) AllocHost(n int) (HostBuffer, error) { return e.d.AllocHost(n) }

func (e *emuDevice) NewStream() (Stream, error) {
	s, err := e.d.NewStream()
	if err != nil {
		return nil, err
	}
	return emuStream{s}, nil
}

func (e *emuDevice) NewEvent() (Event, error) { return e.d.NewEvent() }

// emuStream is an emulated stream.
type emuStream struct{ s *emulator.Stream }

func (s emuStream) Queue() gpu.Queue     { return s.s }
func (s emuStream) Synchronize() error   { return s.s.Synchronize() }
func (s emuStream) Done() (bool, error)  { return s.s.Done() }
func (s emuStream) Close() error         { return s.s.Close() }
func (s emuStream) Record(e Event) error { return e.(*emulator.Event).Record(s.s) }
func (s emuStream) WaitEvent(e Event) error {
	return s.s.WaitEvent(e.(*emulator.Event))
}

func (s emuStream) MemcpyHtoDAsync(dst gpu.DevicePtr, src HostBuffer, off, n int) error {
	return s.s.MemcpyHtoDAsync(dst, src.(*emulator.HostBuffer), off, n)
}

func (s emuStream) MemcpyDtoHAsync(dst HostBuffer, off int, src gpu.DevicePtr, n int) error {
	return s.s.MemcpyDtoHAsync(dst.(*emulator.HostBuffer), off, src, n)
}

func (s emuStream) MemcpyDtoDAsync(dst, src gpu.DevicePtr, n int) error {
	return s.s.MemcpyDtoDAsync(dst, src, n)
}

func (s emuStream) MemsetD8Async(dst gpu.DevicePtr, v byte, n int) error {
	return s.s.MemsetD8Async(dst, v, n)
}

// emuComm is an emulated NCCL communicator.
type emuComm struct{ c *emulator.Comm }

func (c emuComm) SendRecv(s Stream, sends, recvs []gpu.Transfer) error {
	es, ok := s.(emuStream)
	if !ok {
		return fmt.Errorf("epgpu: an emulated communicator's transfers need an emulated stream, not %T", s)
	}
	return c.c.SendRecv(es.s, sends, recvs)
}

func (c emuComm) AsyncError() error { return c.c.AsyncError() }
func (c emuComm) Abort() error      { return c.c.Abort() }
func (c emuComm) Close() error      { return c.c.Close() }

// openEmulated opens this rank's emulated device and a communicator over
// comm, from id or, when nil, from an ID made on rank 0 and handed over
// MPI now. It is collective.
func openEmulated(comm *mpi.Comm, o EmulatorOptions, id *mpi.UniqueID) (Device, Comm, error) {
	d := emulator.Open(0)
	d.SetJitter(o.Jitter)
	if id == nil {
		made, err := mpi.BootstrapID(comm, 0, emulator.UniqueID)
		if err != nil {
			return nil, nil, err
		}
		id = &made
	}
	c, err := emulator.NewComm(d, comm, *id)
	if err != nil {
		return nil, nil, err
	}
	return emulatedDevice(d), emuComm{c}, nil
}
