//go:build mpi

// The mailbox: writes into another rank's memory carried by messages
// instead of one-sided puts, so that they complete through ordinary
// point-to-point progress (any MPI call on either side) rather than needing
// the target to drive a one-sided component.
//
// A put sends one message per target rank (tag `tag`) holding records
// (int64 dst_off, int64 len, then len bytes padded to 8). A record whose
// len is negative names a "direct" block of -len bytes that carries no bytes
// in the message: they follow as a message of their own (tag `tag`+1),
// sent straight from the origin (goep_mbox_put with direct set: the origin
// stays as it is until those sends complete) and received straight into the
// receiver's memory, with no copy at either end. Blocks of at least
// GOEP_MBOX_DIRECT_MIN bytes travel so when the caller allows it.
//
// The receiver keeps every message that has arrived in flight at once:
// each is matched (MPI_Improbe) and received (MPI_Imrecv) as soon as
// progress sees it, from every source together, so that large messages
// from several peers move at the same time instead of one after another;
// completions are collected with MPI_Testsome. Writes are applied in the
// order each source sent them (MPI's non-overtaking rule, kept by a queue
// per source): a message's records in order, a direct block once its bytes
// are in, and a source's next message only after its previous one. The
// direct blocks' receives are posted as soon as the message that names them
// is in (in order, so that they match the sender's sends one to one),
// before earlier records are applied.

#define _GNU_SOURCE
#include "shim_mpi.h"
#include <limits.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

// A message matched from a source: its buffer (from the pool, takebuf, and
// back to it once applied), whether its bytes are in.
typedef struct {
  char *buf;
  int64_t len, cap;
  int done;
} rmsg;

// Per source: the queue of matched messages and the queue of posted direct
// receives, each a ring indexed by an absolute count modulo its capacity
// (so that an entry keeps its index while the ring grows), and how far
// application has come in the head message.
typedef struct {
  rmsg *msg;
  int64_t mhead, mcount, mcap;
  int64_t mposted;  // messages (from the head) whose direct receives are posted
  char *bigdone;    // per posted direct receive: its bytes are in
  int64_t bhead, bcount, bcap;
  int64_t cursor;  // bytes of the head message applied
} rsource;

// What an active receive is for: a message (kind 0) or a direct block
// (kind 1) of source src, at absolute index idx of its ring.
typedef struct {
  int kind, src;
  int64_t idx;
} aref;

// A send in flight: its packing buffer (NULL for a direct send), and for a
// direct send, the put it belongs to and its target.
typedef struct {
  char *buf;
  int64_t cap;
  uint64_t put;
  int target;
} sslot;

struct goep_mbox {
  MPI_Comm comm;
  int tag, ranks;
  char *mem;
  int64_t bytes;
  char *ext;  // attached memory (the caller's), at offsets [bytes, bytes+extbytes)
  int64_t extbytes;
  int64_t *load;  // per target: bytes packed by the put in progress
  int64_t *ndirect;  // per target: direct blocks of the put in progress
  // sends in flight
  int nsend, capsend;
  uint64_t puts;  // puts with direct set so far
  MPI_Request *sreq;
  sslot *sslots;
  int *sidx;  // Testsome's output
  // packing buffers not in use
  char **freebuf;
  int64_t *freecap;
  int nfree, capfree;
  // receives
  rsource *src;
  int nact, capact;
  MPI_Request *areq;
  aref *aref;
  int *aidx;
  int bad;          // the source of the last message that wrote out of range
  int64_t applied;  // messages applied so far
  int64_t rmsgs;    // messages matched and not yet applied
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
      m->mem = NULL;
      free(m);
      return NULL;
    }
  }
  m->load = calloc((size_t)m->ranks, sizeof *m->load);
  m->ndirect = calloc((size_t)m->ranks, sizeof *m->ndirect);
  m->src = calloc((size_t)m->ranks, sizeof *m->src);
  m->capfree = 4 * m->ranks + 16;  // the buffers of the sends and the receives in flight
  m->freebuf = calloc((size_t)m->capfree, sizeof *m->freebuf);
  m->freecap = calloc((size_t)m->capfree, sizeof *m->freecap);
  if (m->load == NULL || m->ndirect == NULL || m->src == NULL || m->freebuf == NULL || m->freecap == NULL) {
    goep_mbox_free(m, 0);
    return NULL;
  }
  return m;
}

