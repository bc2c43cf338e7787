//go:build !mpi

package mpi

import "time"

func adopt(uintptr, string, time.Duration) (*Comm, error) {
	return nil, argErrorf("Adopt", "this binary was built without the mpi build tag: it has no MPI and cannot use an MPI communicator (rebuild with -tags mpi)")
}
