package epcpu

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"
	"unsafe"

	"github.com/goep/goep/ep/driver"
	"github.com/goep/goep/ep/internal/hostrows"
	"github.com/goep/goep/internal/sysmem"
	"github.com/goep/goep/mpi"
)

// New is the CPU engine's Backend, on host memory. Inside a node every rank
// maps every other rank's buffers (an MPI-3 shared-memory window), so a
// dispatched row is copied once, from the sender's tensor into its slot in
// the receiver's buffer, and combine reads the expert outputs in place;
// across nodes rows go by message, one per destination rank per step, into
// a staging memory of the receiver (mpi.Mailbox), which applies them while
// it waits. See docs/ep.md.
func New() driver.Backend { return cpuBackend{} }

// NewOneSided is New with rows across nodes put by one-sided MPI (MPI_Put
// into a staging window, then a flush) instead of sent by message. It needs
// an MPI whose one-sided operations complete without the target's help
// (RDMA hardware): over TCP, Open MPI's osc/ucx completes a put only while
// the target calls MPI, and a put to a stalled rank waits in MPI_Win_flush
// with no deadline.
func NewOneSided() driver.Backend { return cpuBackend{net: oneSidedNet{}} }

// Tuning sets the engine's choices between paths that give the same
// results, for tests and benchmarks that check or compare them; the zero
// value is the defaults New takes.
type Tuning struct {
	// SlotProtocolMax is the largest LL message (the most bytes one rank
	// sends) on the slot protocol: 0 the default, < 0 none.
	SlotProtocolMax int
	// GeneralLL makes LL dispatches take the general path where they
	// would take the direct one (one node, slot protocol).
	GeneralLL bool
	// ReduceInC makes small reductions call the C kernel instead of the Go
	// assembly.
	ReduceInC bool
}

// NewTuned is New with the paths t chooses.
func NewTuned(t Tuning) driver.Backend {
	return cpuBackend{tune: tuning{slotMax: t.SlotProtocolMax, generalLL: t.GeneralLL, reduceInC: t.ReduceInC}}
}

type cpuBackend struct {
	net  networkKind // nil: mailboxNet, the default
	tune tuning
}

// network is the backend's way across nodes.
func (b cpuBackend) network() networkKind {
	if b.net == nil {
		return mailboxNet{}
	}
	return b.net
}

// tuning are the CPU engine's internal switches (Tuning); the zero value is
// the defaults.
type tuning struct {
	slotMax   int  // the largest LL message on the slot protocol: 0 the default (slotProtocolMax), < 0 none
	generalLL bool // LL dispatches take the general path where they would take the direct one
	reduceInC bool // small reductions call the C kernel instead of the Go assembly
}

// slotProtocolMax is the largest message (the most bytes one rank sends:
// MaxTokensPerRank * min(TopK, experts per rank) rows) for which LL uses the
// slot protocol by default. Below it a count round (a hop between ranks)
// costs more than moving the received rows once more to pack them; above
// it, less.
const slotProtocolMax = 32 << 10

// slotProtocolMax is the tuning's largest message on the slot protocol.
func (t tuning) slotProtocolMax() int {
	switch {
	case t.slotMax < 0:
		return -1
	case t.slotMax == 0:
		return slotProtocolMax
	}
	return t.slotMax
}

// Name is "cpu" or "cpu-onesided", with a slot protocol limit other than
// the default said (every rank must take the same protocol).
func (b cpuBackend) Name() string {
	name := "cpu" + b.network().suffix()
	if b.tune.slotMax != 0 {
		name += fmt.Sprintf("(slot protocol up to %d bytes)", b.tune.slotProtocolMax())
	}
	return name
}

func (b cpuBackend) Open(comm *mpi.Comm, spec driver.Spec) (driver.Engine, error) {
	e, err := openEngine(comm, spec, b)
	if err != nil {
		return nil, err // not a nil *engine in a non-nil Engine
	}
	return e, nil
}