char *goep_mbox_mem(goep_mbox *m) { return m->mem; }

void goep_mbox_attach(goep_mbox *m, char *mem, int64_t bytes) {
  m->ext = mem;
  m->extbytes = bytes;
}

int goep_mbox_pending(goep_mbox *m) { return m->nsend + (int)m->rmsgs; }

uint64_t goep_mbox_puts(goep_mbox *m) { return m->puts; }

int goep_mbox_direct_pending(goep_mbox *m, uint64_t put) {
  for (int i = 0; i < m->nsend; i++)
    if (m->sslots[i].buf == NULL && m->sslots[i].put <= put) return m->sslots[i].target;
  return -1;
}

int goep_mbox_bad(goep_mbox *m) { return m->bad; }

int64_t goep_mbox_applied(goep_mbox *m) { return m->applied; }

// bufcap is the capacity of a new buffer for need bytes: the next power of
// two, so that messages whose sizes vary from call to call (the routing
// changes) find a buffer that fits among the ones they used before.
static int64_t bufcap(int64_t need) {
  int64_t c = 256;
  while (c < need) c *= 2;
  return c;
}

// takebuf gives a buffer of at least need bytes, for a message to pack or
// to receive: the smallest free one that is large enough, else a new one in
// place of the largest free one (freed: its contents need no copy), else a
// new one. In a steady state of calls of similar sizes no call allocates,
// so none touches memory it has not touched before: a large allocation
// comes from the kernel afresh each time, and a page's first touch can cost
// far more than copying it (on the VM of docs/bench.md, 12-65 ms to touch
// 4 MB afresh, 0.1-0.3 ms to copy 4 MB already touched: a message received
// into a new buffer took 3-5 times as long as one received into an old one).
static char *takebuf(goep_mbox *m, int64_t need, int64_t *cap) {
  int best = -1, largest = -1;
  for (int i = 0; i < m->nfree; i++) {
    if (m->freecap[i] >= need && (best < 0 || m->freecap[i] < m->freecap[best])) best = i;
    if (largest < 0 || m->freecap[i] > m->freecap[largest]) largest = i;
  }
  if (best < 0 && largest >= 0) {
    free(m->freebuf[largest]);
    m->freebuf[largest] = NULL;
    m->freecap[largest] = 0;
    best = largest;
  }
  char *b = NULL;
  if (best >= 0) {
    b = m->freebuf[best];
    *cap = m->freecap[best];
    m->nfree--;
    m->freebuf[best] = m->freebuf[m->nfree];
    m->freecap[best] = m->freecap[m->nfree];
  }
  if (b == NULL) {
    *cap = bufcap(need);
    b = malloc((size_t)*cap);
  }
  return b;
}

// givebuf keeps a buffer for reuse (when the free list is full, it
// is freed).
static void givebuf(goep_mbox *m, char *b, int64_t cap) {
  if (m->nfree == m->capfree) {
    free(b);
    return;
  }
  m->freebuf[m->nfree] = b;
  m->freecap[m->nfree] = cap;
  m->nfree++;
}

