// Package ep is expert-parallel dispatch and combine for Mixture-of-Experts
// layers over MPI: the Go counterpart of NCCL EP's ncclEpDispatch and
// ncclEpCombine. It states one contract, the Group, and runs it on
// interchangeable backends: CPU (the default: MPI shared memory inside a
// node, messages across nodes), CPUOneSided (the same with one-sided puts
// across nodes, for RDMA fabrics), Alltoallv (two-sided MPI, the
// baseline), and the GPU backend of package epgpu.
//
// A Group is created collectively from an MPI communicator and a Config.
// Experts are spread evenly: rank r owns experts [r*L, (r+1)*L) where
// L = NumExperts/Size. Every token names its top-k experts (-1 = none).
// Dispatch sends each token to the ranks that own its experts; the experts
// run; Combine brings their outputs back to the token's rank and sums them.
//
//	g, _ := ep.NewGroup[ep.BF16](world, ep.Config{Mode: ep.LowLatency, ...})
//	h, _ := g.Dispatch(Tokens(ep.Host(x), topk, weights)) // x: [T][Hidden], topk and weights: [T][TopK]
//	y := expertsForward(h.Recv(), h.ExpertCounts())
//	_ = g.Combine(h, y, ep.Host(out), nil)       // out: [T][Hidden]
//
// # Memory
//
// Rows are Tensors: a flat array of elements in some Memory, the host's
// (Host wraps a slice, Tensor.Host gives it back) or a device's (OnDevice
// names an address). A group's tensors are in Group.Memory(), and the tensors
// passed to it must be too. Alloc, Upload, Download and ToHost work on any
// memory. topk, weights and WeightsOverride are host slices: the group checks
// them before anything is queued.
//
// # Modes
//
// LowLatency (inference decode, up to a few hundred tokens per rank): every
// (token, expert) pair becomes one row of an expert-major buffer
// [L][Size*MaxTokensPerRank][Hidden]; the first ExpertCounts()[l] rows of
// local expert l are valid, grouped by source rank in rank order, each
// group in token order. Combine returns out[t] = sum over k of
// weight[t][k] * y(row of pair (t,k)). Two buffer sets alternate between
// calls (double buffering): a handle's rows stay valid until the second
// dispatch after it, and at most two dispatches may be waiting for their
// combine. DispatchSend/Wait and CombineSend/Wait split each call so that
// computation can overlap communication.
//
// HighThroughput (training and prefill, thousands of tokens per rank): a token
// is sent once to each rank that owns at least one of its experts. The
// received rows, NumRecv() of them, are grouped by source rank in rank order,
// each group in token order, with their top-k expert ids made local
// (-1 = an expert elsewhere, its weight zeroed) and their weights. Across
// nodes the CPU backend sends a token once per destination node, to the rank
// with the same local rank there, which forwards it inside its node. Combine
// sums the per-rank partial outputs (the expert side applies the weights)
// back on the token's rank. The rows stay valid until the next dispatch (a
// refused one too: the GPU engine takes part in its transfers); a dispatch
// or combine must be waited before the next dispatch.
//
// # Receive layouts
//
// Config.Layout says how the received rows are laid out (NCCL EP's
// layouts), for the whole group: it sizes the buffers. Each mode has its
// own (LayoutDefault, described above) and one more:
//
//   - HighThroughput LayoutExpertMajor: the rows grouped by local expert,
//     one row per (token, local expert) pair (a token sent to two experts of
//     a rank arrives twice), zone l at rows [ExpertOffsets()[l],
//     ExpertOffsets()[l+1]) of Recv: its ExpertCounts()[l] rows by source
//     rank then token, then zero rows up to a multiple of
//     Config.ExpertAlignment. RecvWeights has one weight per row (0 on
//     padding); there is no RecvTopK. What a grouped GEMM consumes as it
//     is: the CPU engine writes each row into its zone during the dispatch
//     (its local copies and its rail peers' forwarding), instead of a
//     permutation after a flat dispatch. MaxRecvTokensPerRank counts these
//     rows, padding included.
//   - LowLatency LayoutRankMajor: the rows grouped by source rank, a token
//     once per rank that owns one of its experts, source s's rows at
//     [s*MaxTokensPerRank, s*MaxTokensPerRank+SourceCounts()[s]), in token
//     order, each with its top-k ids (RecvTopK) and weights (RecvWeights,
//     [rows][TopK], 0 where the expert is elsewhere).
//
// Combine applies the gate weights only in LowLatency's expert-major
// layout; in the others the expert side does and Combine sums: HT
// expert-major sums a token's rows, ranks in order and each rank's rows in
// top-k slot order. Config.RecvIDs chooses whether RecvTopK (HT flat, LL
// rank-major) holds local expert ids (the default) or global ones. Each
// non-default choice is a Feature (FeatureHTExpertMajor,
// FeatureLLRankMajor, FeatureGlobalExpertIDs) that a backend implements or
// refuses at NewGroup: the CPU and Alltoallv backends implement them all.
// Cached dispatches, CombineOptions.RowValues and SlotValues, FP8 dispatch
// and the backward pass work in every layout.
//
//	cfg := ep.Config{Mode: ep.HighThroughput, ..., Layout: ep.LayoutExpertMajor, ExpertAlignment: 128}
//	h, _ := g.Dispatch(Tokens(ep.Host(x), topk, weights))
//	off, n := h.ExpertOffsets(), h.ExpertCounts() // expert l: rows off[l] to off[l]+n[l] of h.Recv()
//	groupedGEMM(h.Recv(), off, n, h.RecvWeights(), h.CombineBuffer())
//	_ = g.Combine(h, h.CombineBuffer(), ep.Host(out), nil)
//
// # Handles
//
// A Handle is a small value naming a dispatch: copy it freely. It is needed
// to combine and can be reused (DispatchInput.Reuse) while the routing is
// unchanged. A group keeps the records of its 8 most recent dispatches, so
// that steady-state calls allocate nothing; an older handle is stale: its
// views are empty and calls refuse it. An LL handle holds its buffer set
// until it is combined or released (Release, collective in the place of
// its combine): at most two LL dispatches wait for their combine.
//
// The handle's lifecycle is split as NCCL EP's: what a layout needs is set
// once, by NewGroup (ncclEpInitHandle): the buffers of the layout, the
// records of the handle ring and the engine's per-dispatch state
// (StateMaker), all sized for the largest routing the Config allows. Each
// Dispatch brings its routing (ncclEpUpdateHandle): the routing tables are
// filled in place, and the only collective a routing change adds is the
// count exchange the dispatch needs anyway (HighThroughput's, and
// LowLatency's count round for large messages). So from the group's second
// call on, no dispatch or combine allocates, whatever its routing.
// BufferPlan is ncclEpHandleMemSize: the memory a Config needs, area by
// area, before anything is allocated.
//
// # FP8 dispatch
//
// A Config with Wire: WireFP8 dispatches in FP8, as DeepEP's and NCCL EP's
// low-latency kernels do: tokens are given in the element type (bfloat16 or
// float32), cast to e4m3 (E4M3) with one float32 scale per ScaleGroup (128)
// consecutive elements of a row, scale = amax/448, and received as
// RecvFP8 (the codes, laid out as Recv would be) and RecvScales
// ([rows][ScaleGroups(Hidden)]); Dequantize turns them back into numbers.
// WireFP8UE8M0 rounds each scale up to a power of two (an 8-bit exponent).
// Combine still moves the element type: the experts write their outputs
// into CombineBuffer (an FP8 group's Recv is empty). The cast is fused into
// the copy kernel that places each row, once per token; rows for another
// node are cast into an outbox and put as codes and scales. The bytes on
// the wire are Hidden + 4*ScaleGroups(Hidden) per row instead of Hidden
// elements (2*Hidden bytes in bfloat16).
//
//	cfg.Wire = ep.WireFP8
//	g, _ := ep.NewGroup[ep.BF16](world, cfg)
//	h, _ := g.Dispatch(Tokens(ep.Host(x), topk, weights))
//	y := h.CombineBuffer().Host()
//	_ = ep.Dequantize(y, h.RecvFP8().Host(), h.RecvScales().Host(), cfg.Hidden) // or an FP8 GEMM on them
//	_ = g.Combine(h, h.CombineBuffer(), ep.Host(out), nil)
//
// The cast is defined for every input (Quantize says it exactly): values
// round to the nearest e4m3, ties to even, into e4m3's subnormals too; the
// group's largest magnitude maps to 448 and nothing saturates beyond it; an
// all-zero group has scale 2^-126 (the smallest normal float32) and
// dequantizes to exact zeros; a group whose amax/448 is below 2^-126 has
// that scale too (its values land in e4m3's subnormals or round to zero,
// with no division by zero or infinity); NaN and ±Inf (which e4m3 cannot hold)
// become NaN of their sign and take no part in their group's scale, so the
// group's other values survive. Any Hidden works: when it is not a multiple
// of 128, the last group of a row is shorter and has its own scale. A
// backend that does not implement FP8 (it is not Capable of FeatureFP8Wire)
// is refused at NewGroup with ErrUnsupported.
//
// # Backends
//
// A Backend (Config.Backend) opens an Engine per group; the contract between
// them, and the vocabulary both share, is package ep/driver, which ep names
// for programs (Config, Tensor, the errors, ...). The Group does what
// every backend shares, written once: it checks every input (ids, lengths,
// memories, handles), computes the routing (Routing, the layout kernel's
// result), numbers the calls, enforces the buffer rules above and turns
// engine failures into a broken group; the Engine moves the rows. A new
// backend implements Engine and proves itself with the conformance suite of
// package ep/eptest; it declares the optional Features it implements (FP8
// dispatch, masking stalled ranks, refusals on every rank, per-peer waits,
// ...) by being Capable, from which the suite derives its checks, and
// NewGroup refuses a Config asking for the others by name. The CPU
// backend's zero-copy views are host tensors over its MPI windows: passing
// Recv() or CombineBuffer() itself as Combine's expert output avoids a
// copy.
//
// # Determinism
//
// Combine accumulates in float32 in a fixed order (LL: by top-k slot; HT:
// node by node, ranks in order inside a node), never in arrival order, so the
// same inputs give bit-identical outputs. bfloat16 outputs are rounded once.
// On one node the CPU and Alltoallv backends agree bit for bit.
//
// # Backward
//
// Combine is the transpose of dispatch and dispatch of combine, so the
// handle runs them for gradients: the gradient of the dispatched rows is
// brought home by Combine (with WeightsOverride set to all ones in LL mode, or
// plainly in HT), and the gradient of a combine reaches the expert rows by
// a dispatch of the output gradient reusing the handle (Reuse). CombineOptions.RowValues and
// SlotValues carry one float per row back to its (token, slot), for the
// gradient of the gate weights.
//
// # Collective calls and errors
//
// NewGroup, Dispatch (and its halves and cached forms), Combine (and its
// halves) and Close are collective: all ranks must call the same operations
// in the same order. Layout, the accessors and the Handle's views are local.
// Bad input (an expert id out of range or repeated in a token, more tokens
// than MaxTokensPerRank, wrong lengths, a tensor in the wrong memory, a
// handle from another group or stale, use after Close) is an *InputError on
// the calling rank before anything is written; the group stays usable. A
// rank that stops taking part makes the others return a *TimeoutError after
// Config.Timeout, naming it where the backend can; the group is then
// unusable. Errors of a call name it ("ll dispatch", "ht combine").
//
// A call refused on one rank (its input failed the checks there, or a
// layer above refused its caller's, RefuseDispatch and RefuseCombine) fails
// on every rank at once with a *RefusedError naming that rank and why
// (FeatureRefusals); the group stays usable. Calls carry their number in
// the group and their kind in what they exchange anyway (FeatureCallSequence):
// where a rank skipped a call, made one the others did not, or made another
// kind of call at the same place (a Mark of a step of its own counts), its
// calls and the others' no longer match, and every rank's call fails with a
// *SequenceError or *UnusableError naming a rank and the call (ErrMismatch)
// instead of pairing one rank's step with another's; the group is then
// unusable and closes as usual. A rank that finds the group unusable (a
// peer that did not arrive too) says so to the others, whose calls fail at
// once naming it; after a peer did not arrive, Close returns at once and
// frees nothing (that peer may be gone). Release ends a handle that will
// not be combined, giving its LL buffer set back.
//
// A rank that skips NewGroup or Close (returns early, or calls them on a
// different communicator) makes the others return, after Config.Timeout,
// a *TimeoutError naming it, never a hang:
// both begin with mpi.Comm.Arrive, point-to-point messages to rank 0 with
// tag 32011 on the communicator, before any collective. A Close that
// names a missing rank leaves this rank's buffers allocated, since freeing
// them needs every rank. No barrier is needed around either call.
package ep
