package epcpu

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"time"
	"unsafe"

	"github.com/goep/goep/ep/driver"
	"github.com/goep/goep/internal/memorder"
	"github.com/goep/goep/mpi"
)

// Every collective call of a group has a number, the same on every rank
// (Dispatch.Op, Combine.Op), which every flag the call raises carries; a
// layer above ep that numbers steps of its own that make no call (the C
// and Python interfaces' handles) adds them to the count (Group.Mark). A
// rank that skips a call, makes one the others do not, or makes another
// kind of call at the same place, so has numbers or kinds of call that
// differ from the others', and a wait finds it in what it reads anyway:
//
//   - a flag that arrives holding a later call than the one waited for;
//   - when a flag is late, its raiser's call word (the last call it
//     started, its kind and the dispatch it uses, and the calls it has
//     finished: callWord), which it writes at every call into its own
//     memory (node peers read it there) and sends to the other nodes when
//     its own wait is late: a raiser that is past the call without having
//     raised the flag, in the same call of another kind, or closing the
//     group.
//
// The rank that finds it fails with a *SequenceError and says so to every
// rank (its abort word, with its note): a rank waiting for it in any call
// fails at once with an *UnusableError naming the rank that found it, and
// says so in turn. No result of a call whose ranks differ is ever
// returned.

// callKind is what a call is, in its call word.
type callKind uint64

const (
	callNone     callKind = iota
	callDispatch          // Dispatch (fresh routing)
	callCached            // a dispatch reusing a routing (DispatchInput.Reuse)
	callCombine           // Combine
	callRelease           // Release of an LL handle: its combine without outputs
	callRefused           // a call this rank refused: it stands for whatever the others make
	callClosing           // Close
)

func (k callKind) String() string {
	switch k {
	case callDispatch:
		return "a dispatch"
	case callCached:
		return "a cached dispatch"
	case callCombine:
		return "a combine"
	case callRelease:
		return "a release (a handle ended without its combine)"
	case callRefused:
		return "a call it refused"
	case callClosing:
		return "Close"
	}
	return "no call"
}

// A call word is op<<32 | kind<<29 | behind<<21 | back: the last call the
// rank started (op), what it is, how many calls before op are not finished
// (behind: the rank has finished every call up to op-behind-1, or op itself
// when behind is 0 and the call has ended; saturated), and, for a combine,
// a release or a cached dispatch, how many calls back the dispatch whose
// routing it uses was (back; 0 for a fresh dispatch; saturated).
const (
	callBehindMax = 1<<8 - 1
	callBackMax   = 1<<21 - 1
)

func callWord(op uint64, k callKind, behind, back uint64) uint64 {
	return op<<32 | uint64(k)<<29 | min(behind, callBehindMax)<<21 | min(back, callBackMax)
}

func callOp(w uint64) uint64       { return w >> 32 }
func callKindOf(w uint64) callKind { return callKind(w >> 29 & 7) }
func callBack(w uint64) uint64     { return w & callBackMax }

// callThrough is the last call up to which the word's rank has finished
// every call (0: none known).
func callThrough(w uint64) uint64 {
	op, behind := callOp(w), w>>21&callBehindMax
	if behind >= op {
		return 0
	}
	return op - behind
}

// callsDiffer reports whether theirs, a peer's call word read while this
// rank waited for one of its flags of call mine (a call word of this
// rank's) and the flag had not come, says that the peer is not in that
// call: it is closing the group, it has finished every call up to and past
// it, or it is in a call of that number of another kind or on another
// dispatch. A word of a call it refused matches any call of its number.
func callsDiffer(mine, theirs uint64) bool {
	if theirs == 0 || mine == 0 {
		return false
	}
	q := callOp(mine)
	kt := callKindOf(theirs)
	switch {
	case kt == callClosing:
		return true
	case callThrough(theirs) >= q:
		return true
	case callOp(theirs) != q:
		return false
	}
	km := callKindOf(mine)
	if km == callRefused || kt == callRefused {
		return false
	}
	if km != kt {
		return true
	}
	bm, bt := callBack(mine), callBack(theirs)
	return bm != bt && bm < callBackMax && bt < callBackMax
}

