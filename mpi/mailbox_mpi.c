//go:build mpi

// The mailbox: writes into another rank's memory carried by messages
// instead of one-sided puts, so that they complete through ordinary
// point-to-point progress (any MPI call on either side) rather than needing
// the target to drive a one-sided component. Each goep_mbox_put sends one
// message per target rank holding records (int64 dst_off, int64 len, len
// bytes padded to 8); the target applies the records of a message in order
// when it calls goep_mbox_progress, and messages of one source in the order
// sent (MPI's non-overtaking rule, kept by receiving one message at a time).

#define _GNU_SOURCE
#include "shim_mpi.h"
#include <limits.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

struct goep_mbox {
  MPI_Comm comm;
  int tag, ranks;
  char *mem;
  int64_t bytes;
  int64_t *load;  // per target: bytes packed by the put in progress
  char **start, **cursor;
  int nsend, capsend;  // sends posted and not yet complete, with their buffers
  MPI_Request *sreq;
  void **sbuf;
  int rbusy, rsrc;  // a message matched and being received
  int bad;          // the source of the last message that wrote out of range
  int64_t applied;  // messages applied so far
  MPI_Request rreq;
  int64_t rlen, rcap;
  char *rbuf;
};

static int64_t mbox_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int64_t pad8(int64_t n) { return (n + 7) & ~(int64_t)7; }

goep_mbox *goep_mbox_new(MPI_Comm comm, int64_t size, int tag) {
  goep_mbox *m = calloc(1, sizeof *m);
  if (m == NULL) return NULL;
  m->comm = comm;
  m->tag = tag;
  MPI_Comm_size(comm, &m->ranks);
  m->bytes = size;
  if (size > 0) {
    m->mem = mmap(NULL, (size_t)size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m->mem == MAP_FAILED) {
      free(m);
      return NULL;
    }
  }
  m->load = calloc((size_t)m->ranks, sizeof *m->load);
  m->start = calloc((size_t)m->ranks, sizeof *m->start);
  m->cursor = calloc((size_t)m->ranks, sizeof *m->cursor);
  if (m->load == NULL || m->start == NULL || m->cursor == NULL) {
    goep_mbox_free(m, 0);
    return NULL;
  }
  return m;
}

char *goep_mbox_mem(goep_mbox *m) { return m->mem; }

int goep_mbox_pending(goep_mbox *m) { return m->nsend + m->rbusy; }

int goep_mbox_bad(goep_mbox *m) { return m->bad; }

int64_t goep_mbox_applied(goep_mbox *m) { return m->applied; }

// retire frees the buffers of the sends that completed.
static int retire(goep_mbox *m) {
  for (int i = 0; i < m->nsend;) {
    int done = 0;
    int rc = MPI_Test(&m->sreq[i], &done, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) return rc;
    if (!done) {
      i++;
      continue;
    }
    free(m->sbuf[i]);
    m->nsend--;
    m->sreq[i] = m->sreq[m->nsend];
    m->sbuf[i] = m->sbuf[m->nsend];
  }
  return MPI_SUCCESS;
}

int64_t goep_mbox_put(goep_mbox *m, const void *origin, const goep_block *blocks, int n) {
  int rc = retire(m);
  if (rc != MPI_SUCCESS) return rc;
  memset(m->load, 0, (size_t)m->ranks * sizeof *m->load);
  int targets = 0;
  for (int i = 0; i < n; i++) {
    if (blocks[i].len <= 0) continue;
    if (m->load[blocks[i].target] == 0) targets++;
    m->load[blocks[i].target] += 16 + pad8(blocks[i].len);
  }
  if (m->nsend + targets > m->capsend) {
    int cap = 2 * (m->nsend + targets);
    MPI_Request *r = realloc(m->sreq, (size_t)cap * sizeof *r);
    if (r == NULL) return MPI_ERR_NO_MEM;
    m->sreq = r;
    void **b = realloc(m->sbuf, (size_t)cap * sizeof *b);
    if (b == NULL) return MPI_ERR_NO_MEM;
    m->sbuf = b;
    m->capsend = cap;
  }
  for (int t = 0; t < m->ranks; t++) {
    m->start[t] = m->cursor[t] = NULL;
    if (m->load[t] == 0) continue;
    if (m->load[t] / 8 > INT_MAX) return MPI_ERR_COUNT;
    m->start[t] = m->cursor[t] = malloc((size_t)m->load[t]);
    if (m->start[t] == NULL) {
      for (int u = 0; u < t; u++) free(m->start[u]);
      return MPI_ERR_NO_MEM;
    }
  }
  for (int i = 0; i < n; i++) {
    const goep_block *b = &blocks[i];
    if (b->len <= 0) continue;
    char *p = m->cursor[b->target];
    ((int64_t *)p)[0] = b->dst_off;
    ((int64_t *)p)[1] = b->len;
    memcpy(p + 16, (const char *)origin + b->src_off, (size_t)b->len);
    m->cursor[b->target] = p + 16 + pad8(b->len);
  }
  int64_t err = 0;
  for (int t = 0; t < m->ranks; t++) {
    if (m->start[t] == NULL) continue;
    if (err != 0) {
      free(m->start[t]);
      continue;
    }
    rc = MPI_Isend(m->start[t], (int)(m->load[t] / 8), MPI_UINT64_T, t, m->tag, m->comm, &m->sreq[m->nsend]);
    if (rc != MPI_SUCCESS) {
      free(m->start[t]);
      err = (int64_t)rc | ((int64_t)(t + 1) << 32);
      continue;
    }
    m->sbuf[m->nsend++] = m->start[t];
  }
  return err;
}

