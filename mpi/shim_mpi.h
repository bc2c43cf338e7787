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
// goep_iprobe_any lets MPI make progress (MPI_Iprobe for any message).
int goep_iprobe_any(MPI_Comm comm);
int goep_arrive(MPI_Comm comm, int tag, int64_t timeout_ns, int *missing);

// Adopting a communicator that the caller owns (adopt_mpi.go). goep_comm_of
// turns the handle, as an integer, back into an MPI_Comm. goep_comm_idup
// duplicates comm by MPI_Comm_idup, waited as the collectives are (timeout_ns,
// 0: no limit), and sets MPI_ERRORS_RETURN on the duplicate. goep_mpi_state
// reports MPI_Initialized and MPI_Finalized.
MPI_Comm goep_comm_of(uintptr_t handle);
int goep_comm_idup(MPI_Comm comm, MPI_Comm *dup, int64_t timeout_ns);
void goep_mpi_state(int *initialized, int *finalized);

// Point-to-point messages of an Exchange. goep_p2p_start posts n messages
// (recv[i]: MPI_Irecv, else MPI_Isend) of bytes[i] bytes at addr[i] with
// peer[i], into reqs; it returns 0, or the MPI code plus, in bits 32 and up,
// 1 + the index of the message that failed. goep_p2p_test tests every
// request not yet done, setting done[i] and, for a receive, got[i] to the
// bytes received. goep_p2p_cancel cancels the receives not done (and waits
// for the cancellations) and frees the requests of the sends not done,
// returning how many sends it left to MPI.
int64_t goep_p2p_start(MPI_Comm comm, int n, const int *recv, const int *peer, const uint64_t *addr, const int *bytes,
                       int tag, MPI_Request *reqs);
int goep_p2p_test(int n, MPI_Request *reqs, const int *recv, int *done, int64_t *got);
// goep_is_truncate reports whether rc is of class MPI_ERR_TRUNCATE (a
// message longer than its receive).
int goep_is_truncate(int rc);
int goep_p2p_cancel(int n, MPI_Request *reqs, const int *recv, const int *done);

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
// skip[t] is where rank t's part starts in its MPI window: every
// displacement to t adds it.
int64_t goep_put_blocks(MPI_Win win, const void *origin, const goep_block *blocks, int n, const int64_t *skip);

// Mailbox (mailbox_mpi.c): memory of this rank that other ranks write into
// by message. goep_mbox_put packs the blocks of each target into one
// message (records of dst_off, len and the bytes, padded to 8) and posts it
// with MPI_Isend from a buffer of its own (reused from call to call), so it
// returns at once and keeps no pointer to origin, except for direct blocks
// (below). goep_mbox_progress retires completed sends, receives every
// message that has arrived, from all sources at once, and applies them,
// each whole and in the order each source sent them; a record outside this
// rank's memory stops it with GOEP_ERR_RANGE, and goep_mbox_bad says from
// which rank. goep_mbox_free gives pending sends and receives up to
// timeout_ns to complete while applying what arrives, leaves the rest to
// MPI, and frees everything (not the communicator: the caller's).
#define GOEP_ERR_RANGE (-2)
typedef struct goep_mbox goep_mbox;
goep_mbox *goep_mbox_new(MPI_Comm comm, int64_t size, int tag);
char *goep_mbox_mem(goep_mbox *m);
// goep_mbox_attach makes bytes of the caller's memory at mem writable by the
// other ranks too, at offsets [size, size+bytes) past the mailbox's own.
void goep_mbox_attach(goep_mbox *m, char *mem, int64_t bytes);
// With direct set, blocks of at least GOEP_MBOX_DIRECT_MIN bytes are sent
// straight from origin (in sends of at most GOEP_MBOX_DIRECT_CHUNK bytes) and
// received straight into the target's memory: origin must stay as it is until
// goep_mbox_direct_pending says none of the put's sends is in flight. Puts with
// direct set are numbered from 1 (goep_mbox_puts: the last one's number).
#define GOEP_MBOX_DIRECT_MIN (64 << 10)
#define GOEP_MBOX_DIRECT_CHUNK (1 << 30)
int64_t goep_mbox_put(goep_mbox *m, const void *origin, const goep_block *blocks, int n, int direct);
uint64_t goep_mbox_puts(goep_mbox *m);
// goep_mbox_direct_pending: the target of a direct send of a put numbered put
// or less that is still in flight, or -1 when none is.
int goep_mbox_direct_pending(goep_mbox *m, uint64_t put);
int goep_mbox_progress(goep_mbox *m);
int goep_mbox_bad(goep_mbox *m);
int64_t goep_mbox_applied(goep_mbox *m);  // messages applied so far
int goep_mbox_pending(goep_mbox *m);
int goep_mbox_free(goep_mbox *m, int64_t timeout_ns);

// Open MPI's one-sided components, before and after MPI_Init (onesided_mpi.go).
// goep_is_open_mpi: 1 when mpi.h is Open MPI's.
int goep_is_open_mpi(void);
// goep_libmpi_path writes the path of the loaded MPI library into buf; 0 on success.
int goep_libmpi_path(char *buf, int cap);
// goep_static_component: 1 when component symbol sym is linked in (a build of Open MPI with
// static components).
int goep_static_component(const char *sym);
// goep_can_load: 1 when the shared object at path loads (its libraries are found). It stays
// loaded, as MPI_Init would load it anyway.
int goep_can_load(const char *path);
// goep_mca_string reads the string control variable name through MPI_T; 0 on success. Call it
// after MPI_Init: it asks MPI_T for the thread level MPI provided, which it leaves as it was.
int goep_mca_string(const char *name, char *buf, int cap);
#endif
