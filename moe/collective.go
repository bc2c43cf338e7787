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

// bcastString sends s from rank root to every rank (collective): its length,
// then its bytes.
func bcastString(c *mpi.Comm, s string, root int) (string, error) {
	n := []int64{int64(len(s))}
	if err := mpi.BcastSlice(c, n, root); err != nil {
		return "", err
	}
	buf := make([]byte, n[0])
	if c.Rank() == root {
		copy(buf, s)
	}
	if n[0] > 0 {
		if err := c.Bcast(buf, root); err != nil {
			return "", err
		}
	}
	return string(buf), nil
}

// gatherStrings returns every rank's s, indexed by rank (collective). Each
// string is cut to max bytes.
func gatherStrings(c *mpi.Comm, s string, max int) ([]string, error) {
	mine := make([]byte, max)
	copy(mine, s)
	all := make([]byte, max*c.Size())
	if err := c.Allgather(mine, all); err != nil {
		return nil, err
	}
	out := make([]string, c.Size())
	for r := range out {
		out[r] = string(bytes.TrimRight(all[r*max:(r+1)*max], "\x00"))
	}
	return out, nil
}
