package moe

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

	"github.com/goep/goep/ep"
	"github.com/goep/goep/internal/h5"
	"github.com/goep/goep/mpi"
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

// Checkpoint is the whole state of a training run after Step updates: the
// model with every expert (gathered from all ranks, in global order), Adam's
// moments and step count, the run's identity, and the configuration and
// world size it was written with. A checksum of the arrays (the "checksum"
// attribute) catches damage to the data that HDF5 cannot see. The data of a
// step depends on (seed, step, tokens x ranks) alone (see Batch), so there is
// no random generator state to save. Since the experts are in global order,
// a checkpoint resumes on any number of ranks that divides them. The
// data-parallel parameters (gate, shared expert) in Model are rank 0's; a
// grad sync with per-rank state adds each rank's (Sync).
type Checkpoint struct {
	CheckpointInfo
	Model Params // all Experts experts
	AdamT int64
	AdamM Params
	AdamV Params
	Sync  *SyncState // nil unless Config.GradSync.PerRankState()
}

// CheckpointInfo is what a checkpoint's attributes say, read without its
// arrays (ReadCheckpointInfo): enough to tell which run and step it holds.
type CheckpointInfo struct {
	Path      string // the file it was read from ("" for one not read from a file)
	Version   int    // the file's format version
	RunID     string // the run it belongs to; "" in version 1 files
	Step      int64
	WorldSize int
	Config    TrainConfig
	WrittenAt time.Time
	// Device is what the run that wrote it trained on: the model does not
	// depend on it, and a run may resume on another (Changes says so).
	Device Device
}

// paramNames are the dataset names of the Params arrays, in slices() order.
// A checkpoint without a shared expert has no shared_* datasets.
var paramNames = []string{"gate", "w1", "b1", "w2", "b2", "shared_w1", "shared_b1", "shared_w2", "shared_b2"}

// groups are the checkpoint's parameter groups and their HDF5 group names.
func (ck *Checkpoint) groups() []struct {
	name string
	p    *Params
} {
	return []struct {
		name string
		p    *Params
	}{{"model", &ck.Model}, {"adam/m", &ck.AdamM}, {"adam/v", &ck.AdamV}}
}

// paramShapes are the shapes of the arrays of Params for n experts, in
// slices() order.
func paramShapes(c Config, n int) [][]int {
	H, F, E, S := c.Hidden, c.FFN, c.Experts, c.SharedFFN
	return [][]int{{H, E}, {n, H, F}, {n, F}, {n, F, H}, {n, H}, {H, S}, {S}, {S, H}, {H}}
}

