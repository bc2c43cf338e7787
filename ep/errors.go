package ep

import "fmt"

// inputErrorf makes an *InputError.
func inputErrorf(op, format string, a ...any) error {
	return &InputError{Op: op, Msg: fmt.Sprintf(format, a...)}
}