// retire collects the sends that completed.
static int retire(goep_mbox *m) {
  if (m->nsend == 0) return MPI_SUCCESS;
  int outcount = 0;
  int rc = MPI_Testsome(m->nsend, m->sreq, &outcount, m->sidx, MPI_STATUSES_IGNORE);
  if (rc != MPI_SUCCESS) return rc;
  if (outcount == MPI_UNDEFINED || outcount == 0) return MPI_SUCCESS;
  for (int k = 0; k < outcount; k++) {
    sslot *s = &m->sslots[m->sidx[k]];
    if (s->buf != NULL) givebuf(m, s->buf, s->cap);
    s->buf = (char *)-1;  // done: compacted below
  }
  int j = 0;
  for (int i = 0; i < m->nsend; i++) {
    if (m->sslots[i].buf == (char *)-1) continue;
    m->sreq[j] = m->sreq[i];
    m->sslots[j] = m->sslots[i];
    j++;
  }
  m->nsend = j;
  return MPI_SUCCESS;
}

// addsend makes room for one more send.
static int addsend(goep_mbox *m) {
  if (m->nsend < m->capsend) return 0;
  int cap = m->capsend > 0 ? 2 * m->capsend : 16;
  MPI_Request *r = realloc(m->sreq, (size_t)cap * sizeof *r);
  if (r == NULL) return -1;
  m->sreq = r;
  sslot *s = realloc(m->sslots, (size_t)cap * sizeof *s);
  if (s == NULL) return -1;
  m->sslots = s;
  int *x = realloc(m->sidx, (size_t)cap * sizeof *x);
  if (x == NULL) return -1;
  m->sidx = x;
  m->capsend = cap;
  return 0;
}

// isdirect says whether a block of n bytes goes as direct sends.
static int isdirect(int direct, int64_t n) { return direct && n >= GOEP_MBOX_DIRECT_MIN; }

// chunk is the length of the direct send at offset o of a block of n bytes.
static int64_t chunk(int64_t n, int64_t o) {
  return n - o < GOEP_MBOX_DIRECT_CHUNK ? n - o : GOEP_MBOX_DIRECT_CHUNK;
}

int64_t goep_mbox_put(goep_mbox *m, const void *origin, const goep_block *blocks, int n, int direct) {
  int rc = retire(m);
  if (rc != MPI_SUCCESS) return rc;
  if (direct) m->puts++;
  memset(m->load, 0, (size_t)m->ranks * sizeof *m->load);
  memset(m->ndirect, 0, (size_t)m->ranks * sizeof *m->ndirect);
  for (int i = 0; i < n; i++) {
    const goep_block *b = &blocks[i];
    if (b->len <= 0) continue;
    if (isdirect(direct, b->len)) {
      m->load[b->target] += 16 * ((b->len + GOEP_MBOX_DIRECT_CHUNK - 1) / GOEP_MBOX_DIRECT_CHUNK);
      m->ndirect[b->target]++;
    } else {
      m->load[b->target] += 16 + pad8(b->len);
    }
  }
  for (int t = 0; t < m->ranks; t++)
    if (m->load[t] / 8 > INT_MAX) return MPI_ERR_COUNT;
  for (int t = 0; t < m->ranks; t++) {
    if (m->load[t] == 0) continue;
    int64_t cap = 0;
    char *buf = takebuf(m, m->load[t], &cap);
    if (buf == NULL || addsend(m) != 0) {
      free(buf);
      return MPI_ERR_NO_MEM;
    }
    char *p = buf;
    for (int i = 0; i < n; i++) {
      const goep_block *b = &blocks[i];
      if (b->target != t || b->len <= 0) continue;
      if (isdirect(direct, b->len)) {
        for (int64_t o = 0; o < b->len; o += GOEP_MBOX_DIRECT_CHUNK) {
          ((int64_t *)p)[0] = b->dst_off + o;
          ((int64_t *)p)[1] = -chunk(b->len, o);
          p += 16;
        }
        continue;
      }
      ((int64_t *)p)[0] = b->dst_off;
      ((int64_t *)p)[1] = b->len;
      memcpy(p + 16, (const char *)origin + b->src_off, (size_t)b->len);
      p += 16 + pad8(b->len);
    }
    rc = MPI_Isend(buf, (int)(m->load[t] / 8), MPI_UINT64_T, t, m->tag, m->comm, &m->sreq[m->nsend]);
    if (rc != MPI_SUCCESS) {
      givebuf(m, buf, cap);
      return (int64_t)rc | ((int64_t)(t + 1) << 32);
    }
    m->sslots[m->nsend++] = (sslot){buf, cap, 0, t};
    if (m->ndirect[t] == 0) continue;
    // The direct blocks' bytes, in the order of their records.
    for (int i = 0; i < n; i++) {
      const goep_block *b = &blocks[i];
      if (b->target != t || !isdirect(direct, b->len)) continue;
      for (int64_t o = 0; o < b->len; o += GOEP_MBOX_DIRECT_CHUNK) {
        if (addsend(m) != 0) return MPI_ERR_NO_MEM;
        rc = MPI_Isend((const char *)origin + b->src_off + o, (int)chunk(b->len, o), MPI_BYTE, t, m->tag + 1, m->comm,
                       &m->sreq[m->nsend]);
        if (rc != MPI_SUCCESS) return (int64_t)rc | ((int64_t)(t + 1) << 32);
        m->sslots[m->nsend++] = (sslot){NULL, 0, m->puts, t};
      }
    }
  }
  return 0;
}

