package runs

import (
	"bytes"

	"github.com/goep/goep/mpi"
)

// agree is mpi.AgreeOnError: every rank returns an error if any rank's err
// is not nil. It keeps ranks in step after work that only some ranks do
// (rank 0 writing a file).
func agree(c *mpi.Comm, err error) error { return mpi.AgreeOnError(c, err) }

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