// isSharedParam reports whether array i of slices() is the shared expert's.
func isSharedParam(i int) bool { return i >= 5 }

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
			for i, s := range g.p.slices() {
				if isSharedParam(i) && ck.Config.SharedFFN == 0 {
					continue
				}
				if err := f.WriteDataset(g.name+"/"+paramNames[i], shapes[i], s); err != nil {
					return err
				}
			}
		}
		return ck.Sync.write(f, ck.WorldSize, ck.Config.DataParallelParams())
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
		return fmt.Errorf("moe: %s is not a usable checkpoint: "+format, append([]any{path}, a...)...)
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
		p := g.p
		dst := []*[]float64{&p.Gate, &p.W1, &p.B1, &p.W2, &p.B2, &p.SharedW1, &p.SharedB1, &p.SharedW2, &p.SharedB2}
		for i, name := range paramNames {
			if isSharedParam(i) && ck.Config.SharedFFN == 0 {
				continue
			}
			data, shape, err := f.ReadFloat64(g.name + "/" + name)
			if err != nil {
				return nil, bad("%v", err)
			}
			if !equalInts(shape, shapes[i]) {
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
		return fmt.Errorf("moe: %s is not a usable checkpoint: "+format, append([]any{path}, a...)...)
	}
	if _, err := os.Stat(path); err != nil {
		return nil, nil, fmt.Errorf("moe: checkpoint: %w", err)
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
	arrays := [][]float64{}
	for _, g := range ck.groups() {
		arrays = append(arrays, g.p.slices()...)
	}
	arrays = append(arrays, ck.Sync.arrays()...)
	for _, s := range arrays {
		for _, v := range s {
			binary.LittleEndian.PutUint64(b[:], math.Float64bits(v))
			h.Write(b[:])
		}
	}
	return fmt.Sprintf("%016x", h.Sum64())
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// Compatible reports, as an error naming every field that differs and both
// values, whether a run with cfg on worldSize ranks can resume from the
// checkpoint. What defines the model and its training must match (shape,
// activation, seeds, learning rate, aux weight). What only places or moves
// the work may change, and Changes lists it: the number of ranks (any that
// divides the experts: they are resharded at load), the mode, the element
// type on the wire, the tokens per rank and the backend (a checkpoint is
// the model, not the device).
func (ck *CheckpointInfo) Compatible(cfg TrainConfig, worldSize int) error {
	diffs := fixedDiffs(ck.Config, cfg, "in the checkpoint", "in this run")
	if worldSize <= 0 || ck.Config.Experts%worldSize != 0 {
		diffs = append(diffs, fmt.Sprintf("experts = %d in the checkpoint is not a multiple of the %d ranks of this run", ck.Config.Experts, worldSize))
	}
	if len(diffs) > 0 {
		return fmt.Errorf("moe: cannot resume from %s: the checkpoint was written by a different run: %s", ck.Path, strings.Join(diffs, "; "))
	}
	return nil
}

// fixedDiffs lists the fields that define a run's model and training and
// differ between a (described by inA) and b, with both values.
func fixedDiffs(a, b TrainConfig, inA, inB string) []string {
	var diffs []string
	add := func(name string, av, bv any) {
		if fmt.Sprint(av) != fmt.Sprint(bv) {
			diffs = append(diffs, fmt.Sprintf("%s = %v %s, %v %s", name, av, inA, bv, inB))
		}
	}
	add("experts", a.Experts, b.Experts)
	add("topk", a.TopK, b.TopK)
	add("hidden", a.Hidden, b.Hidden)
	add("ffn", a.FFN, b.FFN)
	add("shared-ffn", a.SharedFFN, b.SharedFFN)
	add("act", a.Act, b.Act)
	add("seed", a.Seed, b.Seed)
	add("teacher-seed", a.TeacherSeed, b.TeacherSeed)
	add("lr", a.LR, b.LR)
	add("aux", a.AuxCoef, b.AuxCoef)
	add("grad-sync", a.GradSync, b.GradSync)
	return diffs
}

// GlobalBatch is the tokens of one step over all ranks.
func (ck *CheckpointInfo) GlobalBatch() int { return ck.Config.Tokens * ck.WorldSize }

// Changes lists, as sentences, what a run with cfg on worldSize ranks does
// differently from the run that wrote the checkpoint, among the things that
// may change (see Compatible); nil if nothing. A changed global batch (tokens
// x ranks) is said explicitly: the steps after the checkpoint then train on
// other tokens than an uninterrupted run would.
func (ck *CheckpointInfo) Changes(cfg TrainConfig, worldSize int) []string {
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

// configAttrs lists the attributes that record a TrainConfig.
func configAttrs(c TrainConfig) []struct {
	name  string
	value any
} {
	return []struct {
		name  string
		value any
	}{
		{"experts", c.Experts}, {"topk", c.TopK}, {"hidden", c.Hidden}, {"ffn", c.FFN},
		{"tokens", c.Tokens}, {"mode", c.Mode.String()}, {"dtype", c.DType.String()}, {"act", c.Act.String()},
		{"seed", int64(c.Seed)}, {"teacher_seed", int64(c.TeacherSeed)}, {"lr", c.LR}, {"aux_coef", c.AuxCoef},
		{"shared_ffn", c.SharedFFN}, {"grad_sync", c.GradSync.String()},
	}
}

func writeConfigAttrs(f *h5.File, obj string, c TrainConfig) error {
	for _, a := range configAttrs(c) {
		if err := f.SetAttr(obj, a.name, a.value); err != nil {
			return err
		}
	}
	return nil
}

func readConfigAttrs(f *h5.File, obj string) (TrainConfig, error) {
	var c TrainConfig
	ints := map[string]*int{"experts": &c.Experts, "topk": &c.TopK, "hidden": &c.Hidden, "ffn": &c.FFN, "tokens": &c.Tokens}
	for name, dst := range ints {
		v, err := f.AttrInt64(obj, name)
		if err != nil {
			return c, err
		}
		*dst = int(v)
	}
	for name, dst := range map[string]*uint64{"seed": &c.Seed, "teacher_seed": &c.TeacherSeed} {
		v, err := f.AttrInt64(obj, name)
		if err != nil {
			return c, err
		}
		*dst = uint64(v)
	}
	for name, dst := range map[string]*float64{"lr": &c.LR, "aux_coef": &c.AuxCoef} {
		v, err := f.AttrFloat64(obj, name)
		if err != nil {
			return c, err
		}
		*dst = v
	}
	strs := map[string]string{}
	for _, name := range []string{"mode", "dtype", "act"} {
		v, err := f.AttrString(obj, name)
		if err != nil {
			return c, err
		}
		strs[name] = v
	}
	var err error
	if c.Mode, err = ep.ParseMode(strs["mode"]); err != nil {
		return c, err
	}
	if c.DType, err = ParseDType(strs["dtype"]); err != nil {
		return c, err
	}
	if c.Act, err = ParseActivation(strs["act"]); err != nil {
		return c, err
	}
	// Added with checkpoint version 3 and trace version 2: absent, the run
	// had no shared expert and summed its gate's gradient by allreduce.
	names, err := f.AttrNames(obj)
	if err != nil {
		return c, err
	}
	if slices.Contains(names, "shared_ffn") {
		v, err := f.AttrInt64(obj, "shared_ffn")
		if err != nil {
			return c, err
		}
		c.SharedFFN = int(v)
	}
	if slices.Contains(names, "grad_sync") {
		v, err := f.AttrString(obj, "grad_sync")
		if err != nil {
			return c, err
		}
		if c.GradSync, err = ParseGradSync(v); err != nil {
			return c, err
		}
	}
	return c, nil
}

// localState lists this rank's expert arrays of the model and of Adam's
// moments, in a fixed order.
func (tr *Trainer) localState() [][]float64 {
	p, m, v := tr.layer.Params(), &tr.adam.M, &tr.adam.V
	return append(append(p.expertSlices(), m.expertSlices()...), v.expertSlices()...)
}

// SaveCheckpoint gathers the model and Adam's state to rank 0, which writes
// them to path atomically. Collective; every rank returns the same outcome.
func (tr *Trainer) SaveCheckpoint(path string) error {
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
		return fmt.Errorf("moe: checkpoint %s: gathering the experts: %w", path, err)
	}
	sync, err := tr.gatherSyncState()
	if err != nil {
		return fmt.Errorf("moe: checkpoint %s: %w", path, err)
	}
	if tr.comm.Rank() == 0 {
		c := tr.cfg.Config
		ck := &Checkpoint{CheckpointInfo: CheckpointInfo{Version: CheckpointVersion, RunID: tr.runID, Step: tr.step, WorldSize: R,
			Config: tr.cfg, WrittenAt: time.Now(), Device: tr.device}, AdamT: tr.adam.T,
			Model: newParams(c, c.Experts), AdamM: newParams(c, c.Experts), AdamV: newParams(c, c.Experts), Sync: sync}
		for _, pair := range [][2]*Params{{&ck.Model, tr.layer.Params()}, {&ck.AdamM, &tr.adam.M}, {&ck.AdamV, &tr.adam.V}} {
			ds, ss := pair[0].dataParallelSlices(), pair[1].dataParallelSlices()
			for i := range ds {
				copy(ds[i], ss[i])
			}
		}
		global := append(append(ck.Model.expertSlices(), ck.AdamM.expertSlices()...), ck.AdamV.expertSlices()...)
		for r := 0; r < R; r++ {
			chunk := all[r*n : (r+1)*n]
			for i, s := range local {
				copy(global[i][r*len(s):(r+1)*len(s)], chunk[:len(s)])
				chunk = chunk[len(s):]
			}
		}
		err = WriteCheckpoint(path, ck)
	}
	return agree(tr.comm, err)
}

// LoadCheckpoint restores the run from the checkpoint at path: rank 0 reads
// and checks it (Compatible), then every rank takes the gate and the shared
// expert, its share of the experts (the checkpoint holds them all in global
// order, so it may come from any number of ranks), Adam's state, the step,
// the run id (a version 1 checkpoint has none: the trainer keeps its own)
// and its state of the grad sync (see restoreSyncState). Collective; every
// rank returns the same outcome.
func (tr *Trainer) LoadCheckpoint(path string) error {
	c := tr.cfg.Config
	R, me := tr.comm.Size(), tr.comm.Rank()
	var ck *Checkpoint
	var err error
	if me == 0 {
		ck, err = ReadCheckpoint(path)
		if err == nil {
			err = ck.Compatible(tr.cfg, R)
		}
	} else {
		ck = &Checkpoint{Model: newParams(c, c.Experts), AdamM: newParams(c, c.Experts), AdamV: newParams(c, c.Experts)}
	}
	if err := agree(tr.comm, err); err != nil {
		return err
	}
	steps := []int64{ck.Step, ck.AdamT, int64(ck.WorldSize)}
	if err := mpi.BcastSlice(tr.comm, steps, 0); err != nil {
		return fmt.Errorf("moe: resume from %s: %w", path, err)
	}
	id, err := bcastString(tr.comm, ck.RunID, 0)
	if err != nil {
		return fmt.Errorf("moe: resume from %s: %w", path, err)
	}
	for _, p := range []*Params{&ck.Model, &ck.AdamM, &ck.AdamV} {
		for _, s := range p.slices() {
			if len(s) == 0 {
				continue // no shared expert
			}
			if err := mpi.BcastSlice(tr.comm, s, 0); err != nil {
				return fmt.Errorf("moe: resume from %s: %w", path, err)
			}
		}
	}
	first, L := tr.layer.FirstExpert(), tr.layer.LocalExperts()
	for _, pair := range [][2]*Params{{tr.layer.Params(), &ck.Model}, {&tr.adam.M, &ck.AdamM}, {&tr.adam.V, &ck.AdamV}} {
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
	if err := tr.restoreSyncState(ck, int(steps[2])); err != nil {
		return fmt.Errorf("moe: resume from %s: %w", path, err)
	}
	tr.step, tr.adam.T = steps[0], steps[1]
	if id != "" {
		tr.runID = id
	}
	return nil
}
