package driver

import (
	"fmt"
	"time"

	"github.com/goep/goep/mpi"
)

// A Backend makes the engines that move a Group's rows: CPU (the default:
// MPI shared memory inside a node, one-sided MPI across nodes), Alltoallv
// (two-sided MPI, the baseline) and, in package epgpu, the GPU backend. A
// Backend is chosen by Config.Backend; every rank must choose the same one.
type Backend interface {
	// Name identifies the backend in messages and in the check that every
	// rank chose the same one: "cpu", "alltoallv", "gpu:emulated", ...
	Name() string
	// Open makes the engine of one Group over comm (a communicator of the
	// group's own, freed by the Group after Engine.Close). It is
	// collective. spec has been validated and agreed on by every rank.
	Open(comm *mpi.Comm, spec Spec) (Engine, error)
}

// Spec is what an engine is opened for.
type Spec struct {
	Config         // validated; Timeout is never 0, Layout never LayoutDefault
	Elem     DType // the element type of the rows
	RowBytes int   // bytes of one row: Hidden elements of Elem
	// WireRowBytes is the bytes of one dispatched row as it arrives in
	// Received.Rows, in the group's Wire format (RowBytes for WireNative;
	// Hidden e4m3 codes for an FP8 one); WireSideBytes is the bytes of its
	// side data, which arrive apart, in Received.Side (the FP8 formats'
	// ScaleGroups(Hidden) float32 scales; 0: none).
	WireRowBytes, WireSideBytes int
	Name                        string // the group's name in messages, e.g. "ep.Group[bfloat16]"
}

// newSpec is the Spec of a validated cfg with rows of elem.
func NewSpec(cfg Config, elem DType) Spec {
	cfg.Layout = cfg.ResolvedLayout()
	w := wires[cfg.Wire]
	return Spec{Config: cfg, Elem: elem, RowBytes: cfg.Hidden * elem.Size(),
		WireRowBytes: w.RowBytes(cfg.Hidden, elem.Size()), WireSideBytes: w.SideBytes(cfg.Hidden),
		Name: fmt.Sprintf("ep.Group[%s]", elem)}
}

// LocalExperts is the number of experts each rank owns.
func (s Spec) LocalExperts(ranks int) int { return s.NumExperts / ranks }

// An Engine moves the rows of one Group. The Group calls it only with inputs
// it has checked (lengths, expert ids, handles, memories) and in an order
// that respects the contract of the package doc, so an engine checks only
// what it alone can see (counts known after an exchange, say) and returns an
// *InputError for those (the group stays usable); any other error makes the
// Group unusable. Engines need not be safe for concurrent use.
//
// A dispatch or combine is split in two halves, Send and Wait: Send must not
// block on peers longer than the protocol needs (so that computation can run
// between the halves), and every wait on a peer must end with a
// *TimeoutError naming the peer after Spec.Timeout.
type Engine interface {
	// Placement is where the group's ranks are: the nodes that the
	// routing counts tokens per (one node for a flat engine).
	Placement() Placement
	// Memory is where the engine's tensors are, and where the caller's
	// tensors must be.
	Memory() Memory
	// BufferBytes is the memory the engine holds on this rank.
	BufferBytes() int

	// DispatchSend starts d: when it returns, d.X may be reused.
	DispatchSend(d *Dispatch) error
	// DispatchWait completes d and sets d.Recv.
	DispatchWait(d *Dispatch) error
	// CombineSend starts c: when it returns, c.Y may be reused.
	CombineSend(c *Combine) error
	// CombineWait completes c: c.Out holds the reduced rows, and
	// c.SlotValues the carried values when asked.
	CombineWait(c *Combine) error
	// Close releases what Open made. It is collective.
	Close() error
}

// A Refuser is an Engine that takes part in a call this rank refused, so
// that every rank's same call fails at once, naming this rank and its
// reason (a *RefusedError on the others), and the group stays usable. The
// Group calls Refuse instead of DispatchSend or CombineSend when its checks
// refuse a collective call's input on this rank. With an engine that is not
// a Refuser, the other ranks wait for this rank until their timeout.
type Refuser interface {
	Refuse(r *Refusal) error
}

