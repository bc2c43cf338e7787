package moe

import (
	"bytes"
	"errors"
	"fmt"

	"github.com/goep/goep/mpi"
)

// maxErrLen bounds the error text agree sends between ranks.
const maxErrLen = 1024

// agree is collective: it returns nil on every rank if err is nil on every
// rank, and otherwise an error on every rank: err itself on the lowest rank
// that failed, and the text of that rank's error elsewhere. It keeps ranks in
// step after work that only some ranks do (rank 0 writing a file).
func agree(c *mpi.Comm, err error) error {
	mine := []int32{0}
	if err != nil {
		mine[0] = 1
	}
	all := make([]int32, c.Size())
	if e := mpi.AllgatherSlice(c, mine, all); e != nil {
		return errors.Join(err, e)
	}
	first := -1
	for r, f := range all {
		if f != 0 {
			first = r
			break
		}
	}
	if first < 0 {
		return nil
	}
	msg := make([]byte, maxErrLen)
	if c.Rank() == first {
		copy(msg, err.Error())
	}
	if e := c.Bcast(msg, first); e != nil {
		return errors.Join(err, e)
	}
	if c.Rank() == first {
		return err
	}
	if err != nil {
		return err
	}
	return fmt.Errorf("rank %d: %s", first, bytes.TrimRight(msg, "\x00"))
}
