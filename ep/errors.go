package ep

import (
	"errors"
	"fmt"
	"time"
)

// ErrClosed is returned by calls on a closed group.
var ErrClosed = errors.New("ep: group is closed")

// ErrTimeout is matched (errors.Is) by every *TimeoutError.
var ErrTimeout = errors.New("ep: timeout")

// TimeoutError reports a peer that did not arrive within the group's timeout.
type TimeoutError struct {
	Op    string        // the call, e.g. "LL dispatch"
	Peer  int           // the rank that did not arrive
	What  string        // what was waited for
	After time.Duration // the timeout
}

func (e *TimeoutError) Error() string {
	return fmt.Sprintf("ep: %s: rank %d did not arrive within %v (waiting for %s): it has stopped or stalled",
		e.Op, e.Peer, e.After, e.What)
}

// Is reports whether target is ErrTimeout.
func (e *TimeoutError) Is(target error) bool { return target == ErrTimeout }

func inputErrorf(op, format string, a ...any) error {
	return fmt.Errorf("ep: %s: "+format, append([]any{op}, a...)...)
}
