package study

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/goep/goep/internal/h5"
)

// Format and Version are the root attributes format and version of a study file.
const (
	Format  = "goep-ep-study"
	Version = 1
)

// The labels of the coded columns mode and dtype: the stored value is the index.
var (
	ModeLabels  = []string{"ll", "ht"}
	DTypeLabels = []string{"f32", "bf16", "fp8"}
)

// column is one dataset under /results.
type column struct {
	name, units, desc string
	float             bool // float64, else int64
	labels            []string
	get               func(*Record) float64
	set               func(*Record, float64)
}

func intCol(name, units, desc string, p func(*Record) *int) column {
	return column{name: name, units: units, desc: desc,
		get: func(r *Record) float64 { return float64(*p(r)) },
		set: func(r *Record, v float64) { *p(r) = int(v) }}
}

func floatCol(name, units, desc string, p func(*Record) *float64) column {
	return column{name: name, units: units, desc: desc, float: true,
		get: func(r *Record) float64 { return *p(r) },
		set: func(r *Record, v float64) { *p(r) = v }}
}

func codeCol(name, desc string, labels []string, p func(*Record) *string) column {
	return column{name: name, units: "code", desc: desc, labels: labels,
		get: func(r *Record) float64 { return float64(slices.Index(labels, *p(r))) },
		set: func(r *Record, v float64) {
			if i := int(v); i >= 0 && i < len(labels) {
				*p(r) = labels[i]
			} else {
				*p(r) = "?" + strconv.Itoa(i)
			}
		}}
}

// columns is the schema of /results, in the order of the package doc.
var columns = []column{
	intCol("step", "index", "job step that measured the row: index into the root attribute steps", func(r *Record) *int { return &r.Step }),
	codeCol("mode", "dispatch mode: index into the attribute labels (ll, ht)", ModeLabels, func(r *Record) *string { return &r.Mode }),
	codeCol("dtype", "element type on the wire: index into the attribute labels (f32, bf16, fp8)", DTypeLabels, func(r *Record) *string { return &r.DType }),
	{name: "elem_bytes", units: "bytes", desc: "bytes per element: 4 (f32), 2 (bf16) or 1 (fp8, whose scales add 4 per 128)",
		get: func(r *Record) float64 { return float64(r.ElemBytes()) }, set: func(*Record, float64) {}},
	intCol("ranks", "ranks", "MPI ranks", func(r *Record) *int { return &r.Ranks }),
	intCol("nodes", "nodes", "nodes as ep saw them (Slurm nodes, or simulated nodes with GOEP_RANKS_PER_NODE)", func(r *Record) *int { return &r.Nodes }),
	intCol("tokens", "tokens", "tokens per rank", func(r *Record) *int { return &r.Tokens }),
	intCol("hidden", "elements", "elements per token", func(r *Record) *int { return &r.Hidden }),
	intCol("topk", "experts", "experts per token", func(r *Record) *int { return &r.TopK }),
	intCol("experts", "experts", "experts in all", func(r *Record) *int { return &r.Experts }),
	intCol("iters", "iterations", "timed iterations; times are medians over them", func(r *Record) *int { return &r.Iters }),
	floatCol("bytes_per_rank", "bytes", "bytes of the rows a rank sends per call ((token, expert) pairs in LL, (token, rank) pairs in HT), mean over ranks", func(r *Record) *float64 { return &r.BytesPerRank }),
	floatCol("dispatch_us", "us", "ep dispatch time: the slowest rank's median", func(r *Record) *float64 { return &r.DispatchUS }),
	floatCol("combine_us", "us", "ep combine time: the slowest rank's median", func(r *Record) *float64 { return &r.CombineUS }),
	floatCol("dispatch_gbps", "GB/s", "ep dispatch algorithm bandwidth per rank, mean over ranks", func(r *Record) *float64 { return &r.DispatchGBps }),
	floatCol("combine_gbps", "GB/s", "ep combine algorithm bandwidth per rank, mean over ranks", func(r *Record) *float64 { return &r.CombineGBps }),
	floatCol("alltoallv_dispatch_us", "us", "the same dispatch by hand with MPI_Alltoallv: slowest rank's median (0: not run)", func(r *Record) *float64 { return &r.AlltoallvDispatchUS }),
	floatCol("alltoallv_combine_us", "us", "the same combine by hand with MPI_Alltoallv (0: not run)", func(r *Record) *float64 { return &r.AlltoallvCombineUS }),
	floatCol("alltoallv_dispatch_gbps", "GB/s", "alltoallv dispatch bandwidth per rank (0: not run)", func(r *Record) *float64 { return &r.AlltoallvDispatchGBps }),
	floatCol("alltoallv_combine_gbps", "GB/s", "alltoallv combine bandwidth per rank (0: not run)", func(r *Record) *float64 { return &r.AlltoallvCombineGBps }),
	floatCol("speedup_vs_alltoallv", "ratio", "alltoallv (dispatch+combine) time over ep's (0: not run)", func(r *Record) *float64 { return &r.Speedup }),
	floatCol("memcpy_gbps", "GB/s", "memcpy of the same bytes, every rank at once, per rank", func(r *Record) *float64 { return &r.MemcpyGBps }),
	floatCol("dispatch_memcpy_frac", "ratio", "dispatch_gbps / memcpy_gbps", func(r *Record) *float64 { return &r.DispatchOfMemcpy }),
	floatCol("combine_memcpy_frac", "ratio", "combine_gbps / memcpy_gbps", func(r *Record) *float64 { return &r.CombineOfMemcpy }),
	intCol("buffer_bytes_per_rank", "bytes", "window memory ep's group holds per rank", func(r *Record) *int { return &r.BufferBytesPerRank }),
}

