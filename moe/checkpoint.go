package moe

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"os"
	"strings"
	"time"

	"github.com/goep/goep/ep"
	"github.com/goep/goep/internal/h5"
	"github.com/goep/goep/mpi"
)

// CheckpointFormat is the value of a checkpoint's "format" attribute, and
// CheckpointVersion of its "version" attribute.
const (
	CheckpointFormat  = "goep-moe-checkpoint"
	CheckpointVersion = 1
)

// Checkpoint is the whole state of a training run after Step updates: the
// model with every expert (gathered from all ranks, in global order), Adam's
// moments and step count, and the configuration and world size it was
// written with. A checksum of the arrays (the "checksum" attribute) catches
// damage to the data that HDF5 cannot see. The data of a step depends on
// (seed, step, tokens x ranks) alone (see Batch), so there is no random
// generator state to save.
type Checkpoint struct {
	Step      int64
	WorldSize int
	Config    TrainConfig
	Model     Params // all Experts experts
	AdamT     int64
	AdamM     Params
	AdamV     Params
	WrittenAt time.Time
}

// paramNames are the dataset names of the Params arrays, in slices() order.
var paramNames = []string{"gate", "w1", "b1", "w2", "b2"}

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

// paramShapes are the shapes of the arrays of Params for n experts.
func paramShapes(c Config, n int) [][]int {
	H, F, E := c.Hidden, c.FFN, c.Experts
	return [][]int{{H, E}, {n, H, F}, {n, F}, {n, F, H}, {n, H}}
}

