package epgpu

import "github.com/goep/goep/ep/driver"

// The GPU engine's backends, by name, for ep.OpenBackend: on CUDA (option
// device=N, each rank's device; default its local rank modulo the visible
// devices) and on the emulated device (option jitter=DURATION), each with
// NCCL between all ranks or with CUDA IPC inside a node (+ipc).
func init() {
	cuda := func(ipc bool) func(driver.BackendOptions) (driver.Backend, error) {
		return func(o driver.BackendOptions) (driver.Backend, error) {
			dev, err := o.Int("device", -1)
			if err != nil {
				return nil, err
			}
			return NewCUDAWith(CUDAOptions{Device: dev, IPC: ipc}), o.Done("device")
		}
	}
	emulated := func(ipc bool) func(driver.BackendOptions) (driver.Backend, error) {
		return func(o driver.BackendOptions) (driver.Backend, error) {
			jitter, err := o.Duration("jitter", 0)
			if err != nil {
				return nil, err
			}
			return NewEmulated(EmulatorOptions{Jitter: jitter, IPC: ipc}), o.Done("jitter")
		}
	}
	driver.Register(driver.Registration{Name: "gpu:cuda", Aliases: []string{"cuda"}, Open: cuda(false),
		Doc: "the GPU engine on each rank's CUDA device, NCCL between ranks (needs the CUDA driver, NVRTC, NCCL); option device=N"})
	driver.Register(driver.Registration{Name: "gpu:cuda+ipc", Aliases: []string{"cuda-ipc"}, Open: cuda(true),
		Doc: "gpu:cuda with CUDA IPC between the ranks of a node and NCCL only between nodes; option device=N"})
	driver.Register(driver.Registration{Name: "gpu:emulated", Aliases: []string{"emulate"}, Open: emulated(false),
		Doc: "the GPU engine on an emulated device (no GPU): CUDA's and NCCL's rules kept; option jitter=DURATION"})
	driver.Register(driver.Registration{Name: "gpu:emulated+ipc", Aliases: []string{"emulate-ipc"}, Open: emulated(true),
		Doc: "gpu:emulated with the IPC transport inside a node; option jitter=DURATION"})
}

// Owns says whether b is one of this package's backends: one that
// Bootstrap prepares at a job's start.
func Owns(b driver.Backend) bool {
	_, ok := b.(backend)
	return ok
}
