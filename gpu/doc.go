// Package gpu is goep's CUDA path: devices, device memory, streams and
// events through the CUDA driver API; NVRTC-compiled kernels for expert
// parallelism (layout, row packing, bfloat16 conversion, weighted combine);
// and NCCL communicators bootstrapped over package mpi.
//
// # Loading
//
// Nothing here links a GPU library. The CUDA driver (libcuda.so.1), NVRTC
// and NCCL (libnccl.so.2) are opened with dlopen at first use, so `go build
// ./...` and every CPU test work on a machine without CUDA, and a binary
// built here runs on a GPU machine that has no Go. Each library is found by
// trying, in order:
//
//   - the variable's candidates, when it is set: GOEP_CUDA_LIB,
//     GOEP_NVRTC_LIB, GOEP_NCCL_LIB hold a path or a colon-separated list of
//     paths, names for dlopen's own search, or glob patterns;
//   - otherwise the usual names and places: for NVRTC libnvrtc.so.13,
//     .so.12, .so.11.2 (Debian's libnvrtc11.2, NVRTC 11.8) and libnvrtc.so,
//     then /usr/local/cuda*, and the nvidia/*/lib directories of pip's
//     nvidia-cuda-nvrtc and nvidia-nccl-cu* wheels under the usual
//     site-packages (system, $VIRTUAL_ENV, $CONDA_PREFIX, ~/.local).
//
// A library that cannot be loaded makes every entry point that needs it
// return a *LibraryError (errors.Is(err, ErrLibraryMissing)) naming the
// library, what was tried, and the variable to set. Libraries reports
// where each was found, for logs.
//
// # Devices, memory, streams
//
// OpenDevice(i) retains device i's primary context (the one the CUDA
// runtime, NCCL and PyTorch share) and returns it as a *CUDADevice;
// DeviceCount, CUDADevice.Name, ComputeCapability, TotalMemory, MemoryInfo,
// PCIBusID and Attribute query it. CUDADevice.Alloc returns a *Buffer of
// device memory (Upload, Download, CopyFrom, Memset, their ...Async forms
// on a stream, Slice views, Free); the generic Upload, Download and
// AllocFor move slices of numbers. AllocHost returns pinned host memory (a
// *CUDAHostBuffer, C memory, viewed without copying by Bytes and HostSlice)
// for asynchronous copies. NewStream and NewEvent give streams (Synchronize,
// Done, Record, WaitEvent) and events (Synchronize, Done, Elapsed). A nil
// Stream is the default stream.
//
// # The device interface
//
// Device, Stream, Event, HostBuffer and Comm are what code written for a
// GPU needs of one (memory by address, copies, streams, events, the
// kernels, NCCL's grouped transfers). This package's CUDA types implement
// them (*CUDADevice, *CUDAStream, *CUDAEvent, *CUDAHostBuffer, *NCCLComm),
// and so do those of package gpu/emulator, so that package epgpu's engine
// runs unchanged on either. A stream, event or host buffer works with those
// of its own kind only: the others are an error naming the type.
// Failed driver calls return *CUDAError with CUDA's own error name and
// string (CUDA_ERROR_OUT_OF_MEMORY: out of memory).
//
// Every C call that acts in a context makes the device's context current
// on the calling thread in the same call, since Go may move a goroutine
// between threads. C never keeps a Go pointer: buffers that outlive a call
// are device or C memory. No C type appears in the exported API.
//
// # Kernels
//
// The kernels are CUDA C (package gpu/internal/kernels, embedded in the
// binary, since cgo does not compile .cu files), using nothing newer than
// CUDA 11.8 and no CUDA header, so that Debian's NVRTC 11.8 compiles them.
// Device.Kernels compiles them with NVRTC on first use, for the newest
// virtual architecture (compute_XY) that NVRTC supports and the device can
// run, loads the PTX (the driver JIT-compiles it for the device), and
// keeps it in a cache: $GOEP_PTX_CACHE, else $XDG_CACHE_HOME/goep/ptx or
// ~/.cache/goep/ptx ("off" disables it), one file per hash of source,
// options, NVRTC version and NVRTC path. KernelPTX and CompilePTX compile
// without a device. The kernels, each the device counterpart of one of
// package ep's C kernels and tested against a CPU reference:
//
//   - Layout (ep_layout): per-expert, per-rank and per-node counts, the
//     place of each (token, slot) among its expert's pairs and of each token
//     among those sent to each rank and node, and the first bad expert id.
//   - PackRows: rows into expert-major (LL: one row per (token, expert),
//     grouped by expert) or rank-grouped (HT: one row per (token, rank))
//     buffers from Layout's ordinals and per-group base rows; CopyRows:
//     gather, scatter or permute rows by index arrays; RowPointers: row
//     numbers to row addresses.
//   - ReduceRows (ep_reduce_rows): the weighted combine, CSR source lists
//     per output row, optional weights, float32 or bfloat16 in and out,
//     accumulated in float32 in a fixed order, bit for bit as ep computes
//     it (NaN payloads aside).
//   - ToBF16 and FromBF16 (ep_f32_to_bf16, ep_bf16_to_f32): round to
//     nearest even by bit operations, NaN kept NaN, and widen.
//   - HTMeta and CountLocal (ep_ht_meta, ep_count_local): the metadata a
//     rank keeps with its received high-throughput rows (top-k ids made
//     local, weights zeroed elsewhere) and its rows per local expert.
//   - LLPlace: places the rows of a low-latency dispatch on arrival, from
//     the counts that travelled with them in each source's fixed-capacity
//     block, into the packed expert-major receive buffer, and checks that
//     every block is of the current call.
//
// Kernels' methods queue work on a Queue (a Stream) and return; arguments
// are device addresses and sizes, checked on the host before anything is
// queued. NewKernels runs the same methods through another Launcher: that
// is how package gpu/emulator runs them on emulated streams.
//
// Besides Buffers, memory can be handled by address (DevicePtr): the
// device's MemAlloc and MemFree, its MemcpyHtoD, MemcpyDtoH, MemcpyDtoD and
// MemsetD8 on the legacy default stream (with the driver's own
// synchronization: see Device), and the stream's asynchronous
// counterparts, for an engine that carves its own buffers. Buffer's Upload,
// CopyFrom and Memset return once their bytes have landed.
//
// # NCCL
//
// NCCLUniqueID is an mpi.IDGenerator (ncclGetUniqueId). NewNCCLComm(world,
// device) is NCCL's MPI bootstrap: each rank opens its device (by default
// its local rank modulo the visible devices, DeviceForRank), the ranks
// agree that each has its libraries and device (so a rank missing NCCL or
// a GPU makes every rank fail with its message instead of leaving the
// others inside NCCL), rank 0's ID goes out by mpi.BootstrapID, and every
// rank calls ncclCommInitRank. NewNCCLCommWithID does the same with an ID
// made and handed out beforehand (at a job's start: epgpu.Bootstrap), the
// ranks first agreeing that they hold one ID (mpi.CheckSameID), so that a
// rank with another fails every rank instead of hanging in NCCL.
// NewNCCLCommFromID joins with an ID shared otherwise, on one rank, within
// a timeout. Every communicator is non-blocking (ncclCommInitRankConfig with
// blocking = 0). NCCLComm.SendRecv posts sends and receives, any number per
// peer, as one ncclGroupStart/ncclGroupEnd group on a stream (transfers to
// the rank itself as device copies): the transport of a dispatch or
// combine. NCCL may still be putting the group on the stream when it
// returns: AsyncError (ncclCommGetAsyncError) says ErrInProgress until it
// has. NCCL has no timeouts and allows one call at a time on a
// communicator, so its user polls AsyncError and calls Abort
// (ncclCommAbort) on the same goroutine past its deadline; Backoff paces
// such loops. Close finalises the communicator (ncclCommFinalize, polled,
// then ncclCommDestroy), aborting it past its timeout. Failed NCCL calls
// return *NCCLError with ncclGetErrorString's text and ncclGetLastError's
// message.
//
// # Tests
//
// Without a GPU: the loading and error paths; the MPI half of the
// bootstrap under mpirun (a missing NCCL fails BootstrapID on every rank
// with root's message); every kernel run on the CPU by an emulator that
// compiles the same source as C and runs its threads in a shuffled order,
// against the references; and TestKernelPTX, which compiles every kernel
// with NVRTC for compute_80 and compute_90 and checks each entry point and
// its parameters in the PTX. Under make test and CI (GOEP_REQUIRE_TOOLS=1,
// or -tags ci) a missing NVRTC fails that test instead of skipping it.
//
// With a GPU: the tests built with -tags gpu (make test-gpu builds them
// into bin/gpu; scripts/gpu/run-on-device.sh runs them on a GPU machine):
// device query, memory round trips (by Buffer and by address), pinned
// memory and streams, events, the kernel suite on the device, NCCL on one
// rank and two ranks on one GPU (NCCL 2.30 on), Abort ending a receive from
// a silent peer, and the kernels' and an NCCL group's speed. They fail,
// never skip, where there is no device.
//
// # Expert parallelism on the GPU
//
// Package ep/epgpu is the ep backend built on this package: the ep.Group
// contract over device memory, its rows moved by NCCL and its layout done
// by these kernels. Package gpu/emulator emulates a device and NCCL on the
// CPU, so that the backend's conformance suite runs in every test run.
// docs/gpu.md describes the design, what only a device checks, and what is
// left to do.
package gpu
