package epcpu

import (
	"fmt"

	"github.com/goep/goep/ep/driver"
)

func inputErrorf(op, format string, a ...any) error {
	return &driver.InputError{Op: op, Msg: fmt.Sprintf(format, a...)}
}

// growTo returns s with length n, reallocating only when it is too small
// (never nil: an empty result is a zero-length slice, which costs nothing).
func growTo[T any](s []T, n int) []T {
	if cap(s) < n || s == nil {
		return make([]T, n)
	}
	return s[:n]
}
