package mpi_test

import (
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goep/goep/internal/mpitesting"
	"github.com/goep/goep/mpi"
)

// The harness places ranks by slot: on one host, or on the hosts of its
// layout (GOEP_TEST_HOSTS), so the expected topology follows from the world
// rank, the layout and GOEP_RANKS_PER_NODE alone.
func TestTopologyMatchesPlacement(t *testing.T) {
	w := mpitesting.World
	defer mpitesting.Agree(t, w)
	topo, err := w.Topology()
	require.NoError(t, err)
	defer func() { require.NoError(t, topo.Free()) }()

	perNode, err := mpi.RanksPerNodeOverride()
	require.NoError(t, err)
	hosts, err := mpitesting.HostLayout(w.Size())
	require.NoError(t, err)
	// The reference: each host's ranks, split into simulated nodes of perNode.
	var nodeOf, localOf, hostOf []int
	nodes := 0
	for h, n := range hosts {
		per := n
		if perNode > 0 {
			per = perNode
		}
		for i := 0; i < n; i++ {
			nodeOf = append(nodeOf, nodes+i/per)
			localOf = append(localOf, i%per)
			hostOf = append(hostOf, h)
		}
		nodes += (n + per - 1) / per
	}
	me := w.Rank()
	assert.Equal(t, nodes, topo.Nodes, "nodes")
	assert.Equal(t, nodeOf, topo.NodeOf, "node of every rank")
	assert.Equal(t, localOf, topo.LocalRankOf, "local rank of every rank")
	assert.Equal(t, nodeOf[me], topo.Node, "node index")
	assert.Equal(t, localOf[me], topo.LocalRank, "local rank")
	size := 0
	for _, n := range nodeOf {
		if n == topo.Node {
			size++
		}
	}
	assert.Equal(t, size, topo.LocalSize, "local size")
	assert.Equal(t, os.Getenv("GOEP_RANKS_PER_NODE") != "", topo.Simulated)
	if !topo.Simulated {
		if s := os.Getenv("OMPI_COMM_WORLD_LOCAL_RANK"); s != "" {
			lr, _ := strconv.Atoi(s)
			assert.Equal(t, lr, topo.LocalRank, "local rank against mpirun's OMPI_COMM_WORLD_LOCAL_RANK")
		}
	}
	ranks := topo.RanksOnNode(topo.Node)
	require.NotEmpty(t, ranks)
	assert.Equal(t, me-localOf[me], ranks[0], "the node's first rank")
	assert.Equal(t, topo.LocalSize, topo.NodeComm.Size())
	assert.Equal(t, topo.LocalRank, topo.NodeComm.Rank())

	// Hosts are real: ranks share a host name exactly when the layout puts
	// them on one host (independent of MPI: the kernel's host name).
	name, err := os.Hostname()
	require.NoError(t, err)
	const n = 64
	mine := make([]byte, n)
	copy(mine, name)
	all := make([]byte, n*w.Size())
	require.NoError(t, w.Allgather(mine, all))
	for r := 0; r < w.Size(); r++ {
		same := string(all[r*n:(r+1)*n]) == string(mine)
		assert.Equal(t, hostOf[r] == hostOf[me], same, "rank %d's host name %q against mine %q", r,
			strings.TrimRight(string(all[r*n:(r+1)*n]), "\x00"), name)
	}
}

func TestTopologyOverrideIsValidated(t *testing.T) {
	for _, bad := range []string{"0", "-2", "two"} {
		t.Setenv("GOEP_RANKS_PER_NODE", bad)
		_, err := mpi.RanksPerNodeOverride()
		require.Error(t, err)
		assert.Contains(t, err.Error(), strconv.Quote(bad))
	}
}
