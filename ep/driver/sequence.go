package driver

import (
	"errors"
	"fmt"
)

// ErrMismatch is matched (errors.Is) by every *SequenceError, and by an
// *UnusableError that one caused.
var ErrMismatch = errors.New("ep: the ranks' calls no longer match")

// SequenceError reports ranks whose calls no longer match: a rank skipped a
// call, made one that the others did not, or made another kind of call (or
// combined another handle) at the same place, so that no result of the call
// could be paired across ranks. It is found by the rank whose wait it ends;
// that rank says so to the others, whose calls fail with an *UnusableError
// naming it. The group is unusable on every rank.
type SequenceError struct {
	Op     string // this rank's call, e.g. "ll dispatch"
	Call   uint64 // its number in the group
	Kind   string // what this rank's call is, e.g. "a dispatch"
	Rank   int    // the rank whose call differs
	Theirs string // what that rank is doing, e.g. "at call 9, a combine of the dispatch of call 8"
}

func (e *SequenceError) Error() string {
	return fmt.Sprintf("ep: %s: the ranks' calls no longer match: this rank is at call %d, %s, and rank %d is %s: "+
		"a rank skipped a call or made one that the others did not, after an error or a step of its own; "+
		"no result of this call is returned, and the group is unusable: close it on every rank and make a new one",
		e.Op, e.Call, e.Kind, e.Rank, e.Theirs)
}

// Is reports whether target is ErrMismatch.
func (e *SequenceError) Is(target error) bool { return target == ErrMismatch }

// UnusableError reports a call that failed because another rank found the
// group unusable (its calls no longer matched this rank's, or a peer did
// not arrive) and said so: Rank found it, and Reason is its error. The
// group is unusable here too. It matches ErrMismatch or ErrTimeout
// (errors.Is) as the error of that rank did.
type UnusableError struct {
	Op     string // this rank's call, e.g. "ll combine"
	Call   uint64 // its number in the group
	Rank   int    // the rank that found the group unusable
	Reason string // its error
	Cause  error  // ErrMismatch, ErrTimeout or nil: what that rank's error matched
}

func (e *UnusableError) Error() string {
	return fmt.Sprintf("ep: %s: call %d failed: rank %d found the group unusable: %s", e.Op, e.Call, e.Rank, e.Reason)
}

// Is reports whether target is the cause of the origin's error.
func (e *UnusableError) Is(target error) bool { return e.Cause != nil && target == e.Cause }

// A Sequencer is an Engine that checks, in the exchanges its calls make,
// that every rank makes the same calls (FeatureCallSequence), and tells
// the other ranks when this one finds the group unusable.
type Sequencer interface {
	// Closing tells the other ranks that this rank is closing the group:
	// a rank waiting for it in a call fails at once.
	Closing()
	// Broken is the error of a rank that has said the group is unusable
	// (this one or another; nil if none has said so yet).
	Broken() error
}
