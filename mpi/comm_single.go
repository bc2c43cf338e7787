//go:build !mpi

package mpi

import (
	"os"
	"reflect"
	"sync"
	"time"

	empi "github.com/emer/empi/v2/mpi"
)

// Built reports whether this binary links MPI (the mpi build tag).
const Built = false

type commHandle struct{ isFreed bool }

func (h commHandle) freed() bool { return h.isFreed }

// Thread levels, as MPI defines them.
const (
	ThreadSingle = iota
	ThreadFunneled
	ThreadSerialized
	ThreadMultiple
)

var (
	initMu sync.Mutex
	world  *Comm
)

// Init returns the world communicator of a job of one rank. It fails if a
// launcher started several processes: this binary has no MPI (build it with
// -tags mpi).
func Init() (*Comm, error) {
	initMu.Lock()
	defer initMu.Unlock()
	if world != nil {
		return world, nil
	}
	timeout, err := defaultTimeout()
	if err != nil {
		return nil, err
	}
	if err := checkLaunch(DetectLaunch(), 1, false); err != nil {
		return nil, err
	}
	empi.Init() // empi's single-rank dummy
	oneSided = OneSidedChoice{Reason: "built without the mpi build tag: no MPI, no one-sided components"}
	world = &Comm{name: "world", rank: empi.WorldRank(), size: empi.WorldSize(), timeout: timeout}
	return world, nil
}

// Finalize ends the job.
func Finalize() error {
	initMu.Lock()
	defer initMu.Unlock()
	world = nil
	empi.Finalize()
	return nil
}

// ThreadLevel is ThreadMultiple: without MPI any goroutine may call.
func ThreadLevel() int { return ThreadMultiple }

// Abort prints msg to standard error and exits with code.
func Abort(code int, msg string) {
	os.Stderr.WriteString("goep: rank 0: aborting the job: " + msg + "\n")
	os.Exit(code)
}

// ProcessorName is the host name.
func ProcessorName() (string, error) { return os.Hostname() }

func (c *Comm) barrier() error                    { return nil }
func (c *Comm) arrive(time.Duration) (int, error) { return -1, nil }
func (c *Comm) bcast(buf []byte, root int) error  { return nil }
func (c *Comm) allgather(send, recv []byte) error {
	copy(recv, send)
	return nil
}
func (c *Comm) alltoall(send, recv []byte, block int) error {
	copy(recv, send)
	return nil
}
func (c *Comm) alltoallv(send []byte, sc, sd []int32, recv []byte, rc, rd []int32) error {
	if sc[0] != rc[0] {
		return argErrorf("Alltoallv", "sendCounts[0] = %d != recvCounts[0] = %d on a single rank", sc[0], rc[0])
	}
	copy(recv[rd[0]:rd[0]+rc[0]], send[sd[0]:sd[0]+sc[0]])
	return nil
}
func (c *Comm) allreduce(send, recv []byte, n int, kind reflect.Kind, op Op) error {
	copy(recv, send)
	return nil
}

func (c *Comm) split(color, key int) (*Comm, error) {
	if color < 0 {
		return nil, nil
	}
	return &Comm{rank: 0, size: 1}, nil
}

func (c *Comm) splitShared() (*Comm, error) { return &Comm{rank: 0, size: 1}, nil }

func (c *Comm) free() error {
	if c != world {
		c.h.isFreed = true
	}
	return nil
}

// Raw is zero: there is no MPI_Comm without the mpi build tag.
func (c *Comm) Raw() uintptr { return 0 }

func (c *Comm) badRootForTest() error {
	return &Error{Call: "MPI_Bcast", Code: -1, Msg: "no MPI in this build"}
}
