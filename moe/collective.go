package moe

import "github.com/goep/goep/mpi"

// agree is mpi.AgreeOnError: every rank returns an error if any rank's err
// is not nil. It keeps ranks in step after work that only some ranks do
// (rank 0 writing a file).
func agree(c *mpi.Comm, err error) error { return mpi.AgreeOnError(c, err) }
