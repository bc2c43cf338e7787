package main

// -plan: a configuration's buffers, with no MPI and nothing allocated.

import (
	"fmt"
	"io"

	"github.com/goep/goep/ep"
)

// plan prints each configuration's buffers for -plan ranks on -plan-nodes
// nodes, as the CPU backend will hold them: a size hint for a job not yet
// launched (NewGroup refuses what a node cannot give, before allocating).
func plan(stdout, stderr io.Writer, o *options) int {
	for _, c := range o.configs() {
		cfg := c.groupConfig(o)
		cfg.Backend, cfg.Timeout = nil, 0
		elem := ep.BFloat16
		if c.dtype == "f32" {
			elem = ep.Float32
		}
		f, err := ep.BufferPlan(cfg, elem, o.planRanks, o.planNodes)
		if err != nil {
			fmt.Fprintf(stderr, "ep-bench: -plan: %v: %v\n", c, err)
			return 2
		}
		fmt.Fprintf(stdout, "%v: %d ranks on %d nodes: %v\n", c, o.planRanks, o.planNodes, f)
		if err := f.WriteLayout(stdout); err != nil {
			fmt.Fprintf(stderr, "ep-bench: -plan: %v\n", err)
			return 1
		}
	}
	return 0
}
