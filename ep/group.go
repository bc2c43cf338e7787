package ep

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/goep/goep/ep/driver"
	"github.com/goep/goep/mpi"
)

// handleRing is how many dispatches' handles a Group keeps: a handle stays
// usable (for Combine, a dispatch reusing it and its views' bookkeeping) until
// handleRing newer dispatches have been made, after which it is stale.
const handleRing = 8

// Group is a set of ranks that dispatch and combine together, over the
// engine of its Backend. Its methods are collective (every rank calls them
// in the same order) unless their doc says otherwise. A Group is not safe
// for concurrent use by several goroutines.
//
// The Group checks every input before its engine sees it, numbers the calls,
// enforces the buffer rules of the modes and keeps the handles; the engine
// moves the rows. Steady-state calls allocate nothing: handles are values
// backed by a ring of reused records.
type Group[E Element] struct {
	spec  Spec
	comm  *mpi.Comm
	eng   Engine
	mem   Memory
	place Placement
	sh    shape
	rank  int
	size  int

	op         uint64 // calls so far: the sequence number of the next is op+1
	dispatches uint64 // dispatches so far: their parity is the LL buffer set
	gen        uint64 // handle generations handed out
	states     [handleRing]*handleState[E]
	next       int                // the ring slot the next dispatch takes
	pending    [2]*handleState[E] // LL: per buffer set, the handle whose combine has not run
	htLast     uint64             // HT: op of the newest dispatch, whose rows the receive buffer holds
	scratchRT  Routing            // routing of a dispatch being checked
	stats      stats
	names      driver.OpNames
	broken     error
	closed     bool
	maskedOut  error // ErrMasked: the others went on without this rank; SetMask lets it rejoin
}

// handleState is one dispatch and its combine: what a Handle points to.
type handleState[E Element] struct {
	g       *Group[E]
	gen     uint64
	d       Dispatch
	rt      Routing
	topk    []int32
	weights []float32
	mode    Mode
	sent    bool // DispatchSend returned
	ready   bool // DispatchWait returned
	done    bool // LL: combined
	c       Combine
	inComb  bool // a CombineSend whose Wait has not run
	// rows to and from each rank in the dispatch (statistics)
	rowsTo, rowsFrom []int32
}

// busy reports a record that a call still needs.
func (s *handleState[E]) busy() bool {
	return (s.sent && !s.ready) || s.inComb || (s.mode == LowLatency && s.ready && !s.done)
}

// NewGroup creates a group over the ranks of comm. It is collective: every
// rank must pass the same Config and element type, which it checks (a
// mismatch fails on every rank, naming the ranks and fields that differ).
// The engine of cfg.Backend (CPU when nil) allocates the buffers; Close
// releases them.
func NewGroup[E Element](comm *mpi.Comm, cfg Config) (*Group[E], error) {
	if comm == nil {
		return nil, errors.New("ep: NewGroup: nil communicator")
	}
	elem := DTypeOf[E]()
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	// Every rank must call NewGroup: one that does not is named here,
	// before the collective Split that could only hang or time out blind.
	if err := arrive(comm, "NewGroup", cfg.Timeout); err != nil {
		return nil, err
	}
	c, err := comm.Split(0, comm.Rank(), "ep")
	if err != nil {
		return nil, fmt.Errorf("ep: NewGroup: %w", err)
	}
	c.SetTimeout(cfg.Timeout)
	g, err := openGroup[E](c, cfg, elem)
	if err != nil {
		// Every rank reaches this with an error (the checks agree, and
		// openGroup agrees on the engine's outcome), so freeing stays
		// collective.
		return nil, errors.Join(err, c.Free())
	}
	return g, nil
}

// arrive waits, within timeout, for every rank of c to call op: a rank that
// does not is a *TimeoutError naming it. See mpi.Comm.Arrive.
func arrive(c *mpi.Comm, op string, timeout time.Duration) error {
	err := c.Arrive("ep."+op, timeout)
	var missing *mpi.MissingError
	if errors.As(err, &missing) {
		return &TimeoutError{Op: op, Peer: missing.Rank, After: missing.After,
			What: "every rank to call " + op + " (a rank that skips it leaves the others here)"}
	}
	if err != nil {
		return fmt.Errorf("ep: %s: %w", op, err)
	}
	return nil
}

