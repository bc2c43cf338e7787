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

// Opaque handles are numbers the library hands out; these convert them to
// and from the pointer types of the header (never dereferenced).
static inline goepEpGroup_t goep_ep_group_of(uint64_t id) { return (goepEpGroup_t)(uintptr_t)id; }
static inline uint64_t goep_ep_group_id(goepEpGroup_t g) { return (uint64_t)(uintptr_t)g; }
static inline goepEpHandle_t goep_ep_handle_of(uint64_t id) { return (goepEpHandle_t)(uintptr_t)id; }
static inline uint64_t goep_ep_handle_id(goepEpHandle_t h) { return (uint64_t)(uintptr_t)h; }
// The MPI_Comm as an integer, whatever the MPI library's MPI_Comm is.
static inline uintptr_t goep_ep_comm_handle(MPI_Comm c) { return (uintptr_t)c; }
#endif
