//go:build mpi

#include "shim_mpi.h"
#include <sched.h>
#include <string.h>
#include <time.h>

static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

int goep_wait(MPI_Request *req, int64_t timeout_ns) {
  int64_t start = now_ns();
  for (unsigned long i = 0;; i++) {
    int done = 0;
    int rc = MPI_Test(req, &done, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) return rc;
    if (done) return MPI_SUCCESS;
    if ((i & 63) == 0) {
      int64_t waited = now_ns() - start;
      if (timeout_ns > 0 && waited > timeout_ns) return GOEP_ERR_TIMEOUT;
      if (waited > 2000000) {  // after 2 ms, poll every 50 us instead of spinning
        struct timespec ts = {0, 50000};
        nanosleep(&ts, NULL);
        continue;
      }
    }
    sched_yield();
  }
}

int goep_barrier(MPI_Comm comm, int64_t timeout_ns) {
  if (timeout_ns == 0) return MPI_Barrier(comm);
  MPI_Request r;
  int rc = MPI_Ibarrier(comm, &r);
  return rc != MPI_SUCCESS ? rc : goep_wait(&r, timeout_ns);
}

int goep_bcast(void *buf, int n, int root, MPI_Comm comm, int64_t timeout_ns) {
  if (timeout_ns == 0) return MPI_Bcast(buf, n, MPI_BYTE, root, comm);
  MPI_Request r;
  int rc = MPI_Ibcast(buf, n, MPI_BYTE, root, comm, &r);
  return rc != MPI_SUCCESS ? rc : goep_wait(&r, timeout_ns);
}

int goep_allgather(const void *send, int n, void *recv, MPI_Comm comm, int64_t timeout_ns) {
  if (timeout_ns == 0) return MPI_Allgather(send, n, MPI_BYTE, recv, n, MPI_BYTE, comm);
  MPI_Request r;
  int rc = MPI_Iallgather(send, n, MPI_BYTE, recv, n, MPI_BYTE, comm, &r);
  return rc != MPI_SUCCESS ? rc : goep_wait(&r, timeout_ns);
}

int goep_alltoall(const void *send, int n, void *recv, MPI_Comm comm, int64_t timeout_ns) {
  if (timeout_ns == 0) return MPI_Alltoall(send, n, MPI_BYTE, recv, n, MPI_BYTE, comm);
  MPI_Request r;
  int rc = MPI_Ialltoall(send, n, MPI_BYTE, recv, n, MPI_BYTE, comm, &r);
  return rc != MPI_SUCCESS ? rc : goep_wait(&r, timeout_ns);
}

int goep_alltoallv(const void *send, const int *scounts, const int *sdispls,
                   void *recv, const int *rcounts, const int *rdispls, MPI_Comm comm, int64_t timeout_ns) {
  if (timeout_ns == 0)
    return MPI_Alltoallv(send, scounts, sdispls, MPI_BYTE, recv, rcounts, rdispls, MPI_BYTE, comm);
  MPI_Request r;
  int rc = MPI_Ialltoallv(send, scounts, sdispls, MPI_BYTE, recv, rcounts, rdispls, MPI_BYTE, comm, &r);
  return rc != MPI_SUCCESS ? rc : goep_wait(&r, timeout_ns);
}

static MPI_Datatype dtype_of(int code) {
  switch (code) {
    case GOEP_I8: return MPI_INT8_T;
    case GOEP_U8: return MPI_UINT8_T;
    case GOEP_I16: return MPI_INT16_T;
    case GOEP_U16: return MPI_UINT16_T;
    case GOEP_I32: return MPI_INT32_T;
    case GOEP_U32: return MPI_UINT32_T;
    case GOEP_I64: return MPI_INT64_T;
    case GOEP_U64: return MPI_UINT64_T;
    case GOEP_F32: return MPI_FLOAT;
    default: return MPI_DOUBLE;
  }
}

