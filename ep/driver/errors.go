package driver

import (
	"errors"
	"fmt"
	"time"
)

// ErrClosed is returned by calls on a closed group.
var ErrClosed = errors.New("ep: group is closed")

// ErrTimeout is matched (errors.Is) by every *TimeoutError.
var ErrTimeout = errors.New("ep: timeout")

// ErrMasked is returned, in a group that masks stalled ranks
// (Config.MaskStalledRanks), to a rank that the others masked: it did not
// arrive within their timeout and they went on without it. It rejoins with
// SetMask, called with them.
var ErrMasked = errors.New("ep: this rank was masked by the others (it did not arrive within their timeout): call SetMask with them to rejoin")

// ErrBadInput is matched (errors.Is) by every *InputError.
var ErrBadInput = errors.New("ep: bad input")

// TimeoutError reports a peer that did not arrive within the group's timeout.
// The group is unusable afterwards.
type TimeoutError struct {
	Op    string        // the call, e.g. "ll dispatch"
	Peer  int           // the rank that did not arrive; -1 when the engine cannot tell (an MPI collective)
	Host  string        // the peer's host, when known
	What  string        // what was waited for
	After time.Duration // the timeout
}

func (e *TimeoutError) Error() string {
	if e.Peer < 0 {
		return fmt.Sprintf("ep: %s: a rank did not arrive within %v (waiting for %s, which cannot say which): it has stopped or stalled",
			e.Op, e.After, e.What)
	}
	peer := fmt.Sprintf("rank %d", e.Peer)
	if e.Host != "" {
		peer += " on host " + e.Host
	}
	return fmt.Sprintf("ep: %s: %s did not arrive within %v (waiting for %s): it has stopped or stalled",
		e.Op, peer, e.After, e.What)
}

// Is reports whether target is ErrTimeout.
func (e *TimeoutError) Is(target error) bool { return target == ErrTimeout }

// InputError reports a call refused because of its arguments, before
// anything was written: the group stays usable.
type InputError struct {
	Op  string // the call, e.g. "ht combine"
	Msg string // what was wrong, naming the bad value
}

func (e *InputError) Error() string { return "ep: " + e.Op + ": " + e.Msg }

// Is reports whether target is ErrBadInput.
func (e *InputError) Is(target error) bool { return target == ErrBadInput }

// RefusedError reports a collective call that another rank refused (its
// input failed the checks there, or disagreed with this rank's), so that
// the same call failed on every rank at once instead of waiting for that
// rank until the timeout. The group stays usable.
type RefusedError struct {
	Op     string // the call, e.g. "ll dispatch"
	Rank   int    // the rank that refused it
	Reason string // that rank's error
}

func (e *RefusedError) Error() string {
	return fmt.Sprintf("ep: %s: rank %d refused the call: %s", e.Op, e.Rank, e.Reason)
}

// Is reports whether target is ErrBadInput.
func (e *RefusedError) Is(target error) bool { return target == ErrBadInput }

// isRefused reports a *RefusedError. (errors.As's target escapes: it is
// declared only when there is an error, so that calls allocate nothing.)
func IsRefused(err error) bool { return err != nil && refusedIn(err) }

func refusedIn(err error) bool {
	var r *RefusedError
	return errors.As(err, &r)
}

func inputErrorf(op, format string, a ...any) error {
	return &InputError{Op: op, Msg: fmt.Sprintf(format, a...)}
}

// InputErrorf makes an *InputError, for Engines that refuse an input only
// they can check.
func InputErrorf(op, format string, a ...any) error { return inputErrorf(op, format, a...) }
