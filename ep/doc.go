// Package ep is expert-parallel dispatch and combine for Mixture-of-Experts
// layers over MPI: the Go counterpart of NCCL EP's ncclEpDispatch and
// ncclEpCombine, running on CPU memory.
//
// A Group is created collectively from an MPI communicator and a Config.
// Experts are spread evenly: rank r owns experts [r*L, (r+1)*L) where
// L = NumExperts/Size. Every token names its top-k experts (-1 = none).
// Dispatch sends each token to the ranks that own its experts; the experts
// run; Combine brings their outputs back to the token's rank and sums them.
//
//	g, _ := ep.NewGroup[ep.BF16](world, ep.Config{Mode: ep.LowLatency, ...})
//	h, _ := g.Dispatch(x, topk, weights)   // x: [T][Hidden], topk and weights: [T][TopK]
//	y := expertsForward(h.Recv(), h.ExpertCounts())
//	_ = g.Combine(h, y, out, nil)           // out: [T][Hidden]
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
// nodes a token travels once per destination node, to the rank with the same
// local rank there, which forwards it inside its node. Combine sums the
// per-rank partial outputs (the expert side applies the weights) back on the
// token's rank. The rows stay valid until the next dispatch.
//
// # Transport and memory
//
// Inside a node every rank maps every other rank's buffers (an MPI-3
// shared-memory window: the counterpart of NCCL's load/store LSA path), so a
// dispatched row is copied once, from the sender's tensor into its slot in the
// receiver's buffer, and combine reads the expert outputs straight from the
// expert rank's buffer. Across nodes rows go by MPI one-sided puts into a
// staging window (the counterpart of GIN), then are copied (LL) or forwarded
// (HT) inside the node. Ranks signal each other with 64-bit sequence flags,
// written with release order after the data and read with acquire order
// before it. Every wait has the group's timeout and returns a *TimeoutError
// naming the rank that did not arrive; the group is then unusable.
//
// Buffers live in MPI windows, not on the Go heap. Recv, CombineBuffer and the
// other views of a handle point into them; Close releases them. Passing
// Recv() or CombineBuffer() itself as Combine's expert output avoids a copy.
//
// # Determinism
//
// Combine accumulates in float32 in a fixed order (LL: by top-k slot; HT:
// node by node, ranks in order inside a node), never in arrival order, so the
// same inputs give bit-identical outputs. bfloat16 outputs are rounded once.
//
// # Backward
//
// Combine is the transpose of dispatch and dispatch of combine, so the
// handle runs them for gradients: the gradient of the dispatched rows is
// brought home by Combine (with WeightsOverride set to all ones in LL mode, or
// plainly in HT), and the gradient of a combine reaches the expert rows by
// DispatchCached with the output gradient. CombineOptions.RowValues and
// SlotValues carry one float per row back to its (token, slot), for the
// gradient of the gate weights.
//
// # Errors
//
// Bad input (an expert id out of range or repeated in a token, more tokens
// than MaxTokensPerRank, wrong slice lengths, a handle from another group,
// use after Close) is reported on the calling rank before anything is
// written. Every call is collective: all ranks must call the same operations
// in the same order.
package ep
