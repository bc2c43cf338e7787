package epgpu

import (
	"fmt"
	"time"

	"github.com/goep/goep/ep/driver"
	"github.com/goep/goep/gpu"
	"github.com/goep/goep/gpu/emulator"
	"github.com/goep/goep/mpi"
)

// CUDA is the GPU backend on each rank's CUDA device (its local rank modulo
// the visible devices, gpu.DeviceForRank), with an NCCL communicator
// bootstrapped over MPI. It needs the CUDA driver, NVRTC and NCCL at run
// time (package gpu loads them); without them NewGroup fails on every rank,
// naming the rank and what it lacks.
var CUDA driver.Backend = NewCUDA(-1)

// Emulated is the GPU backend on an emulated device (package gpu/emulator):
// the same engine, kernels and protocol as CUDA, with device memory in C
// memory, streams as goroutines and NCCL's transfers over MPI. It needs no
// GPU.
var Emulated driver.Backend = NewEmulated(EmulatorOptions{})

// CUDAIPC is the CUDA backend with the ranks of a node writing into each
// other's device memory over CUDA IPC (gpu.NodeComm), moving only the rows
// the routing needs, and NCCL only between nodes: several ranks may share a
// GPU, whatever NCCL's version.
var CUDAIPC driver.Backend = NewCUDAWith(CUDAOptions{Device: -1, IPC: true})

// EmulatedIPC is the Emulated backend with the IPC transport inside a node.
var EmulatedIPC driver.Backend = NewEmulated(EmulatorOptions{IPC: true})

// NewCUDA is the CUDA backend on device number device of each rank
// (negative: gpu.DeviceForRank's choice).
func NewCUDA(device int) driver.Backend { return NewCUDAWith(CUDAOptions{Device: device}) }

// CUDAOptions choose a CUDA backend's device and transport.
type CUDAOptions struct {
	// Device is each rank's device number; negative: its local rank
	// modulo the visible devices (gpu.DeviceForRank).
	Device int
	// IPC moves the rows between the ranks of a node over CUDA IPC
	// (gpu.NodeComm) instead of NCCL, which then only connects the nodes.
	IPC bool
}

// NewCUDAWith is the CUDA backend with options.
func NewCUDAWith(o CUDAOptions) driver.Backend {
	return backend{cuda: true, device: o.Device, ipc: o.IPC}
}

// EmulatorOptions adjust the emulated device.
type EmulatorOptions struct {
	// Jitter delays each operation queued on a stream by a random time up
	// to it, so that work ordered by neither its stream nor an event
	// races visibly: the conformance test sets it. It applies to the
	// process's emulated device from the group's creation on.
	Jitter time.Duration
	// IPC is CUDAOptions.IPC on the emulated device: the ranks of a node
	// map each other's emulated memory (shared mappings).
	IPC bool
}

// NewEmulated is the Emulated backend with options.
func NewEmulated(o EmulatorOptions) driver.Backend { return backend{emu: o, ipc: o.IPC} }

// backend opens engines on a CUDA or an emulated device; boot, when set
// (Bootstrap), is the unique ID its first group's communicator is made
// from.
type backend struct {
	cuda   bool
	device int
	ipc    bool
	emu    EmulatorOptions
	boot   *boundID
}

func (b backend) Name() string {
	name := "gpu:emulated"
	if b.cuda {
		name = "gpu:cuda"
	}
	if b.ipc {
		name += "+ipc"
	}
	return name
}

// Supports says that the GPU engine fails a refused call on every rank,
// measures per-peer waits and names a stalled peer. It does not mask
// stalled ranks (NCCL cannot finish a posted group without a peer), does
// not dispatch in FP8, and allocates a little per call (transfer lists).
func (backend) Supports(f driver.Feature) bool {
	switch f {
	case driver.FeatureRefusals, driver.FeatureMeter, driver.FeatureNamedTimeouts:
		return true
	}
	return false
}

// The GPU backend and its engine, a Refuser and a Meter.
var (
	_ driver.Capable       = backend{}
	_ driver.Engine        = (*engine)(nil)
	_ driver.Refuser       = (*engine)(nil)
	_ driver.Meter         = (*engine)(nil)
	_ driver.DeviceTimer   = (*engine)(nil)
	_ driver.TransferMeter = (*engine)(nil)
)

func (b backend) Open(comm *mpi.Comm, spec driver.Spec) (driver.Engine, error) {
	id, err := b.takeID(comm)
	if err != nil {
		return nil, err
	}
	open := func() (gpu.Device, gpu.Comm, error) { return openEmulated(comm, b.emu, id) }
	if b.cuda {
		open = func() (gpu.Device, gpu.Comm, error) { return openCUDA(comm, b.device, id) }
	}
	if b.ipc {
		inner := open
		open = func() (gpu.Device, gpu.Comm, error) { return openIPC(comm, b, inner) }
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

// openIPC opens this rank's device and a gpu.NodeComm over comm: CUDA IPC
// inside the node, and, where the group spans nodes, the communicator that
// inner opens (NCCL's, or the emulated one) between them. It is
// collective.
func openIPC(comm *mpi.Comm, b backend, inner func() (gpu.Device, gpu.Comm, error)) (gpu.Device, gpu.Comm, error) {
	topo, err := comm.Topology()
	if err != nil {
		return nil, nil, err
	}
	nodes := topo.Nodes
	if err := topo.Free(); err != nil {
		return nil, nil, err
	}
	var dev gpu.Device
	var between gpu.Comm
	if nodes > 1 {
		if dev, between, err = inner(); err != nil {
			return nil, nil, err
		}
	} else {
		dev, err = openDeviceOnly(comm, b)
		if err = mpi.AgreeOnError(comm, err); err != nil {
			return nil, nil, err
		}
	}
	ipc, ok := dev.(gpu.IPCDevice)
	if !ok {
		return nil, nil, fmt.Errorf("epgpu: %s: device %v has no IPC", b.Name(), dev)
	}
	c, err := gpu.NewNodeComm(comm, ipc, between, comm.Timeout())
	if err != nil {
		if between != nil {
			_ = between.Abort()
		}
		return nil, nil, err
	}
	return dev, c, nil
}

// openDeviceOnly opens this rank's device, without a communicator: a group
// on one node over IPC.
func openDeviceOnly(comm *mpi.Comm, b backend) (gpu.Device, error) {
	if !b.cuda {
		d := emulator.Open(0)
		d.SetJitter(b.emu.Jitter)
		return d, nil
	}
	ordinal, err := gpu.DeviceForRank(comm) // collective, whatever b.device is
	if b.device >= 0 {
		ordinal, err = b.device, nil
	}
	if err != nil {
		return nil, err
	}
	return gpu.OpenDevice(ordinal)
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