// describeCall says what a call word says, for errors: "at call 9, a
// dispatch".
func describeCall(w uint64) string {
	k := callKindOf(w)
	s := fmt.Sprintf("at call %d, %v", callOp(w), k)
	if b := callBack(w); b > 0 && b < callBackMax {
		s += fmt.Sprintf(" of the dispatch of call %d", callOp(w)-b)
	}
	if k != callClosing {
		if th := callThrough(w); th < callOp(w) {
			s += fmt.Sprintf(", its calls up to %d finished", th)
		} else {
			s += ", finished"
		}
	}
	return s
}

// sequenceCause is what an error of a rank that found the group unusable
// says about why, for the others' UnusableError.
func sequenceCause(err error) byte {
	switch {
	case errors.Is(err, driver.ErrMismatch):
		return 's'
	case errors.Is(err, driver.ErrTimeout):
		return 't'
	}
	return 'o'
}

func causeOf(b byte) error {
	switch b {
	case 's':
		return driver.ErrMismatch
	case 't':
		return driver.ErrTimeout
	}
	return nil
}

// The CPU engine's side: its transport keeps this rank's call word.

// begin records that this rank starts the call of call word w.
func (t *transport) begin(w uint64) {
	t.started = w
	free, oldest := -1, -1
	for i, c := range t.inflight {
		switch {
		case c == 0:
			free = i
		case oldest < 0 || callOp(c) < callOp(t.inflight[oldest]):
			oldest = i
		}
	}
	if free < 0 { // more calls in flight than kept: forget the oldest (its Wait may never come)
		free = oldest
	}
	t.inflight[free] = w
	t.writeCall()
}

// end records that this rank's call op is over (its Wait, or a Send that
// failed).
func (t *transport) end(op uint64) {
	for i, c := range t.inflight {
		if c != 0 && callOp(c) == op {
			t.inflight[i] = 0
		}
	}
	t.writeCall()
}

// callOf is this rank's call word of call op, if it is in flight (0 if not).
func (t *transport) callOf(op uint64) uint64 {
	for _, c := range t.inflight {
		if c != 0 && callOp(c) == op {
			return c
		}
	}
	return 0
}

// callNow is this rank's call word: the last call started, and how far its
// calls are finished.
func (t *transport) callNow() uint64 {
	op := callOp(t.started)
	behind := uint64(0)
	for _, c := range t.inflight {
		if c != 0 {
			behind = max(behind, op-callOp(c)+1)
		}
	}
	return callWord(op, callKindOf(t.started), behind, callBack(t.started))
}

// callWordOf is where this rank reads rank p's call word: in p's segment
// for a node peer, where p writes it, else where p sends it.
func (t *transport) callWordOf(p int) ptr {
	if t.local[p] {
		return t.lsa(p, t.in.callOff(p))
	}
	return t.staged(t.in.callOff(p))
}

// writeCall stores this rank's call word where its node peers read it.
func (t *transport) writeCall() {
	memorder.StoreRelease((*uint64)(t.lsa(t.me, t.in.callOff(t.me))), t.callNow())
}

// publishCall sends this rank's call word to the ranks of other nodes,
// where it has changed since it was last sent: a rank whose wait is late
// does, so that the ranks of other nodes that wait for it can read it.
func (t *transport) publishCall() error {
	w := t.callNow()
	if w == t.published || len(t.liveRemote) == 0 {
		return nil
	}
	t.published = w
	*(*uint64)(unsafe.Pointer(&t.callBuf[0])) = w
	blocks := t.attachB[:0]
	for _, d := range t.liveRemote {
		blocks = append(blocks, mpi.Block{Len: 8, Target: d, DstOffset: t.in.callOff(t.me)})
	}
	t.attachB = blocks
	return t.net.PutBlocks(t.callBuf, blocks)
}

