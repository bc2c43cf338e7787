// Package backends links every ep backend into a program, each registered
// by name for ep.OpenBackend: the CPU engine and the alltoallv baseline
// (package ep's own) and the GPU engine (package ep/epgpu, which needs the
// CUDA driver, NVRTC and NCCL only when a group opens on a real device).
// Import it for its side effect:
//
//	import _ "github.com/goep/goep/ep/backends"
//
// Package ep does not import it, so that a program that needs only the CPU
// engine does not link the GPU's.
package backends

import _ "github.com/goep/goep/ep/epgpu" // registers gpu:cuda, gpu:cuda+ipc, gpu:emulated, gpu:emulated+ipc