func openGroup[E Element](c *mpi.Comm, cfg Config, elem DType) (*Group[E], error) {
	if err := agreeOnConfig(c, cfg, elem); err != nil {
		return nil, err
	}
	if err := cfg.Validate(c.Size()); err != nil {
		return nil, err
	}
	spec := driver.NewSpec(cfg, elem)
	ferr := checkFeatures(cfg)
	if err := mpi.AgreeOnError(c, ferr); err != nil {
		var agreed *mpi.AgreedError
		if ferr == nil && errors.As(err, &agreed) { // a backend may answer per rank: another rank's said no
			ferr = fmt.Errorf("ep: NewGroup: %w on rank %d: %s", ErrUnsupported, agreed.Rank, agreed.Msg)
		} else if ferr == nil {
			ferr = fmt.Errorf("ep: NewGroup: %w", err)
		}
		return nil, ferr
	}
	eng, err := backendOf(cfg).Open(c, spec)
	if err == nil {
		err = checkEngine(backendOf(cfg), eng)
	}
	var agreed *mpi.AgreedError
	if !errors.As(err, &agreed) { // an engine that agreed already failed on every rank alike
		err = mpi.AgreeOnError(c, err)
	}
	if err != nil {
		if eng != nil {
			err = errors.Join(err, eng.Close())
		}
		return nil, fmt.Errorf("ep: NewGroup: %s backend: %w", backendOf(cfg).Name(), err)
	}
	p := eng.Placement()
	g := &Group[E]{spec: spec, comm: c, eng: eng, mem: eng.Memory(), place: p, rank: c.Rank(), size: c.Size(),
		names: driver.NewOpNames(cfg.Mode)}
	g.sh = shape{E: cfg.NumExperts, L: cfg.NumExperts / g.size, R: g.size, K: cfg.TopK, nodes: p.Nodes,
		nodeOf: make([]int32, g.size)}
	if g.stats.hosts, err = hostNames(c); err != nil {
		return nil, errors.Join(err, eng.Close())
	}
	g.stats.SentBytes, g.stats.RecvBytes = make([]int64, g.size), make([]int64, g.size)
	g.ResetStats()
	for r, n := range p.NodeOf {
		g.sh.nodeOf[r] = int32(n)
	}
	g.makeRecords()
	return g, nil
}

// hostNameLen bounds a host's name in hostNames.
const hostNameLen = 64

// hostNames gathers every rank's host, for Stats and timeout errors. It is
// collective.
func hostNames(c *mpi.Comm) ([]string, error) {
	name, err := mpi.ProcessorName()
	if err != nil {
		return nil, err
	}
	mine := make([]byte, hostNameLen)
	copy(mine, name)
	all := make([]byte, hostNameLen*c.Size())
	if err := c.Allgather(mine, all); err != nil {
		return nil, fmt.Errorf("ep: NewGroup: gathering host names: %w", err)
	}
	out := make([]string, c.Size())
	for r := range out {
		out[r] = strings.TrimRight(string(all[r*hostNameLen:(r+1)*hostNameLen]), "\x00")
	}
	return out, nil
}

// backendNameLen bounds a backend's name in the config check.
const backendNameLen = 64

// agreeOnConfig gathers every rank's config, element type and backend name,
// and fails, identically on every rank, if they differ.
func agreeOnConfig(c *mpi.Comm, cfg Config, elem DType) error {
	fp := cfg.Fingerprint(elem)
	all := make([]int64, len(fp)*c.Size())
	if err := mpi.AllgatherSlice(c, fp, all); err != nil {
		return fmt.Errorf("ep: NewGroup: comparing configs: %w", err)
	}
	name := make([]byte, backendNameLen)
	copy(name, backendOf(cfg).Name())
	names := make([]byte, backendNameLen*c.Size())
	if err := c.Allgather(name, names); err != nil {
		return fmt.Errorf("ep: NewGroup: comparing configs: %w", err)
	}
	nameOf := func(r int) string {
		return strings.TrimRight(string(names[r*backendNameLen:(r+1)*backendNameLen]), "\x00")
	}
	var diffs []string
	for r := 1; r < c.Size(); r++ {
		for i := range fp {
			if a, b := all[i], all[r*len(fp)+i]; a != b {
				diffs = append(diffs, fmt.Sprintf("rank %d has %s = %s, rank 0 has %s", r, driver.FingerprintField(i),
					fieldString(i, b), fieldString(i, a)))
			}
		}
		if nameOf(r) != nameOf(0) {
			diffs = append(diffs, fmt.Sprintf("rank %d has Backend = %s, rank 0 has %s", r, nameOf(r), nameOf(0)))
		}
	}
	if len(diffs) > 0 {
		return fmt.Errorf("ep: NewGroup: ranks passed different configs: %s", strings.Join(diffs, "; "))
	}
	return nil
}

