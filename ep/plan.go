package ep

import (
	"fmt"

	"github.com/goep/goep/ep/driver"
)

// BufferPlan is the memory cfg's backend (the CPU engine when none is
// set; a driver.Planner) holds for a group of cfg over
// ranks ranks on nodes nodes of as equal sizes as can be, with rows of
// element type elem, computed without allocating anything: NCCL EP's
// ncclEpHandleMemSize and DeepEP's buffer size hints, for planning. It
// follows every option of cfg that sizes memory (the mode, the receive
// layout and its alignment, MaxRecvTokensPerRank, the wire format), and
// Footprint.Layout lists every area. NewGroup checks the same against what
// the machine can give before it allocates.
func BufferPlan(cfg Config, elem DType, ranks, nodes int) (Footprint, error) {
	if err := cfg.Validate(ranks); err != nil {
		return Footprint{}, err
	}
	if nodes < 1 || nodes > ranks {
		return Footprint{}, fmt.Errorf("ep: BufferPlan: %d nodes for %d ranks: want 1 to %d", nodes, ranks, ranks)
	}
	b := backendOf(cfg)
	pl, ok := b.(driver.Planner)
	if !ok {
		return Footprint{}, fmt.Errorf("ep: BufferPlan: the %s backend does not say what it holds: %w", b.Name(), ErrUnsupported)
	}
	return pl.Plan(driver.NewSpec(cfg, elem), ranks, nodes)
}
