// Package eptest is the conformance suite of package ep's contract: given a
// Backend, Run checks every property the contract promises, on every rank of
// an MPI job, against references computed by brute force from every rank's
// input (no knowledge of the backend), the way gonum's testblas checks any
// BLAS implementation:
//
//   - the routing (Layout) against a brute-force count;
//   - the received rows, exactly: their sources and order (by source rank,
//     then token), per-expert counts, HT's local top-k ids (-1 elsewhere)
//     and weights;
//   - combine with identity experts (LL: x times the sum of its weights; HT:
//     x times the ranks it reached) and with scaled experts (float32 exact,
//     bfloat16 within its rounding);
//   - uneven token counts including 0, masked (-1) entries, all tokens to
//     one expert, float32 and bfloat16;
//   - cached dispatches and repeats bit-identical, through Recv, a copy, and
//     CombineBuffer;
//   - LL double buffering: many calls with two dispatches in flight;
//   - backward: combine is the transpose of dispatch and cached dispatch of
//     combine, <D x, y> = <x, C y> over all ranks, and RowValues reaching
//     their slots;
//   - FP8 dispatch (where the backend declares ep.FeatureFP8Wire): both
//     modes and scale kinds, hidden sizes with partial groups, fresh,
//     cached and repeated; the received e4m3 codes and scales bit for bit
//     against the reference quantization (internal/fp8ref) of the row each
//     came from, exact combines of the dequantized rows, the bytes counted;
//   - the receive layouts and id kinds other than the modes' own (HT
//     expert-major zones with and without alignment, LL rank-major, global
//     expert ids), where the backend claims them: the rows, metadata,
//     counts, offsets and zero padding against the suite's own reference,
//     combines that never read padding, cached dispatches, the backward
//     pass, RowValues, FP8, statistics, consecutive calls, and agreement
//     with the reference backend;
//   - the optional features a Config asks for and the backend does not
//     declare refused at NewGroup with ep.ErrUnsupported, naming the
//     backend and the feature;
//   - bit-identical agreement with a reference backend (Suite.Reference);
//   - every bad input refused with its message, writing nothing (a normal
//     round afterwards is right), bad configs, use after Close;
//   - a stalled rank: the others time out within the group's timeout,
//     naming it where the backend declares ep.FeatureNamedTimeouts;
//   - steady-state calls allocate nothing, nor do dispatches whose routing
//     changes and grows every time, from the second call on, in every
//     layout (ep.FeatureZeroAllocs);
//   - a group's lifecycle with no barrier from the user: a call right after
//     NewGroup, two groups with interleaved calls, create-run-Close 50
//     times, a group on a sub-communicator beside one on the world, ranks
//     reaching Close at different times;
//   - one rank's refused input failing every rank's same call at once
//     (ep.FeatureRefusals); per-peer statistics, with waits and network
//     bytes exactly where the backend declares ep.FeatureMeter; a stalled
//     rank masked and back (ep.FeatureMaskStalledRanks).
//
// The Suite has no switches for optional behaviour: every ep.Feature the
// backend declares (ep.Capable) has its check run, so a backend cannot
// claim a behaviour whose checks are skipped, and a backend that declares
// a feature the suite has no check for fails.
//
// A backend's own test runs it under mpirun (internal/cmd/mpitest) at several
// rank counts and on simulated nodes:
//
//	func TestConformance(t *testing.T) {
//		eptest.Run(t, eptest.Suite{Comm: mpitesting.World, Backend: ep.CPU, Reference: ep.Alltoallv})
//	}
//
// Tensors are made and read only through ep.Alloc, ep.Upload and
// ep.Download, so a backend on device memory is checked the same way.
package eptest