func fieldString(i int, v int64) string {
	switch driver.FingerprintField(i) {
	case "Mode":
		return Mode(v).String()
	case "Timeout":
		return time.Duration(v).String()
	case "element type":
		return DType(v).String()
	case "Wire":
		return WireFormat(v).String()
	case "Layout":
		return RecvLayout(v).String()
	case "RecvIDs":
		return ExpertIDKind(v).String()
	}
	return fmt.Sprint(v)
}

// Config is the group's configuration (Timeout and Layout resolved). Not
// collective.
func (g *Group[E]) Config() Config { return g.spec.Config }

// Rank is this rank's place in the group. Not collective.
func (g *Group[E]) Rank() int { return g.rank }

// Size is the number of ranks. Not collective.
func (g *Group[E]) Size() int { return g.size }

// Nodes is the number of nodes the ranks span. Not collective.
func (g *Group[E]) Nodes() int { return g.place.Nodes }

// Node is this rank's node index. Not collective.
func (g *Group[E]) Node() int { return g.place.Node }

// NodeOf is the node index of a rank. Not collective.
func (g *Group[E]) NodeOf(rank int) int { return g.place.NodeOf[rank] }

// LocalExperts is the number of experts each rank owns; this rank owns
// experts [Rank()*LocalExperts(), (Rank()+1)*LocalExperts()). Not collective.
func (g *Group[E]) LocalExperts() int { return g.sh.L }

// BufferBytes is the memory the group's engine holds on this rank. Not
// collective.
func (g *Group[E]) BufferBytes() int { return g.eng.BufferBytes() }

// DeviceTimes is, on a backend that runs on a device (an engine that is a
// DeviceTimer), the device's time of this rank's last completed dispatch
// and last completed combine, from the first work each queued to the last
// (0 before the first); ok is false on other backends. Not collective.
func (g *Group[E]) DeviceTimes() (dispatch, combine time.Duration, ok bool) {
	t, ok := g.eng.(DeviceTimer)
	if !ok {
		return 0, 0, false
	}
	dispatch, combine = t.DeviceTimes()
	return dispatch, combine, true
}

// Memory is where the group's tensors are, and where the tensors passed to
// it must be. Not collective.
func (g *Group[E]) Memory() Memory { return g.mem }

// Backend is the name of the group's backend. Not collective.
func (g *Group[E]) Backend() string { return backendOf(g.spec.Config).Name() }

func (g *Group[E]) String() string {
	return fmt.Sprintf("%s{%v, %s backend, rank %d of %d, %v}", g.spec.Name, g.spec.Mode, g.Backend(), g.rank, g.size, g.sh)
}

// Close releases the group's buffers and communicator. It is collective:
// when a rank has not called it within Config.Timeout, Close frees nothing
// and returns a *TimeoutError naming that rank; Close may then be called
// again, unless the rank named is 0 (see mpi.Comm.Arrive).
//
// With FeatureCallSequence, after a peer did not arrive in a call (a
// *TimeoutError here, or on a rank that said so), Close returns nil at once
// and frees nothing: freeing is collective, and that peer may never come.
// The buffers and the communicator stay allocated until MPI ends.
func (g *Group[E]) Close() error {
	if g == nil || g.closed {
		return nil
	}
	// An engine that is a Sequencer has told every rank (a rank that
	// stalled finds it when it comes back); with any other, the rank that
	// stalled would wait here for the others.
	sq, _ := g.eng.(Sequencer)
	if sq != nil && !g.spec.MaskStalledRanks && (errors.Is(g.broken, ErrTimeout) || errors.Is(sq.Broken(), ErrTimeout)) {
		g.closed = true
		return nil
	}
	if sq != nil {
		sq.Closing() // a rank still waiting for this one in a call fails at once
	}
	// Freeing windows and the communicator is collective: a rank that
	// does not call Close is named here, and this rank then leaves them
	// allocated rather than hang in the free, and may call Close again.
	if err := arrive(g.comm, "Close", g.spec.Timeout); err != nil {
		g.nameHost(err)
		return err
	}
	g.closed = true
	return errors.Join(g.eng.Close(), g.comm.Free())
}

// usable reports a closed or broken group.
func (g *Group[E]) usable(op string) error {
	if g == nil {
		return fmt.Errorf("ep: %s: nil group", op)
	}
	if g.closed {
		return fmt.Errorf("ep: %s: %w", op, ErrClosed)
	}
	if g.broken != nil {
		return fmt.Errorf("ep: %s: the group is unusable after an earlier failure: %w", op, g.broken)
	}
	if g.maskedOut != nil {
		return fmt.Errorf("ep: %s: %w", op, ErrMasked)
	}
	return nil
}

