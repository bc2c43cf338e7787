//go:build mpi

package mpi

/*
#include "shim_mpi.h"
*/
import "C"

import (
	"fmt"
	"time"
)

func adopt(raw uintptr, name string, timeout time.Duration) (*Comm, error) {
	var initialized, finalized C.int
	C.goep_mpi_state(&initialized, &finalized)
	switch {
	case finalized != 0:
		return nil, argErrorf("Adopt", "MPI has been finalised")
	case initialized == 0:
		return nil, argErrorf("Adopt", "MPI is not initialised: the caller initialises it first (MPI_Init_thread in C, importing mpi4py's MPI in Python)")
	}
	c := C.goep_comm_of(C.uintptr_t(raw))
	if c == C.MPI_COMM_NULL {
		return nil, argErrorf("Adopt", "the communicator is MPI_COMM_NULL")
	}
	var inter C.int
	if rc := C.MPI_Comm_test_inter(c, &inter); rc != C.MPI_SUCCESS {
		return nil, mpiError("MPI_Comm_test_inter", rc)
	}
	if inter != 0 {
		return nil, argErrorf("Adopt", "the communicator is an intercommunicator; want an intracommunicator")
	}
	callers, err := newComm(c)
	if err != nil {
		return nil, err
	}
	callers.name, callers.timeout, callers.h.borrowed = name+" (the caller's)", timeout, true
	if err := callers.Arrive("mpi.Adopt", timeout); err != nil {
		return nil, err
	}
	var dup C.MPI_Comm
	if rc := C.goep_comm_idup(c, &dup, C.int64_t(timeout.Nanoseconds())); rc != C.MPI_SUCCESS {
		if rc == C.GOEP_ERR_TIMEOUT {
			return nil, &TimeoutError{Call: "MPI_Comm_idup", After: timeout, Comm: callers.name}
		}
		return nil, fmt.Errorf("mpi: Adopt: %w", mpiError("MPI_Comm_idup", rc))
	}
	ac, err := newComm(dup)
	if err != nil {
		return nil, err
	}
	ac.name, ac.timeout = name, timeout
	initMu.Lock()
	if world == nil { // else Init asked for the thread level
		var provided C.int
		C.MPI_Query_thread(&provided)
		threadLevel = int(provided)
	}
	if oneSided.Reason == notInitialised {
		oneSided = OneSidedChoice{Reason: "MPI was initialised by the program that called mpi.Adopt: its choice"}
		readOneSided()
	}
	initMu.Unlock()
	return ac, nil
}
