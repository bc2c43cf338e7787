package runs

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/goep/goep/internal/h5"
	"github.com/goep/goep/moe"
)

// CheckpointFormat is the value of a checkpoint's "format" attribute, and
// CheckpointVersion of its "version" attribute.
// Version 2 added the run id and lets a checkpoint resume on another number
// of ranks; version 3 the shared expert and the per-rank state of the
// data-parallel gradient sync (/sync); version 4 the backend and device
// the run trained on (Device). Versions 1 to 3 are read (version 1 files
// have no run id; files before version 4 were written on the CPU engine).
const (
	CheckpointFormat  = "goep-moe-checkpoint"
	CheckpointVersion = 4
)

// Checkpoint is the whole state of a training run after Step updates, in a
// file: the trainer's State (the model with every expert, gathered from all
// ranks in global order, Adam's moments and update count, the grad sync's
// per-rank state), the run's identity, and the configuration and world size
// it was written with. A checksum of the arrays (the "checksum" attribute)
// catches damage to the data that HDF5 cannot see. Since the experts are in
// global order, a checkpoint resumes on any number of ranks that divides
// them.
type Checkpoint struct {
	CheckpointInfo
	moe.State
}

// CheckpointInfo is what a checkpoint's attributes say, read without its
// arrays (ReadCheckpointInfo): enough to tell which run and step it holds.
type CheckpointInfo struct {
	Path      string // the file it was read from ("" for one not read from a file)
	Version   int    // the file's format version
	RunID     string // the run it belongs to; "" in version 1 files
	Step      int64
	WorldSize int
	Config    moe.TrainConfig
	WrittenAt time.Time
	// Device is what the run that wrote it trained on: the model does not
	// depend on it, and a run may resume on another (Changes says so).
	Device moe.Device
}

// paramNames are the dataset names of the Params arrays, in paramArrays
// order. A checkpoint without a shared expert has no shared_* datasets.
var paramNames = []string{"gate", "w1", "b1", "w2", "b2", "shared_w1", "shared_b1", "shared_w2", "shared_b2"}

// paramArrays lists the arrays of p in the order of paramNames.
func paramArrays(p *moe.Params) []*[]float64 {
	return []*[]float64{&p.Gate, &p.W1, &p.B1, &p.W2, &p.B2, &p.SharedW1, &p.SharedB1, &p.SharedW2, &p.SharedB2}
}

// groups are the checkpoint's parameter groups and their HDF5 group names.
func (ck *Checkpoint) groups() []struct {
	name string
	p    *moe.Params
} {
	return []struct {
		name string
		p    *moe.Params
	}{{"model", &ck.Model}, {"adam/m", &ck.AdamM}, {"adam/v", &ck.AdamV}}
}

// paramShapes are the shapes of the arrays of Params for n experts, in
// paramNames order.
func paramShapes(c moe.Config, n int) [][]int {
	H, F, E, S := c.Hidden, c.FFN, c.Experts, c.SharedFFN
	return [][]int{{H, E}, {n, H, F}, {n, F}, {n, F, H}, {n, H}, {H, S}, {S}, {S, H}, {H}}
}

// isSharedParam reports whether array i of paramNames is the shared
// expert's.
func isSharedParam(i int) bool { return i >= 5 }

// syncNames are the datasets of a SyncState under /sync, in syncArrays
// order.
var syncNames = []string{"residual", "model", "adam_m", "adam_v"}

// syncArrays lists the sync state's arrays in the order of syncNames: the
// residuals, then, where the copies drift apart (s.Model not nil), each
// rank's copy of the data-parallel parameters and their Adam moments; none
// for a nil state.
func syncArrays(s *moe.SyncState) []*[]float64 {
	switch {
	case s == nil:
		return nil
	case s.Model == nil:
		return []*[]float64{&s.Residual}
	}
	return []*[]float64{&s.Residual, &s.Model, &s.AdamM, &s.AdamV}
}

// writeSyncState puts s under /sync, [ranks][n] arrays (nothing for a nil
// state).
func writeSyncState(f *h5.File, s *moe.SyncState, ranks, n int) error {
	for i, a := range syncArrays(s) {
		if err := f.WriteDataset("sync/"+syncNames[i], []int{ranks, n}, *a); err != nil {
			return err
		}
	}
	if s == nil {
		return nil
	}
	return f.SetAttr("sync", "layout", "one row per rank, in rank order: gate, shared_w1, shared_b1, shared_w2, shared_b2, flattened")
}

