/*
 * goep_nccl.h: the names of NCCL's nccl.h that a program written for NCCL EP uses beside NCCL EP's own
 * (result codes, data types, the communicator and window types, ncclGetErrorString), as goep's, so that
 * such a program compiles on goep after renaming ncclEp to goepEp, NCCL_EP_ to GOEP_EP_ and nccl_ep.h
 * to goep_ep.h, and including this header where it included nccl.h.
 *
 * Its communicator is an MPI one (ncclComm_t is MPI_Comm): the program's communicator set-up
 * (ncclGetUniqueId, ncclCommInitRank) is the part of it that changes. Everything here is a macro or a
 * typedef of goep's types, so that ncclBfloat16 is a goepEpDataType_t and ncclSuccess a goepEpResult_t
 * (which C++ needs where a tensor's datatype or a call's result is assigned).
 *
 * It stands for nccl.h: a program includes one or the other, never both.
 */
#ifndef GOEP_NCCL_H
#define GOEP_NCCL_H

#ifdef NCCL_H_
#error "goep_nccl.h stands for NCCL's nccl.h, which is included already: include one or the other"
#endif

#include "goep_ep.h"

/* Result codes: nccl.h's values, which goep's share. */
typedef goepEpResult_t ncclResult_t;
#define ncclSuccess goepEpSuccess
#define ncclUnhandledCudaError ((goepEpResult_t)1) /* never returned: goep makes no CUDA calls */
#define ncclSystemError goepEpSystemError
#define ncclInternalError goepEpInternalError
#define ncclInvalidArgument goepEpInvalidArgument
#define ncclInvalidUsage goepEpInvalidUsage
#define ncclRemoteError goepEpRemoteError
#define ncclInProgress ((goepEpResult_t)7) /* never returned: every call has finished when it returns */
#define ncclNumResults 8

/* Data types: nccl.h's numbers, with its aliases. */
typedef goepEpDataType_t ncclDataType_t;
#define ncclInt8 goepEpInt8
#define ncclChar goepEpInt8
#define ncclUint8 goepEpUint8
#define ncclInt32 goepEpInt32
#define ncclInt goepEpInt32
#define ncclUint32 goepEpUint32
#define ncclInt64 goepEpInt64
#define ncclUint64 goepEpUint64
#define ncclFloat16 goepEpFloat16
#define ncclHalf goepEpFloat16
#define ncclFloat32 goepEpFloat32
#define ncclFloat goepEpFloat32
#define ncclFloat64 goepEpFloat64
#define ncclDouble goepEpFloat64
#define ncclBfloat16 goepEpBfloat16
#define ncclFloat8e4m3 goepEpFloat8e4m3
#define ncclFloat8e5m2 goepEpFloat8e5m2
#define ncclFloat4x2 goepEpFloat4x2

/* The communicator: an MPI one. Windows: goep has none (only NULL is accepted). */
typedef MPI_Comm ncclComm_t;
typedef goepEpWindow_t ncclWindow_t;

/* goep's result codes are nccl.h's where they share a value; goep's own (64 and above) have names too. */
#define ncclGetErrorString goepEpGetErrorString
#define ncclGetLastError(comm_) ((void)(comm_), goepEpGetLastError())

#endif /* GOEP_NCCL_H */
