package mpi

import (
	"encoding/binary"
	"fmt"
	"os"
	"slices"
	"strconv"
)

// Topology places the ranks of a communicator on nodes.
type Topology struct {
	Rank, Size           int // this rank and the size of the communicator
	Node, Nodes          int // this rank's node index and the number of nodes
	LocalRank, LocalSize int // this rank's place in its node

	// NodeOf and LocalRankOf give every rank's node index and local rank.
	NodeOf, LocalRankOf []int

	// Simulated is true when GOEP_RANKS_PER_NODE split real nodes further.
	Simulated bool

	// HostSize is the number of ranks that share this rank's memory (its
	// host): the node's size, or more when nodes are simulated on one host.
	// What a rank allocates competes with all of them.
	HostSize int

	// NodeComm holds the ranks of this node, ordered by rank; its ranks share
	// memory, so AllocateShared works on it. Free releases it.
	NodeComm *Comm
}

// RanksOnNode lists the ranks (of the communicator) on node n, by local rank.
func (t *Topology) RanksOnNode(n int) []int {
	var out []int
	for r, node := range t.NodeOf {
		if node == n {
			out = append(out, r)
		}
	}
	slices.SortFunc(out, func(a, b int) int { return t.LocalRankOf[a] - t.LocalRankOf[b] })
	return out
}

// Uniform reports whether every node holds the same number of ranks.
func (t *Topology) Uniform() bool {
	return t.Size == t.Nodes*t.LocalSize && len(t.RanksOnNode(t.Nodes-1)) == t.LocalSize
}

// Free releases the node communicator. It is collective over the
// communicator the topology was made from.
func (t *Topology) Free() error {
	if t.NodeComm == nil {
		return nil
	}
	err := t.NodeComm.Free()
	t.NodeComm = nil
	return err
}

// RanksPerNodeOverride reads GOEP_RANKS_PER_NODE: 0 when unset.
func RanksPerNodeOverride() (int, error) {
	s := os.Getenv("GOEP_RANKS_PER_NODE")
	if s == "" {
		return 0, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 {
		return 0, fmt.Errorf("mpi: GOEP_RANKS_PER_NODE=%q is not a positive number of ranks", s)
	}
	return n, nil
}

// nodeName names the node this process runs on: the host, and under Slurm
// the Slurm node too, since one host may run several simulated Slurm nodes.
func nodeName() (string, error) {
	host, err := ProcessorName()
	if err != nil {
		return "", err
	}
	if s := os.Getenv("SLURMD_NODENAME"); s != "" {
		host = s + "@" + host
	}
	return host, nil
}

const nodeNameLen = 256

// Topology finds the nodes of the communicator: ranks that share memory and,
// under Slurm, run on the same Slurm node; then, if GOEP_RANKS_PER_NODE=N is
// set, simulated nodes of N consecutive ranks of each. It is collective.
func (c *Comm) Topology() (*Topology, error) {
	if err := c.checkUsable("Topology"); err != nil {
		return nil, err
	}
	perNode, err := RanksPerNodeOverride()
	if err != nil {
		return nil, err
	}
	shared, err := c.splitShared()
	if err != nil {
		return nil, err
	}
	shared.name, shared.timeout = c.name+"/shared", c.timeout
	hostSize := shared.size
	node, err := splitByName(shared)
	if ferr := shared.Free(); err == nil {
		err = ferr
	}
	if err != nil {
		return nil, err
	}
	if perNode > 0 {
		sim, err := node.Split(node.rank/perNode, node.rank, "")
		if ferr := node.Free(); err == nil {
			err = ferr
		}
		if err != nil {
			return nil, err
		}
		node = sim
	}
	node.name, node.timeout = c.name+"/node", c.timeout

	// The node's leader (local rank 0) names the node by its rank in c.
	leader := []int64{int64(c.rank)}
	if err := BcastSlice(node, leader, 0); err != nil {
		return nil, err
	}
	mine := []int64{leader[0], int64(node.rank)}
	all := make([]int64, 2*c.size)
	if err := AllgatherSlice(c, mine, all); err != nil {
		return nil, err
	}
	var leaders []int64
	for r := 0; r < c.size; r++ {
		leaders = append(leaders, all[2*r])
	}
	slices.Sort(leaders)
	leaders = slices.Compact(leaders)
	t := &Topology{
		Rank: c.rank, Size: c.size, Nodes: len(leaders),
		LocalRank: node.rank, LocalSize: node.size,
		NodeOf: make([]int, c.size), LocalRankOf: make([]int, c.size),
		Simulated: perNode > 0, NodeComm: node, HostSize: hostSize,
	}
	for r := 0; r < c.size; r++ {
		t.NodeOf[r], _ = slices.BinarySearch(leaders, all[2*r])
		t.LocalRankOf[r] = int(all[2*r+1])
	}
	t.Node = t.NodeOf[c.rank]
	return t, nil
}

// splitByName splits a shared-memory communicator by node name, for hosts
// that run several (simulated) Slurm nodes.
func splitByName(shared *Comm) (*Comm, error) {
	name, err := nodeName()
	if err != nil {
		return nil, err
	}
	mine := make([]byte, nodeNameLen)
	binary.LittleEndian.PutUint16(mine, uint16(min(len(name), nodeNameLen-2)))
	copy(mine[2:], name)
	all := make([]byte, nodeNameLen*shared.size)
	if err := shared.Allgather(mine, all); err != nil {
		return nil, err
	}
	color := shared.rank
	for r := 0; r < shared.size; r++ {
		if string(all[r*nodeNameLen:(r+1)*nodeNameLen]) == string(mine) {
			color = r
			break
		}
	}
	return shared.Split(color, shared.rank, "")
}