// readSyncState reads the /sync state that a checkpoint of g on ranks ranks
// with n data-parallel parameters must have.
func readSyncState(f *h5.File, g moe.GradSync, ranks, n int) (*moe.SyncState, error) {
	s := &moe.SyncState{}
	if !g.Replicated() {
		s.Model = []float64{} // not nil: syncArrays lists the per-rank copies
	}
	for i, d := range syncArrays(s) {
		data, shape, err := f.ReadFloat64("sync/" + syncNames[i])
		if err != nil {
			return nil, fmt.Errorf("grad sync %v keeps per-rank state: %w", g, err)
		}
		if !slices.Equal(shape, []int{ranks, n}) {
			return nil, fmt.Errorf("/sync/%s has shape %v, want [%d %d] (ranks, data-parallel parameters)", syncNames[i], shape, ranks, n)
		}
		*d = data
	}
	return s, nil
}

// WriteCheckpoint writes ck to path atomically (h5.WriteAtomic): a reader
// finds the previous file or the new one, whole.
func WriteCheckpoint(path string, ck *Checkpoint) error {
	return h5.WriteAtomic(path, func(f *h5.File) error {
		attrs := []struct {
			name  string
			value any
		}{
			{"format", CheckpointFormat}, {"version", CheckpointVersion}, {"run_id", ck.RunID}, {"step", ck.Step},
			{"world_size", ck.WorldSize}, {"adam_t", ck.AdamT},
			{"adam_beta1", 0.9}, {"adam_beta2", 0.999}, {"adam_eps", 1e-8},
			{"written_at", ck.WrittenAt.UTC().Format(time.RFC3339Nano)},
			{"rng", "none: step s trains on tokens [(s-1)*G, s*G) of one stream, G = tokens * world_size, token i drawn from a PCG seeded with (seed, i)"},
		}
		for _, a := range attrs {
			if err := f.SetAttr("/", a.name, a.value); err != nil {
				return err
			}
		}
		if err := writeConfigAttrs(f, "/", ck.Config); err != nil {
			return err
		}
		if err := writeDeviceAttrs(f, "/", ck.Device); err != nil {
			return err
		}
		if err := f.SetAttr("/", "checksum", checksumHex(ck)); err != nil {
			return err
		}
		shapes := paramShapes(ck.Config.Config, ck.Config.Experts)
		for _, g := range ck.groups() {
			for i, s := range paramArrays(g.p) {
				if isSharedParam(i) && ck.Config.SharedFFN == 0 {
					continue
				}
				if err := f.WriteDataset(g.name+"/"+paramNames[i], shapes[i], *s); err != nil {
					return err
				}
			}
		}
		return writeSyncState(f, ck.Sync, ck.WorldSize, ck.Config.DataParallelParams())
	})
}