// Columns lists the names of the datasets under /results.
func Columns() []string {
	out := make([]string, len(columns))
	for i, c := range columns {
		out[i] = c.name
	}
	return out
}

// Step is one job step's results, as collected.
type Step struct {
	Name    string // e.g. "003-2x4-ht"; "" gives "step-<index>"
	Command string // the launch command line, for the record
	Records []Record
}

// Collect adds steps to the study file at path: it creates the file (with
// every /results table, empty) when it does not exist or fresh is set, and
// otherwise appends to it. attrs are set on the root group, replacing
// attributes of the same name (values as for h5.File.SetAttr). The file is
// flushed after each step.
func Collect(path string, fresh bool, attrs map[string]any, steps ...Step) (err error) {
	var f *h5.File
	if _, statErr := os.Stat(path); fresh || errors.Is(statErr, fs.ErrNotExist) {
		if f, err = create(path); err != nil {
			return err
		}
	} else {
		if f, err = h5.OpenRW(path); err != nil {
			return err
		}
		if err := checkFormat(f); err != nil {
			f.Close()
			return err
		}
	}
	defer func() {
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}()
	for _, name := range sortedKeys(attrs) {
		if err := f.SetAttr("", name, attrs[name]); err != nil {
			return err
		}
	}
	names, err := f.AttrStrings("", "steps")
	if err != nil && !errors.Is(err, h5.ErrNotFound) {
		return err
	}
	cmds, err := f.AttrStrings("", "step_commands")
	if err != nil && !errors.Is(err, h5.ErrNotFound) {
		return err
	}
	for _, s := range steps {
		idx := len(names)
		name := s.Name
		if name == "" {
			name = fmt.Sprintf("step-%d", idx)
		}
		names, cmds = append(names, name), append(cmds, s.Command)
		for _, c := range columns {
			t, err := f.OpenTable("results/" + c.name)
			if err != nil {
				return err
			}
			if c.float {
				v := make([]float64, len(s.Records))
				for i := range s.Records {
					v[i] = c.get(&s.Records[i])
				}
				err = t.Append(v)
			} else {
				v := make([]int64, len(s.Records))
				for i := range s.Records {
					r := s.Records[i]
					r.Step = idx
					v[i] = int64(c.get(&r))
				}
				err = t.Append(v)
			}
			if err != nil {
				return err
			}
		}
		if err := f.SetAttr("", "steps", names); err != nil {
			return err
		}
		if err := f.SetAttr("", "step_commands", cmds); err != nil {
			return err
		}
		if err := f.Flush(); err != nil {
			return err
		}
	}
	return nil
}

func create(path string) (*h5.File, error) {
	f, err := h5.Create(path)
	if err != nil {
		return nil, err
	}
	host, _ := os.Hostname()
	attrs := map[string]any{
		"format": Format, "version": Version, "created": time.Now().UTC().Format(time.RFC3339),
		"go_version": runtime.Version(), "host": host, "host_cpus": runtime.NumCPU(),
		"steps": []string{}, "step_commands": []string{},
	}
	for _, name := range sortedKeys(attrs) {
		if s, ok := attrs[name].([]string); ok && len(s) == 0 {
			continue // an empty string array cannot be stored: steps appear with the first step
		}
		if err := f.SetAttr("", name, attrs[name]); err != nil {
			f.Close()
			return nil, err
		}
	}
	for _, c := range columns {
		dt := h5.Int64
		if c.float {
			dt = h5.Float64
		}
		if _, err := f.CreateTable("results/"+c.name, dt, nil, 128); err != nil {
			f.Close()
			return nil, err
		}
		name := "results/" + c.name
		err := f.SetAttr(name, "units", c.units)
		if err == nil {
			err = f.SetAttr(name, "description", c.desc)
		}
		if err == nil && c.labels != nil {
			err = f.SetAttr(name, "labels", c.labels)
		}
		if err != nil {
			f.Close()
			return nil, err
		}
	}
	if err := f.SetAttr("results", "description", "one row per measured configuration (one JSON line of ep-bench -json)"); err != nil {
		f.Close()
		return nil, err
	}
	return f, f.Flush()
}

