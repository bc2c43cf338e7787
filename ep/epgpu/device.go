package epgpu

import "github.com/goep/goep/gpu"

// Device is what the engine needs of a GPU: memory, copies, streams and
// events, and the kernels of package gpu. Two implement it: a CUDA device
// (package gpu over the CUDA driver) and an emulated one (package
// gpu/emulator). Synchronous copies do not wait for streams (as cuMemcpy
// does not wait for non-blocking streams); Synchronize does.
type Device interface {
	String() string
	// Alloc returns n bytes of device memory, not initialised; Free
	// releases them (after the work using them has run: the caller
	// synchronises).
	Alloc(n int) (gpu.DevicePtr, error)
	Free(p gpu.DevicePtr) error
	// AllocHost returns n bytes of host memory for asynchronous copies
	// (pinned memory on a device).
	AllocHost(n int) (HostBuffer, error)
	NewStream() (Stream, error)
	NewEvent() (Event, error)
	// Kernels are package gpu's kernels on this device, run on its streams
	// (Stream.Queue).
	Kernels() (*gpu.Kernels, error)
	MemcpyHtoD(dst gpu.DevicePtr, src []byte) error
	MemcpyDtoH(dst []byte, src gpu.DevicePtr) error
	MemcpyDtoD(dst, src gpu.DevicePtr, n int) error
	MemsetD8(dst gpu.DevicePtr, v byte, n int) error
	// Synchronize waits for the work queued on every stream.
	Synchronize() error
}

// Stream runs the work queued on it in order, later than it was queued;
// only events order two streams.
type Stream interface {
	// Queue is the stream as package gpu's kernels take it.
	Queue() gpu.Queue
	Synchronize() error
	// Done reports whether the work queued so far has run.
	Done() (bool, error)
	MemcpyHtoDAsync(dst gpu.DevicePtr, src HostBuffer, off, n int) error
	MemcpyDtoHAsync(dst HostBuffer, off int, src gpu.DevicePtr, n int) error
	MemcpyDtoDAsync(dst, src gpu.DevicePtr, n int) error
	MemsetD8Async(dst gpu.DevicePtr, v byte, n int) error
	// Record marks e at the current end of the stream's work; WaitEvent
	// makes the work queued from now on wait until e's latest mark.
	Record(e Event) error
	WaitEvent(e Event) error
	Close() error
}

// Event marks a point in a stream's work.
type Event interface {
	// Done reports whether the work before the latest mark has run.
	Done() (bool, error)
	Close() error
}

// HostBuffer is host memory that asynchronous copies read and write: they
// use it when they run, not when they are queued.
type HostBuffer interface {
	Bytes() []byte
	Free() error
}

// Comm is what the engine needs of NCCL: grouped point-to-point transfers
// queued on a stream, and the means to end them when a peer stalls. Two
// implement it: an NCCL communicator (gpu.NCCLComm) and an emulated one
// over MPI (package gpu/emulator).
type Comm interface {
	// SendRecv queues one group of transfers on s (ncclGroupStart,
	// ncclSend/ncclRecv, ncclGroupEnd): the stream goes on when every one
	// has completed. Transfers between two ranks match in the order they
	// are listed and must agree in size; a rank may transfer to itself.
	SendRecv(s Stream, sends, recvs []gpu.Transfer) error
	// AsyncError reports the failure of a queued group
	// (ncclCommGetAsyncError); nil while all is well.
	AsyncError() error
	// Abort ends the queued groups (ncclCommAbort); any goroutine may call
	// it, while another waits.
	Abort() error
	// Close releases the communicator. It is collective.
	Close() error
}
