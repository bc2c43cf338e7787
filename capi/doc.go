//go:build mpi

// Command capi is goep's C interface: built with
//
//	go build -tags mpi -buildmode=c-shared -o bin/capi/libgoep_ep.so ./capi
//
// (make capi), it is the shared library libgoep_ep.so whose API goep_ep.h
// declares, shaped after NCCL EP's nccl_ep.h: a group made from an MPI
// communicator the calling program owns, handles for a step's routing,
// dispatch and combine (with their send-only halves and goepEpComplete),
// masking and the asynchronous error flag, and the memory plan. The Python
// package in python/ (goep.ep, named after NCCL EP's nccl.ep) calls it
// through ctypes.
//
// Every function is a thin layer over one ep.Group (the CPU backend unless
// goepEpGroupOptions_t names another registered one): it
// checks the caller's versioned structs and tensor descriptors, wraps the
// caller's host memory as ep tensors without copying, calls the group, and
// copies what the group received into the caller's output tensors (NCCL EP's
// outputs are the caller's memory). Groups and handles are numbers in a
// registry, never Go pointers; a Go panic is recovered into
// goepEpInternalError; an error's message is kept per calling thread
// (lasterror.c). docs/capi.md is the user's guide, examples/ep_test.c the C
// example and tests/ the C tests.
package main