// apply writes the records of a received message into the memory.
static int apply(goep_mbox *m) {
  const char *p = m->rbuf, *end = m->rbuf + m->rlen;
  while (p < end) {
    if (end - p < 16) goto range;
    int64_t off = ((const int64_t *)p)[0], n = ((const int64_t *)p)[1];
    p += 16;
    if (off < 0 || n < 0 || n > m->bytes || off > m->bytes - n || n > end - p) goto range;
    memcpy(m->mem + off, p, (size_t)n);
    p += pad8(n);
  }
  return MPI_SUCCESS;
range:
  m->bad = m->rsrc;
  return GOEP_ERR_RANGE;
}

int goep_mbox_progress(goep_mbox *m) {
  int rc = retire(m);
  if (rc != MPI_SUCCESS) return rc;
  for (;;) {
    if (m->rbusy) {
      int done = 0;
      rc = MPI_Test(&m->rreq, &done, MPI_STATUS_IGNORE);
      if (rc != MPI_SUCCESS) return rc;
      if (!done) return MPI_SUCCESS;
      m->rbusy = 0;
      rc = apply(m);
      if (rc != MPI_SUCCESS) return rc;
      m->applied++;
    }
    int flag = 0, count = 0;
    MPI_Message msg;
    MPI_Status st;
    rc = MPI_Improbe(MPI_ANY_SOURCE, m->tag, m->comm, &flag, &msg, &st);
    if (rc != MPI_SUCCESS) return rc;
    if (!flag) return MPI_SUCCESS;
    rc = MPI_Get_count(&st, MPI_UINT64_T, &count);
    if (rc != MPI_SUCCESS) return rc;
    int64_t need = (int64_t)count * 8;
    if (need > m->rcap) {
      char *b = realloc(m->rbuf, (size_t)need);
      if (b == NULL) return MPI_ERR_NO_MEM;
      m->rbuf = b;
      m->rcap = need;
    }
    rc = MPI_Imrecv(m->rbuf, count, MPI_UINT64_T, &msg, &m->rreq);
    if (rc != MPI_SUCCESS) return rc;
    m->rbusy = 1;
    m->rsrc = st.MPI_SOURCE;
    m->rlen = need;
  }
}

int goep_mbox_free(goep_mbox *m, int64_t timeout_ns) {
  int64_t start = mbox_now_ns();
  while (m->nsend > 0 || m->rbusy) {
    if (goep_mbox_progress(m) != MPI_SUCCESS) break;
    if (m->nsend == 0 && !m->rbusy) break;
    if (mbox_now_ns() - start > timeout_ns) break;
    sched_yield();
  }
  int left = m->nsend + m->rbusy;
  // What did not complete is left to MPI, with its buffer: MPI may still
  // read or write it.
  for (int i = 0; i < m->nsend; i++) MPI_Request_free(&m->sreq[i]);
  if (m->rbusy) MPI_Request_free(&m->rreq);
  else free(m->rbuf);
  if (m->mem != NULL && m->mem != MAP_FAILED) munmap(m->mem, (size_t)m->bytes);
  free(m->sreq);
  free(m->sbuf);
  free(m->load);
  free(m->start);
  free(m->cursor);
  free(m);
  return left;
}
