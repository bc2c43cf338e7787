package ep

import "github.com/goep/goep/ep/driver"

// DefaultBackend is the backend a Config without one runs on: the CPU
// engine.
const DefaultBackend = driver.DefaultBackend

// The registry of backends (package ep/driver): ep links the CPU engine and
// the alltoallv baseline, which register themselves; package ep/backends
// links every backend, the GPU's too.
type (
	Registration   = driver.Registration
	BackendOptions = driver.BackendOptions
	BackendInfo    = driver.BackendInfo
)

// RegisterBackend makes a backend reachable by its name and aliases (a
// backend package calls it from init; driver.Register).
func RegisterBackend(r Registration) { driver.Register(r) }

// OpenBackend opens the backend spec names: a registered name or alias,
// then options as comma-separated key=value pairs ("gpu:cuda,device=1").
// An unknown name is an error that lists the registered ones; an option the
// backend does not take is an error that names it.
func OpenBackend(spec string) (Backend, error) { return driver.Open(spec) }

// Backends lists the registered backends, by name, with the features each
// declares with its default options.
func Backends() []BackendInfo { return driver.Backends() }