func checkFormat(f *h5.File) error {
	format, err := f.AttrString("", "format")
	if err != nil {
		return fmt.Errorf("study: %s is not a study file: %w", f.Path(), err)
	}
	if format != Format {
		return fmt.Errorf("study: %s has format %q, not %q", f.Path(), format, Format)
	}
	v, err := f.AttrInt64("", "version")
	if err != nil {
		return err
	}
	if v != Version {
		return fmt.Errorf("study: %s is version %d; this program reads version %d", f.Path(), v, Version)
	}
	return nil
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// Study is a study file read back.
type Study struct {
	Path     string
	Attrs    map[string]any // root attributes: string, []string, int64, []int64, float64 or []float64
	Steps    []string       // the root attribute steps
	Commands []string       // the root attribute step_commands
	Records  []Record
}

// Read reads the whole study file at path.
func Read(path string) (*Study, error) {
	f, err := h5.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if err := checkFormat(f); err != nil {
		return nil, err
	}
	s := &Study{Path: path, Attrs: map[string]any{}}
	names, err := f.AttrNames("")
	if err != nil {
		return nil, err
	}
	for _, name := range names {
		if s.Attrs[name], err = readAttr(f, "", name); err != nil {
			return nil, err
		}
	}
	if slices.Contains(names, "steps") {
		if s.Steps, err = f.AttrStrings("", "steps"); err != nil {
			return nil, err
		}
		if s.Commands, err = f.AttrStrings("", "step_commands"); err != nil {
			return nil, err
		}
	}
	n := -1
	cols := make([][]float64, len(columns))
	for i, c := range columns {
		name := "results/" + c.name
		var shape []int
		if c.float {
			cols[i], shape, err = f.ReadFloat64(name)
		} else {
			var v []int64
			v, shape, err = f.ReadInt64(name)
			cols[i] = make([]float64, len(v))
			for j, x := range v {
				cols[i][j] = float64(x)
			}
		}
		if err != nil {
			return nil, err
		}
		if len(shape) != 1 {
			return nil, fmt.Errorf("study: %s /%s has shape %v, want one dimension", path, name, shape)
		}
		if n >= 0 && shape[0] != n {
			return nil, fmt.Errorf("study: %s /%s has %d rows, /results/%s %d", path, name, shape[0], columns[0].name, n)
		}
		n = shape[0]
	}
	s.Records = make([]Record, n)
	for i, c := range columns {
		for j := range s.Records {
			c.set(&s.Records[j], cols[i][j])
		}
	}
	for j := range s.Records {
		if st := s.Records[j].Step; st < 0 || st >= len(s.Steps) {
			return nil, fmt.Errorf("study: %s row %d: step %d, but %d steps recorded", path, j, st, len(s.Steps))
		}
	}
	return s, nil
}

// readAttr reads an attribute of whatever type it has.
func readAttr(f *h5.File, obj, name string) (any, error) {
	if v, err := f.AttrInt64s(obj, name); err == nil {
		if len(v) == 1 {
			return v[0], nil
		}
		return v, nil
	} else if !errors.Is(err, h5.ErrType) {
		return nil, err
	}
	if v, err := f.AttrFloat64s(obj, name); err == nil {
		if len(v) == 1 {
			return v[0], nil
		}
		return v, nil
	} else if !errors.Is(err, h5.ErrType) {
		return nil, err
	}
	v, err := f.AttrStrings(obj, name)
	if err != nil {
		return nil, err
	}
	if len(v) == 1 && name != "steps" && name != "step_commands" {
		return v[0], nil
	}
	return v, nil
}

// AttrString returns the root attribute name formatted as text ("" if absent).
func (s *Study) AttrString(name string) string {
	switch v := s.Attrs[name].(type) {
	case nil:
		return ""
	case string:
		return v
	case []string:
		return strings.Join(v, " ")
	default:
		return strings.Trim(fmt.Sprint(v), "[]")
	}
}

// AttrInt returns the integer root attribute name, or def if it is absent or
// not an integer.
func (s *Study) AttrInt(name string, def int) int {
	if v, ok := s.Attrs[name].(int64); ok {
		return int(v)
	}
	if v, ok := s.Attrs[name].(string); ok {
		if n, err := strconv.Atoi(strings.TrimSpace(v)); err == nil {
			return n
		}
	}
	return def
}

// ParseAttr turns the text of a command-line attribute into the value
// SetAttr stores: a whole number becomes an int64, a number a float64, a
// comma-separated list of whole numbers an []int64, of numbers a []float64,
// of anything else a []string; any other text stays a string.
func ParseAttr(text string) any {
	if n, err := strconv.ParseInt(text, 10, 64); err == nil {
		return n
	}
	if x, err := strconv.ParseFloat(text, 64); err == nil {
		return x
	}
	if !strings.Contains(text, ",") {
		return text
	}
	parts := strings.Split(text, ",")
	for i := range parts {
		parts[i] = strings.TrimSpace(parts[i])
	}
	ints, floats := make([]int64, len(parts)), make([]float64, len(parts))
	allInt, allFloat := true, true
	for i, p := range parts {
		var err error
		if ints[i], err = strconv.ParseInt(p, 10, 64); err != nil {
			allInt = false
		}
		if floats[i], err = strconv.ParseFloat(p, 64); err != nil {
			allFloat = false
		}
	}
	switch {
	case allInt:
		return ints
	case allFloat:
		return floats
	}
	return parts
}
