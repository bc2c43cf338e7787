// Package emulator is a CUDA device and NCCL communicator emulated on the
// CPU, so that code written for a GPU (package epgpu's engine) runs, and is
// tested, on machines with none: it implements package gpu's device
// interface (gpu.Device, gpu.Stream, gpu.Event, gpu.HostBuffer, gpu.Comm),
// as package gpu's CUDA types do. It keeps the semantics that make device
// code break when it is wrong, rather than hiding them:
//
//   - Device memory is C memory named by addresses (gpu.DevicePtr) that Go
//     code cannot read: data moves only through copies. A new allocation is
//     filled with 0xa5 bytes, as cuMemAlloc's memory is not zeroed. Copies
//     and transfers are checked against the live allocations: one outside
//     them is CUDA_ERROR_ILLEGAL_ADDRESS, a sticky error after which every
//     call fails, as on a device.
//   - A Stream is a goroutine that runs its queue in order; every copy,
//     memset, kernel launch and transfer is queued and runs later, in
//     parallel with the host and with other streams. Nothing orders two
//     streams but events: Stream.Record marks an event at a point of the
//     stream, Stream.WaitEvent makes a stream wait for it. SetJitter delays each
//     operation by a random time, so that work that lacks an event or a
//     synchronisation races, and shows it.
//   - Synchronous copies (Device.MemcpyHtoD, ...) run on a legacy default
//     stream of their own, as CUDA's do: MemcpyHtoD returns once it has read
//     its source, its bytes landing later; MemcpyDtoD and MemsetD8 return
//     before they run; MemcpyDtoH waits for the legacy stream's earlier
//     work. No stream of NewStream waits for them: Device.Synchronize does.
//     MemFree waits for every stream first, as cuMemFree does.
//   - Kernels are package gpu's CUDA C source compiled as C and run by the
//     emulator of gpu/internal/kernels, each launch's threads in a shuffled
//     order, through gpu.Kernels: the same argument checks and launches as
//     on a device.
//   - A Comm stands for an NCCL communicator, made as one is: from a unique
//     ID that one rank makes (UniqueID, as ncclGetUniqueId) and MPI hands
//     to every rank (mpi.BootstrapID); NewComm refuses, on every rank, an ID
//     that UniqueID did not make or that not every rank holds, where NCCL
//     would wait for ever. It is non-blocking, as a communicator made with
//     blocking = 0: SendRecv puts its group of point-to-point transfers on
//     the stream in the background (the first group with a peer only once
//     that peer has posted its own), and AsyncError says gpu.ErrInProgress
//     until then; the stream runs the group as MPI non-blocking sends and
//     receives (mpi.Exchange) between the ranks and waits for all of them,
//     as an NCCL group kernel occupies its stream. Transfers to this rank
//     are copies. Both sides must post the same sizes in the same order: a
//     mismatch hangs, as NCCL's does. Calls NCCL forbids (work on the
//     stream while a group is being put on it, a second call meanwhile, two
//     goroutines in calls at once) are misuses that stick and are reported.
//     NCCL has no timeouts and neither has this: a stalled peer stalls the
//     stream until Abort, which AsyncError then reports.
//
// What it cannot show is what only a device has: the speed of the device
// and its links, NCCL's own protocol and connection set-up, memory
// consistency between a kernel's threads (each launch runs its threads one
// at a time), and kernels' out-of-bounds accesses (copies are checked,
// kernel memory accesses are not).
package emulator
