package epgpu_test

import (
	"testing"
	"time"

	"github.com/goep/goep/ep"
	"github.com/goep/goep/ep/epgpu"
	"github.com/goep/goep/ep/eptest"
	"github.com/goep/goep/internal/mpitesting"
)

func TestMain(m *testing.M) { mpitesting.Main(m) }

// The GPU engine on the emulated device, checked against the CPU engine bit
// for bit: every operation of the emulated streams waits a random time, so
// that work ordered by neither its stream nor an event would race, and
// fail here.
func TestConformanceEmulated(t *testing.T) {
	b := epgpu.NewEmulated(epgpu.EmulatorOptions{Jitter: 50 * time.Microsecond})
	eptest.Run(t, eptest.Suite{Comm: mpitesting.World, Backend: b, Reference: ep.CPU})
}

// The same over the IPC transport inside a node (gpu.NodeComm on the
// emulated device's shared memory), the emulated NCCL between simulated
// nodes.
func TestConformanceEmulatedIPC(t *testing.T) {
	b := epgpu.NewEmulated(epgpu.EmulatorOptions{Jitter: 50 * time.Microsecond, IPC: true})
	eptest.Run(t, eptest.Suite{Comm: mpitesting.World, Backend: b, Reference: ep.CPU})
}