// addactive makes room for one more active receive and returns where its
// request goes.
static MPI_Request *addactive(goep_mbox *m, int kind, int src, int64_t idx) {
  if (m->nact == m->capact) {
    int cap = m->capact > 0 ? 2 * m->capact : 16;
    MPI_Request *r = realloc(m->areq, (size_t)cap * sizeof *r);
    if (r == NULL) return NULL;
    m->areq = r;
    aref *a = realloc(m->aref, (size_t)cap * sizeof *a);
    if (a == NULL) return NULL;
    m->aref = a;
    int *x = realloc(m->aidx, (size_t)cap * sizeof *x);
    if (x == NULL) return NULL;
    m->aidx = x;
    m->capact = cap;
  }
  m->aref[m->nact] = (aref){kind, src, idx};
  return &m->areq[m->nact++];
}

// where is the memory at offset off of length n (in the mailbox's own
// memory or in the attached one), NULL when out of range.
static char *where(goep_mbox *m, int64_t off, int64_t n) {
  if (off < 0 || n < 0) return NULL;
  if (n <= m->bytes && off <= m->bytes - n) return m->mem + off;
  off -= m->bytes;
  if (m->ext != NULL && off >= 0 && n <= m->extbytes && off <= m->extbytes - n) return m->ext + off;
  return NULL;
}

// msgat is the message at absolute index i of source q's ring.
static rmsg *msgat(rsource *q, int64_t i) { return &q->msg[i % q->mcap]; }

// growmsgs makes room for one more message in q's ring, keeping every
// entry (and the buffers of free ones) at its absolute index.
static int growmsgs(rsource *q) {
  if (q->mcount < q->mcap) return 0;
  int64_t old = q->mcap, cap = old > 0 ? 2 * old : 4;
  rmsg *r = calloc((size_t)cap, sizeof *r);
  if (r == NULL) return -1;
  for (int64_t i = q->mhead; i < q->mhead + old; i++) r[i % cap] = q->msg[i % old];
  free(q->msg);
  q->msg = r;
  q->mcap = cap;
  return 0;
}

// growbigs makes room for need direct receives in q's ring, keeping every
// entry at its absolute index.
static int growbigs(rsource *q, int64_t need) {
  if (need <= q->bcap) return 0;
  int64_t cap = q->bcap > 0 ? q->bcap : 16;
  while (cap < need) cap *= 2;
  char *r = calloc((size_t)cap, 1);
  if (r == NULL) return -1;
  for (int64_t i = q->bhead; i < q->bhead + q->bcount; i++) r[i % cap] = q->bigdone[i % q->bcap];
  free(q->bigdone);
  q->bigdone = r;
  q->bcap = cap;
  return 0;
}