// sequenceError is the *SequenceError of this rank's call q (op), found
// waiting for rank p, which is doing theirs.
func (t *transport) sequenceError(op string, q uint64, p int, theirs string) error {
	kind := "a call"
	if c := t.callOf(q); c != 0 {
		kind = callKindOf(c).String()
		if b := callBack(c); b > 0 && b < callBackMax {
			kind += fmt.Sprintf(" of the dispatch of call %d", q-b)
		}
	}
	return &driver.SequenceError{Op: op, Call: q, Kind: kind, Rank: p, Theirs: theirs}
}

// brokenPeer is what a wait returns when the rank that should raise a flag
// says that the group is unusable (its abort word): the engine reads why
// (unusable).
type brokenPeer struct{ peer int }

func (b *brokenPeer) Error() string {
	return "ep: rank " + strconv.Itoa(b.peer) + " found the group unusable"
}

// The note of a rank that found the group unusable: brokenMark, then the
// cause (sequenceCause), the rank that found it first, and its error.
const brokenMark = 1 << 63

// breakGroup says to every other rank that this one found the group
// unusable (err; or, for an *UnusableError, the rank it names found it):
// its note, then its abort word with brokenBit, which ends any wait for
// one of its flags. Once.
func (t *transport) breakGroup(err error) {
	if t.broken != nil {
		return
	}
	t.broken = err
	origin, cause, reason := t.me, sequenceCause(err), err.Error()
	var ue *driver.UnusableError
	if errors.As(err, &ue) {
		origin, reason = ue.Rank, ue.Reason
	}
	note := make([]byte, noteLen) // a broken group is no hot path
	binary.LittleEndian.PutUint64(note, brokenMark)
	note[8] = cause
	binary.LittleEndian.PutUint32(note[12:], uint32(origin))
	copy(note[16:noteLen-1], reason)
	// Best effort: the network may be what failed.
	if t.writeNoteBytes(note) == nil {
		_ = t.raise(t.liveOthers, flagAborted, 0, t.me, callOp(t.started), brokenBy(origin), nil)
	}
}

// unusable is the *UnusableError of this rank's call q (op) after rank p
// said the group is unusable: its note says who found it and why (across
// nodes it may come after the abort word that said so from a third rank:
// the wait for it is bounded by the timeout).
func (t *transport) unusable(op string, q uint64, p int) *driver.UnusableError {
	b := t.noteBytes(p)
	start := time.Now()
	for binary.LittleEndian.Uint64(b) != brokenMark {
		if t.net == nil || time.Since(start) > t.timeout {
			return &driver.UnusableError{Op: op, Call: q, Rank: p, Reason: fmt.Sprintf("(rank %d's reason did not arrive within %v)", p, t.timeout)}
		}
		if err := t.net.Progress(); err != nil {
			return &driver.UnusableError{Op: op, Call: q, Rank: p, Reason: fmt.Sprintf("(rank %d's reason did not arrive: %v)", p, err)}
		}
	}
	reason := b[16:]
	if i := bytes.IndexByte(reason, 0); i >= 0 {
		reason = reason[:i]
	}
	return &driver.UnusableError{Op: op, Call: q, Rank: int(int32(binary.LittleEndian.Uint32(b[12:]))), Reason: string(reason), Cause: causeOf(b[8])}
}

// peerBroken is the error of a rank that said the group is unusable, if
// one did (after letting what the other nodes sent land).
func (t *transport) peerBroken(op string) error {
	if t.net != nil {
		_ = t.net.Drain()
	}
	for _, p := range t.others {
		if a := loadFlag(t.inboxOf(p, t.in.flagOff(flagAborted, 0, p))); a&brokenBit != 0 {
			return t.unusable(op, callOp(t.started), p)
		}
	}
	return nil
}

// closing tells the other ranks that this rank is closing the group: its
// call word says so, here and sent to the other nodes.
func (t *transport) closing() {
	t.started = callWord(callOp(t.started)+1, callClosing, 0, 0)
	clear(t.inflight[:])
	t.writeCall()
	_ = t.publishCall()
}
