package mpi

import (
	"errors"
	"fmt"
	"time"
)

// Error is an error returned by the MPI library, naming the call that failed.
type Error struct {
	Call string // the MPI function, e.g. "MPI_Alltoallv"
	Code int    // the MPI error code
	Msg  string // MPI_Error_string of Code
}

func (e *Error) Error() string {
	return fmt.Sprintf("mpi: %s failed: %s (error code %d)", e.Call, e.Msg, e.Code)
}

// ErrTimeout is matched (errors.Is) by every *TimeoutError.
var ErrTimeout = errors.New("mpi: timeout")

// TimeoutError reports a collective that did not complete before the
// communicator's timeout: some peer did not take part in time.
type TimeoutError struct {
	Call  string        // the MPI call that was waited on
	After time.Duration // how long it waited
	Comm  string        // the communicator's name
}

func (e *TimeoutError) Error() string {
	return fmt.Sprintf("mpi: %s on communicator %q did not complete within %v: a peer has stopped or is stalled",
		e.Call, e.Comm, e.After)
}

// Is reports whether target is ErrTimeout.
func (e *TimeoutError) Is(target error) bool { return target == ErrTimeout }

// MissingError reports a rank that did not arrive at a point every rank
// must reach (Arrive): named, unlike a collective's timeout. It matches
// ErrTimeout.
type MissingError struct {
	What  string        // the point, e.g. "ep.NewGroup"
	Rank  int           // the first rank that did not arrive
	After time.Duration // how long it was waited for
	Comm  string        // the communicator's name
}

func (e *MissingError) Error() string {
	return fmt.Sprintf("mpi: %s: rank %d of communicator %q did not arrive within %v: it has stopped, is stalled, or skipped the call",
		e.What, e.Rank, e.Comm, e.After)
}

// Is reports whether target is ErrTimeout.
func (e *MissingError) Is(target error) bool { return target == ErrTimeout }

// ArgError reports a bad argument, caught before MPI is called.
type ArgError struct {
	Call string // the method of this package
	Msg  string
}

func (e *ArgError) Error() string { return fmt.Sprintf("mpi: %s: %s", e.Call, e.Msg) }

func argErrorf(call, format string, a ...any) error {
	return &ArgError{Call: call, Msg: fmt.Sprintf(format, a...)}
}
