package epgpu

import (
	"errors"
	"fmt"
	"strings"
	"sync/atomic"

	"github.com/goep/goep/ep/driver"
	"github.com/goep/goep/gpu"
	"github.com/goep/goep/gpu/emulator"
	"github.com/goep/goep/mpi"
)

// Bootstrapped is a GPU backend prepared at a job's start by Bootstrap:
// every rank's device checked, and the communicator's unique ID made on
// rank 0 and handed to every rank over MPI.
type Bootstrapped struct {
	// Backend is the backend given to Bootstrap, bound to ID: the first
	// group opened with it, over Ranks ranks, makes its communicator from
	// ID (gpu.NewNCCLCommWithID; emulator.NewComm) instead of making an ID
	// of its own. An ID makes one communicator, as NCCL's does: a second
	// group opened with Backend is refused on every rank.
	Backend driver.Backend
	ID      mpi.UniqueID // the same on every rank (mpi.CheckSameID checked it)
	Ranks   int          // the ranks the ID was handed to
	// Generator names what made the ID on rank 0: "ncclGetUniqueId" or
	// "emulator.UniqueID".
	Generator string
	Device    DeviceInfo // this rank's device
}

// DeviceInfo describes the device a rank runs on and what drives it, for
// logs and records.
type DeviceInfo struct {
	Name      string // "cuda:0 NVIDIA H100 80GB HBM3", "emulated:0"
	Driver    string // "CUDA 12.4" (the version the driver supports); "" on the emulated device
	Libraries string // "NCCL 2.21.5, NVRTC 12.4"; on the emulated device, what stands in for them
}

// String is the description on one line.
func (d DeviceInfo) String() string {
	parts := []string{d.Name}
	if d.Driver != "" {
		parts = append(parts, "driver "+d.Driver)
	}
	if d.Libraries != "" {
		parts = append(parts, d.Libraries)
	}
	return strings.Join(parts, ", ")
}

// boundID is the unique ID a backend was bound to by Bootstrap.
type boundID struct {
	id    mpi.UniqueID
	ranks int
	used  atomic.Bool
}

// Bootstrap prepares the GPU backend b (CUDA, Emulated, or one of
// NewCUDA's or NewEmulated's) at a job's start, as NCCL's MPI bootstrap
// does: every rank of world checks that it can open its device (CUDA: the
// driver, a visible device, NVRTC and NCCL; the emulated device:
// MPI_THREAD_MULTIPLE), and the ranks agree on it, so that a rank that
// cannot makes every rank return an error naming the rank and what it
// lacks; then rank 0 makes the communicator's unique ID (gpu.NCCLUniqueID;
// emulator.UniqueID), mpi.BootstrapID hands it to every rank, and
// mpi.CheckSameID checks that every rank holds it. The result's Backend
// makes the first group's communicator from that ID. Collective over
// world.
func Bootstrap(world *mpi.Comm, b driver.Backend) (*Bootstrapped, error) {
	be, ok := b.(backend)
	if !ok {
		return nil, fmt.Errorf("epgpu: Bootstrap: backend %q is not one of package epgpu's", nameOf(b))
	}
	if be.boot != nil {
		return nil, fmt.Errorf("epgpu: Bootstrap: backend %s is bound to ID %s already", be.Name(), be.boot.id.Digest())
	}
	// The device ordinal is collective (the ranks of a host are counted):
	// every rank asks, whatever its outcome.
	var ordinal int
	var oerr error
	if be.cuda {
		if ordinal, oerr = gpu.DeviceForRank(world); be.device >= 0 {
			ordinal, oerr = be.device, nil
		}
	}
	info, err := probeDevice(be, ordinal, oerr)
	if err := mpi.AgreeOnError(world, err); err != nil {
		return nil, fmt.Errorf("epgpu: Bootstrap: %s: %w", be.Name(), err)
	}
	gen, genName := emulator.UniqueID, "emulator.UniqueID"
	if be.cuda {
		gen, genName = gpu.NCCLUniqueID, "ncclGetUniqueId"
	}
	id, err := mpi.BootstrapID(world, 0, gen)
	if err == nil {
		err = mpi.CheckSameID(world, 0, id)
	}
	if err != nil {
		return nil, fmt.Errorf("epgpu: Bootstrap: %s: %w", be.Name(), err)
	}
	be.boot = &boundID{id: id, ranks: world.Size()}
	return &Bootstrapped{Backend: be, ID: id, Ranks: world.Size(), Generator: genName, Device: info}, nil
}