// postbigs posts, in order, the direct receives named by the messages of
// source s that are in and whose direct receives are not posted yet.
static int postbigs(goep_mbox *m, int s) {
  rsource *q = &m->src[s];
  for (; q->mposted < q->mcount; q->mposted++) {
    rmsg *g = msgat(q, q->mhead + q->mposted);
    if (!g->done) return MPI_SUCCESS;
    if (growbigs(q, q->bcount + g->len / 16) != 0) return MPI_ERR_NO_MEM;
    const char *p = g->buf, *end = g->buf + g->len;
    while (end - p >= 16) {
      int64_t off = ((const int64_t *)p)[0], n = ((const int64_t *)p)[1];
      p += 16;
      if (n >= 0) {
        if (n > end - p) break;  // reported when applied
        p += pad8(n);
        continue;
      }
      char *dst = where(m, off, -n);
      if (dst == NULL || -n > INT_MAX) {
        m->bad = s;
        return GOEP_ERR_RANGE;
      }
      int64_t i = q->bhead + q->bcount;
      q->bigdone[i % q->bcap] = 0;
      MPI_Request *r = addactive(m, 1, s, i);
      if (r == NULL) return MPI_ERR_NO_MEM;
      int rc = MPI_Irecv(dst, (int)-n, MPI_BYTE, s, m->tag + 1, m->comm, r);
      if (rc != MPI_SUCCESS) return rc;
      q->bcount++;
    }
  }
  return MPI_SUCCESS;
}

// applysource applies, in order, what source s sent that is in.
static int applysource(goep_mbox *m, int s) {
  rsource *q = &m->src[s];
  while (q->mposted > 0) {
    rmsg *g = msgat(q, q->mhead);
    const char *end = g->buf + g->len;
    while (g->buf + q->cursor < end) {
      const char *p = g->buf + q->cursor;
      if (end - p < 16) goto range;
      int64_t off = ((const int64_t *)p)[0], n = ((const int64_t *)p)[1];
      if (n < 0) {  // a direct block: done once its bytes are in
        if (q->bcount == 0) goto range;
        if (!q->bigdone[q->bhead % q->bcap]) return MPI_SUCCESS;
        q->bhead++;
        q->bcount--;
        q->cursor += 16;
        continue;
      }
      if (n > end - p - 16) goto range;
      char *dst = where(m, off, n);
      if (dst == NULL) goto range;
      memcpy(dst, p + 16, (size_t)n);
      q->cursor += 16 + pad8(n);
    }
    q->cursor = 0;
    givebuf(m, g->buf, g->cap);  // for the next message, from any source
    g->buf = NULL;
    g->cap = 0;
    q->mhead++;
    q->mcount--;
    q->mposted--;
    m->rmsgs--;
    m->applied++;
  }
  return MPI_SUCCESS;
range:
  m->bad = s;
  return GOEP_ERR_RANGE;
}

// collect marks the active receives that completed.
static int collect(goep_mbox *m) {
  if (m->nact == 0) return MPI_SUCCESS;
  int outcount = 0;
  int rc = MPI_Testsome(m->nact, m->areq, &outcount, m->aidx, MPI_STATUSES_IGNORE);
  if (rc != MPI_SUCCESS) return rc;
  if (outcount == MPI_UNDEFINED || outcount == 0) return MPI_SUCCESS;
  for (int k = 0; k < outcount; k++) {
    aref *a = &m->aref[m->aidx[k]];
    rsource *q = &m->src[a->src];
    if (a->kind == 0) msgat(q, a->idx)->done = 1;
    else q->bigdone[a->idx % q->bcap] = 1;
    a->kind = -1;
  }
  int j = 0;
  for (int i = 0; i < m->nact; i++) {
    if (m->aref[i].kind < 0) continue;
    m->areq[j] = m->areq[i];
    m->aref[j] = m->aref[i];
    j++;
  }
  m->nact = j;
  return MPI_SUCCESS;
}