// Supports says that the CPU engine implements every optional feature.
func (cpuBackend) Supports(f driver.Feature) bool {
	switch f {
	case driver.FeatureFP8Wire, driver.FeatureMaskStalledRanks, driver.FeatureFP8Forward, driver.FeatureFP8Combine, driver.FeatureOverflowDrop,
		driver.FeatureRefusals, driver.FeatureMeter, driver.FeatureNamedTimeouts, driver.FeatureZeroAllocs,
		driver.FeatureHTExpertMajor, driver.FeatureLLRankMajor, driver.FeatureGlobalExpertIDs, driver.FeatureCallSequence,
		driver.FeatureNVFP4Forward, driver.FeatureNVFP4Combine:
		return true
	}
	return false
}

// The CPU backend and its engine, with every optional interface.
var (
	_ driver.Capable   = cpuBackend{}
	_ driver.Engine    = (*engine)(nil)
	_ driver.Refuser   = (*engine)(nil)
	_ driver.Meter     = (*engine)(nil)
	_ driver.Masker    = (*engine)(nil)
	_ driver.Sequencer = (*engine)(nil)
)

// engine is the CPU engine: the transport between the ranks, and the mode
// that decides what goes where.
type engine struct {
	spec      driver.Spec
	tune      tuning
	topo      *mpi.Topology
	shm       *mpi.SharedWindow
	t         transport
	mode      mode
	segSize   int
	winSize   int
	node      int
	localRank int
	nodes     int
	nodeOf    []int
	last      [2]uint64 // op of the last combine per buffer set
	// The ops of the last dispatch and of the one before it (refused ones
	// included: every rank counts them alike).
	lastDispatch, prevDispatch uint64
	names                      driver.OpNames
}

// spinWhenAlone is how long a wait spins before giving up the core when
// every rank of the node can have a core of its own: longer than a flag's
// round trip, short against the cost of being descheduled.
const spinWhenAlone = 20 * time.Microsecond

// mode is LowLatency or HighThroughput: the protocol of each half call, on
// the transport. Each mode owns its areas of the two memories and its
// per-dispatch state.
type mode interface {
	send(d *driver.Dispatch) error
	wait(d *driver.Dispatch) error
	combineSend(c *driver.Combine) error
	combineWait(c *driver.Combine) error
}

func openEngine(comm *mpi.Comm, spec driver.Spec, b cpuBackend) (_ *engine, err error) {
	net := b.network()
	caps := net.caps()
	e := &engine{spec: spec, tune: b.tune, names: driver.NewOpNames(spec.Mode)}
	defer func() {
		if err != nil {
			err = errors.Join(err, e.Close()) // every rank fails at the same step: the frees stay collective
		}
	}()
	if e.topo, err = comm.Topology(); err != nil {
		return nil, err
	}
	t := e.topo
	R := comm.Size()
	e.node, e.localRank, e.nodes, e.nodeOf = t.Node, t.LocalRank, t.Nodes, t.NodeOf
	tr := &e.t
	tr.me, tr.size, tr.timeout = comm.Rank(), R, spec.Timeout
	tr.local = make([]bool, R)
	for r := 0; r < R; r++ {
		tr.local[r] = t.NodeOf[r] == e.node
		tr.all = append(tr.all, r)
		if r != tr.me {
			tr.others = append(tr.others, r)
		}
		if !tr.local[r] {
			tr.remote = append(tr.remote, r)
		}
	}
	tr.nodeRanks = t.RanksOnNode(e.node)
	tr.waits, tr.netSent = make([]time.Duration, R), make([]int64, R)
	tr.masked, tr.maskStalled = make([]bool, R), spec.MaskStalledRanks
	tr.stream = hostrows.Streams(spec)
	tr.setMasked(tr.me, false) // the lists of ranks that take part: all
	if len(tr.nodeRanks) <= hostrows.OnlineCPUs() {
		tr.spin = spinWhenAlone
	}

	tr.in = inboxFor(spec, R, t.Nodes)
	seg, win := hostrows.NewArenas(tr.in.size)
	var modeErr error // agreed on below, with the footprint: every rank fails at the same step
	switch {
	case spec.LLRankMajor():
		e.mode, modeErr = newLLRank(e, seg, win)
	case spec.Mode == driver.LowLatency:
		e.mode, modeErr = newLL(e, seg, win)
	default:
		e.mode = newHT(e, seg, win)
	}
	e.segSize = seg.N
	if t.Nodes > 1 {
		e.winSize = win.N
	}
	if modeErr == nil {
		e.reserve()
	}
	// Large blocks leave for other nodes straight from the segment where the
	// network can send them so, except where a masked rank may never
	// receive them (its sends would stay in flight).
	tr.inPlace = t.Nodes > 1 && caps.sendsInPlace && !spec.MaskStalledRanks
	// Refuse what the node cannot give before allocating anything (the
	// kernel would kill a rank half way, or MPI fail with MPI_ERR_INTERN),
	// on every rank: a node that fits must not go on into the allocations.
	f := driver.Footprint{SharedPerRank: e.segSize, WindowPerRank: e.winSize, RanksPerNode: len(tr.nodeRanks)}
	if t.Nodes > 1 {
		f.CopiesPerRank = caps.copies * e.winSize
	}
	f.PerNode = f.RanksPerNode * f.PerRank()
	if err := mpi.AgreeOnError(comm, errors.Join(modeErr, checkFits(spec, caps, b.tune, f, sysmem.Read(), R, t.Nodes, max(t.HostSize, f.RanksPerNode)))); err != nil {
		return nil, err
	}
	if e.shm, err = t.NodeComm.AllocateShared(e.segSize); err != nil {
		return nil, fmt.Errorf("allocating %d bytes of shared buffers: %w", e.segSize, err)
	}
	tr.seg = make([]ptr, R)
	for _, r := range tr.nodeRanks {
		mem, err := e.shm.Peer(t.LocalRankOf[r])
		if err != nil {
			return nil, err
		}
		tr.seg[r] = unsafe.Pointer(unsafe.SliceData(mem))
	}
	tr.segBytes = e.shm.Local()
	if t.Nodes > 1 {
		if tr.net, err = net.open(comm, e.winSize, tr.segBytes); err != nil {
			return nil, fmt.Errorf("allocating %d bytes of staging memory for %d nodes: %w", e.winSize, t.Nodes, err)
		}
		tr.winBase = unsafe.Pointer(unsafe.SliceData(tr.net.Local()))
		tr.landsFinal = caps.landsInPlace
	}
	return e, nil
}

