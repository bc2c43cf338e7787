package mpi_test

import (
	"bytes"
	"fmt"

	"github.com/goep/goep/mpi"
)

// Every rank starts MPI (Init returns the same world communicator if it is
// already running), finds its node, and joins an NCCL-style unique-ID
// bootstrap: rank 0 makes the ID, every rank ends up with the same bytes. A
// GPU program passes the NCCL generator instead of mpi.HostID.
func Example() {
	world, err := mpi.Init()
	if err != nil {
		fmt.Println(err)
		return
	}
	topo, err := world.Topology()
	if err != nil {
		fmt.Println(err)
		return
	}
	defer topo.Free()
	id, err := mpi.BootstrapID(world, 0, mpi.HostID)
	if err != nil {
		fmt.Println(err)
		return
	}
	all := make([]byte, len(id)*world.Size())
	if err := world.Allgather(id[:], all); err != nil {
		fmt.Println(err)
		return
	}
	same := true
	for r := 0; r < world.Size(); r++ {
		same = same && bytes.Equal(all[r*len(id):(r+1)*len(id)], id[:])
	}
	fmt.Println("node index in range:", topo.Node >= 0 && topo.Node < topo.Nodes)
	fmt.Println("same ID on every rank:", same)
	// Output:
	// node index in range: true
	// same ID on every rank: true
}
