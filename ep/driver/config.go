package driver

import (
	"fmt"
	"time"
)

// Mode selects the algorithm of a Group. Its zero value is invalid, so that a
// Config must choose.
type Mode int

// Modes.
const (
	LowLatency     Mode = iota + 1 // expert-major buffers, direct writes, double buffering
	HighThroughput                 // rank-grouped rows, once per rank, hierarchical across nodes
)

func (m Mode) String() string {
	switch m {
	case LowLatency:
		return "ll"
	case HighThroughput:
		return "ht"
	}
	return fmt.Sprintf("Mode(%d)", int(m))
}

// ParseMode reads "ll" or "ht".
func ParseMode(s string) (Mode, error) {
	switch s {
	case "ll", "LL", "low-latency":
		return LowLatency, nil
	case "ht", "HT", "high-throughput":
		return HighThroughput, nil
	}
	return 0, fmt.Errorf("ep: unknown mode %q (want ll or ht)", s)
}

// OverflowPolicy is what an HT dispatch does with rows beyond
// MaxRecvTokensPerRank (Config.Overflow).
type OverflowPolicy int

// Overflow policies.
const (
	OverflowFail OverflowPolicy = iota // the dispatch fails on every rank
	OverflowDrop                       // the rows that do not fit are dropped, deterministically
)

func (o OverflowPolicy) String() string {
	switch o {
	case OverflowFail:
		return "fail"
	case OverflowDrop:
		return "drop"
	}
	return fmt.Sprintf("OverflowPolicy(%d)", int(o))
}

// DefaultTimeout is the wait limit of a Config with Timeout zero.
const DefaultTimeout = 60 * time.Second

// MaxTopK bounds Config.TopK.
const MaxTopK = 64

// MaxExperts bounds Config.NumExperts: far past the models of today (a few
// hundred), and what keeps the tables a group makes per expert (per source
// rank, in each of the handle ring's records) to what a host holds; a plan
// for a billion experts once took minutes and 14 GB of Go heap to refuse.
const MaxExperts = 1 << 16

// Config describes a Group. Every rank must pass the same Config (and the
// same element type); NewGroup checks.
type Config struct {
	Mode             Mode
	NumExperts       int // a multiple of the number of ranks, at most MaxExperts
	MaxTokensPerRank int // most tokens one rank dispatches in one call
	Hidden           int // elements per token row
	TopK             int // experts per token, 1..min(NumExperts, MaxTopK)
	// MaxRecvTokensPerRank bounds the rows one rank can receive in an HT
	// dispatch; 0 means the worst case, Size*MaxTokensPerRank (with
	// expert-major zones, whose rows are (token, local expert) pairs and
	// their padding: Size*MaxTokensPerRank*min(TopK, L) + L*(ExpertAlignment-1)).
	// It sizes the HT buffers; what a dispatch that would exceed it does is
	// Overflow.
	MaxRecvTokensPerRank int
	// Overflow (HighThroughput) is what a dispatch does when a rank would
	// receive more than MaxRecvTokensPerRank rows: OverflowFail (the zero
	// value) fails it on every rank, before anything is written;
	// OverflowDrop drops the rows that do not fit, the same on every rank
	// (each receiving rank's rows are kept source rank by source rank,
	// each source's in token order, until MaxRecvTokensPerRank), lists each
	// source's dropped (token, slot) pairs in its handle (Handle.Dropped),
	// and the combine counts them as contributing nothing. As NCCL EP's
	// overflow_policy TRAP and DROP.
	Overflow OverflowPolicy
	// Timeout bounds every wait for a peer; 0 means DefaultTimeout.
	Timeout time.Duration
	// MaskStalledRanks (LowLatency only: inference) masks a rank that does
	// not arrive within Timeout instead of failing: the call finishes
	// without it, tokens routed to its experts contribute nothing (each
	// handle's Dropped lists them), and later calls skip it at no cost. The
	// masked rank gets ErrMasked when it comes back; SetMask, called by it
	// and the others, lets it rejoin. As NCCL EP's enable_mask. Such a group
	// always takes LL's slot protocol (it needs no count round that a
	// stalled rank could leave half done).
	MaskStalledRanks bool
	// Wire is how dispatched rows travel: WireNative (the zero value: in
	// the element type, Handle.Recv), or FP8 e4m3 with per-128-element
	// scales, WireFP8 or WireFP8UE8M0 (Handle.RecvFP8 and RecvScales; the
	// rows are given and combined in the element type as always). Any
	// Hidden: a last partial group of Hidden mod 128 elements has its own
	// scale.
	Wire WireFormat
	// CombineWire is how a combine's expert outputs travel: WireNative
	// (the zero value: in the element type), or a low-precision combine
	// (as DeepEP's LogFMT and NCCL EP's NVFP4 combine): WireFP8 or
	// WireFP8UE8M0 quantizes every output row a combine reads exactly as
	// Quantize does and moves its e4m3 codes and scales. LowLatency sums
	// their float32 values (code times scale, times the weight) in float32
	// in top-k order, rounded once to the element type. HighThroughput
	// sums the float32 values of a token's partial outputs on each node
	// (ranks in local order), rounds each other node's sum to the element
	// type and quantizes it again before it crosses, and sums the token's
	// own node's partials and the other nodes' sums, node by node, in
	// float32, rounded once (docs/ep.md defines both and bounds their
	// error). The WireInfo of the format says where it may be used.
	CombineWire WireFormat
	// Layout is how the received rows are laid out (RecvLayout): the
	// mode's own by default (LowLatency expert-major blocks,
	// HighThroughput flat rows), HighThroughput expert-major zones, or
	// LowLatency rank-major rows. It sizes the buffers: set once per group,
	// as NCCL EP's ncclEpInitHandle, while each Dispatch brings its
	// routing.
	Layout RecvLayout
	// ExpertAlignment pads each zone of a HighThroughput expert-major
	// layout to a multiple of this many rows (a power of two; 0 or 1: no
	// padding), with zero rows: NCCL EP's
	// dispatch_output_per_expert_alignment.
	ExpertAlignment int
	// RecvIDs numbers the experts of RecvTopK (HighThroughput flat,
	// LowLatency rank-major): LocalExpertIDs (the zero value) or
	// GlobalExpertIDs.
	RecvIDs ExpertIDKind
	// Backend moves the rows; nil means CPU, the shared-memory and
	// one-sided MPI engine of this package.
	Backend Backend
}

