// Declarations the Go side of the library needs beside the public header
// (goep_ep.h, included without its prototypes: cgo declares the exported
// functions from their Go signatures).
#ifndef GOEP_EP_INTERNAL_H
#define GOEP_EP_INTERNAL_H
#define GOEP_EP_NO_PROTOTYPES
#include "goep_ep.h"

// lasterror.c: the calling thread's last error message.
void goep_ep_set_last_error(const char *msg, size_t n);
const char *goepEpGetLastError(void);

// The MPI_Comm as an integer, whatever the MPI library's MPI_Comm is.
static inline uintptr_t goep_ep_comm_handle(MPI_Comm c) { return (uintptr_t)c; }
#endif
