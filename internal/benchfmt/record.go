// Package benchfmt is the format of ep-bench's results: one Record per
// measured configuration, written by ep-bench -json as a JSON line and read
// by the scaling study (internal/study). It has no dependencies, so the
// benchmark does not link what the study needs.
package benchfmt

import "fmt"

// Record is one measured configuration.
type Record struct {
	Mode    string `json:"mode"`             // "ll" or "ht"
	Device  string `json:"device,omitempty"` // the ep backend's device: "cpu" (absent: cpu), "emulate" or "cuda"
	Ranks   int    `json:"ranks"`
	Nodes   int    `json:"nodes"`
	Tokens  int    `json:"tokens"` // per rank
	Hidden  int    `json:"hidden"`
	TopK    int    `json:"topk"`
	Experts int    `json:"experts"`
	DType   string `json:"dtype"` // "f32", "bf16", or "fp8" (bf16 tokens, FP8 e4m3 and per-128 scales on the wire)
	Iters   int    `json:"iters"`

	BytesPerRank float64 `json:"bytes_per_rank"` // bytes a rank's rows carry, mean over ranks

	DispatchUS   float64 `json:"dispatch_us"` // the slowest rank's median
	CombineUS    float64 `json:"combine_us"`
	DispatchGBps float64 `json:"dispatch_gbps"` // per rank, mean over ranks
	CombineGBps  float64 `json:"combine_gbps"`

	// The same work written by hand with MPI_Alltoallv (the ep.Alltoallv backend);
	// absent when the baseline was not run.
	AlltoallvDispatchUS   float64 `json:"alltoallv_dispatch_us,omitempty"`
	AlltoallvCombineUS    float64 `json:"alltoallv_combine_us,omitempty"`
	AlltoallvDispatchGBps float64 `json:"alltoallv_dispatch_gbps,omitempty"`
	AlltoallvCombineGBps  float64 `json:"alltoallv_combine_gbps,omitempty"`
	Speedup               float64 `json:"speedup_vs_alltoallv,omitempty"` // alltoallv (dispatch+combine) / ep (dispatch+combine)

	// Across nodes: the bytes of one dispatch and combine that crossed
	// nodes, over all ranks: ep's (its rows, counts and flags: Stats'
	// NetworkBytes) and the flat exchange's (the baseline's rows to and
	// from ranks of other nodes: what an alltoallv sends); absent on one
	// node or without the baseline.
	NetworkBytesPerCall     float64 `json:"network_bytes_per_call,omitempty"`
	FlatNetworkBytesPerCall float64 `json:"flat_network_bytes_per_call,omitempty"`

	// The network floor (across nodes, ep-bench -floor): ep's own bytes
	// across nodes, per peer, moved by a plain MPI exchange per half (the
	// dispatch's, then the combine's) from buffers filled beforehand, timed
	// as ep is: each half the faster of a blocking MPI_Alltoallv and every
	// MPI_Isend and MPI_Irecv posted at once (their totals are
	// FloorAlltoallvUS and FloorP2PUS). XFloor is ep's dispatch+combine over
	// the floor's, AlltoallvXFloor the baseline's. Absent on one node.
	FloorDispatchUS   float64 `json:"floor_dispatch_us,omitempty"`
	FloorCombineUS    float64 `json:"floor_combine_us,omitempty"`
	FloorAlltoallvUS  float64 `json:"floor_alltoallv_us,omitempty"`
	FloorP2PUS        float64 `json:"floor_p2p_us,omitempty"`
	FloorBytesPerCall float64 `json:"floor_bytes_per_call,omitempty"`
	// The processor time (user and system) a rank used in ep's
	// dispatch+combine and in the floor's point-to-point exchange, the
	// median over rounds, mean over ranks: where the hosts share the
	// machine's cores, as emulated hosts do, the network's own work (the
	// TCP stacks) competes with the ranks' for the same cores.
	CPUPerRoundUS      float64 `json:"cpu_per_round_us,omitempty"`
	FloorCPUPerRoundUS float64 `json:"floor_cpu_per_round_us,omitempty"`
	XFloor             float64 `json:"x_floor,omitempty"`
	AlltoallvXFloor    float64 `json:"alltoallv_x_floor,omitempty"`

	// With DType fp8: the same dispatch and combine in bf16 by the same
	// backend, timed in the same rounds, its bytes, and bf16's dispatch
	// time over fp8's; absent otherwise.
	BF16DispatchUS     float64 `json:"bf16_dispatch_us,omitempty"`
	BF16CombineUS      float64 `json:"bf16_combine_us,omitempty"`
	BF16BytesPerRank   float64 `json:"bf16_bytes_per_rank,omitempty"`
	FP8DispatchSpeedup float64 `json:"fp8_dispatch_speedup,omitempty"`

	// With a low-precision combine (ep-bench -combine fp8, LL): "fp8", the
	// bytes of a rank's combined codes and scales, the same dispatch and
	// combine in the element type timed in the same rounds (BF16*US), its
	// combine time over the fp8 one, and its bytes across nodes per call
	// (beside NetworkBytesPerCall, the fp8 group's).
	CombineWire             string  `json:"combine_wire,omitempty"`
	CombineBytesPerRank     float64 `json:"combine_bytes_per_rank,omitempty"`
	FP8CombineSpeedup       float64 `json:"fp8_combine_speedup,omitempty"`
	BF16NetworkBytesPerCall float64 `json:"bf16_network_bytes_per_call,omitempty"`
	// Layout is the receive layout measured (ep.Config.Layout), absent for
	// the modes' own. With HT's expert-major layout: its zone alignment,
	// and the flat layout by the same backend plus the permutation a user
	// writes to get the same zones (dispatch) and to sum the expert outputs
	// back into the flat rows (combine), timed in the same rounds; its time
	// over the expert-major layout's, the median over the rounds of each
	// round's ratio (slowest ranks), dispatch+combine and the dispatch
	// alone; and the permutation and the sums back alone (Go copies, and
	// Go loops for the sums).
	Layout                     string  `json:"layout,omitempty"`
	ExpertAlignment            int     `json:"expert_alignment,omitempty"`
	FlatPermuteDispatchUS      float64 `json:"flat_permute_dispatch_us,omitempty"`
	FlatPermuteCombineUS       float64 `json:"flat_permute_combine_us,omitempty"`
	ExpertMajorSpeedup         float64 `json:"expert_major_speedup,omitempty"`
	ExpertMajorDispatchSpeedup float64 `json:"expert_major_dispatch_speedup,omitempty"`
	PermuteUS                  float64 `json:"permute_us,omitempty"`
	UnpermuteUS                float64 `json:"unpermute_us,omitempty"`

	// FlagRoundTripUS is the floor of a flag exchange between ranks 0 and 1
	// of a node, measured in the same run (ep-bench -latency); absent when
	// not measured.
	FlagRoundTripUS float64 `json:"flag_round_trip_us,omitempty"`
	// DataRoundTripUS is the floor of a decode round that moves this
	// configuration's rows: ranks 0 and 1 each copy the rows they send the
	// other into its segment and raise a flag, wait for the other's, raise
	// a second flag, wait again, and read their rows back and sum them
	// (ep-bench's bench_exchange, in C), the slower rank's mean round;
	// measured in the same run with -latency, bfloat16 rows on one node
	// only, absent otherwise.
	DataRoundTripUS float64 `json:"data_round_trip_us,omitempty"`
	// With -latency: rounds back to back, as a decode loop runs them (no
	// barrier between them, as the flag round trip is measured): the time
	// of one dispatch+combine, the slowest rank's mean over a burst of
	// rounds, the median over bursts; ep's and the baseline's.
	SteadyRoundUS          float64 `json:"steady_round_us,omitempty"`
	AlltoallvSteadyRoundUS float64 `json:"alltoallv_steady_round_us,omitempty"`

	MemcpyGBps         float64 `json:"memcpy_gbps"`          // glibc memcpy of the same bytes, per rank, all ranks at once
	DispatchOfMemcpy   float64 `json:"dispatch_memcpy_frac"` // DispatchGBps / MemcpyGBps
	CombineOfMemcpy    float64 `json:"combine_memcpy_frac"`
	BufferBytesPerRank int     `json:"buffer_bytes_per_rank"`

	// With a device other than cpu: the CPU engine on the same work in the
	// same run (whose results ep's were checked against), and a copy of the
	// same bytes inside the device's memory (cuMemcpyDtoD on a GPU).
	CPUDispatchUS        float64 `json:"cpu_dispatch_us,omitempty"`
	CPUCombineUS         float64 `json:"cpu_combine_us,omitempty"`
	DeviceCopyGBps       float64 `json:"device_copy_gbps,omitempty"`
	DispatchOfDeviceCopy float64 `json:"dispatch_device_copy_frac,omitempty"`
	CombineOfDeviceCopy  float64 `json:"combine_device_copy_frac,omitempty"`
	// On a GPU: the device's time of ep's dispatch and combine (the
	// slowest rank's median), from the first work each queued to the
	// last, timed with events; the host times above include the launch
	// and the host's waits.
	DispatchDeviceUS float64 `json:"dispatch_device_us,omitempty"`
	CombineDeviceUS  float64 `json:"combine_device_us,omitempty"`
	// With a transport that moves rows between the ranks of a node itself
	// (the GPU backend over IPC): the bytes it moved per dispatch+combine
	// round, all ranks together, and what transfers of fixed size (an NCCL
	// group's) would have moved for the same rounds.
	TransferBytesPerRound     float64 `json:"transfer_bytes_per_round,omitempty"`
	TransferFullBytesPerRound float64 `json:"transfer_full_bytes_per_round,omitempty"`

	// Step is the index of the study's job step that produced the record
	// (its position in the study's steps attribute); set by the collector,
	// not part of the JSON.
	Step int `json:"-"`
}

