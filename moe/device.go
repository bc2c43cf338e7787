package moe

import (
	"fmt"
	"strings"
)

// Device is what a run's ep calls ran on, as its trace segments and
// checkpoints record it: the ep backend and, on a device (a GPU backend),
// which one and what drives it. It describes the work's placement, not the
// model: a run may resume on another backend (CheckpointInfo.Changes says
// so).
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

// deviceAttrs lists the attributes that record a Device (trace segments
// and checkpoints from trace schema 5 and checkpoint version 4 on).
func deviceAttrs(d Device) []struct {
	name  string
	value any
} {
	return []struct {
		name  string
		value any
	}{{"backend", d.Backend}, {"device", d.Name}, {"device_driver", d.Driver}, {"device_libraries", d.Libraries}, {"comm_id", d.CommID}}
}

// attrSetter and attrReader are what a Device is written to and read from
// (an HDF5 file's object).
type attrSetter interface {
	SetAttr(obj, name string, value any) error
}

type attrReader interface {
	AttrString(obj, name string) (string, error)
	AttrNames(obj string) ([]string, error)
}

func writeDeviceAttrs(f attrSetter, obj string, d Device) error {
	for _, a := range deviceAttrs(d) {
		if err := f.SetAttr(obj, a.name, a.value); err != nil {
			return err
		}
	}
	return nil
}

// readDeviceAttrs reads a Device; a file from before they were recorded
// has none, and its run was on the CPU engine, the only backend then.
func readDeviceAttrs(f attrReader, obj string) (Device, error) {
	names, err := f.AttrNames(obj)
	if err != nil {
		return Device{}, err
	}
	has := map[string]bool{}
	for _, n := range names {
		has[n] = true
	}
	if !has["backend"] {
		return Device{Backend: "cpu"}, nil
	}
	var d Device
	dst := map[string]*string{"backend": &d.Backend, "device": &d.Name, "device_driver": &d.Driver,
		"device_libraries": &d.Libraries, "comm_id": &d.CommID}
	for _, a := range deviceAttrs(d) {
		v, err := f.AttrString(obj, a.name)
		if err != nil {
			return d, fmt.Errorf("attribute %s: %w", a.name, err)
		}
		*dst[a.name] = v
	}
	return d, nil
}
