package epgpu

import (
	"fmt"
	"time"

	"github.com/goep/goep/ep"
	"github.com/goep/goep/gpu"
	"github.com/goep/goep/gpu/emulator"
	"github.com/goep/goep/mpi"
)

// CUDA is the GPU backend on each rank's CUDA device (its local rank modulo
// the visible devices, gpu.DeviceForRank), with an NCCL communicator
// bootstrapped over MPI. It needs the CUDA driver, NVRTC and NCCL at run
// time (package gpu loads them); without them NewGroup fails on every rank,
// naming the rank and what it lacks.
var CUDA ep.Backend = NewCUDA(-1)

// Emulated is the GPU backend on an emulated device (package gpu/emulator):
// the same engine, kernels and protocol as CUDA, with device memory in C
// memory, streams as goroutines and NCCL's transfers over MPI. It needs no
// GPU.
var Emulated ep.Backend = NewEmulated(EmulatorOptions{})

// NewCUDA is the CUDA backend on device number device of each rank
// (negative: gpu.DeviceForRank's choice).
func NewCUDA(device int) ep.Backend { return backend{cuda: true, device: device} }

// EmulatorOptions adjust the emulated device.
type EmulatorOptions struct {
	// Jitter delays each operation queued on a stream by a random time up
	// to it, so that work ordered by neither its stream nor an event
	// races visibly: the conformance test sets it. It applies to the
	// process's emulated device from the group's creation on.
	Jitter time.Duration
}

// NewEmulated is the Emulated backend with options.
func NewEmulated(o EmulatorOptions) ep.Backend { return backend{emu: o} }

// backend opens engines on a CUDA or an emulated device; boot, when set
// (Bootstrap), is the unique ID its first group's communicator is made
// from.
type backend struct {
	cuda   bool
	device int
	emu    EmulatorOptions
	boot   *boundID
}

func (b backend) Name() string {
	if b.cuda {
		return "gpu:cuda"
	}
	return "gpu:emulated"
}

// Supports says that the GPU engine fails a refused call on every rank,
// measures per-peer waits and names a stalled peer. It does not mask
// stalled ranks (NCCL cannot finish a posted group without a peer), does
// not dispatch in FP8, and allocates a little per call (transfer lists).
func (backend) Supports(f ep.Feature) bool {
	switch f {
	case ep.FeatureRefusals, ep.FeatureMeter, ep.FeatureNamedTimeouts:
		return true
	}
	return false
}

// The GPU backend and its engine, a Refuser and a Meter.
var (
	_ ep.Capable     = backend{}
	_ ep.Engine      = (*engine)(nil)
	_ ep.Refuser     = (*engine)(nil)
	_ ep.Meter       = (*engine)(nil)
	_ ep.DeviceTimer = (*engine)(nil)
)

func (b backend) Open(comm *mpi.Comm, spec ep.Spec) (ep.Engine, error) {
	id, err := b.takeID(comm)
	if err != nil {
		return nil, err
	}
	open := func() (gpu.Device, gpu.Comm, error) { return openEmulated(comm, b.emu, id) }
	if b.cuda {
		open = func() (gpu.Device, gpu.Comm, error) { return openCUDA(comm, b.device, id) }
	}
	// A failure after the communicator exists comes back with the engine,
	// which the Group closes on every rank (its Close is collective).
	e, err := openEngine(comm, spec, open)
	if e == nil {
		return nil, err
	}
	return e, err
}

// takeID returns the unique ID the group's communicator is made from: the
// one Bootstrap bound the backend to, once, or nil for an ID of the
// group's own. Every rank opens the same groups in the same order, so
// every rank returns the same outcome.
func (b backend) takeID(comm *mpi.Comm) (*mpi.UniqueID, error) {
	if b.boot == nil {
		return nil, nil
	}
	if comm.Size() != b.boot.ranks {
		return nil, fmt.Errorf("epgpu: %s: a group of %d ranks, but the unique ID %s (Bootstrap) was handed to %d", b.Name(), comm.Size(), b.boot.id.Digest(), b.boot.ranks)
	}
	if b.boot.used.Swap(true) {
		return nil, fmt.Errorf("epgpu: %s: the unique ID %s (Bootstrap) has made a group's communicator already, and an ID makes one: Bootstrap again for another group", b.Name(), b.boot.id.Digest())
	}
	return &b.boot.id, nil
}

// openCUDA opens this rank's CUDA device and an NCCL communicator over
// comm: from id when set (gpu.NewNCCLCommWithID), else from an ID made on
// rank 0 and handed over MPI now (gpu.NewNCCLComm). A rank without a
// device or NCCL makes every rank fail, naming it. It is collective. Only
// a machine with a GPU runs it; the gpu-tagged conformance test (make
// test-gpu) does.
func openCUDA(comm *mpi.Comm, device int, id *mpi.UniqueID) (gpu.Device, gpu.Comm, error) {
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
	return c.Device(), c, nil
}

// openEmulated opens this rank's emulated device and a communicator over
// comm, from id or, when nil, from an ID made on rank 0 and handed over
// MPI now. It is collective.
func openEmulated(comm *mpi.Comm, o EmulatorOptions, id *mpi.UniqueID) (gpu.Device, gpu.Comm, error) {
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
	return d, c, nil
}
