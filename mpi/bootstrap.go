package mpi

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"os"
	"time"
)

// UniqueIDBytes is the size of a UniqueID: that of NCCL's ncclUniqueId.
const UniqueIDBytes = 128

// UniqueID is an opaque identifier that one rank creates and every rank of a
// job must share before a communication library (NCCL, say) can connect them.
type UniqueID [UniqueIDBytes]byte

// Digest is a short hexadecimal fingerprint of the ID, for logs: ranks that
// print the same digest hold the same ID.
func (id UniqueID) Digest() string {
	sum := sha256.Sum256(id[:])
	return hex.EncodeToString(sum[:6])
}

// IDGenerator creates a UniqueID. The NCCL generator (ncclGetUniqueId) and
// HostID both fit it.
type IDGenerator func() (UniqueID, error)

// HostID is an IDGenerator needing no GPU library: random bytes, then the
// host name, process id and time, so IDs from different jobs differ.
func HostID() (UniqueID, error) {
	var id UniqueID
	if _, err := rand.Read(id[:96]); err != nil {
		return id, fmt.Errorf("mpi: HostID: %w", err)
	}
	host, _ := os.Hostname()
	copy(id[96:120], host)
	binary.LittleEndian.PutUint32(id[120:], uint32(os.Getpid()))
	binary.LittleEndian.PutUint32(id[124:], uint32(time.Now().Unix()))
	return id, nil
}

// BootstrapID makes root call gen and broadcasts the ID, so that every rank
// returns the same bytes; this is NCCL's MPI bootstrap with the generator as
// a parameter. If gen fails on root, every rank returns an error carrying
// root's message. It is collective.
func BootstrapID(c *Comm, root int, gen IDGenerator) (UniqueID, error) {
	var id UniqueID
	if err := c.checkUsable("BootstrapID"); err != nil {
		return id, err
	}
	if err := c.checkRank("BootstrapID", "root", root); err != nil {
		return id, err
	}
	if gen == nil {
		return id, argErrorf("BootstrapID", "nil ID generator")
	}
	// Layout: [status byte][ID][error message]; status 0 = ok.
	const msgLen = 512
	buf := make([]byte, 1+UniqueIDBytes+msgLen)
	if c.rank == root {
		generated, err := gen()
		if err != nil {
			buf[0] = 1
			copy(buf[1+UniqueIDBytes:], err.Error())
		} else {
			copy(buf[1:], generated[:])
		}
	}
	if err := c.Bcast(buf, root); err != nil {
		return id, err
	}
	if buf[0] != 0 {
		msg := buf[1+UniqueIDBytes:]
		for i, b := range msg {
			if b == 0 {
				msg = msg[:i]
				break
			}
		}
		return id, fmt.Errorf("mpi: BootstrapID: the generator failed on root rank %d: %s", root, msg)
	}
	copy(id[:], buf[1:])
	return id, nil
}

// CheckSameID checks that every rank of c passes the same id, as the ranks
// of one communicator built from a shared ID must (a rank with another ID
// would wait for ever inside NCCL's ncclCommInitRank): every rank returns
// nil, or an error naming the lowest rank whose ID differs from root's and
// both digests. It is collective.
func CheckSameID(c *Comm, root int, id UniqueID) error {
	if err := c.checkUsable("CheckSameID"); err != nil {
		return err
	}
	if err := c.checkRank("CheckSameID", "root", root); err != nil {
		return err
	}
	all := make([]byte, UniqueIDBytes*c.size)
	if err := c.Allgather(id[:], all); err != nil {
		return err
	}
	var want UniqueID
	copy(want[:], all[root*UniqueIDBytes:])
	for r := 0; r < c.size; r++ {
		var got UniqueID
		copy(got[:], all[r*UniqueIDBytes:])
		if got != want {
			return fmt.Errorf("mpi: CheckSameID: rank %d holds ID %s, root rank %d holds %s: the ranks were not given one ID", r, got.Digest(), root, want.Digest())
		}
	}
	return nil
}