// engineError passes an engine's error on: an *InputError leaves the group
// usable; anything else (a timeout, an MPI failure) breaks it, since flags
// may be half-written and no later call can trust them.
func (g *Group[E]) engineError(err error) error {
	if err == nil || errors.Is(err, ErrBadInput) {
		return err
	}
	if errors.Is(err, ErrMasked) { // not broken: SetMask lets this rank rejoin
		g.maskedOut = err
		return err
	}
	g.nameHost(err)
	if g.broken == nil {
		g.broken = err
	}
	return err
}

// refuse makes a collective call this rank refused (err) fail on every
// rank at once: the call is numbered as on the others (and in LL takes its
// buffer set's turn), and an engine that is a Refuser tells the other
// ranks, which get a *RefusedError naming this rank and err. r says what
// the call was (Kind, Cached, and where this rank knows them its Set, -1
// otherwise, and its handle's Dispatch); refuse numbers it.
func (g *Group[E]) refuse(r Refusal, err error) error {
	g.op++
	if r.Kind == CallDispatch {
		if g.spec.Mode == LowLatency {
			r.Set = int(g.dispatches % 2)
		} else {
			// An engine that takes part in the refused call's transfers
			// may receive into the one receive buffer, as the other
			// ranks' same call does: the rows an earlier handle's Recv
			// views are no longer there.
			g.htLast = g.op
		}
		g.dispatches++
	}
	if rf, ok := g.eng.(Refuser); ok {
		r.Op, r.Reason = g.op, err.Error()
		if rerr := rf.Refuse(&r); rerr != nil {
			return errors.Join(err, g.engineError(rerr))
		}
	}
	return err
}

// nameHost fills in the host of a timeout's peer.
func (g *Group[E]) nameHost(err error) {
	var te *TimeoutError
	if errors.As(err, &te) && te.Peer >= 0 && te.Peer < len(g.stats.hosts) {
		te.Host = g.stats.hosts[te.Peer]
	}
}

// newState takes the next record of the ring for a dispatch.
func (g *Group[E]) newState(op string) (*handleState[E], error) {
	s := g.states[g.next]
	if s == nil {
		s = &handleState[E]{g: g}
		g.states[g.next] = s
	} else if s.busy() {
		return nil, inputErrorf(op, "%d earlier dispatches are still in flight or waiting for their combine", handleRing)
	}
	g.next = (g.next + 1) % handleRing
	g.gen++
	s.gen, s.mode = g.gen, g.spec.Mode
	s.sent, s.ready, s.done, s.inComb = false, false, false, false
	return s, nil
}

// RefuseDispatch takes part in this rank's next dispatch as a refusal with
// reason: a layer above ep that checks its callers' arguments itself (the
// C and Python interfaces do) calls it instead of a dispatch when this
// rank's are bad, so that every other rank's same call fails at once with a
// *RefusedError naming this rank and reason, as when one of ep's own checks
// refuses, instead of waiting for this rank until its timeout. prev is the
// handle a dispatch would have reused (the zero Handle for a fresh
// dispatch). It returns reason as an *InputError; the group stays usable.
// It is collective, as the dispatch it stands for.
func (g *Group[E]) RefuseDispatch(prev Handle[E], reason string) error {
	op := g.names.Dispatch
	r := Refusal{Kind: CallDispatch}
	if prev.s != nil {
		op, r.Cached = g.names.Cached, true
		if p, err := g.checkHandle(op, prev); err == nil {
			r.Dispatch = &p.d
		}
	}
	if err := g.usable(op); err != nil {
		return err
	}
	return g.refuse(r, inputErrorf(op, "%s", reason))
}

// RefuseCombine is RefuseDispatch for the combine of handle h.
func (g *Group[E]) RefuseCombine(h Handle[E], reason string) error {
	op := g.names.Combine
	if err := g.usable(op); err != nil {
		return err
	}
	r := Refusal{Kind: CallCombine, Set: -1}
	if s, err := g.checkHandle(op, h); err == nil {
		r.Set, r.Dispatch = s.d.Set, &s.d
	}
	return g.refuse(r, inputErrorf(op, "%s", reason))
}

// Mark numbers a step of the caller's that makes no collective call (the C
// and Python interfaces mark each handle they create, refused or not): the
// group's next call takes a number one higher. A rank that took a step the
// others did not (or skipped one) then has calls numbered differently from
// theirs, which the engines of FeatureCallSequence find at the next call
// that needs a flag of it: every rank fails with an error naming the rank
// and the call, instead of pairing one rank's step with another's. Every
// rank must mark the same steps in the same order between the same calls.
// Not collective.
func (g *Group[E]) Mark() {
	if g != nil {
		g.op++
	}
}
