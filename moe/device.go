package moe

import "strings"

// Device is what a trainer's ep calls run on, as a run's trace segments and
// checkpoints record it (package moe/runs): the ep backend and, on a device
// (a GPU backend), which one and what drives it. It describes the work's
// placement, not the model: a run may resume on another backend.
type Device struct {
	Backend   string // the ep backend's name: "cpu", "gpu:emulated", "gpu:cuda" (Config.BackendName)
	Name      string // the device: "cuda:0 NVIDIA H100 80GB HBM3", "emulated:0"; "" for the CPU engine
	Driver    string // its driver's version, "CUDA 12.4"; "" where there is none
	Libraries string // the libraries' versions, "NCCL 2.21.5, NVRTC 12.4", or what stands in for them
	// CommID is the digest (mpi.UniqueID.Digest) of the unique ID that the
	// ranks' communicator was made from, made on rank 0 and handed to every
	// rank over MPI; "" where there is none (the CPU engine).
	CommID string
}

// String is the description on one line: "gpu:cuda on cuda:0 NVIDIA ...,
// driver CUDA 12.4, NCCL 2.21.5, NVRTC 12.4, communicator ID 1a2b3c4d5e6f".
func (d Device) String() string {
	s := d.Backend
	if s == "" {
		s = "cpu"
	}
	var parts []string
	if d.Name != "" {
		s += " on " + d.Name
	}
	if d.Driver != "" {
		parts = append(parts, "driver "+d.Driver)
	}
	if d.Libraries != "" {
		parts = append(parts, d.Libraries)
	}
	if d.CommID != "" {
		parts = append(parts, "communicator ID "+d.CommID)
	}
	if len(parts) > 0 {
		s += ", " + strings.Join(parts, ", ")
	}
	return s
}
