package runs

import (
	"fmt"
	"slices"

	"github.com/goep/goep/ep"
	"github.com/goep/goep/internal/h5"
	"github.com/goep/goep/moe"
)

// The attributes that traces and checkpoints share: the run's configuration
// (configAttrs) and the device it trained on (deviceAttrs).

// configAttrs lists the attributes that record a TrainConfig.
func configAttrs(c moe.TrainConfig) []struct {
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

func writeConfigAttrs(f *h5.File, obj string, c moe.TrainConfig) error {
	for _, a := range configAttrs(c) {
		if err := f.SetAttr(obj, a.name, a.value); err != nil {
			return err
		}
	}
	return nil
}

func readConfigAttrs(f *h5.File, obj string) (moe.TrainConfig, error) {
	var c moe.TrainConfig
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
	if c.DType, err = moe.ParseDType(strs["dtype"]); err != nil {
		return c, err
	}
	if c.Act, err = moe.ParseActivation(strs["act"]); err != nil {
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
		if c.GradSync, err = moe.ParseGradSync(v); err != nil {
			return c, err
		}
	}
	return c, nil
}

// fixedDiffs lists the fields that define a run's model and training and
// differ between a (described by inA) and b, with both values.
func fixedDiffs(a, b moe.TrainConfig, inA, inB string) []string {
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

// deviceAttrs lists the attributes that record a moe.Device (trace segments
// and checkpoints from trace schema 5 and checkpoint version 4 on).
func deviceAttrs(d moe.Device) []struct {
	name  string
	value any
} {
	return []struct {
		name  string
		value any
	}{{"backend", d.Backend}, {"device", d.Name}, {"device_driver", d.Driver}, {"device_libraries", d.Libraries}, {"comm_id", d.CommID}}
}

// attrSetter and attrReader are what a moe.Device is written to and read from
// (an HDF5 file's object).
type attrSetter interface {
	SetAttr(obj, name string, value any) error
}

type attrReader interface {
	AttrString(obj, name string) (string, error)
	AttrNames(obj string) ([]string, error)
}

func writeDeviceAttrs(f attrSetter, obj string, d moe.Device) error {
	for _, a := range deviceAttrs(d) {
		if err := f.SetAttr(obj, a.name, a.value); err != nil {
			return err
		}
	}
	return nil
}

// readDeviceAttrs reads a moe.Device; a file from before they were recorded
// has none, and its run was on the CPU engine, the only backend then.
func readDeviceAttrs(f attrReader, obj string) (moe.Device, error) {
	names, err := f.AttrNames(obj)
	if err != nil {
		return moe.Device{}, err
	}
	has := map[string]bool{}
	for _, n := range names {
		has[n] = true
	}
	if !has["backend"] {
		return moe.Device{Backend: "cpu"}, nil
	}
	var d moe.Device
	dst := map[string]*string{"backend": &d.Backend, "device": &d.Name, "device_driver": &d.Driver,
		"device_libraries": &d.Libraries, "comm_id": &d.CommID}
	for _, a := range deviceAttrs(d) {
		v, err := f.AttrString(obj, a.name)
		if err != nil {
			return d, fmt.Errorf("attribute %s: %w", a.name, err)
		}
		*dst[a.name] = v
	}
	return d, nil
}
