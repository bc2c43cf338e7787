package h5

import (
	"errors"
	"strconv"
)

// Sentinel errors, matched with errors.Is. The *Error that wraps one adds the
// operation, the file, the object and the details.
var (
	// ErrNotHDF5 reports a file that is not HDF5, or is truncated or corrupt.
	ErrNotHDF5 = errors.New("not an HDF5 file or truncated")
	// ErrLocked reports a file that another process holds open for writing
	// (HDF5 1.10 locks files; see the package doc).
	ErrLocked = errors.New("file is locked by another process")
	// ErrNotFound reports a missing dataset, group or attribute.
	ErrNotFound = errors.New("not found")
	// ErrExist reports a dataset that already exists.
	ErrExist = errors.New("already exists")
	// ErrType reports a Go type that does not match the stored type.
	ErrType = errors.New("wrong type")
	// ErrShape reports a data length that does not match a shape.
	ErrShape = errors.New("bad shape")
	// ErrReadOnly reports a write to a file opened with Open.
	ErrReadOnly = errors.New("file is open read-only")
	// ErrClosed reports use of a closed File or of a Table of a closed File.
	ErrClosed = errors.New("file is closed")
	// ErrPath reports a malformed object path ("a//b", "..").
	ErrPath = errors.New("bad object path")
	// ErrHDF5 reports a failure inside the HDF5 library; the *Error's text
	// carries HDF5's own message.
	ErrHDF5 = errors.New("HDF5 error")
)

// Error is the error returned by every function of the package.
type Error struct {
	Op     string // the operation: "open", "create", "append", "read", "set attribute", ...
	File   string // the file's path as given to Create, Open or OpenRW
	Object string // the object inside the file ("/results/ll/latency"), "" for the file itself
	Err    error  // the cause; wraps one of the sentinel errors or an os error
}

// Error formats as
//
//	h5: open "out/ckpt.h5": not an HDF5 file or truncated: ...
//	h5: read "out/ckpt.h5" /w: wrong type: dataset is float32, not float64
func (e *Error) Error() string {
	s := "h5: " + e.Op + " " + strconv.Quote(e.File)
	if e.Object != "" {
		s += " " + e.Object
	}
	return s + ": " + e.Err.Error()
}

func (e *Error) Unwrap() error { return e.Err }

// detail wraps a sentinel with details: "wrong type: dataset is float32".
type detail struct {
	sentinel error
	msg      string
}

func (d *detail) Error() string {
	if d.msg == "" {
		return d.sentinel.Error()
	}
	return d.sentinel.Error() + ": " + d.msg
}

func (d *detail) Unwrap() error { return d.sentinel }

func wrap(sentinel error, msg string) error { return &detail{sentinel, msg} }

// libErr is an HDF5 failure, with the message HDF5 left on its error stack.
// Call it with the lock held, right after the failing call.
func libErr(what string) error {
	msg := lastError()
	if what != "" {
		msg = what + ": " + msg
	}
	return &detail{ErrHDF5, msg}
}
