// Command gpu-info prints, as one JSON object, what the device command
// (scripts/gpu/run-on-device.sh) needs to know of a GPU machine before it
// chooses what to run: the CUDA devices, the CUDA version the driver
// supports, NVRTC's and NCCL's versions and where each library was loaded
// from, and whether this NCCL accepts two ranks on one GPU. A library or
// device that is missing is an error field, not a failure: the command
// exits 0 whenever it could print.
package main

import (
	"encoding/json"
	"fmt"
	"os"

	"github.com/goep/goep/gpu"
)

type device struct {
	Ordinal int    `json:"ordinal"`
	Name    string `json:"name"`
	Compute string `json:"compute_capability"`
	MemGiB  int64  `json:"memory_gib"`
}

type info struct {
	Devices      []device          `json:"devices"`
	DevicesError string            `json:"devices_error,omitempty"`
	DriverCUDA   string            `json:"driver_cuda,omitempty"`
	NVRTC        string            `json:"nvrtc,omitempty"`
	NCCL         string            `json:"nccl,omitempty"`
	NCCLCode     int               `json:"nccl_code,omitempty"`
	MultiRankGPU bool              `json:"nccl_multi_rank_gpu"` // NCCL >= 2.30: two ranks on one GPU
	Libraries    map[string]string `json:"libraries"`
	Errors       []string          `json:"errors,omitempty"`
}

func main() {
	var in info
	fail := func(what string, err error) { in.Errors = append(in.Errors, fmt.Sprintf("%s: %v", what, err)) }
	if v, err := gpu.DriverVersion(); err != nil {
		fail("driver", err)
	} else {
		in.DriverCUDA = fmt.Sprintf("%d.%d", v/1000, v%1000/10)
	}
	if n, err := gpu.DeviceCount(); err != nil {
		in.DevicesError = err.Error()
	} else {
		for i := 0; i < n; i++ {
			d, err := gpu.OpenDevice(i)
			if err != nil {
				fail(fmt.Sprintf("device %d", i), err)
				continue
			}
			x := device{Ordinal: i}
			x.Name, _ = d.Name()
			if major, minor, err := d.ComputeCapability(); err == nil {
				x.Compute = fmt.Sprintf("%d.%d", major, minor)
			}
			if b, err := d.TotalMemory(); err == nil {
				x.MemGiB = b >> 30
			}
			in.Devices = append(in.Devices, x)
		}
	}
	if major, minor, err := gpu.NVRTCVersion(); err != nil {
		fail("NVRTC", err)
	} else {
		in.NVRTC = fmt.Sprintf("%d.%d", major, minor)
	}
	if v, err := gpu.NCCLVersion(); err != nil {
		fail("NCCL", err)
	} else {
		in.NCCL, in.NCCLCode = fmt.Sprintf("%d.%d.%d", v/10000, v/100%100, v%100), v
		in.MultiRankGPU = v >= 23000
	}
	in.Libraries = gpu.Libraries()
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	if err := enc.Encode(in); err != nil {
		fmt.Fprintln(os.Stderr, "gpu-info:", err)
		os.Exit(1)
	}
}
