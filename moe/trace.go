package moe

import (
	"fmt"
	"runtime"
	"time"

	"github.com/goep/goep/internal/h5"
)

// TraceVersion is the value of a trace's "version" attribute: the version of
// the schema in docs/trace-schema.md.
const TraceVersion = 1

// traceChunkRows is the rows per HDF5 chunk of the trace tables: small, so
// that a flush after each step writes little.
const traceChunkRows = 256

// TraceInfo is what a trace records about its run, as attributes of the
// root group.
type TraceInfo struct {
	Config      TrainConfig
	WorldSize   int
	Nodes       int
	Steps       int64  // the step the run ends at
	StartStep   int64  // steps done before the run (from a checkpoint)
	ResumedFrom string // the checkpoint it resumed from, or ""
	Command     string // the command line
	Start       time.Time
}

// Trace is a run's per-step trace: an HDF5 file of appendable tables under
// /trace, one row per step, written by one process (rank 0). The schema is
// in docs/trace-schema.md.
type Trace struct {
	f      *h5.File
	ranks  int
	start  time.Time
	tables map[string]*h5.Table
}

// traceTables are the trace's tables: name, element type, row shape
// ("experts", "ranks" or scalar) and meaning.
var traceTables = []struct {
	name  string
	dtype h5.DType
	row   string
	doc   string
}{
	{"step", h5.Int64, "", "step number (1 = the first step of the run from scratch)"},
	{"loss", h5.Float64, "", "task loss: mean squared error over all ranks' tokens, before the step's update"},
	{"aux_loss", h5.Float64, "", "load-balancing loss E * sum_e f_e * P_e, before the update"},
	{"tokens_per_expert", h5.Int64, "experts", "(token, slot) pairs routed to each expert, all ranks"},
	{"dispatch_us", h5.Float64, "ranks", "microseconds each rank spent in the step's dispatches (forward Dispatch, backward DispatchCached)"},
	{"combine_us", h5.Float64, "ranks", "microseconds each rank spent in the step's combines (forward and backward)"},
	{"bytes_sent", h5.Int64, "ranks", "payload bytes each rank addressed to other ranks in the step's four ep calls"},
	{"wall_time", h5.Float64, "", "seconds from the start of the run to the end of the step (rank 0's clock)"},
}

// CreateTrace creates (or truncates) the trace file at path and records
// info. Not collective: one process writes it.
func CreateTrace(path string, info TraceInfo) (_ *Trace, err error) {
	f, err := h5.Create(path)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			f.Close()
		}
	}()
	t := &Trace{f: f, ranks: info.WorldSize, start: info.Start, tables: map[string]*h5.Table{}}
	attrs := []struct {
		name  string
		value any
	}{
		{"format", "goep-moe-trace"}, {"version", TraceVersion}, {"go_version", runtime.Version()},
		{"world_size", info.WorldSize}, {"nodes", info.Nodes},
		{"steps", info.Steps}, {"start_step", info.StartStep}, {"resumed_from", info.ResumedFrom},
		{"command", info.Command}, {"start_time", info.Start.UTC().Format(time.RFC3339Nano)},
	}
	for _, a := range attrs {
		if err := f.SetAttr("/", a.name, a.value); err != nil {
			return nil, err
		}
	}
	if err := writeConfigAttrs(f, "/", info.Config); err != nil {
		return nil, err
	}
	for _, tt := range traceTables {
		var row []int
		switch tt.row {
		case "experts":
			row = []int{info.Config.Experts}
		case "ranks":
			row = []int{info.WorldSize}
		}
		tab, err := f.CreateTable("trace/"+tt.name, tt.dtype, row, traceChunkRows)
		if err != nil {
			return nil, err
		}
		if err := f.SetAttr("trace/"+tt.name, "description", tt.doc); err != nil {
			return nil, err
		}
		t.tables[tt.name] = tab
	}
	return t, f.Flush()
}

// Path is the trace file's path.
func (t *Trace) Path() string { return t.f.Path() }

