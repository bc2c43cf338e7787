//go:build mpi

#define _GNU_SOURCE
#include "shim_mpi.h"
#include <dlfcn.h>
#include <sched.h>
#include <stdlib.h>
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

MPI_Comm goep_comm_of(uintptr_t handle) { return (MPI_Comm)handle; }

int goep_comm_idup(MPI_Comm comm, MPI_Comm *dup, int64_t timeout_ns) {
  MPI_Request r;
  int rc = MPI_Comm_idup(comm, dup, &r);
  if (rc == MPI_SUCCESS) rc = goep_wait(&r, timeout_ns);
  if (rc == MPI_SUCCESS) rc = MPI_Comm_set_errhandler(*dup, MPI_ERRORS_RETURN);
  return rc;
}

void goep_mpi_state(int *initialized, int *finalized) {
  MPI_Initialized(initialized);
  MPI_Finalized(finalized);
}

int goep_iprobe_any(MPI_Comm comm) {
  int flag = 0;  // here, not in Go: a Go variable whose address cgo takes escapes to the heap
  return MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, comm, &flag, MPI_STATUS_IGNORE);
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

// goep_arrive: every rank tells rank 0 that it arrived, and rank 0, once
// every rank has or timeout_ns (0: no limit) is past, tells every rank that
// arrived the first rank that did not (*missing; -1: none). A rank whose
// answer does not come in twice the time returns GOEP_ERR_TIMEOUT with
// *missing = 0, its token left pending at rank 0. Point-to-point messages with tag, so that the rank that did
// not arrive can be named, which a collective cannot do.
int goep_arrive(MPI_Comm comm, int tag, int64_t timeout_ns, int *missing) {
  int rank, size, rc = MPI_SUCCESS;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  *missing = -1;
  if (size == 1) return MPI_SUCCESS;
  if (rank != 0) {
    static const char token = 1; // outlives the send, which may be left pending
    int32_t answer = -1;
    MPI_Request send, recv;
    if ((rc = MPI_Isend(&token, 1, MPI_BYTE, 0, tag, comm, &send)) != MPI_SUCCESS) return rc;
    if ((rc = MPI_Irecv(&answer, 1, MPI_INT32_T, 0, tag, comm, &recv)) != MPI_SUCCESS) return rc;
    rc = goep_wait(&recv, timeout_ns > 0 ? 2 * timeout_ns : 0);
    if (rc == GOEP_ERR_TIMEOUT) {
      MPI_Cancel(&recv);
      MPI_Wait(&recv, MPI_STATUS_IGNORE); // a cancelled receive completes at once
      MPI_Request_free(&send);
      *missing = 0;
      return rc;
    }
    MPI_Wait(&send, MPI_STATUS_IGNORE);
    *missing = answer;
    return rc;
  }
  MPI_Request *reqs = malloc(sizeof(MPI_Request) * (size_t)size);
  char *tokens = malloc((size_t)size);
  for (int r = 1; r < size; r++) MPI_Irecv(&tokens[r], 1, MPI_BYTE, r, tag, comm, &reqs[r]);
  int64_t start = now_ns();
  int left = size - 1;
  char *done = calloc((size_t)size, 1);
  for (unsigned long i = 0; left > 0; i++) {
    for (int r = 1; r < size; r++) {
      int flag = 0;
      if (!done[r] && MPI_Test(&reqs[r], &flag, MPI_STATUS_IGNORE) == MPI_SUCCESS && flag) {
        done[r] = 1;
        left--;
      }
    }
    if (left == 0) break;
    if (timeout_ns > 0 && now_ns() - start > timeout_ns) break;
    if ((i & 63) == 0) {
      struct timespec ts = {0, 20000};
      nanosleep(&ts, NULL);
    } else {
      sched_yield();
    }
  }
  int32_t first = -1;
  for (int r = 1; r < size; r++) {
    if (!done[r]) {
      if (first < 0) first = r;
      MPI_Cancel(&reqs[r]);
      MPI_Wait(&reqs[r], MPI_STATUS_IGNORE);
    }
  }
  for (int r = 1; r < size && rc == MPI_SUCCESS; r++)
    if (done[r]) rc = MPI_Send(&first, 1, MPI_INT32_T, r, tag, comm);
  free(reqs);
  free(tokens);
  free(done);
  *missing = first;
  return rc;
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

int64_t goep_put_blocks(MPI_Win win, const void *origin, const goep_block *blocks, int n, const int64_t *skip) {
  int rc;
  for (int i = 0; i < n; i++) {
    const goep_block *b = &blocks[i];
    const char *src = (const char *)origin + b->src_off;
    int64_t left = b->len, done = 0;
    while (left > 0) {  // MPI counts are int: split very large blocks
      int chunk = left > (1 << 30) ? (1 << 30) : (int)left;
      rc = MPI_Put(src + done, chunk, MPI_BYTE, (int)b->target, (MPI_Aint)(skip[b->target] + b->dst_off + done), chunk, MPI_BYTE, win);
      if (rc != MPI_SUCCESS) return (int64_t)rc | ((int64_t)(i + 1) << 32);
      left -= chunk;
      done += chunk;
    }
  }
  // Complete every put before returning: the origin may be Go memory, which C
  // must not keep past this call.
  return MPI_Win_flush_all(win);
}

int goep_is_open_mpi(void) {
#ifdef OPEN_MPI
  return 1;
#else
  return 0;
#endif
}

int goep_libmpi_path(char *buf, int cap) {
  Dl_info info;
  if (dladdr((void *)MPI_Init, &info) == 0 || info.dli_fname == NULL) return -1;
  size_t n = strlen(info.dli_fname);
  if ((int)n >= cap) return -1;
  memcpy(buf, info.dli_fname, n + 1);
  return 0;
}

int goep_static_component(const char *sym) { return dlsym(RTLD_DEFAULT, sym) != NULL; }

int goep_can_load(const char *path) { return dlopen(path, RTLD_LAZY | RTLD_LOCAL | RTLD_NODELETE) != NULL; }

int goep_mca_string(const char *name, char *buf, int cap) {
  int level, provided, idx, count, rc;
  MPI_T_cvar_handle h;
  // Ask MPI_T for the thread level MPI_Init gave: Open MPI 4.1 sets the MPI library's own level
  // to the one MPI_T_init_thread asks for (MPI_THREAD_SINGLE would turn its locks off).
  rc = MPI_Query_thread(&level);
  if (rc != MPI_SUCCESS) return rc;
  rc = MPI_T_init_thread(level, &provided);
  if (rc != MPI_SUCCESS) return rc;
  rc = MPI_T_cvar_get_index(name, &idx);
  if (rc == MPI_SUCCESS) rc = MPI_T_cvar_handle_alloc(idx, NULL, &h, &count);
  if (rc == MPI_SUCCESS) {
    if (count < cap) {
      memset(buf, 0, cap);
      rc = MPI_T_cvar_read(h, buf);
    } else {
      rc = MPI_ERR_TRUNCATE;
    }
    MPI_T_cvar_handle_free(&h);
  }
  MPI_T_finalize();
  buf[cap - 1] = 0;
  return rc;
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

int goep_is_truncate(int rc) {
  int cls = 0;
  return MPI_Error_class(rc, &cls) == MPI_SUCCESS && cls == MPI_ERR_TRUNCATE;
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
