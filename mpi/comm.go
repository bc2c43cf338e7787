package mpi

import (
	"fmt"
	"os"
	"strconv"
	"sync"
	"time"
)

// Comm is a communicator: a group of ranks that run collectives together.
// Its methods are collective unless their doc says otherwise: every rank of
// the communicator must call them, in the same order.
type Comm struct {
	name    string
	rank    int
	size    int
	timeout time.Duration
	h       commHandle // the MPI_Comm, in builds with the mpi tag

	mu     sync.Mutex
	broken error // set after a timeout: the communicator can no longer be used
}

// Rank is this process's rank in the communicator. It is not collective.
func (c *Comm) Rank() int { return c.rank }

// Size is the number of ranks in the communicator. It is not collective.
func (c *Comm) Size() int { return c.size }

// Name is the communicator's name, used in errors. It is not collective.
func (c *Comm) Name() string { return c.name }

// Timeout is how long collectives wait for peers; zero means they block
// inside MPI with no limit.
func (c *Comm) Timeout() time.Duration { return c.timeout }

// SetTimeout sets how long collectives wait for peers (zero: no limit).
// Communicators split from c inherit it. It is not collective, but every rank
// must set the same value: with a timeout the collectives are MPI's
// non-blocking ones, and MPI never matches a blocking collective on one rank
// with a non-blocking one on another.
func (c *Comm) SetTimeout(d time.Duration) { c.timeout = d }