int goep_mbox_progress(goep_mbox *m) {
  int rc = retire(m);
  if (rc != MPI_SUCCESS) return rc;
  // Match and start receiving every message that has arrived, from every
  // source at once.
  for (;;) {
    int flag = 0, count = 0;
    MPI_Message msg;
    MPI_Status st;
    rc = MPI_Improbe(MPI_ANY_SOURCE, m->tag, m->comm, &flag, &msg, &st);
    if (rc != MPI_SUCCESS) return rc;
    if (!flag) break;
    rc = MPI_Get_count(&st, MPI_UINT64_T, &count);
    if (rc != MPI_SUCCESS) return rc;
    int s = st.MPI_SOURCE;
    rsource *q = &m->src[s];
    if (growmsgs(q) != 0) return MPI_ERR_NO_MEM;
    int64_t i = q->mhead + q->mcount;
    rmsg *g = msgat(q, i);
    int64_t need = (int64_t)count * 8;
    g->buf = takebuf(m, need, &g->cap);
    if (g->buf == NULL) return MPI_ERR_NO_MEM;
    g->len = need;
    g->done = 0;
    q->mcount++;
    m->rmsgs++;
    MPI_Request *r = addactive(m, 0, s, i);
    if (r == NULL) return MPI_ERR_NO_MEM;
    rc = MPI_Imrecv(g->buf, count, MPI_UINT64_T, &msg, r);
    if (rc != MPI_SUCCESS) return rc;
  }
  rc = collect(m);
  if (rc != MPI_SUCCESS) return rc;
  // Post the direct receives the messages in name, and apply in order.
  for (int s = 0; s < m->ranks; s++) {
    if (m->src[s].mcount == 0) continue;
    rc = postbigs(m, s);
    if (rc != MPI_SUCCESS) return rc;
    rc = applysource(m, s);
    if (rc != MPI_SUCCESS) return rc;
  }
  return MPI_SUCCESS;
}

int goep_mbox_free(goep_mbox *m, int64_t timeout_ns) {
  int64_t start = mbox_now_ns();
  while (m->src != NULL && (m->nsend > 0 || m->nact > 0)) {
    if (goep_mbox_progress(m) != MPI_SUCCESS) break;
    if (m->nsend == 0 && m->nact == 0) break;
    if (mbox_now_ns() - start > timeout_ns) break;
    sched_yield();
  }
  int left = m->nsend + m->nact;
  // What did not complete is left to MPI with its memory, which MPI may
  // still read or write: those buffers, and the mailbox's memory if a
  // receive is left, are not freed.
  for (int i = 0; i < m->nsend; i++) {
    MPI_Request_free(&m->sreq[i]);
    m->sslots[i].buf = NULL;
  }
  for (int i = 0; i < m->nact; i++) {
    if (m->aref[i].kind == 0) msgat(&m->src[m->aref[i].src], m->aref[i].idx)->buf = NULL;
    MPI_Request_free(&m->areq[i]);
  }
  if (m->src != NULL) {
    for (int s = 0; s < m->ranks; s++) {
      for (int64_t i = 0; i < m->src[s].mcap; i++) free(m->src[s].msg[i].buf);
      free(m->src[s].msg);
      free(m->src[s].bigdone);
    }
  }
  for (int i = 0; i < m->nfree; i++) free(m->freebuf[i]);
  if (m->nact == 0 && m->mem != NULL) munmap(m->mem, (size_t)m->bytes);
  free(m->sreq);
  free(m->sslots);
  free(m->sidx);
  free(m->freebuf);
  free(m->freecap);
  free(m->areq);
  free(m->aref);
  free(m->aidx);
  free(m->src);
  free(m->load);
  free(m->ndirect);
  free(m);
  return left;
}