// ElemBytes is the size of one element on the wire: 4 for f32, 2 for bf16,
// 1 for fp8 (whose scales add 4 bytes per 128 elements).
func (r *Record) ElemBytes() int {
	switch r.DType {
	case "f32":
		return 4
	case "fp8":
		return 1
	}
	return 2
}

// RanksPerNode is the number of ranks on the largest node (nodes may hold
// different numbers of ranks).
func (r *Record) RanksPerNode() int {
	if r.Nodes <= 0 {
		return r.Ranks
	}
	return (r.Ranks + r.Nodes - 1) / r.Nodes
}

// Validate reports what is wrong with a record read from JSON.
func (r *Record) Validate() error {
	switch {
	case r.Mode != "ll" && r.Mode != "ht":
		return fmt.Errorf("mode %q is not ll or ht", r.Mode)
	case r.DType != "f32" && r.DType != "bf16" && r.DType != "fp8":
		return fmt.Errorf("dtype %q is not f32, bf16 or fp8", r.DType)
	case r.Ranks < 1 || r.Nodes < 1 || r.Nodes > r.Ranks:
		return fmt.Errorf("%d ranks on %d nodes: want ranks >= nodes >= 1", r.Ranks, r.Nodes)
	case r.Tokens < 0 || r.Hidden < 1 || r.TopK < 1 || r.Experts < 1 || r.Iters < 1:
		return fmt.Errorf("tokens %d, hidden %d, topk %d, experts %d, iters %d: out of range",
			r.Tokens, r.Hidden, r.TopK, r.Experts, r.Iters)
	case r.DispatchUS <= 0 || r.CombineUS <= 0:
		return fmt.Errorf("dispatch_us %g and combine_us %g must be positive", r.DispatchUS, r.CombineUS)
	}
	return nil
}
