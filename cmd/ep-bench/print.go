package main

// The tables ep-bench prints.

import (
	"fmt"
	"io"
)

func printTable(w io.Writer, r *Result, baseline bool) {
	fmt.Fprintf(w, "ep-bench %s %s: %d ranks on %d node(s), %d tokens/rank, hidden %d, top-%d, %d experts; %.1f MB/rank per call; median of %d, slowest rank\n",
		r.Mode, r.DType, r.Ranks, r.Nodes, r.Tokens, r.Hidden, r.TopK, r.Experts, r.BytesPerRank/1e6, r.Iters)
	fmt.Fprintf(w, "  buffers: %.1f MB per rank\n", float64(r.BufferBytesPerRank)/1e6)
	if r.Layout != "" {
		fmt.Fprintf(w, "  receive layout: %s", r.Layout)
		if r.ExpertAlignment > 1 {
			fmt.Fprintf(w, ", zones aligned to %d rows", r.ExpertAlignment)
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintf(w, "  %-22s %12s %10s %12s %10s %12s\n", "", "dispatch us", "GB/s", "combine us", "GB/s", "total us")
	name := "ep (goep)"
	if r.Device != "" {
		name = "ep (goep) on " + r.Device
	}
	fmt.Fprintf(w, "  %-22s %12.1f %10.2f %12.1f %10.2f %12.1f\n", name, r.DispatchUS, r.DispatchGBps, r.CombineUS, r.CombineGBps, r.DispatchUS+r.CombineUS)
	if r.Device != "" {
		bw := func(us float64) float64 { // the CPU engine's, from the same bytes
			if us <= 0 {
				return 0
			}
			return r.BytesPerRank / us / 1e3
		}
		fmt.Fprintf(w, "  %-22s %12.1f %10.2f %12.1f %10.2f %12.1f\n", "ep CPU engine", r.CPUDispatchUS, bw(r.CPUDispatchUS),
			r.CPUCombineUS, bw(r.CPUCombineUS), r.CPUDispatchUS+r.CPUCombineUS)
		if r.DispatchDeviceUS > 0 {
			fmt.Fprintf(w, "  %-22s %12.1f %10s %12.1f %10s %12.1f\n", "  device time (events)", r.DispatchDeviceUS, "",
				r.CombineDeviceUS, "", r.DispatchDeviceUS+r.CombineDeviceUS)
		}
		fmt.Fprintf(w, "  %s takes %.2fx the CPU engine's time (dispatch+combine), results checked against it\n", r.Device,
			(r.DispatchUS+r.CombineUS)/(r.CPUDispatchUS+r.CPUCombineUS))
	}
	if baseline {
		fmt.Fprintf(w, "  %-22s %12.1f %10.2f %12.1f %10.2f %12.1f\n", "alltoallv by hand", r.AlltoallvDispatchUS, r.AlltoallvDispatchGBps,
			r.AlltoallvCombineUS, r.AlltoallvCombineGBps, r.AlltoallvDispatchUS+r.AlltoallvCombineUS)
		fmt.Fprintf(w, "  speedup over alltoallv: %.2fx\n", r.Speedup)
	}
	if r.XFloor > 0 {
		fmt.Fprintf(w, "  %-22s %12.1f %10s %12.1f %10s %12.1f\n", "network floor", r.FloorDispatchUS, "", r.FloorCombineUS, "",
			r.FloorDispatchUS+r.FloorCombineUS)
		fmt.Fprintf(w, "  x floor (median of each round's ratio): ep %.2fx", r.XFloor)
		if r.AlltoallvXFloor > 0 {
			fmt.Fprintf(w, ", alltoallv %.2fx", r.AlltoallvXFloor)
		}
		fmt.Fprintf(w, " (floor: ep's own %.1f MB across nodes, all ranks, each half by the faster of MPI_Alltoallv, %.1f us in all, and every MPI_Isend/Irecv at once, %.1f us)\n",
			r.FloorBytesPerCall/1e6, r.FloorAlltoallvUS, r.FloorP2PUS)
		fmt.Fprintf(w, "  processor time per rank and round (mean over ranks): ep %.1f ms, the floor's exchange %.1f ms (%.2fx)\n",
			r.CPUPerRoundUS/1e3, r.FloorCPUPerRoundUS/1e3, r.CPUPerRoundUS/r.FloorCPUPerRoundUS)
	}
	if r.FlatNetworkBytesPerCall > 0 {
		fmt.Fprintf(w, "  across nodes per dispatch+combine, all ranks: ep %.1f MB, a flat exchange (alltoallv) %.1f MB (%.2fx)\n",
			r.NetworkBytesPerCall/1e6, r.FlatNetworkBytesPerCall/1e6, r.NetworkBytesPerCall/r.FlatNetworkBytesPerCall)
	}
	if r.FlatPermuteDispatchUS > 0 {
		fmt.Fprintf(w, "  %-22s %12.1f %10s %12.1f %10s %12.1f\n", "flat + permutation", r.FlatPermuteDispatchUS, "",
			r.FlatPermuteCombineUS, "", r.FlatPermuteDispatchUS+r.FlatPermuteCombineUS)
		saved := r.FlatPermuteDispatchUS + r.FlatPermuteCombineUS - r.DispatchUS - r.CombineUS
		fmt.Fprintf(w, "  expert-major saves %.1f us per round (medians: dispatch %.1f, combine %.1f); flat + permutation takes %.2fx its time, its dispatch %.2fx (medians of each round's ratio)\n",
			saved, r.FlatPermuteDispatchUS-r.DispatchUS, r.FlatPermuteCombineUS-r.CombineUS, r.ExpertMajorSpeedup, r.ExpertMajorDispatchSpeedup)
		fmt.Fprintf(w, "  (flat + permutation: the flat dispatch and the rows copied into the same zones, %.1f us of it; the zone rows summed back into the flat rows, %.1f us, and the flat combine)\n",
			r.PermuteUS, r.UnpermuteUS)
	}
	if r.FP8CombineSpeedup > 0 {
		fmt.Fprintf(w, "  %-22s %12.1f %10s %12.1f %10s %12.1f\n", "ep, bf16 combine", r.BF16DispatchUS, "", r.BF16CombineUS, "",
			r.BF16DispatchUS+r.BF16CombineUS)
		fmt.Fprintf(w, "  fp8 combine: %.2f MB/rank per call (bf16: %.2f MB), %.2fx the speed of the bf16 combine", r.CombineBytesPerRank/1e6,
			r.BytesPerRank/1e6, r.FP8CombineSpeedup)
		if r.BF16NetworkBytesPerCall > 0 {
			fmt.Fprintf(w, "; across nodes per dispatch+combine, all ranks: %.1f MB (bf16 combine: %.1f MB)", r.NetworkBytesPerCall/1e6,
				r.BF16NetworkBytesPerCall/1e6)
		}
		fmt.Fprintln(w)
	} else if r.BF16DispatchUS > 0 {
		fmt.Fprintf(w, "  %-22s %12.1f %10.2f %12.1f %10.2f %12.1f\n", "ep, bf16 on the wire", r.BF16DispatchUS,
			r.BF16BytesPerRank/r.BF16DispatchUS/1e3, r.BF16CombineUS, r.BF16BytesPerRank/r.BF16CombineUS/1e3, r.BF16DispatchUS+r.BF16CombineUS)
		fmt.Fprintf(w, "  fp8 dispatch: %.2f MB/rank per call (bf16: %.2f MB, %.2fx the bytes), %.2fx the speed of bf16\n",
			r.BytesPerRank/1e6, r.BF16BytesPerRank/1e6, r.BytesPerRank/r.BF16BytesPerRank, r.FP8DispatchSpeedup)
	}
	fmt.Fprintf(w, "  memcpy of the same bytes: %.2f GB/s per rank; dispatch %.0f%%, combine %.0f%% of it\n",
		r.MemcpyGBps, 100*r.DispatchOfMemcpy, 100*r.CombineOfMemcpy)
	if r.Device != "" {
		fmt.Fprintf(w, "  %s copy of the same bytes in device memory: %.2f GB/s per rank; dispatch %.0f%%, combine %.0f%% of it\n",
			r.Device, r.DeviceCopyGBps, 100*r.DispatchOfDeviceCopy, 100*r.CombineOfDeviceCopy)
	}
	if r.TransferFullBytesPerRound > 0 {
		fmt.Fprintf(w, "  the IPC transport moved %.2f MB per dispatch+combine (all ranks); fixed-size transfers would move %.2f MB (%.0f%%)\n",
			r.TransferBytesPerRound/1e6, r.TransferFullBytesPerRound/1e6, 100*r.TransferBytesPerRound/r.TransferFullBytesPerRound)
	}
	fmt.Fprintln(w)
}

// printLatency is the -latency sweep as one table: ep's LL dispatch and
// combine against the two floors measured in the same run, the flag round
// trip and the data round trip of the same rows. "round" is a
// dispatch+combine back to back with the others (a decode loop), which is
// how the floors are measured too, and what "x flag" and "x data" compare;
// the dispatch and combine columns are each timed from a barrier.
func printLatency(w io.Writer, results []*Result, floor float64) {
	fmt.Fprintf(w, "LL latency, flag round trip between two ranks of a node: %.2f us\n", floor)
	fmt.Fprintf(w, "  %8s %8s %10s %8s %10s %8s %10s | %12s %11s | %14s %10s\n", "tokens", "hidden", "round us", "x flag",
		"data us", "x data", "alltoallv", "dispatch us", "combine us", "alltoallv d+c", "speedup")
	ratio := func(a, b float64) float64 {
		if b > 0 {
			return a / b
		}
		return 0
	}
	for _, r := range results {
		fmt.Fprintf(w, "  %8d %8d %10.2f %8.2f %10.2f %8.2f %10.2f | %12.2f %11.2f | %14.2f %9.2fx\n", r.Tokens, r.Hidden,
			r.SteadyRoundUS, ratio(r.SteadyRoundUS, floor), r.DataRoundTripUS, ratio(r.SteadyRoundUS, r.DataRoundTripUS),
			r.AlltoallvSteadyRoundUS, r.DispatchUS, r.CombineUS, r.AlltoallvDispatchUS+r.AlltoallvCombineUS,
			ratio(r.AlltoallvSteadyRoundUS, r.SteadyRoundUS))
	}
	fmt.Fprintf(w, "  round: one dispatch+combine back to back (a decode loop), the slowest rank's mean over %d;\n", burst)
	fmt.Fprintln(w, "  x flag = round / flag round trip; data: the same rows moved and summed by the least code that can (C), x data = round / data;")
	fmt.Fprintln(w, "  dispatch, combine: each from a barrier, medians, slowest rank; speedup = alltoallv's round / ep's")
}