static MPI_Op op_of(int code) {
  switch (code) {
    case GOEP_MAX: return MPI_MAX;
    case GOEP_MIN: return MPI_MIN;
    default: return MPI_SUM;
  }
}

int goep_allreduce(const void *send, void *recv, int n, int dtype, int op, MPI_Comm comm, int64_t timeout_ns) {
  if (timeout_ns == 0) return MPI_Allreduce(send, recv, n, dtype_of(dtype), op_of(op), comm);
  MPI_Request r;
  int rc = MPI_Iallreduce(send, recv, n, dtype_of(dtype), op_of(op), comm, &r);
  return rc != MPI_SUCCESS ? rc : goep_wait(&r, timeout_ns);
}

int goep_error_string(int code, char *buf, int cap) {
  char s[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, s, &len) != MPI_SUCCESS) len = 0;
  if (len >= cap) len = cap - 1;
  memcpy(buf, s, len);
  buf[len] = 0;
  return len;
}

int64_t goep_put_blocks(MPI_Win win, const void *origin, const goep_block *blocks, int n) {
  int rc;
  for (int i = 0; i < n; i++) {
    const goep_block *b = &blocks[i];
    const char *src = (const char *)origin + b->src_off;
    int64_t left = b->len, done = 0;
    while (left > 0) {  // MPI counts are int: split very large blocks
      int chunk = left > (1 << 30) ? (1 << 30) : (int)left;
      rc = MPI_Put(src + done, chunk, MPI_BYTE, (int)b->target, (MPI_Aint)(b->dst_off + done), chunk, MPI_BYTE, win);
      if (rc != MPI_SUCCESS) return (int64_t)rc | ((int64_t)(i + 1) << 32);
      left -= chunk;
      done += chunk;
    }
  }
  // Complete every put before returning: the origin may be Go memory, which C
  // must not keep past this call.
  return MPI_Win_flush_all(win);
}

int64_t goep_p2p_start(MPI_Comm comm, int n, const int *recv, const int *peer, const uint64_t *addr, const int *bytes,
                       int tag, MPI_Request *reqs) {
  for (int i = 0; i < n; i++) reqs[i] = MPI_REQUEST_NULL;
  for (int i = 0; i < n; i++) {
    void *p = (void *)(uintptr_t)addr[i];
    int rc = recv[i] ? MPI_Irecv(p, bytes[i], MPI_BYTE, peer[i], tag, comm, &reqs[i])
                     : MPI_Isend(p, bytes[i], MPI_BYTE, peer[i], tag, comm, &reqs[i]);
    if (rc != MPI_SUCCESS) return (int64_t)rc | ((int64_t)(i + 1) << 32);
  }
  return 0;
}

int goep_p2p_test(int n, MPI_Request *reqs, const int *recv, int *done, int64_t *got) {
  for (int i = 0; i < n; i++) {
    if (done[i]) continue;
    MPI_Status st;
    int flag = 0;
    int rc = MPI_Test(&reqs[i], &flag, &st);
    if (rc != MPI_SUCCESS) return rc;
    if (!flag) continue;
    done[i] = 1;
    if (recv[i]) {
      MPI_Count c = 0;
      rc = MPI_Get_elements_x(&st, MPI_BYTE, &c);
      if (rc != MPI_SUCCESS) return rc;
      got[i] = (int64_t)c;
    }
  }
  return MPI_SUCCESS;
}

int goep_p2p_cancel(int n, MPI_Request *reqs, const int *recv, const int *done) {
  int left = 0;
  for (int i = 0; i < n; i++) {
    if (done[i] || reqs[i] == MPI_REQUEST_NULL) continue;
    if (recv[i]) {
      MPI_Cancel(&reqs[i]);
      MPI_Wait(&reqs[i], MPI_STATUS_IGNORE);
    } else {
      MPI_Request_free(&reqs[i]);
      left++;
    }
  }
  return left;
}