// Refusal is a call this rank refused, numbered as it would have been.
type Refusal struct {
	Op     uint64   // the call's sequence number
	Set    int      // its buffer set, where this rank knows it (a combine of a bad handle does not)
	Kind   CallKind // a dispatch (fresh or cached) or a combine
	Cached bool     // the dispatch reuses a handle's routing (DispatchInput.Reuse: its peers skip the count exchange)
	// Dispatch is, where this rank could resolve the call's handle, the
	// dispatch whose routing the call uses: a combine's, or the one a
	// cached dispatch reuses (its State included); nil for a fresh
	// dispatch or a handle this rank could not resolve. Valid during
	// Refuse only.
	Dispatch *Dispatch
	Reason   string // this rank's error text
}

// CallKind is a dispatch or a combine.
type CallKind int

// Kinds of collective call.
const (
	CallDispatch CallKind = iota + 1 // Dispatch and DispatchSend, fresh or reusing a routing
	CallCombine                      // Combine and its halves
)

// A Meter is an Engine that measures, since it was opened, how long this
// rank waited for each peer (waits, indexed by rank) and how many bytes it
// sent across nodes (network). Group.Stats reports them.
type Meter interface {
	Meter() (waits []time.Duration, network int64)
}

// A NetworkMeter is a Meter that also says, per peer (indexed by rank),
// how many bytes this rank sent it across nodes since the engine was
// opened: the matrix of what crosses nodes, which ep-bench moves by plain
// MPI as the floor of the same traffic.
type NetworkMeter interface {
	NetworkSent() []int64
}

// A DeviceTimer is an Engine on a device that times its calls on the
// device's clock: the time from the first work its last dispatch (or
// combine) queued to the last, beside the host's wall time of the call.
// Group.DeviceTimes reports them.
type DeviceTimer interface {
	DeviceTimes() (dispatch, combine time.Duration)
}

// A TransferMeter is an Engine whose transport moves rows between the
// ranks of a node itself: it counts, since it was opened, the bytes it
// moved into this rank's buffers (moved) and the bytes transfers of fixed
// size would have moved for the same calls (full). Group.Stats reports
// them.
type TransferMeter interface {
	TransferBytes() (moved, full int64)
}

// A Masker is an Engine that can mask stalled ranks
// (Config.MaskStalledRanks).
type Masker interface {
	// Masked is, per rank, whether this rank has masked it.
	Masked() []bool
	// SetMask makes masked the mask of every rank that takes part (the
	// ranks it does not mask, which all call SetMask with the same mask),
	// and agrees with them on the calls' numbering: each passes the number
	// of calls and dispatches it made, and gets the largest of each.
	SetMask(masked []bool, calls, dispatches uint64) (uint64, uint64, error)
}

// Placement places a group's ranks on nodes.
type Placement struct {
	Node   int   // this rank's node
	Nodes  int   // how many nodes
	NodeOf []int // node of each rank
}

// Dispatch is one dispatch call as an engine sees it. The Group reuses
// Dispatch records from call to call (State too: an engine may keep its
// per-dispatch storage there and reuse it).
type Dispatch struct {
	Op   uint64 // the call's sequence number among the group's calls, from 1; the same on every rank
	Set  int    // buffer set: LowLatency alternates 0 and 1, HighThroughput uses 0
	From *Dispatch
	// From is, for a dispatch that reuses a routing, the dispatch whose routing this one
	// reuses (valid during DispatchSend only: copy what is needed into
	// State); nil for a fresh dispatch. Every rank passes a cached
	// dispatch at the same call.

	X       Tensor[byte] // the tokens: T rows of RowBytes (a Forward Wire: T rows of Spec.WireRowBytes), in Memory()
	Scales  Tensor[byte] // a Forward Wire: the rows' side data, T rows of Spec.WireSideBytes; zero otherwise
	TopK    []int32      // [T][TopK] expert ids, -1 = none (host)
	Weights []float32    // [T][TopK] (host)
	Route   *Routing     // TopK's routing, computed on the host

	Recv  Received // what this rank received; set by DispatchWait
	State any      // the engine's
}

// T is the number of tokens dispatched.
func (d *Dispatch) T() int { return d.Route.T }

