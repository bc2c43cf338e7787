// Command mpi-hello is the smallest goep MPI program: a template to copy.
// Every rank starts MPI, finds its place in the node topology, and takes part
// in an NCCL-style unique-ID bootstrap; rank 0 prints how Open MPI's one-sided
// components were chosen (mpi.OneSided) and one line per rank.
//
// Build and run it with 4 ranks:
//
//	go build -tags mpi -o bin/mpi-hello ./examples/mpi-hello
//	mpirun -np 4 bin/mpi-hello
//
// GOEP_RANKS_PER_NODE=2 splits the machine into simulated nodes of 2 ranks.
package main

import (
	"bytes"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/goep/goep/mpi"
)

func main() { os.Exit(run(os.Stdout, os.Stderr, os.Args[1:])) }

func run(stdout, stderr io.Writer, args []string) int {
	fs := flag.NewFlagSet("mpi-hello", flag.ContinueOnError)
	fs.SetOutput(stderr)
	timeout := fs.Duration("timeout", time.Minute, "how long a collective waits for a peer")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	world, err := mpi.Init()
	if err != nil {
		fmt.Fprintln(stderr, "mpi-hello:", err)
		return 1
	}
	world.SetTimeout(*timeout)
	if err := hello(stdout, world); err != nil {
		fmt.Fprintf(stderr, "mpi-hello: rank %d: %v\n", world.Rank(), err)
		mpi.Abort(1, err.Error()) // the other ranks may be waiting on us
	}
	if err := mpi.Finalize(); err != nil {
		fmt.Fprintln(stderr, "mpi-hello:", err)
		return 1
	}
	return 0
}

// lineLen is the fixed size of one rank's line in the gather.
const lineLen = 160

func hello(stdout io.Writer, world *mpi.Comm) error {
	topo, err := world.Topology()
	if err != nil {
		return err
	}
	defer topo.Free()
	id, err := mpi.BootstrapID(world, 0, mpi.HostID)
	if err != nil {
		return err
	}
	host, err := mpi.ProcessorName()
	if err != nil {
		return err
	}
	launch := mpi.DetectLaunch()
	if launch.Launcher == "" {
		launch.Launcher = "none"
	}
	line := fmt.Sprintf("%4d %4d %5d %5d  %-8s %-20s %s", world.Rank(), topo.Node, topo.LocalRank, topo.LocalSize,
		launch.Launcher, host, id.Digest())
	mine := make([]byte, lineLen)
	copy(mine, line)
	all := make([]byte, lineLen*world.Size())
	if err := world.Allgather(mine, all); err != nil {
		return err
	}
	if world.Rank() != 0 {
		return nil
	}
	fmt.Fprintf(stdout, "goep mpi-hello: %d ranks on %d node(s)%s, MPI thread level %d\n",
		world.Size(), topo.Nodes, map[bool]string{true: " (simulated)", false: ""}[topo.Simulated], mpi.ThreadLevel())
	osc, by := mpi.OneSided(), "user"
	if osc.ByGoep {
		by = "goep"
	}
	fmt.Fprintf(stdout, "one-sided components: osc=%q chosen-by=%s: %s\n", osc.Components, by, osc.Reason)
	fmt.Fprintln(stdout, "rank node local nodesz  launcher host                 bootstrap-id")
	for r := 0; r < world.Size(); r++ {
		fmt.Fprintln(stdout, strings.TrimRight(string(bytes.TrimRight(all[r*lineLen:(r+1)*lineLen], "\x00")), " "))
	}
	return nil
}
