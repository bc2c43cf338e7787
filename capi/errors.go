//go:build mpi

package main

/*
#cgo pkg-config: ompi
#cgo CFLAGS: -O2 -std=gnu11
#include "capi_internal.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"runtime/debug"
	"unsafe"

	"github.com/goep/goep/ep"
	"github.com/goep/goep/mpi"
)

// apiError is an error this layer found itself, with its result code.
type apiError struct {
	code C.goepEpResult_t
	msg  string
}

func (e *apiError) Error() string { return e.msg }

// invalidArgf is a bad value: goepEpInvalidArgument.
func invalidArgf(format string, a ...any) error {
	return &apiError{code: C.goepEpInvalidArgument, msg: fmt.Sprintf(format, a...)}
}

// invalidUsagef is a call out of order or not offered: goepEpInvalidUsage.
func invalidUsagef(format string, a ...any) error {
	return &apiError{code: C.goepEpInvalidUsage, msg: fmt.Sprintf(format, a...)}
}

// withCode gives err a result code of its own, keeping its message.
func withCode(code C.goepEpResult_t, err error) error {
	return &apiError{code: code, msg: err.Error()}
}

// resultOf maps an error of this layer, of ep or of mpi to its result code.
func resultOf(err error) C.goepEpResult_t {
	var ae *apiError
	var refused *ep.RefusedError
	var mpiErr *mpi.Error
	var argErr *mpi.ArgError
	switch {
	case err == nil:
		return C.goepEpSuccess
	case errors.As(err, &ae):
		return ae.code
	case errors.Is(err, ep.ErrMasked):
		return C.goepEpMasked
	case errors.Is(err, ep.ErrMismatch):
		return C.goepEpMismatch
	case errors.Is(err, ep.ErrTimeout), errors.Is(err, mpi.ErrTimeout):
		return C.goepEpTimeout
	case errors.As(err, &refused):
		return C.goepEpRemoteError
	case errors.Is(err, ep.ErrBadInput), errors.As(err, &argErr):
		return C.goepEpInvalidArgument
	case errors.Is(err, ep.ErrClosed), errors.Is(err, ep.ErrUnsupported):
		return C.goepEpInvalidUsage
	case errors.As(err, &mpiErr):
		return C.goepEpSystemError
	}
	return C.goepEpSystemError
}

// finish returns err's result code, keeping its message, named after the
// function fn, as the calling thread's last error.
func finish(fn string, err error) C.goepEpResult_t {
	if err == nil {
		return C.goepEpSuccess
	}
	setLastError(fn + ": " + err.Error())
	return resultOf(err)
}

func setLastError(msg string) {
	b := []byte(msg)
	if len(b) == 0 {
		return
	}
	C.goep_ep_set_last_error((*C.char)(unsafe.Pointer(&b[0])), C.size_t(len(b)))
}

// guard runs f, the body of the exported function fn: f's error becomes fn's
// result code and the calling thread's last error, and a panic
// goepEpInternalError.
func guard(fn string, f func() error) (rc C.goepEpResult_t) {
	defer recoverPanic(fn, &rc)
	return finish(fn, f())
}

// lastError is the calling thread's last error message.
func lastError() string { return C.GoString(C.goepEpGetLastError()) }

// recoverPanic, deferred by guard, turns a Go panic into
// goepEpInternalError with its message and stack, so that nothing unwinds
// into the caller's C frames.
func recoverPanic(fn string, rc *C.goepEpResult_t) {
	if r := recover(); r != nil {
		setLastError(fmt.Sprintf("%s: internal error (a Go panic, recovered; please report it): %v\n%s", fn, r, debug.Stack()))
		*rc = C.goepEpInternalError
	}
}
