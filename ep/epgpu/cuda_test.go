//go:build gpu

package epgpu_test

import (
	"os"
	"testing"

	"github.com/goep/goep/ep"
	"github.com/goep/goep/ep/epgpu"
	"github.com/goep/goep/ep/eptest"
	"github.com/goep/goep/internal/mpitesting"
)

func init() {
	// Several ranks on one GPU (mpirun on a one-GPU machine) need NCCL
	// 2.30's switch, read at NCCL's first call.
	if os.Getenv("NCCL_MULTI_RANK_GPU_ENABLE") == "" {
		os.Setenv("NCCL_MULTI_RANK_GPU_ENABLE", "1")
	}
}

// The GPU engine on each rank's CUDA device with NCCL, checked against the
// CPU engine bit for bit: built with -tags gpu (make test-gpu) and run on a
// GPU machine by scripts/gpu/run-on-device.sh. Without a device, the CUDA
// driver, NVRTC or NCCL it fails, never skips.
func TestConformanceCUDA(t *testing.T) {
	eptest.Run(t, eptest.Suite{Comm: mpitesting.World, Backend: epgpu.CUDA, Reference: ep.CPU})
}

// The refusal and statistics checks of the emulated device, on NCCL: a
// rank without its handle takes part in an HT call in two groups, which
// NCCL matches transfer by transfer in order.
func TestRefusalsCUDA(t *testing.T) { testRefusals(t, epgpu.CUDA) }

func TestStatsCUDA(t *testing.T) { testStats(t, epgpu.CUDA) }

// The same over CUDA IPC inside a node (gpu.NodeComm): several ranks may
// share one GPU, whatever NCCL's version; NCCL only between nodes.
func TestConformanceCUDAIPC(t *testing.T) {
	eptest.Run(t, eptest.Suite{Comm: mpitesting.World, Backend: epgpu.CUDAIPC, Reference: ep.CPU})
}

func TestRefusalsCUDAIPC(t *testing.T) { testRefusals(t, epgpu.CUDAIPC) }

func TestStatsCUDAIPC(t *testing.T) { testStats(t, epgpu.CUDAIPC) }
