package moe

import (
	"fmt"

	"github.com/goep/goep/mpi"
)

// State is a trainer's whole state, gathered from every rank (GatherState)
// and handed back to the ranks of a trainer of the same model
// (RestoreState), on as many ranks or on another number: the model with
// every expert, in global order, and Adam's moments laid out alike, and
// Adam's update count. The data-parallel parameters (the gate and the
// shared expert) in Model, AdamM and AdamV are rank 0's; a grad sync that
// keeps per-rank state adds each rank's (Sync). The data of a step depends
// on (seed, step, tokens x ranks) alone (see Batch), so there is no random
// generator state. Package moe/runs writes a State to a checkpoint file and
// reads it back.
type State struct {
	Model Params // all Experts experts
	// AdamT is Adam's update count: the steps the trainer had taken
	// (Trainer.StepsDone).
	AdamT        int64
	AdamM, AdamV Params
	Sync         *SyncState // nil unless Config.GradSync.PerRankState()
}

// localState lists this rank's expert arrays of the model and of Adam's
// moments, in a fixed order.
func (tr *Trainer) localState() [][]float64 {
	p, m, v := tr.layer.Params(), &tr.adam.M, &tr.adam.V
	return append(append(p.expertSlices(), m.expertSlices()...), v.expertSlices()...)
}

// GatherState gathers the model and Adam's state from every rank to rank 0,
// which returns them; the other ranks return nil. Collective.
func (tr *Trainer) GatherState() (*State, error) {
	local := tr.localState()
	n := 0
	for _, s := range local {
		n += len(s)
	}
	mine := make([]float64, 0, n)
	for _, s := range local {
		mine = append(mine, s...)
	}
	R := tr.comm.Size()
	all := make([]float64, n*R)
	if err := mpi.AllgatherSlice(tr.comm, mine, all); err != nil {
		return nil, fmt.Errorf("moe: gathering the experts: %w", err)
	}
	sync, err := tr.gatherSyncState()
	if err != nil {
		return nil, fmt.Errorf("moe: %w", err)
	}
	if tr.comm.Rank() != 0 {
		return nil, nil
	}
	c := tr.cfg.Config
	st := &State{AdamT: tr.adam.T, Model: newParams(c, c.Experts), AdamM: newParams(c, c.Experts), AdamV: newParams(c, c.Experts), Sync: sync}
	for _, pair := range [][2]*Params{{&st.Model, tr.layer.Params()}, {&st.AdamM, &tr.adam.M}, {&st.AdamV, &tr.adam.V}} {
		ds, ss := pair[0].dataParallelSlices(), pair[1].dataParallelSlices()
		for i := range ds {
			copy(ds[i], ss[i])
		}
	}
	global := append(append(st.Model.expertSlices(), st.AdamM.expertSlices()...), st.AdamV.expertSlices()...)
	for r := 0; r < R; r++ {
		chunk := all[r*n : (r+1)*n]
		for i, s := range local {
			copy(global[i][r*len(s):(r+1)*len(s)], chunk[:len(s)])
			chunk = chunk[len(s):]
		}
	}
	return st, nil
}

