package ep_test

import (
	"testing"

	"github.com/goep/goep/ep"
	"github.com/goep/goep/ep/eptest"
	"github.com/goep/goep/internal/mpitesting"
)

func TestMain(m *testing.M) { mpitesting.Main(m) }

// The CPU engine, checked against the two-sided baseline bit for bit.
func TestConformanceCPU(t *testing.T) {
	eptest.Run(t, eptest.Suite{Comm: mpitesting.World, Backend: ep.CPU, Reference: ep.Alltoallv, ZeroAllocs: true, Refusals: true,
		Masking: true})
}

// The CPU engine with LL's count-round protocol, which large messages take
// (the suite's are small enough for the slot protocol).
func TestConformanceCPUCountRound(t *testing.T) {
	defer ep.SetSlotProtocolMax(0)()
	eptest.Run(t, eptest.Suite{Comm: mpitesting.World, Backend: ep.CPU, Reference: ep.Alltoallv, ZeroAllocs: true, Refusals: true})
}

// The two-sided baseline, checked against the CPU engine. Its timeouts come
// from MPI collectives, which cannot say which rank is missing.
func TestConformanceAlltoallv(t *testing.T) {
	eptest.Run(t, eptest.Suite{Comm: mpitesting.World, Backend: ep.Alltoallv, Reference: ep.CPU, AnonymousTimeouts: true,
		Refusals: true})
}