// NewState is the per-dispatch state of the engine's mode, sized for any
// routing (StateMaker).
func (e *engine) NewState() any {
	if m, ok := e.mode.(interface{ newState() any }); ok {
		return m.newState()
	}
	return nil
}

// reserve sizes what the engine fills during a call (the transport's
// queues and lists, the wire format's queue, the mode's scratch) for the
// largest routing the group allows, so that no call allocates.
func (e *engine) reserve() {
	s, t := e.spec, &e.t
	R, M, K, E := t.size, s.MaxTokensPerRank, s.TopK, s.NumExperts
	t.flags, t.aborts, t.calls, t.peers = make([]ptr, 0, R), make([]ptr, 0, R), make([]ptr, 0, R), make([]int, 0, R)
	t.callBuf = make([]byte, 8)
	t.flagB, t.attachB = make([]mpi.Block, 0, R), make([]mpi.Block, 0, R)
	// Stores into node peers: rows forwarded by a rail peer (and their
	// side data), and blocks of words per expert or rank.
	local := 2*M*K + 4*E + 4*R
	t.locDst.Reserve(local)
	t.locOff, t.lens = make([]int64, 0, local), make([]int64, 0, local)
	// Blocks across nodes: a few per rank and expert, and per chunk.
	t.blocks = make([]mpi.Block, 0, 4*E+4*R+2*(M/htChunk+1)*e.nodes)
	moves := 4*E + 4*R // settles: per source and expert, rows, side data, words
	t.landDst.Reserve(moves)
	t.landSrc.Reserve(moves)
	t.landLens = make([]int64, 0, moves)
	if m, ok := e.mode.(interface{ reserve() }); ok {
		m.reserve()
	}
}

func (e *engine) Placement() driver.Placement {
	return driver.Placement{Node: e.node, Nodes: e.nodes, NodeOf: e.nodeOf}
}

func (e *engine) Memory() driver.Memory { return driver.HostMemory }

func (e *engine) BufferBytes() int { return e.segSize + e.winSize }

