package moe

import (
	"fmt"

	"github.com/goep/goep/mpi"
)

// SyncState is each rank's own state of a data-parallel gradient sync that
// keeps one (GradSync.PerRankState), in a State: [ranks][n] arrays, rank by
// rank, n = Config.DataParallelParams, each row in the order of the
// data-parallel vector (gate, shared_w1, shared_b1, shared_w2, shared_b2,
// flattened).
type SyncState struct {
	// Residual is each rank's error feedback (Syncer.Residual).
	Residual []float64
	// Model, AdamM and AdamV are each rank's own copy of the data-parallel
	// parameters and of their Adam moments, for a sync whose copies drift
	// apart (A2SGD: not GradSync.Replicated); nil otherwise, where every
	// rank's copy is the State's Model.
	Model, AdamM, AdamV []float64
}

// arrays lists the state's arrays in a fixed order (nil for a nil state);
// the per-rank copies are absent when the parameters stay replicated.
func (s *SyncState) arrays() [][]float64 {
	if s == nil {
		return nil
	}
	if s.Model == nil {
		return [][]float64{s.Residual}
	}
	return [][]float64{s.Residual, s.Model, s.AdamM, s.AdamV}
}

// localSyncState is this rank's row of the SyncState (nil for a sync with
// none): its residual, then, if the copies drift apart, its data-parallel
// parameters and their Adam moments.
func (tr *Trainer) localSyncState() []float64 {
	g := tr.cfg.GradSync
	if !g.PerRankState() {
		return nil
	}
	row := clone(tr.layer.Syncer().Residual())
	if !g.Replicated() {
		n := len(row)
		row = append(row, make([]float64, 3*n)...)
		for i, p := range []*Params{tr.layer.Params(), &tr.adam.M, &tr.adam.V} {
			p.gatherDataParallel(row[(i+1)*n : (i+2)*n])
		}
	}
	return row
}

// gatherSyncState gathers every rank's row of the sync state (collective);
// rank 0 returns the SyncState, the others nil.
func (tr *Trainer) gatherSyncState() (*SyncState, error) {
	mine := tr.localSyncState()
	if mine == nil {
		return nil, nil
	}
	R, n := tr.comm.Size(), tr.cfg.DataParallelParams()
	all := make([]float64, len(mine)*R)
	if err := mpi.AllgatherSlice(tr.comm, mine, all); err != nil {
		return nil, fmt.Errorf("gathering the grad sync's per-rank state: %w", err)
	}
	if tr.comm.Rank() != 0 {
		return nil, nil
	}
	s := &SyncState{}
	dst := []*[]float64{&s.Residual}
	if !tr.cfg.GradSync.Replicated() {
		dst = append(dst, &s.Model, &s.AdamM, &s.AdamV)
	}
	for i, d := range dst {
		*d = make([]float64, R*n)
		for r := 0; r < R; r++ {
			row := all[r*len(mine) : (r+1)*len(mine)]
			copy((*d)[r*n:(r+1)*n], row[i*n:(i+1)*n])
		}
	}
	return s, nil
}

// restoreSyncState gives every rank its state from st's, which rank 0
// holds (the other ranks pass a State without it), gathered from ckRanks
// ranks. On the same number of ranks each rank takes its own row:
// the run continues bit for bit. On another number the rows do not map onto
// ranks: the residuals are pooled (summed) and spread evenly, so that the
// gradient not yet applied is kept as a whole, and every rank keeps rank 0's
// copy of the data-parallel parameters that RestoreState gave it (a
// checkpoint's CheckpointInfo.Changes, in package moe/runs, says so).
// Collective.
func (tr *Trainer) restoreSyncState(ck *State, ckRanks int) error {
	g := tr.cfg.GradSync
	if !g.PerRankState() {
		return nil
	}
	R, me, n := tr.comm.Size(), tr.comm.Rank(), tr.cfg.DataParallelParams()
	if me != 0 {
		ck.Sync = &SyncState{Residual: make([]float64, ckRanks*n)}
		if !g.Replicated() && ckRanks == R {
			ck.Sync.Model, ck.Sync.AdamM, ck.Sync.AdamV = make([]float64, R*n), make([]float64, R*n), make([]float64, R*n)
		}
	}
	arrays := ck.Sync.arrays()
	if ckRanks != R {
		arrays = arrays[:1] // the residuals only: every rank keeps rank 0's copy
	}
	for _, a := range arrays {
		if err := mpi.BcastSlice(tr.comm, a, 0); err != nil {
			return err
		}
	}
	e := tr.layer.Syncer().Residual()
	if ckRanks != R {
		clear(e)
		for r := 0; r < ckRanks; r++ { // in rank order: the same sum on every rank
			for i, v := range ck.Sync.Residual[r*n : (r+1)*n] {
				e[i] += v
			}
		}
		for i := range e {
			e[i] /= float64(R)
		}
		return nil
	}
	copy(e, ck.Sync.Residual[me*n:(me+1)*n])
	if !g.Replicated() {
		for _, pair := range []struct {
			p   *Params
			all []float64
		}{{tr.layer.Params(), ck.Sync.Model}, {&tr.adam.M, ck.Sync.AdamM}, {&tr.adam.V, ck.Sync.AdamV}} {
			pair.p.scatterDataParallel(pair.all[me*n : (me+1)*n])
		}
	}
	return nil
}