// Append adds the row of one step; it reaches the file at the next Flush.
func (t *Trace) Append(s *StepStats, end time.Time) error {
	if len(s.DispatchUS) != t.ranks || len(s.CombineUS) != t.ranks || len(s.BytesSent) != t.ranks {
		return fmt.Errorf("moe: trace %s: step %d has statistics of %d ranks, the trace holds %d", t.Path(), s.Step, len(s.DispatchUS), t.ranks)
	}
	rows := map[string]any{
		"step": []int64{s.Step}, "loss": []float64{s.Loss}, "aux_loss": []float64{s.AuxLoss},
		"tokens_per_expert": s.TokensPerExpert, "dispatch_us": s.DispatchUS, "combine_us": s.CombineUS,
		"bytes_sent": s.BytesSent, "wall_time": []float64{end.Sub(t.start).Seconds()},
	}
	for _, tt := range traceTables {
		if err := t.tables[tt.name].Append(rows[tt.name]); err != nil {
			return err
		}
	}
	return nil
}

// Flush hands the rows appended so far to the operating system: a process
// killed after it leaves a file that h5dump and ReadTrace read.
func (t *Trace) Flush() error { return t.f.Flush() }

// Close flushes and closes the file.
func (t *Trace) Close() error { return t.f.Close() }

// TraceData is a trace read back.
type TraceData struct {
	Config      TrainConfig
	WorldSize   int
	Nodes       int
	Version     int
	StartStep   int64
	ResumedFrom string
	StartTime   string

	Step            []int64
	Loss, AuxLoss   []float64
	TokensPerExpert []int64   // [steps][Experts]
	DispatchUS      []float64 // [steps][WorldSize]
	CombineUS       []float64 // [steps][WorldSize]
	BytesSent       []int64   // [steps][WorldSize]
	WallTime        []float64
}

// ReadTrace reads a trace file. A file cut short by a killed writer reads
// up to its last flush; tables of unequal length (a kill between two
// appends) are cut to the shortest.
func ReadTrace(path string) (*TraceData, error) {
	f, err := h5.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	d := &TraceData{}
	if d.Config, err = readConfigAttrs(f, "/"); err != nil {
		return nil, err
	}
	ints := map[string]*int64{"start_step": &d.StartStep}
	var ws, nodes, version int64
	ints["world_size"], ints["nodes"], ints["version"] = &ws, &nodes, &version
	for name, dst := range ints {
		if *dst, err = f.AttrInt64("/", name); err != nil {
			return nil, err
		}
	}
	d.WorldSize, d.Nodes, d.Version = int(ws), int(nodes), int(version)
	if d.ResumedFrom, err = f.AttrString("/", "resumed_from"); err != nil {
		return nil, err
	}
	if d.StartTime, err = f.AttrString("/", "start_time"); err != nil {
		return nil, err
	}
	f64 := map[string]*[]float64{"loss": &d.Loss, "aux_loss": &d.AuxLoss, "dispatch_us": &d.DispatchUS,
		"combine_us": &d.CombineUS, "wall_time": &d.WallTime}
	i64 := map[string]*[]int64{"step": &d.Step, "tokens_per_expert": &d.TokensPerExpert, "bytes_sent": &d.BytesSent}
	rows := -1
	for _, tt := range traceTables {
		var shape []int
		if dst, ok := f64[tt.name]; ok {
			*dst, shape, err = f.ReadFloat64("trace/" + tt.name)
		} else {
			*i64[tt.name], shape, err = f.ReadInt64("trace/" + tt.name)
		}
		if err != nil {
			return nil, err
		}
		if rows < 0 || shape[0] < rows {
			rows = shape[0]
		}
	}
	E, R := d.Config.Experts, d.WorldSize
	d.Step, d.Loss, d.AuxLoss, d.WallTime = d.Step[:rows], d.Loss[:rows], d.AuxLoss[:rows], d.WallTime[:rows]
	d.TokensPerExpert = d.TokensPerExpert[:rows*E]
	d.DispatchUS, d.CombineUS, d.BytesSent = d.DispatchUS[:rows*R], d.CombineUS[:rows*R], d.BytesSent[:rows*R]
	return d, nil
}