// Meter reports what the engine measured since it was opened.
func (e *engine) Meter() ([]time.Duration, int64) { return e.t.waits, e.t.netBytes }

// NetworkSent is, per rank, the bytes this rank put to it across nodes.
func (e *engine) NetworkSent() []int64 { return e.t.netSent }

func (e *engine) DispatchSend(d *driver.Dispatch) error {
	k, back := callDispatch, uint64(0)
	if d.From != nil {
		k, back = callCached, d.Op-d.From.Op
	}
	e.t.begin(callWord(d.Op, k, 0, back))
	e.prevDispatch, e.lastDispatch = e.lastDispatch, d.Op
	err := e.outcome(d.Op, e.names.Dispatch, e.mode.send(d))
	if err != nil {
		e.t.end(d.Op)
	}
	return err
}

func (e *engine) DispatchWait(d *driver.Dispatch) error {
	err := e.outcome(d.Op, e.names.Dispatch, e.mode.wait(d))
	e.t.end(d.Op)
	return err
}

func (e *engine) CombineSend(c *driver.Combine) error {
	k := callCombine
	if c.Release {
		k = callRelease
	}
	e.t.begin(callWord(c.Op, k, 0, c.Op-c.Dispatch.Op))
	err := e.outcome(c.Op, e.names.Combine, e.mode.combineSend(c))
	if err != nil {
		e.t.end(c.Op)
	}
	return err
}

func (e *engine) CombineWait(c *driver.Combine) error {
	err := e.outcome(c.Op, e.names.Combine, e.mode.combineWait(c))
	if err == nil || errors.Is(err, driver.ErrBadInput) && !driver.IsRefused(err) {
		e.last[c.Dispatch.Set] = c.Op // the combine ran: its readers will release the buffers
	}
	e.t.end(c.Op)
	return err
}

// Refuse takes part in a call this rank refused: its note, then every flag
// of the call marked refused, so that the other ranks' same call fails at
// once with this rank's reason.
func (e *engine) Refuse(r *driver.Refusal) error {
	e.t.begin(callWord(r.Op, callRefused, 0, 0))
	defer e.t.end(r.Op)
	if r.Kind == driver.CallDispatch {
		e.prevDispatch, e.lastDispatch = e.lastDispatch, r.Op
	}
	op := e.names.Dispatch
	if r.Kind == driver.CallCombine {
		op = e.names.Combine
	}
	if err := e.t.writeNote(r.Op, r.Reason); err != nil {
		return e.outcome(r.Op, op, err)
	}
	return e.outcome(r.Op, op, e.endRefused(op, r.Op, e.t.me))
}

// outcome passes a half call's error on; when the call was refused by a
// rank, it reads that rank's reason, ends the call here too, and reports
// the refusal. Any other error but bad input ends the group on this rank:
// it says so to the others (breakGroup), so that none waits for this rank
// until its timeout; a rank that said so before is named.
func (e *engine) outcome(q uint64, op string, err error) error {
	if err == nil {
		return nil
	}
	var r *refusal
	if errors.As(err, &r) {
		reason := e.t.note(r.origin, q) // before the rendezvous: the origin may write another note after it
		if err = e.endRefused(op, q, r.origin); err == nil {
			return &driver.RefusedError{Op: op, Rank: r.origin, Reason: reason}
		}
	}
	var bp *brokenPeer
	if errors.As(err, &bp) {
		err = e.t.unusable(op, q, bp.peer)
	}
	if !errors.Is(err, driver.ErrBadInput) && !errors.Is(err, driver.ErrMasked) && !e.t.maskStalled {
		e.t.breakGroup(err)
	}
	return err
}

// Closing tells the other ranks that this rank is closing the group
// (Sequencer).
func (e *engine) Closing() { e.t.closing() }

// Broken is the error of a rank that found the group unusable and said so
// (Sequencer): this one's, or another's.
func (e *engine) Broken() error {
	if e.t.broken != nil {
		return e.t.broken
	}
	return e.t.peerBroken("Close")
}

