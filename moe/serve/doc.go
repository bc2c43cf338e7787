// Package serve serves a stream of requests with a small multi-layer
// Mixture-of-Experts decoder whose routed experts are spread over the ranks
// of an MPI job by package ep: LL mode where it is meant to run, in a
// decode loop. cmd/moe-serve is its command; docs/serve.md has the
// design, the measurements and the trace schema.
//
// # The model
//
// A token id is embedded ([Vocab][Hidden], tied to the output), then goes
// through Layers decoder layers, each
//
//	h += Attention(rms(h))          single head, causal, over the request's own KV cache
//	u  = rms(h), rounded to the wire's element type
//	h += sum_k grid(w_k * expert_{e_k}(u)) + shared(u)
//
// and the next token is the argmax of rms(h)·Embᵀ (greedy; ties to the
// lower id). The attention is real attention of a real shape (its cost
// grows with the context) but a stand-in for a production model's: one
// head, no positional encoding. The MoE layer is package moe's: its router
// (moe.Route: softmax of u·Gate, top k, weights renormalised), its experts
// (Params.ExpertForward) and shared expert, drawn as moe's teacher is
// (moe.TeacherParams, a seed per layer) or taken from a moe-train
// checkpoint (Config.Checkpoint: its layer in every decoder layer).
// Parameters and compute are float64; rows travel as float32 or bfloat16.
//
// The experts' weighted outputs are rounded to multiples of 2^-10 (grid),
// so that every sum of them is exact in float32: a token's MoE output, and
// so every token served, is the same whatever the number of ranks, the
// mode (LL sums one row per (token, expert), HT first sums each rank's
// experts) and the order of reduction. Reference decodes one request
// alone, position by position, with every expert and no ep: serving must
// give its tokens, and the bits of its logits (Served.Hash), exactly.
//
// # Serving
//
// Requests (Workload: seeded prompts and lengths, Poisson arrivals) are
// scheduled by rank 0. Before each step it tells every rank that takes
// part, by a point-to-point message on a communicator of its own, what
// kind of step to run and which requests are newly its; every rank keeps
// its requests' KV caches and tokens. Rank 0 keeps a mirror of every rank's
// queue, planned and committed by the same code as the rank's own, so it
// knows what each will do without being told. A rank holds at most Batch
// requests; requests join and leave between steps (continuous batching),
// going to the live rank holding the fewest (round robin among equals). A
// step is a prefill step (the next prompt tokens of every request whose
// prompt is not all in its cache, at most PrefillTokens per rank, a prompt
// possibly over several steps) whenever some rank has one, else a decode
// step (one token of every running request). Decode steps go through an LL
// group of Batch tokens per rank; prompts through the same group in chunks
// (Prefill ep.LowLatency) or through HT groups (ep.HighThroughput). Every
// rank runs every step, with 0 tokens when it has none.
//
// # Two micro-batches
//
// With Overlap a step's rows are cut into two micro-batches (whole
// requests; a prompt may be cut, its first positions in the first) and
// each layer runs as DeepEP's two-batch overlap:
//
//	attention(A) DispatchSend(A)  attention(B) DispatchSend(B)
//	per layer:   Wait(A) experts(A) CombineSend(A)   Wait(B) experts(B) CombineSend(B)
//	             Wait(A) [attention(A) DispatchSend(A) of the next layer]
//	             Wait(B) [attention(B) DispatchSend(B) of the next layer]
//
// so that while one micro-batch's dispatch or combine is in flight the
// other computes. In LL both micro-batches use the one group, whose two
// buffer sets hold both dispatches at once; in HT each has a group of its
// own (an HT group has one receive buffer). Without Overlap the step's
// rows go as one batch through the same calls, one after the other. Every
// row's result depends on its own request alone, so both give the same
// tokens, bit for bit. The trace's events time every phase of every
// micro-batch, so that the interleaving can be seen.
//
// # Stalled ranks
//
// With MaskStalled (ep's MaskStalledRanks on the LL group) a rank that does
// not arrive within Timeout is masked by the others, who finish the step
// without it: the (token, expert) pairs routed to its experts contribute
// nothing and are counted, per step and per request. Rank 0 sees the mask,
// gives the rank nothing more, sends it a notice and serves on. The stalled
// rank, when it comes back, finds that its ep calls return ep.ErrMasked:
// it undoes its unfinished step (its requests' caches back to where they
// stood) and reports its requests' progress to rank 0. When every masked
// rank has reported, rank 0 has every rank call SetMask(nil) at the start
// of the next step, and the rank serves on from where it stood. A stalled
// rank 0 is masked by the others too; they finish their step and wait for
// its next instruction, and it has them all rejoin as soon as it is back.
// Limits: prompts through HT cannot be masked (ep masks LL groups only);
// masked ranks rejoin together, once all are back; a rank that does not
// come back within ControlTimeout while it holds requests fails the run.
//
// # Results and traces
//
// Serve returns, on rank 0, the Result: every step of every rank (tokens,
// times, dropped pairs, the ranks masked), every request (arrival, first
// token, tokens, hash, dropped pairs), every phase of every micro-batch,
// and the masking episodes. Figures computes what a service owner reads:
// step latency p50/p90/p99 for decode and prefill, time to first token,
// tokens per second in all and per rank, what masking lost. WriteTrace
// writes it all as HDF5 (ReadTrace reads it back; cmd/ep-plot serve draws
// it).
//
// Serve is collective. Its errors on one rank are that rank's: the program
// should call mpi.Abort so that the others do not wait for it.
package serve
