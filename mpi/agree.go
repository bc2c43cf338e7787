package mpi

import (
	"bytes"
	"errors"
	"fmt"
)

// maxAgreedMsg bounds the error text AgreeOnError sends between ranks.
const maxAgreedMsg = 1024

// AgreedError is what AgreeOnError returns on every rank when some rank's
// error was not nil: the text of the lowest failing rank's error, the same on
// every rank, and on that rank the error itself (Unwrap).
type AgreedError struct {
	Rank   int    // the lowest rank whose error was not nil
	Failed []int  // every rank whose error was not nil, in order
	Msg    string // Rank's error text (at most 1 KiB)
	Err    error  // Rank's error, on Rank only; nil elsewhere
}

func (e *AgreedError) Error() string { return fmt.Sprintf("rank %d: %s", e.Rank, e.Msg) }

// Unwrap returns the original error on the rank that failed.
func (e *AgreedError) Unwrap() error { return e.Err }

// AgreeOnError is collective: every rank passes its own outcome, and every
// rank returns nil if every err is nil, and otherwise an *AgreedError with the
// lowest failing rank's message. It keeps ranks in step after work that can
// fail on some ranks only (one rank writing a file, one rank missing a
// library), so that no rank goes on into a collective the others have left.
// A failure of the agreement itself is joined to err.
func AgreeOnError(c *Comm, err error) error {
	mine := []int32{0}
	if err != nil {
		mine[0] = 1
	}
	all := make([]int32, c.Size())
	if e := AllgatherSlice(c, mine, all); e != nil {
		return errors.Join(err, e)
	}
	var failed []int
	for r, f := range all {
		if f != 0 {
			failed = append(failed, r)
		}
	}
	if len(failed) == 0 {
		return nil
	}
	first := failed[0]
	msg := make([]byte, maxAgreedMsg)
	if c.Rank() == first {
		copy(msg, err.Error())
	}
	if e := c.Bcast(msg, first); e != nil {
		return errors.Join(err, e)
	}
	agreed := &AgreedError{Rank: first, Failed: failed, Msg: string(bytes.TrimRight(msg, "\x00"))}
	if c.Rank() == first {
		agreed.Err = err
	}
	return agreed
}