// validate checks the config for a communicator of size ranks.
func (c Config) Validate(size int) error {
	bad := func(format string, a ...any) error { return fmt.Errorf("ep: invalid Config: "+format, a...) }
	switch {
	case c.Mode != LowLatency && c.Mode != HighThroughput:
		return bad("Mode %v: choose ep.LowLatency or ep.HighThroughput", c.Mode)
	case c.NumExperts <= 0 || c.NumExperts > MaxExperts:
		return bad("NumExperts = %d, want 1..%d", c.NumExperts, MaxExperts)
	case c.NumExperts%size != 0:
		return bad("NumExperts = %d is not a multiple of the %d ranks", c.NumExperts, size)
	case c.MaxTokensPerRank <= 0:
		return bad("MaxTokensPerRank = %d, want > 0", c.MaxTokensPerRank)
	case c.Hidden <= 0:
		return bad("Hidden = %d, want > 0", c.Hidden)
	case c.TopK <= 0 || c.TopK > c.NumExperts || c.TopK > MaxTopK:
		return bad("TopK = %d, want 1..%d (NumExperts = %d)", c.TopK, min(c.NumExperts, MaxTopK), c.NumExperts)
	case c.MaxRecvTokensPerRank < 0:
		return bad("MaxRecvTokensPerRank = %d is negative", c.MaxRecvTokensPerRank)
	case c.Timeout < 0:
		return bad("Timeout = %v is negative", c.Timeout)
	case c.Overflow != OverflowFail && c.Overflow != OverflowDrop:
		return bad("Overflow = %v: choose ep.OverflowFail or ep.OverflowDrop", c.Overflow)
	case c.Overflow == OverflowDrop && c.Mode != HighThroughput:
		return bad("Overflow %v is for HighThroughput groups (LowLatency buffers hold the worst case), not %v", c.Overflow, c.Mode)
	case c.MaskStalledRanks && c.Mode != LowLatency:
		return bad("MaskStalledRanks is for LowLatency (inference) groups, not %v", c.Mode)
	case int64(c.MaxTokensPerRank)*int64(size) > 1<<31-1:
		return bad("MaxTokensPerRank*ranks = %d*%d overflows the 32-bit row indices", c.MaxTokensPerRank, size)
	}
	if err := c.checkWires(bad); err != nil {
		return err
	}
	if err := c.validateLayout(bad); err != nil {
		return err
	}
	if n := c.MaxRecvRows(size); n > 1<<31-1 {
		return bad("an HT expert-major receive buffer of %d rows (MaxRecvTokensPerRank = 0: the worst case) overflows the 32-bit row indices: set MaxRecvTokensPerRank", n)
	}
	return nil
}

// maxRecv is the most rows one rank receives in an HT dispatch: with
// expert-major zones, (token, local expert) rows and their padding.
func (c Config) MaxRecv(ranks int) int {
	return int(c.MaxRecvRows(ranks))
}

// maxRecvRows is maxRecv computed without overflow: the default of an
// expert-major group is its worst case, every token of every rank to
// min(TopK, L) experts of this rank, with every zone padded.
func (c Config) MaxRecvRows(ranks int) int64 {
	if c.MaxRecvTokensPerRank > 0 {
		return int64(c.MaxRecvTokensPerRank)
	}
	n := int64(ranks) * int64(c.MaxTokensPerRank)
	if c.HTExpertMajor() {
		L := int64(c.NumExperts / ranks)
		n = n*min(int64(c.TopK), L) + L*int64(c.Alignment()-1)
	}
	return n
}

// fingerprint encodes everything that must agree across ranks.
func (c Config) Fingerprint(elem DType) []int64 {
	return []int64{int64(c.Mode), int64(c.NumExperts), int64(c.MaxTokensPerRank), int64(c.Hidden),
		int64(c.TopK), int64(c.MaxRecvTokensPerRank), int64(c.Timeout), int64(elem), boolInt(c.MaskStalledRanks), int64(c.Wire),
		int64(c.CombineWire), int64(c.Overflow), int64(c.Layout), int64(c.ExpertAlignment), int64(c.RecvIDs)}
}

var fingerprintFields = []string{"Mode", "NumExperts", "MaxTokensPerRank", "Hidden", "TopK",
	"MaxRecvTokensPerRank", "Timeout", "element type", "MaskStalledRanks", "Wire", "CombineWire", "Overflow",
	"Layout", "ExpertAlignment", "RecvIDs"}

// FingerprintField names entry i of a Fingerprint, for the message that
// says which setting differs across ranks.
func FingerprintField(i int) string { return fingerprintFields[i] }

func boolInt(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

// OpNames name a mode's calls in errors: "ll dispatch", "ht combine", ...
// made once, so that calls do not build strings.
type OpNames struct{ Dispatch, Cached, Combine string }

// NewOpNames are the names of m's calls.
func NewOpNames(m Mode) OpNames {
	return OpNames{Dispatch: m.String() + " dispatch", Cached: m.String() + " cached dispatch", Combine: m.String() + " combine"}
}
