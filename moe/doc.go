// Package moe is a toy Mixture-of-Experts layer that trains over package
// ep's expert-parallel dispatch and combine, on every rank of an MPI job
// (package moe/runs runs whole trainings with HDF5 traces and
// checkpoints). It is small enough to check by finite
// differences and real enough to exercise ep as a training framework does:
// forward and backward through both modes, the gradient of the routing
// weights carried back by Combine's RowValues, a gate and an optional shared
// expert trained with data parallelism (their gradient summed exactly, or by
// A2SGD or Top-K), and a state that can be gathered and restored on any
// number of ranks.
//
// # The layer
//
// A Layer maps each rank's tokens x ([T][Hidden], float64) to outputs of
// the same shape:
//
//	p      = softmax(x · Gate)                    Gate [Hidden][Experts], replicated on every rank
//	e_1..K = the K most probable experts           distinct; ties go to the lower index
//	w_k    = p[e_k] / sum_j p[e_j]                 renormalised over the top k
//	out    = sum_k w_k * expert_{e_k}(x) + shared(x)
//	expert(u) = act(u · W1 + b1) · W2 + b2         Hidden -> FFN -> Hidden, act SiLU or GELU
//	shared(u) = act(u · SW1 + sb1) · SW2 + sb2     Hidden -> SharedFFN -> Hidden; 0 if SharedFFN = 0
//
// Rank r owns experts [r*L, (r+1)*L), L = Experts/ranks, as in ep. The
// shared expert, as in DeepSeek-MoE and Qwen-MoE, is a dense FFN every token
// passes through, on its own rank: like the gate, every rank holds a copy.
// Parameters and expert compute are float64 (matrix products with gonum's
// BLAS); tokens travel through ep as float32 or bfloat16 (Config.DType).
//
// Forward routes the tokens, dispatches them (ep.Group.Dispatch), runs each
// local expert on its rows and combines (ep.Group.Combine). In LL mode each
// received row is one (token, expert) pair: expert l runs on the first
// ExpertCounts()[l] rows of its block and Combine applies the weights. In HT
// mode a token arrives once per rank: for each received row and each local
// slot k (RecvTopK >= 0) the expert side computes sum_k w_k * expert_k(row),
// and Combine sums over ranks.
//
// Config.Backend chooses the ep backend (ep.Config.Backend): nil for ep's
// CPU engine, whose tensors are host memory, so the layer hands it its
// rows as they are; a GPU backend (package epgpu) keeps them in device
// memory, and the layer uploads the tokens before each dispatch and the
// expert outputs before each combine and brings the received rows and the
// results back, counting every copy (CommStats.Copies). The expert
// computation stays on the host. The GPU engine's results are the CPU
// engine's bit for bit, and so is the training. Trainer.SetDevice
// describes the device (Device), for a run's traces and checkpoints; a
// run may resume on another.
//
// # The load-balancing loss
//
// Forward also returns the Switch Transformer's auxiliary loss over the
// whole batch (every rank's tokens):
//
//	aux = Experts * sum_e f_e * P_e
//	f_e = (number of (token, slot) pairs routed to e) / (tokens * TopK)
//	P_e = (sum over tokens of p[e]) / tokens
//
// where tokens counts every rank's. It is 1 when routing is balanced. f_e
// comes from a discrete choice and is treated as a constant; only P_e
// carries gradient: d aux / d p[t][e] = Experts * f_e / tokens.
//
// # Backward
//
// Backward takes d(loss)/d(out) on every rank and d(loss)/d(aux), and
// passes back through ep with the forward's handle: the output gradient
// reaches the expert rows by a dispatch reusing the forward's routing (ep.Reuse; the transpose of combine), the
// experts' backward runs there and yields, per (row, slot), the gradient of
// the routing weight, <d(loss)/d(out), expert output>; one Combine brings the
// input gradients home (the transpose of dispatch: WeightsOverride all ones
// in LL mode, where the expert side already applied the weights; a plain sum
// in HT mode) and carries those weight gradients back to their (token, slot)
// through RowValues and SlotValues. The router's backward (through the
// renormalisation, the softmax and the aux loss) then gives the gate's
// gradient and the rest of the input's; the shared expert's backward runs on
// the rank's own tokens and adds to the input's. TestGradients checks every
// gradient against central differences of the global loss on one rank and,
// under mpirun, on several.
//
// # Data-parallel gradients
//
// The gate and the shared expert are data parallel: every rank holds a copy
// and computes the gradient of its own tokens' share of the loss. The loss
// is a sum of per-rank terms (the global mean squared error is), so the sum
// over ranks of those gradients is the gradient of the global loss. A
// Syncer computes it, once per Backward, over one vector (the gate's
// gradient, then the shared expert's), as Config.GradSync chooses:
//
//   - allreduce (the default): mpi.Allreduce, exact; every rank applies the
//     same update and the copies stay identical.
//   - a2sgd: A2SGD's two-level gradient averaging (Bhattacharya, Yu,
//     Chowdhury, "O(1) Communication for Distributed SGD through Two-Level
//     Gradient Averaging", arXiv 2006.07405). Each rank adds its kept error
//     to its gradient, condenses the whole vector to the mean of its
//     positive entries and the mean of its negative ones, and the ranks
//     average those two numbers (an allreduce of 16 bytes, whatever the
//     model's size). Each rank then updates every entry by the global
//     average of its sign (0 for a zero entry) and keeps the difference
//     between what it had and what it applied as its error, added back at
//     the next step. The signs are each rank's own, so the ranks' copies of
//     the gate and shared expert drift apart (Replicated is false).
//   - topk:K: Top-K sparsification with error feedback, the paper's
//     baseline: each rank sends the K entries of its gradient plus error of
//     largest magnitude (an allgather of K index-value pairs), keeps the
//     rest as its error, and every rank sums what all sent, in rank order,
//     so the copies stay identical.
//
// Choices where the paper is silent or could not be checked (it was not
// available to read while this was written; docs/gradsync.md discusses
// them): the two means are taken over the whole data-parallel vector, not per
// tensor ("two local averages per worker"); the error is what the rank had
// minus what it applied with the global averages, so that applied updates
// plus the error always equal the sum of the raw gradients; an entry equal to
// zero counts in neither mean and is updated by 0; a rank without positive
// (or negative) entries contributes 0 to that average; the synced gradient
// goes to Adam, the trainer's optimiser, where the paper uses SGD. Sync
// returns a sum over ranks, like the exact sync: R times the rank's averaged
// update. SyncStats counts the bytes each rank sends under the
// bandwidth-optimal algorithms (2(R-1)/R of an allreduced vector, R-1 times
// a rank's own part of an allgather) and the time the sync took.
//
// # The synthetic task
//
// A Teacher is a fixed random MoE of the same shape (its own seed; a sharper
// gate and larger weights than the student's initialisation), evaluated in
// float64 on every rank. The data is one stream of tokens, token i drawn
// from a PCG seeded by (seed, i) alone; the global batch of step s is tokens
// [(s-1)*G, s*G), G = tokens per rank * ranks, and rank r takes its
// contiguous share (Batch). There is no data generator state: runs are
// reproducible, resume exactly, and a run resumed on another number of ranks
// with the same G trains on the same tokens. Trainer runs steps: the student
// Layer's forward, the loss
//
//	loss  = sum over ranks and tokens of |out - target|^2 / (tokens * Hidden)
//	total = loss + AuxCoef * aux
//
// its backward, and an Adam update (Adam, whose moments and step count are
// part of the trainer's State). Initial parameters come from Config.Seed, the gate from
// one stream and expert e from a stream of its own, so the model does not
// depend on the number of ranks.
//
// # The trainer's state
//
// A Trainer's whole state is its State: the model with every expert, in
// global order, Adam's moments and update count, and the per-rank state of
// a grad sync with error feedback (SyncState; for A2SGD also each rank's
// own copy of the gate and shared expert and of their Adam moments).
// GatherState brings it to rank 0; RestoreState hands it to the ranks of
// another trainer of the same model, on any number of ranks that divides
// the experts (each rank takes its share), in either mode and element
// type, with any tokens per rank. On the same ranks, mode and element type
// a trainer of 2N steps and one of N steps restored and run N more end
// bit-identical, with any grad sync; on another number of ranks the ranks'
// errors are pooled and spread evenly (none is lost) and, under A2SGD,
// every rank starts from rank 0's copy.
//
// Package moe/runs manages whole runs over a Trainer: the run's identity,
// its HDF5 trace (one row per step of StepStats), its checkpoints (a State
// in a file), resumes, and the straggler analysis of the per-peer waits.
//
// # Collectives and errors
//
// NewLayer, Forward, Backward, NewTrainer, Trainer.Step, GatherState and
// RestoreState are collective: every rank calls them in the same order.
// Errors are returned, never panics. RestoreState refuses a state of
// another shape on every rank alike; other errors (a failed MPI call) may
// be on one rank only, and the program should call mpi.Abort so that the
// other ranks do not wait for it.
package moe
