package mpi_test

import (
	"os"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goep/goep/internal/mpitesting"
	"github.com/goep/goep/mpi"
)

// The harness runs every rank on one host, placed by slot, so the expected
// topology follows from the world rank and GOEP_RANKS_PER_NODE alone.
func TestTopologyOnOneHost(t *testing.T) {
	w := mpitesting.World
	topo, err := w.Topology()
	require.NoError(t, err)
	defer func() { require.NoError(t, topo.Free()) }()

	perNode, err := mpi.RanksPerNodeOverride()
	require.NoError(t, err)
	if perNode == 0 {
		perNode = w.Size() // one real node holds every rank
	}
	wantNodes := (w.Size() + perNode - 1) / perNode
	assert.Equal(t, wantNodes, topo.Nodes, "nodes")
	assert.Equal(t, w.Rank()/perNode, topo.Node, "node index")
	assert.Equal(t, w.Rank()%perNode, topo.LocalRank, "local rank")
	assert.Equal(t, min(perNode, w.Size()-topo.Node*perNode), topo.LocalSize, "local size")
	assert.Equal(t, os.Getenv("GOEP_RANKS_PER_NODE") != "", topo.Simulated)
	if !topo.Simulated {
		if s := os.Getenv("OMPI_COMM_WORLD_LOCAL_RANK"); s != "" {
			lr, _ := strconv.Atoi(s)
			assert.Equal(t, lr, topo.LocalRank, "local rank against mpirun's OMPI_COMM_WORLD_LOCAL_RANK")
		}
	}
	for r := 0; r < w.Size(); r++ {
		assert.Equal(t, r/perNode, topo.NodeOf[r])
		assert.Equal(t, r%perNode, topo.LocalRankOf[r])
	}
	assert.Equal(t, []int{topo.Node * perNode}, topo.RanksOnNode(topo.Node)[:1])
	assert.Equal(t, topo.LocalSize, topo.NodeComm.Size())
	assert.Equal(t, topo.LocalRank, topo.NodeComm.Rank())
	mpitesting.Agree(t, w)
}

func TestTopologyOverrideIsValidated(t *testing.T) {
	for _, bad := range []string{"0", "-2", "two"} {
		t.Setenv("GOEP_RANKS_PER_NODE", bad)
		_, err := mpi.RanksPerNodeOverride()
		require.Error(t, err)
		assert.Contains(t, err.Error(), strconv.Quote(bad))
	}
}
