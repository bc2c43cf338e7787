package epgpu

import (
	"fmt"
	"time"

	"github.com/goep/goep/ep"
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

func (b backend) Open(comm *mpi.Comm, spec ep.Spec) (ep.Engine, error) {
	id, err := b.takeID(comm)
	if err != nil {
		return nil, err
	}
	open := func() (Device, Comm, error) { return openEmulated(comm, b.emu, id) }
	if b.cuda {
		open = func() (Device, Comm, error) { return openCUDA(comm, b.device, id) }
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