func nameOf(b driver.Backend) string {
	if b == nil {
		return "<nil> (the CPU engine)"
	}
	return b.Name()
}

// probeDevice checks, on this rank, what the backend's device needs, and
// describes the device; for CUDA it names everything that is missing.
func probeDevice(b backend, ordinal int, ordinalErr error) (DeviceInfo, error) {
	if !b.cuda {
		if lvl := mpi.ThreadLevel(); lvl != mpi.ThreadMultiple {
			return DeviceInfo{}, fmt.Errorf("MPI provides thread level %d, not MPI_THREAD_MULTIPLE (%d), which the emulated device's transfers need", lvl, mpi.ThreadMultiple)
		}
		return DeviceInfo{Name: emulator.Open(0).String(), Libraries: "package gpu/emulator: the CUDA C kernels run on the CPU, NCCL's transfers over MPI"}, nil
	}
	var missing []error
	var info DeviceInfo
	devErr := ordinalErr
	if devErr == nil {
		var d *gpu.CUDADevice
		if d, devErr = gpu.OpenDevice(ordinal); devErr == nil {
			info.Name = d.String()
			if name, err := d.Name(); err == nil {
				info.Name += " " + name
			}
		}
	}
	if devErr != nil {
		missing = append(missing, devErr)
	}
	if v, err := gpu.DriverVersion(); err == nil {
		info.Driver = fmt.Sprintf("CUDA %d.%d", v/1000, v%1000/10)
	} else if !errors.Is(err, gpu.ErrLibraryMissing) || !errors.Is(devErr, gpu.ErrLibraryMissing) {
		missing = append(missing, err) // a missing driver is said once
	}
	var libs []string
	if v, err := gpu.NCCLVersion(); err != nil {
		missing = append(missing, err)
	} else {
		libs = append(libs, "NCCL "+ncclVersion(v))
	}
	if major, minor, err := gpu.NVRTCVersion(); err != nil {
		missing = append(missing, err)
	} else {
		libs = append(libs, fmt.Sprintf("NVRTC %d.%d", major, minor))
	}
	info.Libraries = strings.Join(libs, ", ")
	if len(missing) > 0 {
		var what, msgs []string
		for _, e := range missing {
			msgs = append(msgs, e.Error())
			var le *gpu.LibraryError
			switch {
			case errors.As(e, &le):
				what = append(what, le.What)
			case errors.Is(e, gpu.ErrNoDevice):
				what = append(what, "a GPU")
			}
		}
		lacks := ""
		if len(what) > 0 {
			lacks = " (it lacks " + andList(what) + ")"
		}
		return info, fmt.Errorf("%w%s: %s", errNoCUDA, lacks, strings.Join(msgs, "; "))
	}
	return info, nil
}

// andList joins words as "a", "a and b", "a, b and c".
func andList(words []string) string {
	if len(words) < 2 {
		return strings.Join(words, "")
	}
	return strings.Join(words[:len(words)-1], ", ") + " and " + words[len(words)-1]
}

// errNoCUDA opens the error of a rank that cannot run the CUDA backend.
var errNoCUDA = errors.New("this rank cannot run the CUDA backend")

// ncclVersion spells an NCCL version code: 22703 is 2.27.3 (codes before
// 2.9 are 1000*major + 100*minor + patch).
func ncclVersion(code int) string {
	if code >= 10000 {
		return fmt.Sprintf("%d.%d.%d", code/10000, code/100%100, code%100)
	}
	return fmt.Sprintf("%d.%d.%d", code/1000, code/100%10, code%100)
}