// WriteCheckpoint writes ck to path atomically (h5.WriteAtomic): a reader
// finds the previous file or the new one, whole.
func WriteCheckpoint(path string, ck *Checkpoint) error {
	return h5.WriteAtomic(path, func(f *h5.File) error {
		attrs := []struct {
			name  string
			value any
		}{
			{"format", CheckpointFormat}, {"version", CheckpointVersion}, {"step", ck.Step},
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
		if err := f.SetAttr("/", "checksum", checksumHex(ck)); err != nil {
			return err
		}
		shapes := paramShapes(ck.Config.Config, ck.Config.Experts)
		for _, g := range ck.groups() {
			for i, s := range g.p.slices() {
				if err := f.WriteDataset(g.name+"/"+paramNames[i], shapes[i], s); err != nil {
					return err
				}
			}
		}
		return nil
	})
}

// ReadCheckpoint reads and checks a checkpoint file. A file that is not a
// checkpoint, is truncated or damaged, or whose arrays do not have the
// shapes its configuration implies gives an error saying so.
func ReadCheckpoint(path string) (*Checkpoint, error) {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("moe: %s is not a usable checkpoint: "+format, append([]any{path}, a...)...)
	}
	if _, err := os.Stat(path); err != nil {
		return nil, fmt.Errorf("moe: checkpoint: %w", err)
	}
	f, err := h5.Open(path)
	if err != nil {
		if errors.Is(err, h5.ErrNotHDF5) {
			return nil, bad("not an HDF5 file, or truncated or corrupt (%v)", err)
		}
		return nil, bad("%v", err)
	}
	defer f.Close()
	if format, err := f.AttrString("/", "format"); err != nil || format != CheckpointFormat {
		return nil, bad("its format attribute is %q, want %q (%v)", format, CheckpointFormat, err)
	}
	if v, err := f.AttrInt64("/", "version"); err != nil || v != CheckpointVersion {
		return nil, bad("version %d, this program reads version %d (%v)", v, CheckpointVersion, err)
	}
	ck := &Checkpoint{}
	var ws int64
	for _, a := range []struct {
		name string
		dst  *int64
	}{{"step", &ck.Step}, {"world_size", &ws}, {"adam_t", &ck.AdamT}} {
		if *a.dst, err = f.AttrInt64("/", a.name); err != nil {
			return nil, bad("%v", err)
		}
	}
	ck.WorldSize = int(ws)
	if s, err := f.AttrString("/", "written_at"); err == nil {
		ck.WrittenAt, _ = time.Parse(time.RFC3339Nano, s)
	}
	if ck.Config, err = readConfigAttrs(f, "/"); err != nil {
		return nil, bad("%v", err)
	}
	if err := ck.Config.Validate(ck.WorldSize); err != nil {
		return nil, bad("%v", err)
	}
	if ck.Step < 0 || ck.AdamT != ck.Step {
		return nil, bad("step %d and Adam's step count %d disagree", ck.Step, ck.AdamT)
	}
	shapes := paramShapes(ck.Config.Config, ck.Config.Experts)
	for _, g := range ck.groups() {
		p := g.p
		dst := []*[]float64{&p.Gate, &p.W1, &p.B1, &p.W2, &p.B2}
		for i, name := range paramNames {
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
	sum, err := f.AttrString("/", "checksum")
	if err != nil {
		return nil, bad("%v", err)
	}
	if got := checksumHex(ck); got != sum {
		return nil, bad("the arrays' checksum is %s, the file says %s: the data is corrupt", got, sum)
	}
	return ck, nil
}

// checksumHex is the FNV-1a 64-bit hash of the bits of every array of ck, in
// a fixed order, in hexadecimal.
func checksumHex(ck *Checkpoint) string {
	h := fnv.New64a()
	var b [8]byte
	for _, g := range ck.groups() {
		for _, s := range g.p.slices() {
			for _, v := range s {
				binary.LittleEndian.PutUint64(b[:], math.Float64bits(v))
				h.Write(b[:])
			}
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
// values, whether a run with cfg on worldSize ranks can resume from ck.
// Everything that changes the numbers must match; the number of steps, the
// file names and the timeout need not.
func (ck *Checkpoint) Compatible(cfg TrainConfig, worldSize int) error {
	var diffs []string
	add := func(name string, ckV, runV any) {
		if fmt.Sprint(ckV) != fmt.Sprint(runV) {
			diffs = append(diffs, fmt.Sprintf("%s = %v in the checkpoint, %v in this run", name, ckV, runV))
		}
	}
	a, b := ck.Config, cfg
	add("world size (ranks)", ck.WorldSize, worldSize)
	add("experts", a.Experts, b.Experts)
	add("topk", a.TopK, b.TopK)
	add("hidden", a.Hidden, b.Hidden)
	add("ffn", a.FFN, b.FFN)
	add("tokens", a.Tokens, b.Tokens)
	add("mode", a.Mode, b.Mode)
	add("dtype", a.DType, b.DType)
	add("act", a.Act, b.Act)
	add("seed", a.Seed, b.Seed)
	add("teacher-seed", a.TeacherSeed, b.TeacherSeed)
	add("lr", a.LR, b.LR)
	add("aux", a.AuxCoef, b.AuxCoef)
	if len(diffs) > 0 {
		return fmt.Errorf("moe: cannot resume: the checkpoint was written by a different run: %s", strings.Join(diffs, "; "))
	}
	return nil
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
	var err error
	if tr.comm.Rank() == 0 {
		c := tr.cfg.Config
		ck := &Checkpoint{Step: tr.step, WorldSize: R, Config: tr.cfg, AdamT: tr.adam.T, WrittenAt: time.Now(),
			Model: newParams(c, c.Experts), AdamM: newParams(c, c.Experts), AdamV: newParams(c, c.Experts)}
		copy(ck.Model.Gate, tr.layer.Params().Gate)
		copy(ck.AdamM.Gate, tr.adam.M.Gate)
		copy(ck.AdamV.Gate, tr.adam.V.Gate)
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
// and checks it (Compatible), then every rank takes the gate, its experts,
// Adam's state and the step. Collective; every rank returns the same outcome.
func (tr *Trainer) LoadCheckpoint(path string) error {
	c := tr.cfg.Config
	R, me := tr.comm.Size(), tr.comm.Rank()
	var ck *Checkpoint
	var err error
	if me == 0 {
		ck, err = ReadCheckpoint(path)
		if err == nil {
			err = ck.Compatible(tr.cfg, R)
			if err != nil {
				err = fmt.Errorf("%w (checkpoint %s)", err, path)
			}
		}
	} else {
		ck = &Checkpoint{Model: newParams(c, c.Experts), AdamM: newParams(c, c.Experts), AdamV: newParams(c, c.Experts)}
	}
	if err := agree(tr.comm, err); err != nil {
		return err
	}
	steps := []int64{ck.Step, ck.AdamT}
	if err := mpi.BcastSlice(tr.comm, steps, 0); err != nil {
		return fmt.Errorf("moe: resume from %s: %w", path, err)
	}
	for _, p := range []*Params{&ck.Model, &ck.AdamM, &ck.AdamV} {
		for _, s := range p.slices() {
			if err := mpi.BcastSlice(tr.comm, s, 0); err != nil {
				return fmt.Errorf("moe: resume from %s: %w", path, err)
			}
		}
	}
	first, L := tr.layer.FirstExpert(), tr.layer.LocalExperts()
	for _, pair := range [][2]*Params{{tr.layer.Params(), &ck.Model}, {&tr.adam.M, &ck.AdamM}, {&tr.adam.V, &ck.AdamV}} {
		dst, src := pair[0], pair[1]
		copy(dst.Gate, src.Gate)
		ds, ss := dst.expertSlices(), src.expertSlices()
		for j := range ds {
			per := len(ds[j]) / L
			copy(ds[j], ss[j][first*per:(first+L)*per])
		}
	}
	tr.step, tr.adam.T = steps[0], steps[1]
	return nil
}