// ReadCheckpoint reads and checks a checkpoint file. A file that is not a
// checkpoint, is truncated or damaged, or whose arrays do not have the
// shapes its configuration implies gives an error saying so.
func ReadCheckpoint(path string) (*Checkpoint, error) {
	f, info, err := openCheckpoint(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	bad := func(format string, a ...any) error {
		return fmt.Errorf("runs: %s is not a usable checkpoint: "+format, append([]any{path}, a...)...)
	}
	ck := &Checkpoint{CheckpointInfo: *info}
	if ck.AdamT, err = f.AttrInt64("/", "adam_t"); err != nil {
		return nil, bad("%v", err)
	}
	if ck.AdamT != ck.Step {
		return nil, bad("step %d and Adam's step count %d disagree", ck.Step, ck.AdamT)
	}
	shapes := paramShapes(ck.Config.Config, ck.Config.Experts)
	for _, g := range ck.groups() {
		dst := paramArrays(g.p)
		for i, name := range paramNames {
			if isSharedParam(i) && ck.Config.SharedFFN == 0 {
				continue
			}
			data, shape, err := f.ReadFloat64(g.name + "/" + name)
			if err != nil {
				return nil, bad("%v", err)
			}
			if !slices.Equal(shape, shapes[i]) {
				return nil, bad("/%s/%s has shape %v, want %v for its configuration", g.name, name, shape, shapes[i])
			}
			*dst[i] = data
		}
	}
	if ck.Config.GradSync.PerRankState() {
		if ck.Sync, err = readSyncState(f, ck.Config.GradSync, ck.WorldSize, ck.Config.DataParallelParams()); err != nil {
			return nil, bad("%v", err)
		}
	}
	sum, err := f.AttrString("/", "checksum")
	if err != nil {
		return nil, bad("%v", err)
	}
	if got := checksumHex(ck); got != sum {
		return nil, bad("the arrays' checksum is %s, the file says %s: the data is corrupt", got, sum)
	}
	return ck, nil
}

// ReadCheckpointInfo reads a checkpoint's attributes: its run, step, world
// size and configuration, without the arrays (cheap enough to look at every
// checkpoint of a directory). ReadCheckpoint checks the arrays too.
func ReadCheckpointInfo(path string) (*CheckpointInfo, error) {
	f, info, err := openCheckpoint(path)
	if err != nil {
		return nil, err
	}
	f.Close()
	return info, nil
}

// openCheckpoint opens a checkpoint file and reads its attributes.
func openCheckpoint(path string) (_ *h5.File, _ *CheckpointInfo, err error) {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("runs: %s is not a usable checkpoint: "+format, append([]any{path}, a...)...)
	}
	if _, err := os.Stat(path); err != nil {
		return nil, nil, fmt.Errorf("runs: checkpoint: %w", err)
	}
	f, err := h5.Open(path)
	if err != nil {
		if errors.Is(err, h5.ErrNotHDF5) {
			return nil, nil, bad("not an HDF5 file, or truncated or corrupt (%v)", err)
		}
		return nil, nil, bad("%v", err)
	}
	defer func() {
		if err != nil {
			f.Close()
		}
	}()
	if format, err := f.AttrString("/", "format"); err != nil || format != CheckpointFormat {
		return nil, nil, bad("its format attribute is %q, want %q (%v)", format, CheckpointFormat, err)
	}
	v, err := f.AttrInt64("/", "version")
	if err != nil || v < 1 || v > CheckpointVersion {
		return nil, nil, bad("version %d, this program reads versions 1 to %d (%v)", v, CheckpointVersion, err)
	}
	info := &CheckpointInfo{Path: path, Version: int(v)}
	if v >= 2 {
		if info.RunID, err = f.AttrString("/", "run_id"); err != nil {
			return nil, nil, bad("%v", err)
		}
		if info.RunID == "" {
			return nil, nil, bad("its run_id attribute is empty")
		}
	}
	ws, err := f.AttrInt64("/", "world_size")
	if err != nil {
		return nil, nil, bad("%v", err)
	}
	info.WorldSize = int(ws)
	if info.Step, err = f.AttrInt64("/", "step"); err != nil {
		return nil, nil, bad("%v", err)
	}
	if s, err := f.AttrString("/", "written_at"); err == nil {
		info.WrittenAt, _ = time.Parse(time.RFC3339Nano, s)
	}
	if info.Config, err = readConfigAttrs(f, "/"); err != nil {
		return nil, nil, bad("%v", err)
	}
	if info.Device, err = readDeviceAttrs(f, "/"); err != nil {
		return nil, nil, bad("%v", err)
	}
	if err := info.Config.Validate(info.WorldSize); err != nil {
		return nil, nil, bad("%v", err)
	}
	if info.Step < 0 {
		return nil, nil, bad("step %d", info.Step)
	}
	return f, info, nil
}

// checksumHex is the FNV-1a 64-bit hash of the bits of every array of ck, in
// a fixed order (the model, Adam's moments, then the sync state), in
// hexadecimal.
func checksumHex(ck *Checkpoint) string {
	h := fnv.New64a()
	var b [8]byte
	var arrays []*[]float64
	for _, g := range ck.groups() {
		arrays = append(arrays, paramArrays(g.p)...)
	}
	arrays = append(arrays, syncArrays(ck.Sync)...)
	for _, s := range arrays {
		for _, v := range *s {
			binary.LittleEndian.PutUint64(b[:], math.Float64bits(v))
			h.Write(b[:])
		}
	}
	return fmt.Sprintf("%016x", h.Sum64())
}

// Compatible reports, as an error naming every field that differs and both
// values, whether a run with cfg on worldSize ranks can resume from the
// checkpoint. What defines the model and its training must match (shape,
// activation, seeds, learning rate, aux weight). What only places or moves
// the work may change, and Changes lists it: the number of ranks (any that
// divides the experts: they are resharded at load), the mode, the element
// type on the wire, the tokens per rank and the backend (a checkpoint is
// the model, not the device).
func (ck *CheckpointInfo) Compatible(cfg moe.TrainConfig, worldSize int) error {
	diffs := fixedDiffs(ck.Config, cfg, "in the checkpoint", "in this run")
	if worldSize <= 0 || ck.Config.Experts%worldSize != 0 {
		diffs = append(diffs, fmt.Sprintf("experts = %d in the checkpoint is not a multiple of the %d ranks of this run", ck.Config.Experts, worldSize))
	}
	if len(diffs) > 0 {
		return fmt.Errorf("runs: cannot resume from %s: the checkpoint was written by a different run: %s", ck.Path, strings.Join(diffs, "; "))
	}
	return nil
}

// GlobalBatch is the tokens of one step over all ranks.
func (ck *CheckpointInfo) GlobalBatch() int { return ck.Config.Tokens * ck.WorldSize }

