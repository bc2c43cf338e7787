package mpi

import "time"

// Adopt makes a Comm of an MPI communicator that the caller created and
// owns, for code that runs inside someone else's MPI program: a C program
// that called MPI_Init_thread, a Python program that imported mpi4py. raw is
// the MPI_Comm as an integer (Open MPI's MPI_Comm is a pointer; mpi4py gives
// it as MPI._handleof(comm)).
//
// MPI must be initialised already, and Adopt neither initialises nor
// finalises it: the caller does both, and frees its communicator after the
// Comm is freed. The Comm is a duplicate (MPI_Comm_idup), so that this
// package's messages never mix with the caller's and its error handler
// (MPI_ERRORS_RETURN) is set on the duplicate, not on the caller's
// communicator; Free releases the duplicate only.
//
// It is collective over raw's ranks. Before the duplication every rank
// announces itself with Arrive (point-to-point messages to rank 0 with tag
// 32011 on raw), so that a rank that does not call Adopt within timeout
// (0: no limit) is a *MissingError naming it on the others, never a hang.
// The Comm's collectives wait timeout too (SetTimeout changes it).
//
// The MPI thread level is the caller's choice: this package calls MPI from
// the goroutine that calls it, which, inside a call from C, is the calling
// thread. ThreadLevel reports the level provided.
func Adopt(raw uintptr, name string, timeout time.Duration) (*Comm, error) {
	if raw == 0 {
		return nil, argErrorf("Adopt", "communicator handle 0 (MPI_COMM_NULL or no communicator)")
	}
	if timeout < 0 {
		return nil, argErrorf("Adopt", "timeout %v is negative", timeout)
	}
	return adopt(raw, name, timeout)
}
