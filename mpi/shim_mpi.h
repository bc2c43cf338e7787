// Small C helpers of package mpi, built with the mpi tag only.
//
// Every collective here is issued as a non-blocking MPI call and completed by
// goep_wait, which polls MPI_Test, yields the core between polls (a machine
// may run more ranks than it has cores), backs off to short sleeps after a
// while, and gives up with GOEP_ERR_TIMEOUT after timeout_ns (0: no limit).
// With timeout_ns == 0 the blocking MPI call is used instead, as a plain MPI
// program would.
#ifndef GOEP_SHIM_MPI_H
#define GOEP_SHIM_MPI_H
#include <mpi.h>
#include <stdint.h>

#define GOEP_ERR_TIMEOUT (-1)

enum goep_dtype { GOEP_I8, GOEP_U8, GOEP_I16, GOEP_U16, GOEP_I32, GOEP_U32, GOEP_I64, GOEP_U64, GOEP_F32, GOEP_F64 };
enum goep_op { GOEP_SUM = 1, GOEP_MAX, GOEP_MIN };

int goep_wait(MPI_Request *req, int64_t timeout_ns);
int goep_barrier(MPI_Comm comm, int64_t timeout_ns);
int goep_bcast(void *buf, int n, int root, MPI_Comm comm, int64_t timeout_ns);
int goep_allgather(const void *send, int n, void *recv, MPI_Comm comm, int64_t timeout_ns);
int goep_alltoall(const void *send, int n, void *recv, MPI_Comm comm, int64_t timeout_ns);
int goep_alltoallv(const void *send, const int *scounts, const int *sdispls,
                   void *recv, const int *rcounts, const int *rdispls, MPI_Comm comm, int64_t timeout_ns);
int goep_allreduce(const void *send, void *recv, int n, int dtype, int op, MPI_Comm comm, int64_t timeout_ns);
int goep_error_string(int code, char *buf, int cap);
int goep_arrive(MPI_Comm comm, int tag, int64_t timeout_ns, int *missing);

// One-sided helpers on a window in a lock_all epoch.
//
// goep_block is the layout of package mpi's Block on a 64-bit machine (four
// Go ints, in its field order), so that Go passes its slice as it is.
typedef struct {
  int64_t src_off;  // offset in the origin buffer
  int64_t len;      // bytes
  int64_t target;   // target rank
  int64_t dst_off;  // offset in the target's window (displacement unit 1)
} goep_block;

// goep_put_blocks puts every block from origin and then flushes the targets
// it wrote, so the origin buffer may be reused (and no pointer to it kept)
// when it returns. It returns 0, or on an error the MPI code plus, in bits 32
// and up, 1 + the index of the block that failed (0: the final flush).
int64_t goep_put_blocks(MPI_Win win, const void *origin, const goep_block *blocks, int n);
#endif