// Received is what a dispatch delivered to this rank: the views that Handle
// returns, in the engine's Memory.
type Received struct {
	// Rows is Recv, laid out as Spec.Layout says (RecvLayout):
	// LowLatency expert-major [L][Size*MaxTokensPerRank] rows (the first
	// ExpertCounts[l] of block l valid, by source rank then token);
	// LowLatency rank-major [Size][MaxTokensPerRank] rows (the first
	// SourceCounts[s] of block s valid, in token order); HighThroughput
	// flat [NumRecv] rows (by source rank then token); HighThroughput
	// expert-major [NumRecv] rows, zone l at [ExpertOffsets[l],
	// ExpertOffsets[l+1]) (its first ExpertCounts[l] rows valid, by source
	// rank then token, the rest zero). Each row is Spec.WireRowBytes, in
	// the group's Wire format (RecvWire; an FP8 one: e4m3 codes, RecvFP8).
	Rows Tensor[byte]
	// Side: with a Wire that has side data, the rows' side data, laid out
	// like them, Spec.WireSideBytes per row (an FP8 Wire: float32 scales,
	// RecvScales); zero otherwise.
	Side Tensor[byte]
	// Outputs is CombineBuffer: laid out like Rows but in rows of
	// RowBytes (the element type, also with an FP8 Wire), where expert
	// outputs can be written for Combine to read without a copy.
	Outputs Tensor[byte]
	// Weights: expert-major layouts, one per row of Rows (0 on padding);
	// flat and rank-major, [rows][TopK], 0 where the expert is elsewhere.
	Weights Tensor[float32]
	// TopK: flat and rank-major, [rows][TopK] expert ids (-1 = elsewhere),
	// local or global as Spec.RecvIDs says; zero in expert-major layouts.
	TopK Tensor[int32]
	// Tokens: the source token index of each row, one per row (-1 on
	// HighThroughput expert-major padding).
	Tokens Tensor[int32]
	// ExpertCounts: valid rows per local expert (flat and rank-major: rows
	// whose top-k names it). Host memory.
	ExpertCounts []int
	// ExpertOffsets: HighThroughput expert-major, [L+1]: where each
	// expert's zone starts in Rows, the last the padded total (NumRecv);
	// nil otherwise. Host memory.
	ExpertOffsets []int
	// SourceCounts: expert-major layouts [Size][L], rows of local expert l
	// from source s; flat and rank-major [Size], rows from s. Host memory.
	SourceCounts []int
	// NumRecv is the number of valid rows (HighThroughput expert-major:
	// the rows of Rows, padding included).
	NumRecv int
	// Dropped lists the (token, slot) pairs of this rank's dispatch (as
	// t*TopK+k, increasing) whose expert was on a masked rank (not sent,
	// or their output did not come back: MaskStalledRanks) or whose row did
	// not fit there (Overflow OverflowDrop): they contribute nothing to the
	// combine. The engine may add to it during the combine.
	Dropped []int32
}

// Combine is one combine call as an engine sees it; like Dispatch, the
// Group reuses the records.
type Combine struct {
	Op       uint64    // sequence number among the group's calls
	Dispatch *Dispatch // the dispatch whose rows are combined
	Y        Tensor[byte]
	// Y holds the expert outputs laid out like Dispatch.Recv.Rows; YIn
	// says whether it is that buffer, the Outputs buffer, or elsewhere.
	YIn YPlace
	Out Tensor[byte] // [T] rows: the result
	// Weights: LowLatency expert-major, the weight of each (token, slot)
	// pair to apply ([T][TopK]: the dispatch's weights or
	// CombineOptions.WeightsOverride); nil in the other layouts, where the
	// expert side applied them.
	Weights []float32
	// RowValues and SlotValues: see CombineOptions; zero when not asked.
	RowValues, SlotValues Tensor[float32]
	// Release: the call ends the dispatch without combining it
	// (Group.Release): Y, Out and Weights are zero, and the engine only
	// does what frees the dispatch's buffers on every rank. An engine
	// that is a Sequencer fails the call on every rank where some ranks
	// release the dispatch and others combine it.
	Release bool
	State   any // the engine's
}

// YPlace says where a combine's expert outputs are.
type YPlace int

// Places of Combine.Y.
const (
	YElsewhere YPlace = iota // the caller's own tensor
	YInRows                  // Dispatch.Recv.Rows itself
	YInOutputs               // Dispatch.Recv.Outputs itself
)

// A StateMaker is an Engine that makes its per-dispatch state
// (Dispatch.State) up front: NewGroup asks it for one per record of the
// handle ring, so that no dispatch allocates one, whatever its routing. An
// engine that is not a StateMaker makes its state at the first dispatch of
// each record.
type StateMaker interface {
	// NewState is the state of one dispatch record, sized for any routing
	// of the group.
	NewState() any
}

// A Planner is a Backend that says, without allocating anything, what its
// engine of a group of spec holds over ranks ranks on nodes nodes of as
// equal sizes as can be (ep.BufferPlan).
type Planner interface {
	Plan(spec Spec, ranks, nodes int) (Footprint, error)
}
