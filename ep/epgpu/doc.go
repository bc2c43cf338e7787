// Package epgpu is the GPU backend of package ep: the ep contract (ep.Group)
// over device memory, with the rows moved by NCCL's grouped sends and
// receives and the layout, packing, placement and combine done by package
// gpu's CUDA kernels.
//
//	g, err := ep.NewGroup[ep.BF16](world, ep.Config{Mode: ep.LowLatency, ..., Backend: epgpu.CUDA})
//	x, _ := ep.Alloc[ep.BF16](g.Memory(), tokens*hidden) // device memory
//	h, _ := g.Dispatch(ep.Tokens(x, topk, weights))                 // topk, weights: host slices
//
// # Two devices, one engine
//
// The engine is written against package gpu's device interface, gpu.Device
// (memory, copies, streams, events, kernels) and gpu.Comm (grouped
// send/receive, asynchronous error, abort), which two packages implement
// directly: CUDA is a CUDA device (package gpu over the CUDA driver) with
// an NCCL communicator bootstrapped over MPI (gpu.NewNCCLComm); Emulated is
// package gpu/emulator's device, whose memory Go reads only through copies,
// whose streams run their work later than it is queued and are ordered only
// by events, whose kernels are the same CUDA C run on the CPU, and whose
// communicator moves bytes with MPI. The conformance suite (ep/eptest)
// runs against Emulated under mpirun in every test run; the same test,
// built with -tags gpu, runs against CUDA on a GPU machine (make test-gpu,
// scripts/gpu/run-on-device.sh). docs/gpu.md says which checks only a
// device makes.
//
// # Bootstrap at a job's start
//
// A group makes its communicator when it opens: NCCL's MPI bootstrap, an
// ID made on rank 0 and handed to every rank over MPI. A program that
// wants the exchange at its start instead, and its devices checked before
// it writes anything, calls Bootstrap(world, backend): every rank checks
// its device and libraries (CUDA: the driver, a GPU, NVRTC and NCCL; a rank
// that lacks one makes every rank fail, naming it and what it lacks), rank
// 0 makes the ID (gpu.NCCLUniqueID, or emulator.UniqueID on the emulated
// device), mpi.BootstrapID hands it out and mpi.CheckSameID checks it. The
// returned backend makes its first group's communicator from that ID;
// moe-train -device emulate|cuda does this and shows the ID's digest.
//
//	b, err := epgpu.Bootstrap(world, epgpu.CUDA)
//	g, err := ep.NewGroup[ep.BF16](world, ep.Config{..., Backend: b.Backend})
//
// # Low latency
//
// Nothing on the send path waits for the host, so that it could be
// captured in a CUDA graph: each rank sends every rank a block of fixed
// capacity (MaxTokensPerRank*min(TopK, LocalExperts) rows) with the counts
// and the rows' tokens and weights alongside, and a kernel (gpu.LLPlace)
// places the rows on arrival into the expert-major receive buffer
// [LocalExperts][Size*MaxTokensPerRank][Hidden], packed by source rank then
// token, as the CPU engine gives them. Two buffer sets alternate (double
// buffering). Each half call queues its work and returns: DispatchSend
// and CombineSend return before the transfers complete, and the Wait halves
// wait for an event, so that expert computation overlaps the transfers. The
// combine sums each token's rows in top-k order in float32 (gpu.ReduceRows,
// no fused multiply-add): bit for bit the CPU engine's result.
//
// # High throughput
//
// The counts must be known to post the receives: each rank's tokens per
// rank go to every rank first (one group, copied to the host), then each
// token goes once to each rank that owns one of its experts, with its top-k
// ids and weights, received in place by source rank then token; kernels
// make the ids local (gpu.HTMeta) and count the rows per local expert
// (gpu.CountLocal). The combine sums a token's partials rank by rank, in
// rank order (bit for bit the CPU engine's on one node). A cached dispatch
// skips the count exchange.
//
// # Waits and failures
//
// Every transfer group carries the call's sequence number in a header
// word per peer, checked on arrival. NCCL has no timeouts and allows one
// call at a time on a communicator, so the engine makes its communicator
// non-blocking and polls it on the goroutine that makes the call: while
// NCCL puts a group on its stream (which may wait for peers to connect)
// and during every wait, it reads the communicator's state and, past the
// group's timeout or on a failure, aborts it there, which ends the queued
// transfers; the waiter then reads the peers' headers on a stream of its
// own and returns an *ep.TimeoutError naming the first peer whose header
// did not arrive. The group is then unusable, as with every backend, and
// Close only drains the streams and frees the memory.
//
// A call that one rank's checks refuse fails at once on every rank: the
// refusing rank takes part in the call's transfers with headers that say
// so, and sends its reason by MPI to the ranks that read them, which
// return an *ep.RefusedError naming it; the group stays usable (ep.Refuser).
// Group.Stats gets the bytes sent across nodes and, for waits long enough
// to read the peers' headers while they last, the time waited for the
// peers that arrived last (ep.Meter). docs/gpu.md has the details.
//
// Tensors passed to a group are in its Memory: device memory, allocated,
// filled and read with ep.Alloc, ep.Upload and ep.Download, which wait for
// the work the group has queued. A tensor given to DispatchSend or
// CombineSend is read by work queued on the group's streams: reuse it
// through those functions (or after the Wait half), which order the reuse
// after that work.
package epgpu
