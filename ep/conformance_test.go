package ep_test

import (
	"testing"

	"github.com/goep/goep/ep"
	"github.com/goep/goep/ep/eptest"
	"github.com/goep/goep/internal/mpitesting"
	"github.com/stretchr/testify/require"
)

func TestMain(m *testing.M) { mpitesting.Main(m) }

// The CPU engine, checked against the two-sided baseline bit for bit.
func TestConformanceCPU(t *testing.T) {
	eptest.Run(t, eptest.Suite{Comm: mpitesting.World, Backend: ep.CPU, Reference: ep.Alltoallv})
}

// The CPU engine with LL's count-round protocol, which large messages take
// (the suite's are small enough for the slot protocol).
func TestConformanceCPUCountRound(t *testing.T) {
	eptest.Run(t, eptest.Suite{Comm: mpitesting.World, Backend: ep.CPUWithSlotProtocolMax(0), Reference: ep.Alltoallv})
}

// The two-sided baseline, checked against the CPU engine. Its timeouts come
// from MPI collectives, which cannot say which rank is missing.
func TestConformanceAlltoallv(t *testing.T) {
	eptest.Run(t, eptest.Suite{Comm: mpitesting.World, Backend: ep.Alltoallv, Reference: ep.CPU})
}

// The CPU engine with one-sided puts across nodes, where the nodes are
// simulated on one host (Open MPI's osc/sm): across hosts over TCP a flush
// to a rank that does not call MPI waits for it with no deadline, so the
// suite's stalled-rank checks cannot pass there (docs/ep.md).
func TestConformanceCPUOneSided(t *testing.T) {
	topo, err := mpitesting.World.Topology()
	require.NoError(t, err)
	oneHost := topo.HostSize == topo.Size
	require.NoError(t, topo.Free())
	if !oneHost {
		t.Skip("ep.CPUOneSided is checked where every rank is on one host; across hosts it needs RDMA hardware")
	}
	eptest.Run(t, eptest.Suite{Comm: mpitesting.World, Backend: ep.CPUOneSided, Reference: ep.Alltoallv})
}