// checkState says why st cannot be this trainer's state, or nil, and how
// many ranks its sync state is of (0 without one).
func (tr *Trainer) checkState(st *State) (ranks int, err error) {
	if st == nil {
		return 0, fmt.Errorf("moe: restore: rank 0 has no state to restore")
	}
	c := tr.cfg.Config
	shape := newParams(c, c.Experts)
	names := []string{"gate", "w1", "b1", "w2", "b2", "shared_w1", "shared_b1", "shared_w2", "shared_b2"}
	for _, p := range []struct {
		name string
		p    *Params
	}{{"model", &st.Model}, {"Adam's m", &st.AdamM}, {"Adam's v", &st.AdamV}} {
		for i, s := range p.p.slices() {
			if w := len(shape.slices()[i]); len(s) != w {
				return 0, fmt.Errorf("moe: restore: the state's %s %s has %d values, this model (%d experts, hidden %d, ffn %d, shared ffn %d) has %d",
					p.name, names[i], len(s), c.Experts, c.Hidden, c.FFN, c.SharedFFN, w)
			}
		}
	}
	if st.AdamT < 0 {
		return 0, fmt.Errorf("moe: restore: Adam's update count %d is negative", st.AdamT)
	}
	g, n := c.GradSync, c.DataParallelParams()
	switch s := st.Sync; {
	case !g.PerRankState() && s != nil:
		return 0, fmt.Errorf("moe: restore: the state has per-rank sync state, and grad sync %v keeps none", g)
	case !g.PerRankState():
		return 0, nil
	case s == nil:
		return 0, fmt.Errorf("moe: restore: grad sync %v keeps per-rank state, and the state has none", g)
	case len(s.Residual) == 0 || len(s.Residual)%n != 0:
		return 0, fmt.Errorf("moe: restore: the sync state's residual has %d values, not a whole number of ranks' %d", len(s.Residual), n)
	}
	ranks = len(st.Sync.Residual) / n
	want := ranks * n // each rank's own copy, where the copies drift apart
	if g.Replicated() {
		want = 0
	}
	for _, a := range []struct {
		name string
		v    []float64
	}{{"model", st.Sync.Model}, {"Adam's m", st.Sync.AdamM}, {"Adam's v", st.Sync.AdamV}} {
		if len(a.v) != want {
			return 0, fmt.Errorf("moe: restore: the sync state's per-rank %s has %d values, grad sync %v on %d ranks wants %d", a.name, len(a.v), g, ranks, want)
		}
	}
	return ranks, nil
}

// RestoreState gives every rank its part of st, which rank 0 passes (the
// other ranks pass nil: theirs is not read): the gate and the shared
// expert, its share of the experts (st holds them all in global order, so
// it may come from any number of ranks), Adam's moments, its update count
// as the steps done, and its state of the grad sync (see
// restoreSyncState). A state of another shape is refused, naming the array,
// and changes nothing. Collective; every rank returns the same outcome.
func (tr *Trainer) RestoreState(st *State) error {
	c := tr.cfg.Config
	me := tr.comm.Rank()
	var ranks int
	var err error
	if me == 0 {
		ranks, err = tr.checkState(st)
	}
	if err := mpi.AgreeOnError(tr.comm, err); err != nil {
		return err
	}
	if me != 0 {
		st = &State{Model: newParams(c, c.Experts), AdamM: newParams(c, c.Experts), AdamV: newParams(c, c.Experts)}
	}
	head := []int64{st.AdamT, int64(ranks)}
	if err := mpi.BcastSlice(tr.comm, head, 0); err != nil {
		return fmt.Errorf("moe: restore: %w", err)
	}
	for _, p := range []*Params{&st.Model, &st.AdamM, &st.AdamV} {
		for _, s := range p.slices() {
			if len(s) == 0 {
				continue // no shared expert
			}
			if err := mpi.BcastSlice(tr.comm, s, 0); err != nil {
				return fmt.Errorf("moe: restore: %w", err)
			}
		}
	}
	first, L := tr.layer.FirstExpert(), tr.layer.LocalExperts()
	for _, pair := range [][2]*Params{{tr.layer.Params(), &st.Model}, {&tr.adam.M, &st.AdamM}, {&tr.adam.V, &st.AdamV}} {
		dst, src := pair[0], pair[1]
		dd, sd := dst.dataParallelSlices(), src.dataParallelSlices()
		for j := range dd {
			copy(dd[j], sd[j])
		}
		ds, ss := dst.expertSlices(), src.expertSlices()
		for j := range ds {
			per := len(ds[j]) / L
			copy(ds[j], ss[j][first*per:(first+L)*per])
		}
	}
	if err := tr.restoreSyncState(st, int(head[1])); err != nil {
		return fmt.Errorf("moe: restore: %w", err)
	}
	tr.step, tr.adam.T = head[0], head[0]
	return nil
}