// endRefused ends refused call q on this rank: it raises its abort word
// for q at every rank (a rank waiting for any of this rank's flags of the
// call sees it and ends the call too), then meets every rank: flags hold
// only their latest value, so no rank may start another call (and
// overwrite a flag of this one that a slower rank still reads) before every
// rank has ended this one. Only a refused call pays for the rendezvous; the
// call's own flags are never touched.
func (e *engine) endRefused(op string, q uint64, origin int) error {
	t := &e.t
	if err := t.raise(t.liveOthers, flagAborted, 0, t.me, q, refusedBy(origin), nil); err != nil {
		return err
	}
	return t.wait(op, "the end of a refused call", flagAborted, 0, t.live, nil, q, false)
}

// Close frees the windows and the node communicator. It is collective.
func (e *engine) Close() error {
	var errs []error
	if m, ok := e.mode.(interface{ free() }); ok { // what a mode holds outside Go's memory
		m.free()
	}
	if e.t.net != nil {
		errs = append(errs, e.t.net.Free())
		e.t.net = nil
	}
	if e.shm != nil {
		errs = append(errs, e.shm.Free())
		e.shm = nil
	}
	if e.topo != nil {
		errs = append(errs, e.topo.Free())
		e.topo = nil
	}
	return errors.Join(errs...)
}

// hostTensor views n elements of T at off of this rank's segment.
func hostTensor[T driver.Scalar](e *engine, off, n int) driver.Tensor[T] {
	if n == 0 {
		return driver.Host([]T{})
	}
	return driver.Host(unsafe.Slice((*T)(e.t.lsa(e.t.me, off)), n))
}

// hostBytes is x's bytes as a slice (x is in host memory: the Group checked).
// ptr is an address of shared, window or pinned memory.
type ptr = unsafe.Pointer

func hostBytes(x driver.Tensor[byte]) []byte { return x.Host() }

// Masked is, per rank, whether this rank has masked it.
func (e *engine) Masked() []bool { return e.t.masked }

// SetMask makes masked the mask of the ranks that take part and meets them:
// each puts its numbers of calls and dispatches into its note, raises its
// mask flag for the new epoch at the others and waits for theirs; then all
// take the largest numbers. No combine is outstanding after it, so no
// buffer waits for readers.
func (e *engine) SetMask(masked []bool, calls, dispatches uint64) (uint64, uint64, error) {
	t := &e.t
	for r, m := range masked {
		t.setMasked(r, m)
	}
	t.epoch++
	rec := make([]byte, noteLen)
	binary.LittleEndian.PutUint64(rec, calls)
	binary.LittleEndian.PutUint64(rec[8:], dispatches)
	if err := t.writeNoteBytes(rec); err != nil {
		return 0, 0, err
	}
	if err := t.raise(t.liveOthers, flagMask, 0, t.me, t.epoch, 0, nil); err != nil {
		return 0, 0, err
	}
	stalled := t.maskStalled
	t.maskStalled = false // a rank missing here is an error, not a rank to mask
	err := t.wait("SetMask", "its SetMask", flagMask, 0, t.live, nil, t.epoch, false)
	t.maskStalled = stalled
	if err != nil {
		return 0, 0, err
	}
	for _, r := range t.liveOthers {
		rec := t.noteBytes(r)
		calls = max(calls, binary.LittleEndian.Uint64(rec))
		dispatches = max(dispatches, binary.LittleEndian.Uint64(rec[8:]))
	}
	e.last = [2]uint64{}
	return calls, dispatches, nil
}

// checkMasked, at the start of a call of a group that masks stalled ranks,
// refuses to write anything if another rank has masked this one (a rank
// that masks another says so in its inbox): a rank that stalled must not
// write into buffers the others have moved on with.
func (e *engine) checkMasked(op string) error {
	t := &e.t
	if !t.maskStalled {
		return nil
	}
	if t.net != nil { // what the other nodes said while this rank was away lands now
		if err := t.net.Drain(); err != nil {
			return fmt.Errorf("ep: %s: %w", op, err)
		}
	}
	for _, r := range t.liveOthers {
		if v := loadFlag(t.inboxOf(r, t.in.flagOff(flagYouAreMasked, 0, r))); v>>32 == t.epoch+1 && v&1 != 0 {
			return fmt.Errorf("ep: %s: rank %d masked this rank: %w", op, r, driver.ErrMasked)
		}
	}
	return nil
}