// checkUsable returns the error that broke the communicator, if any.
func (c *Comm) checkUsable(call string) error {
	if c == nil {
		return argErrorf(call, "nil communicator")
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.broken != nil {
		return fmt.Errorf("mpi: %s on communicator %q: unusable after an earlier failure: %w", call, c.name, c.broken)
	}
	if c.h.freed() {
		return argErrorf(call, "communicator %q has been freed", c.name)
	}
	return nil
}

func (c *Comm) markBroken(err error) {
	c.mu.Lock()
	if c.broken == nil {
		c.broken = err
	}
	c.mu.Unlock()
}

func (c *Comm) checkRank(call, what string, r int) error {
	if r < 0 || r >= c.size {
		return argErrorf(call, "%s %d out of range [0, %d) of communicator %q", what, r, c.size, c.name)
	}
	return nil
}

// Barrier blocks until every rank has called it.
func (c *Comm) Barrier() error {
	if err := c.checkUsable("Barrier"); err != nil {
		return err
	}
	return c.barrier()
}

// arriveTag is the message tag of Arrive's point-to-point messages.
const arriveTag = 32011

// Arrive returns once every rank has called it, or, after within (0: no
// limit), a *MissingError naming the first rank that did not, on every rank
// that did. It is a barrier that can name who is missing, which a
// collective cannot: for the entry of calls that every rank must make
// (NewGroup, Close), so that one rank skipping them is an error naming it,
// never a hang. It is collective, by point-to-point messages to rank 0
// with tag 32011.
//
// After a *MissingError naming rank r > 0, every rank may call Arrive
// again (with r this time). One naming rank 0 leaves this rank's message
// pending there: the communicator is then unusable, as after a timeout.
func (c *Comm) Arrive(what string, within time.Duration) error {
	if err := c.checkUsable("Arrive"); err != nil {
		return err
	}
	missing, err := c.arrive(within)
	if err != nil {
		return err
	}
	if missing >= 0 {
		return &MissingError{What: what, Rank: missing, After: within, Comm: c.name}
	}
	return nil
}

// Bcast copies buf on root into buf on every other rank. len(buf) must be
// the same on every rank.
func (c *Comm) Bcast(buf []byte, root int) error {
	if err := c.checkUsable("Bcast"); err != nil {
		return err
	}
	if err := c.checkRank("Bcast", "root", root); err != nil {
		return err
	}
	if err := checkCount("Bcast", "len(buf)", len(buf)); err != nil {
		return err
	}
	return c.bcast(buf, root)
}

// Allgather gathers send from every rank into recv, rank r's block at
// recv[r*len(send):]. len(recv) must be Size()*len(send).
func (c *Comm) Allgather(send, recv []byte) error {
	if err := c.checkUsable("Allgather"); err != nil {
		return err
	}
	if len(recv) != c.size*len(send) {
		return argErrorf("Allgather", "len(recv) = %d, want Size()*len(send) = %d*%d", len(recv), c.size, len(send))
	}
	if err := checkCount("Allgather", "len(send)", len(send)); err != nil {
		return err
	}
	return c.allgather(send, recv)
}

// Alltoall sends block d of send (blocks of len(send)/Size() bytes) to rank d
// and receives rank s's block into block s of recv.
func (c *Comm) Alltoall(send, recv []byte) error {
	if err := c.checkUsable("Alltoall"); err != nil {
		return err
	}
	if len(send) != len(recv) || len(send)%c.size != 0 {
		return argErrorf("Alltoall", "len(send) = %d and len(recv) = %d must be equal multiples of the communicator size %d", len(send), len(recv), c.size)
	}
	if err := checkCount("Alltoall", "block length", len(send)/c.size); err != nil {
		return err
	}
	return c.alltoall(send, recv, len(send)/c.size)
}

// Alltoallv sends sendCounts[d] bytes starting at send[sendDispls[d]] to
// rank d, and receives recvCounts[s] bytes from rank s at
// recv[recvDispls[s]]. Each slice of counts and displacements has Size()
// entries. Counts must agree pairwise (sendCounts[d] on rank s equals
// recvCounts[s] on rank d); MPI cannot check that, so exchange the counts with
// Alltoall first.
func (c *Comm) Alltoallv(send []byte, sendCounts, sendDispls []int, recv []byte, recvCounts, recvDispls []int) error {
	if err := c.checkUsable("Alltoallv"); err != nil {
		return err
	}
	sc, sd, err := c.checkVector("Alltoallv", "send", len(send), sendCounts, sendDispls)
	if err != nil {
		return err
	}
	rc, rd, err := c.checkVector("Alltoallv", "recv", len(recv), recvCounts, recvDispls)
	if err != nil {
		return err
	}
	return c.alltoallv(send, sc, sd, recv, rc, rd)
}

// checkVector validates one side of an alltoallv and converts it to the
// int32 counts MPI takes.
func (c *Comm) checkVector(call, side string, bufLen int, counts, displs []int) ([]int32, []int32, error) {
	if len(counts) != c.size || len(displs) != c.size {
		return nil, nil, argErrorf(call, "len(%sCounts) = %d and len(%sDispls) = %d, want the communicator size %d",
			side, len(counts), side, len(displs), c.size)
	}
	c32 := make([]int32, c.size)
	d32 := make([]int32, c.size)
	for i := range counts {
		n, d := counts[i], displs[i]
		if n < 0 || d < 0 {
			return nil, nil, argErrorf(call, "%sCounts[%d] = %d, %sDispls[%d] = %d: negative", side, i, n, side, i, d)
		}
		if d+n > bufLen {
			return nil, nil, argErrorf(call, "%sDispls[%d] + %sCounts[%d] = %d + %d exceeds len(%s) = %d", side, i, side, i, d, n, side, bufLen)
		}
		if err := checkCount(call, side+" displacement", d+n); err != nil {
			return nil, nil, err
		}
		c32[i], d32[i] = int32(n), int32(d)
	}
	return c32, d32, nil
}

const maxCount = 1<<31 - 1

func checkCount(call, what string, n int) error {
	if n > maxCount {
		return argErrorf(call, "%s = %d exceeds the MPI count limit %d", what, n, maxCount)
	}
	return nil
}

// Op is a reduction operation for Allreduce.
type Op int

// Reduction operations.
const (
	OpSum Op = iota + 1
	OpMax
	OpMin
)

func (op Op) String() string {
	switch op {
	case OpSum:
		return "sum"
	case OpMax:
		return "max"
	case OpMin:
		return "min"
	}
	return "Op(" + strconv.Itoa(int(op)) + ")"
}

// Split partitions the communicator: ranks passing the same color form a new
// communicator, ordered by key (ties by rank). A negative color means
// "not in any": that rank gets a nil *Comm.
func (c *Comm) Split(color, key int, name string) (*Comm, error) {
	if err := c.checkUsable("Split"); err != nil {
		return nil, err
	}
	// MPI_Comm_split has no non-blocking form: a barrier with the
	// communicator's timeout first turns a missing peer into an error.
	if c.timeout > 0 {
		if err := c.barrier(); err != nil {
			return nil, err
		}
	}
	nc, err := c.split(color, key)
	if err != nil || nc == nil {
		return nil, err
	}
	nc.name, nc.timeout = name, c.timeout
	return nc, nil
}

// Free releases the communicator. It is collective. The world communicator
// is freed by Finalize, not here.
func (c *Comm) Free() error {
	if err := c.checkUsable("Free"); err != nil {
		return err
	}
	return c.free()
}

// defaultTimeout is the collective timeout of the world communicator:
// GOEP_MPI_TIMEOUT (a Go duration; "0" for none), else 10 minutes.
func defaultTimeout() (time.Duration, error) {
	s := os.Getenv("GOEP_MPI_TIMEOUT")
	if s == "" {
		return 10 * time.Minute, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		return 0, fmt.Errorf("mpi: GOEP_MPI_TIMEOUT=%q is not a non-negative Go duration (such as 90s or 0)", s)
	}
	return d, nil
}