// Changes lists, as sentences, what a run with cfg on worldSize ranks does
// differently from the run that wrote the checkpoint, among the things that
// may change (see Compatible); nil if nothing. A changed global batch (tokens
// x ranks) is said explicitly: the steps after the checkpoint then train on
// other tokens than an uninterrupted run would.
func (ck *CheckpointInfo) Changes(cfg moe.TrainConfig, worldSize int) []string {
	var out []string
	a := ck.Config
	if ck.WorldSize != worldSize {
		out = append(out, fmt.Sprintf("world size = %d ranks in the checkpoint, %d in this run: its %d experts are resharded, %d per rank",
			ck.WorldSize, worldSize, a.Experts, a.Experts/max(worldSize, 1)))
		if g := a.GradSync; g.PerRankState() {
			s := fmt.Sprintf("grad sync %v: the %d ranks' error feedback (gradient not yet applied) does not map onto %d ranks: it is pooled and spread evenly, so that none of it is lost, though which rank holds what changes",
				g, ck.WorldSize, worldSize)
			if !g.Replicated() {
				s += "; every rank starts from rank 0's copy of the gate and the shared expert and of their Adam moments (a2sgd lets the ranks' copies drift apart; the others are dropped)"
			}
			out = append(out, s)
		}
	}
	if a.Mode != cfg.Mode {
		out = append(out, fmt.Sprintf("mode = %v in the checkpoint, %v in this run", a.Mode, cfg.Mode))
	}
	if a.DType != cfg.DType {
		out = append(out, fmt.Sprintf("dtype = %v in the checkpoint, %v in this run", a.DType, cfg.DType))
	}
	if b := cfg.BackendName(); ck.Device.Backend != "" && ck.Device.Backend != b {
		out = append(out, fmt.Sprintf("backend = %s in the checkpoint, %s in this run: a checkpoint is the model, not the device; the run goes on on %s",
			ck.Device.Backend, b, b))
	}
	if g := cfg.Tokens * worldSize; g != ck.GlobalBatch() {
		out = append(out, fmt.Sprintf("the global batch changed: %d ranks x %d tokens = %d tokens per step in the checkpoint, %d x %d = %d in this run: the steps after %d train on other tokens than an uninterrupted run would (keep tokens x ranks = %d to train on the same)",
			ck.WorldSize, a.Tokens, ck.GlobalBatch(), worldSize, cfg.Tokens, g, ck.Step, ck.GlobalBatch()))
	} else if a.Tokens != cfg.Tokens {
		out = append(out, fmt.Sprintf("tokens per rank = %d in the checkpoint, %d in this run; the global batch is %d tokens per step in both", a.Tokens, cfg.Tokens, g))
	}
	return out
}

// SaveCheckpoint gathers tr's state to rank 0 (moe.Trainer.GatherState),
// which writes it to path atomically as a checkpoint of run runID after
// tr.StepsDone() steps, with tr's configuration and device. Collective;
// every rank returns the same outcome.
func SaveCheckpoint(tr *moe.Trainer, path, runID string) error {
	st, err := tr.GatherState()
	if err != nil {
		return fmt.Errorf("runs: checkpoint %s: %w", path, err)
	}
	if st != nil { // rank 0
		ck := &Checkpoint{CheckpointInfo: CheckpointInfo{Version: CheckpointVersion, RunID: runID, Step: tr.StepsDone(),
			WorldSize: tr.Comm().Size(), Config: tr.Config(), WrittenAt: time.Now(), Device: tr.Device()}, State: *st}
		err = WriteCheckpoint(path, ck)
	}
	return agree(tr.Comm(), err)
}

// LoadCheckpoint restores tr from the checkpoint at path: rank 0 reads and
// checks it (ReadCheckpoint, Compatible), then every rank takes its part of
// the state (moe.Trainer.RestoreState: the checkpoint holds every expert in
// global order, so it may come from any number of ranks). It returns the
// checkpoint's run id ("" for a version 1 checkpoint), the same on every
// rank. A checkpoint that does not fit is refused, naming why, and tr is
// left as it was. Collective; every rank returns the same outcome.
func LoadCheckpoint(tr *moe.Trainer, path string) (runID string, err error) {
	comm := tr.Comm()
	var st *moe.State
	if comm.Rank() == 0 {
		var ck *Checkpoint
		ck, err = ReadCheckpoint(path)
		if err == nil {
			err = ck.Compatible(tr.Config(), comm.Size())
		}
		if err == nil {
			runID, st = ck.RunID, &ck.State
		}
	}
	if err := agree(comm, err); err != nil {
		return "", err
	}
	if runID, err = bcastString(comm, runID, 0); err != nil {
		return "", fmt.Errorf("runs: resume from %s: %w", path, err)
	}
	if err := tr.RestoreState(st); err != nil {
		return "", fmt.Errorf("runs: resume from %s: %w", path, err)
	}
	return runID, nil
}
