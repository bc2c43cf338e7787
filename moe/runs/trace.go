package runs

import (
	"errors"
	"fmt"
	"math"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/goep/goep/ep"
	"github.com/goep/goep/internal/h5"
	"github.com/goep/goep/moe"
)

// TraceVersion is the value of a trace's "version" attribute: the version of
// the schema in docs/trace-schema.md. Version 2 added the run id, the
// segments and per-rank tables as wide as the largest world size of the
// run; version 3 the data-parallel gradient sync (the tables sync_us,
// sync_bytes and step_us, the attributes shared_ffn and grad_sync); version
// 4 the per-peer statistics (wait_us, peer_sent_bytes, peer_recv_bytes:
// one ranks x ranks matrix per step); version 5 the backend and device of
// each segment and the copies between the host and the ep group's memory
// (copies, copy_bytes, copy_us). ReadTrace reads versions 1 to 4 too.
const TraceVersion = 5

// TraceFormat is the value of a trace's "format" attribute.
const TraceFormat = "goep-moe-trace"

// traceChunkRows is the rows per HDF5 chunk of the trace tables: small, so
// that a flush after each step writes little.
const traceChunkRows = 256

// Segment is one stretch of a run done by one job: from scratch, or resumed
// from a checkpoint. A trace records every segment of its run.
type Segment struct {
	StartStep   int64     // steps done before it: the checkpoint's step, 0 from scratch
	Checkpoint  string    // the checkpoint it resumed from, "" from scratch
	DroppedRows int64     // rows after StartStep it dropped from the trace (work lost with a crash)
	Steps       int64     // the step it was asked to end at
	WorldSize   int       // ranks
	Nodes       int       // nodes (simulated ones with GOEP_RANKS_PER_NODE)
	Hosts       string    // the hosts and their ranks in rank order, "host:ranks,host:ranks"
	Mode        ep.Mode   // dispatch mode
	DType       moe.DType // element type on the wire
	Tokens      int       // tokens per rank per step
	Command     string    // the command line
	Start       time.Time // when it started
	GoVersion   string    // the Go toolchain that built the program
	// Device is what its ep calls ran on (schema version 5; older
	// segments read as the CPU engine, the only backend then).
	Device moe.Device
}

// TraceInfo is what a trace records about its run and the segment that opens
// it (CreateTrace, ContinueTrace).
type TraceInfo struct {
	RunID string
	// Config is the run's configuration; its Mode, DType and Tokens are the
	// segment's (they may change between segments), the rest the run's.
	Config  moe.TrainConfig
	Segment Segment // Mode, DType, Tokens and GoVersion are filled in from Config and the runtime
}

func (info *TraceInfo) fill() {
	s := &info.Segment
	s.Mode, s.DType, s.Tokens = info.Config.Mode, info.Config.DType, info.Config.Tokens
	if s.GoVersion == "" {
		s.GoVersion = runtime.Version()
	}
	if s.Device.Backend == "" {
		s.Device.Backend = info.Config.BackendName()
	}
}

// Trace is a run's per-step trace: an HDF5 file of appendable tables under
// /trace, one row per step, and a /segments group describing each segment
// of the run, written by one process (rank 0). The schema is in
// docs/trace-schema.md.
type Trace struct {
	f      *h5.File
	ranks  int // this segment's world size
	width  int // the per-rank tables' row length: the largest world size of the run
	start  time.Time
	tables map[string]*h5.Table
}

// traceTables are the trace's tables: name, element type, row shape
// ("experts", "ranks", "ranks x ranks" or scalar), meaning and the schema
// version that added it.
var traceTables = []struct {
	name  string
	dtype h5.DType
	row   string
	doc   string
	since int
}{
	{"step", h5.Int64, "", "step number (1 = the first step of the run from scratch)", 1},
	{"loss", h5.Float64, "", "task loss: mean squared error over all ranks' tokens, before the step's update", 1},
	{"aux_loss", h5.Float64, "", "load-balancing loss E * sum_e f_e * P_e, before the update", 1},
	{"tokens_per_expert", h5.Int64, "experts", "(token, slot) pairs routed to each expert, all ranks", 1},
	{"dispatch_us", h5.Float64, "ranks", "microseconds each rank spent in the step's dispatches (forward Dispatch, backward ep.Reuse); NaN past the step's world size", 1},
	{"combine_us", h5.Float64, "ranks", "microseconds each rank spent in the step's combines (forward and backward); NaN past the step's world size", 1},
	{"bytes_sent", h5.Int64, "ranks", "payload bytes each rank addressed to other ranks in the step's four ep calls; -1 past the step's world size", 1},
	{"wall_time", h5.Float64, "", "seconds from the start of the step's segment to the end of the step (rank 0's clock)", 1},
	{"sync_us", h5.Float64, "ranks", "microseconds each rank spent in the data-parallel gradient sync of the gate and the shared expert (grad_sync), its computation included; NaN past the step's world size and in rows from schema version 2", 3},
	{"sync_bytes", h5.Int64, "ranks", "bytes each rank sent in the data-parallel gradient sync: 2(R-1)/R of the allreduced payload (allreduce: 8 per parameter; a2sgd: 16), (R-1) times its own part of an allgather (topk:K: 12*K); -1 past the step's world size and in rows from schema version 2", 3},
	{"step_us", h5.Float64, "", "microseconds rank 0 spent in the step: forward, backward, sync, update and statistics, not the trace or checkpoints; NaN in rows from schema version 2", 3},
	{"wait_us", h5.Float64, "ranks x ranks", "[i][j]: microseconds rank i waited for rank j in the step's ep calls (ep.Stats.Wait); NaN where not measured, past the step's world size and in rows from schema versions before 4", 4},
	{"peer_sent_bytes", h5.Int64, "ranks x ranks", "[i][j]: token-row bytes rank i sent to rank j in the step's four ep calls, [i][i] the rows it kept (ep.Stats.SentBytes); -1 past the step's world size and in rows from schema versions before 4", 4},
	{"peer_recv_bytes", h5.Int64, "ranks x ranks", "[i][j]: token-row bytes rank i received from rank j in the step's four ep calls (ep.Stats.RecvBytes); -1 past the step's world size and in rows from schema versions before 4", 4},
	{"copies", h5.Int64, "ranks", "copies each rank made between the host and its ep group's memory in the step (0 on the CPU engine; on a device the tokens in, the received rows and the results out); -1 past the step's world size and in rows from schema versions before 5", 5},
	{"copy_bytes", h5.Int64, "ranks", "bytes of those copies, both ways; -1 past the step's world size and in rows from schema versions before 5", 5},
	{"copy_us", h5.Float64, "ranks", "microseconds each rank spent in those copies, outside dispatch_us and combine_us; NaN past the step's world size and in rows from schema versions before 5", 5},
}

// CreateTrace creates (or truncates) the trace file at path for a run whose
// first segment in it is info.Segment. Not collective: one process writes
// it.
func CreateTrace(path string, info TraceInfo) (_ *Trace, err error) {
	info.fill()
	if err := checkTraceInfo(path, info); err != nil {
		return nil, err
	}
	f, err := h5.Create(path)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			f.Close()
		}
	}()
	t, err := writeTraceHeader(f, info, []Segment{info.Segment}, info.Segment.WorldSize)
	if err != nil {
		return nil, err
	}
	return t, f.Flush()
}

// ContinueTrace continues the trace at path, of run info.RunID, with the
// segment info.Segment, resumed at step info.Segment.StartStep: the rows of
// the steps up to it are kept, the rows after it (work lost with a crash, or
// a branch the resume abandons) are dropped, and new rows append. It returns
// the number of rows dropped (also recorded as the segment's DroppedRows).
// The file is rewritten atomically (h5.WriteAtomic): a failure leaves it as
// it was. A trace of another run, or of another model, is refused, naming
// the field and both values. Not collective.
func ContinueTrace(path string, info TraceInfo) (_ *Trace, dropped int64, err error) {
	info.fill()
	if err := checkTraceInfo(path, info); err != nil {
		return nil, 0, err
	}
	old, err := ReadTrace(path)
	if err != nil {
		return nil, 0, err
	}
	if err := old.continuableBy(info.RunID, info.Config); err != nil {
		return nil, 0, err
	}
	keep := old.RowsUpTo(info.Segment.StartStep)
	dropped = int64(len(old.Step) - keep)
	info.Segment.DroppedRows = dropped
	width := max(old.RankColumns, info.Segment.WorldSize)
	segments := append(slices.Clone(old.Segments), info.Segment)
	err = h5.WriteAtomic(path, func(f *h5.File) error {
		t, err := writeTraceHeader(f, info, segments, width)
		if err != nil {
			return err
		}
		return t.appendRows(old, keep)
	})
	if err != nil {
		return nil, 0, err
	}
	f, err := h5.OpenRW(path)
	if err != nil {
		return nil, 0, err
	}
	t := &Trace{f: f, ranks: info.Segment.WorldSize, width: width, start: info.Segment.Start, tables: map[string]*h5.Table{}}
	for _, tt := range traceTables {
		if t.tables[tt.name], err = f.OpenTable("trace/" + tt.name); err != nil {
			f.Close()
			return nil, 0, err
		}
	}
	return t, dropped, nil
}

func checkTraceInfo(path string, info TraceInfo) error {
	switch {
	case info.RunID == "":
		return fmt.Errorf("runs: trace %s: no run id", path)
	case info.Segment.WorldSize <= 0:
		return fmt.Errorf("runs: trace %s: world size %d", path, info.Segment.WorldSize)
	}
	return nil
}

// continuableBy says why a run runID with cfg cannot continue the trace, or
// nil: the trace must be of this schema, of the same run and model.
func (d *TraceData) continuableBy(runID string, cfg moe.TrainConfig) error {
	if d.Version < 2 || d.RunID == "" {
		return fmt.Errorf("runs: %s is a trace of schema version %d, with no run id: it cannot be told to belong to run %s (use another -trace path, or move it away)", d.Path, d.Version, runID)
	}
	if d.RunID != runID {
		return fmt.Errorf("runs: %s belongs to another run: run_id = %s in the trace, %s in this run", d.Path, d.RunID, runID)
	}
	if diffs := fixedDiffs(d.Config, cfg, "in the trace", "in this run"); len(diffs) > 0 {
		return fmt.Errorf("runs: %s, a trace of run %s, holds another model: %s", d.Path, runID, strings.Join(diffs, "; "))
	}
	return nil
}

// writeTraceHeader writes the attributes, the segments and the empty tables
// of a trace into f.
func writeTraceHeader(f *h5.File, info TraceInfo, segments []Segment, width int) (*Trace, error) {
	seg := info.Segment
	t := &Trace{f: f, ranks: seg.WorldSize, width: width, start: seg.Start, tables: map[string]*h5.Table{}}
	attrs := []struct {
		name  string
		value any
	}{
		{"format", TraceFormat}, {"version", TraceVersion}, {"run_id", info.RunID}, {"go_version", seg.GoVersion},
		{"world_size", seg.WorldSize}, {"nodes", seg.Nodes}, {"rank_columns", width}, {"segment_count", len(segments)},
		{"steps", seg.Steps}, {"start_step", seg.StartStep}, {"resumed_from", seg.Checkpoint},
		{"command", seg.Command}, {"start_time", seg.Start.UTC().Format(time.RFC3339Nano)},
	}
	for _, a := range attrs {
		if err := f.SetAttr("/", a.name, a.value); err != nil {
			return nil, err
		}
	}
	if err := writeConfigAttrs(f, "/", info.Config); err != nil {
		return nil, err
	}
	if err := writeDeviceAttrs(f, "/", seg.Device); err != nil {
		return nil, err
	}
	for i, s := range segments {
		if err := writeSegment(f, i, s); err != nil {
			return nil, err
		}
	}
	for _, tt := range traceTables {
		var row []int
		switch tt.row {
		case "experts":
			row = []int{info.Config.Experts}
		case "ranks":
			row = []int{width}
		case "ranks x ranks":
			row = []int{width, width}
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
	return t, nil
}

// segmentPath is the group of segment i (0-based).
func segmentPath(i int) string { return fmt.Sprintf("segments/%04d", i) }

func writeSegment(f *h5.File, i int, s Segment) error {
	attrs := []struct {
		name  string
		value any
	}{
		{"start_step", s.StartStep}, {"checkpoint", s.Checkpoint}, {"dropped_rows", s.DroppedRows}, {"steps", s.Steps},
		{"world_size", s.WorldSize}, {"nodes", s.Nodes}, {"hosts", s.Hosts},
		{"mode", s.Mode.String()}, {"dtype", s.DType.String()}, {"tokens", s.Tokens},
		{"command", s.Command}, {"start_time", s.Start.UTC().Format(time.RFC3339Nano)}, {"go_version", s.GoVersion},
	}
	for _, a := range attrs {
		if err := f.SetAttr(segmentPath(i), a.name, a.value); err != nil {
			return err
		}
	}
	return writeDeviceAttrs(f, segmentPath(i), s.Device)
}

func readSegment(f *h5.File, name string) (Segment, error) {
	var s Segment
	g := "segments/" + name
	ints := []struct {
		name string
		dst  *int64
	}{{"start_step", &s.StartStep}, {"dropped_rows", &s.DroppedRows}, {"steps", &s.Steps}}
	for _, a := range ints {
		v, err := f.AttrInt64(g, a.name)
		if err != nil {
			return s, err
		}
		*a.dst = v
	}
	for _, a := range []struct {
		name string
		dst  *int
	}{{"world_size", &s.WorldSize}, {"nodes", &s.Nodes}, {"tokens", &s.Tokens}} {
		v, err := f.AttrInt64(g, a.name)
		if err != nil {
			return s, err
		}
		*a.dst = int(v)
	}
	strs := map[string]string{}
	for _, name := range []string{"checkpoint", "hosts", "mode", "dtype", "command", "start_time", "go_version"} {
		v, err := f.AttrString(g, name)
		if err != nil {
			return s, err
		}
		strs[name] = v
	}
	s.Checkpoint, s.Hosts, s.Command, s.GoVersion = strs["checkpoint"], strs["hosts"], strs["command"], strs["go_version"]
	var err error
	if s.Mode, err = ep.ParseMode(strs["mode"]); err != nil {
		return s, err
	}
	if s.DType, err = moe.ParseDType(strs["dtype"]); err != nil {
		return s, err
	}
	if s.Start, err = time.Parse(time.RFC3339Nano, strs["start_time"]); err != nil {
		return s, err
	}
	s.Device, err = readDeviceAttrs(f, g)
	return s, err
}

// Path is the trace file's path.
func (t *Trace) Path() string { return t.f.Path() }

// Append adds the row of one step; it reaches the file at the next Flush.
func (t *Trace) Append(s *moe.StepStats, end time.Time) error {
	if len(s.DispatchUS) != t.ranks || len(s.CombineUS) != t.ranks || len(s.BytesSent) != t.ranks {
		return fmt.Errorf("runs: trace %s: step %d has statistics of %d ranks, this segment has %d", t.Path(), s.Step, len(s.DispatchUS), t.ranks)
	}
	if len(s.SyncUS) != t.ranks || len(s.SyncBytes) != t.ranks {
		return fmt.Errorf("runs: trace %s: step %d has sync statistics of %d ranks, this segment has %d", t.Path(), s.Step, len(s.SyncUS), t.ranks)
	}
	if R2 := t.ranks * t.ranks; len(s.WaitUS) != R2 || len(s.PeerSent) != R2 || len(s.PeerRecv) != R2 {
		return fmt.Errorf("runs: trace %s: step %d has per-peer statistics of %d, %d and %d values, this segment's %d ranks want %d", t.Path(), s.Step, len(s.WaitUS), len(s.PeerSent), len(s.PeerRecv), t.ranks, R2)
	}
	copies, copyBytes, copyUS := s.Copies, s.CopyBytes, s.CopyUS
	if len(copies) == 0 && len(copyBytes) == 0 && len(copyUS) == 0 { // not measured
		copies, copyBytes, copyUS = padInts(nil, t.ranks), padInts(nil, t.ranks), padFloats(nil, t.ranks)
	}
	if len(copies) != t.ranks || len(copyBytes) != t.ranks || len(copyUS) != t.ranks {
		return fmt.Errorf("runs: trace %s: step %d has copy statistics of %d, %d and %d ranks, this segment has %d", t.Path(), s.Step, len(copies), len(copyBytes), len(copyUS), t.ranks)
	}
	rows := map[string]any{
		"copies": padInts(copies, t.width), "copy_bytes": padInts(copyBytes, t.width), "copy_us": padFloats(copyUS, t.width),
		"step": []int64{s.Step}, "loss": []float64{s.Loss}, "aux_loss": []float64{s.AuxLoss},
		"tokens_per_expert": s.TokensPerExpert, "dispatch_us": padFloats(s.DispatchUS, t.width),
		"combine_us": padFloats(s.CombineUS, t.width), "bytes_sent": padInts(s.BytesSent, t.width),
		"wall_time": []float64{end.Sub(t.start).Seconds()},
		"sync_us":   padFloats(s.SyncUS, t.width), "sync_bytes": padInts(s.SyncBytes, t.width),
		"step_us":         []float64{float64(s.Elapsed.Nanoseconds()) / 1e3},
		"wait_us":         padMatrix(s.WaitUS, t.ranks, t.width, math.NaN()),
		"peer_sent_bytes": padMatrix(s.PeerSent, t.ranks, t.width, -1),
		"peer_recv_bytes": padMatrix(s.PeerRecv, t.ranks, t.width, -1),
	}
	for _, tt := range traceTables {
		if err := t.tables[tt.name].Append(rows[tt.name]); err != nil {
			return err
		}
	}
	return nil
}

// appendRows appends the first n rows of d, widening its per-rank rows to
// the trace's width.
func (t *Trace) appendRows(d *TraceData, n int) error {
	E, W := d.Config.Experts, d.RankColumns
	widen := func(v []float64) []float64 {
		out := make([]float64, 0, n*t.width)
		for i := 0; i < n; i++ {
			out = append(out, padFloats(v[i*W:(i+1)*W], t.width)...)
		}
		return out
	}
	widenInts := func(v []int64) []int64 {
		out := make([]int64, 0, n*t.width)
		for i := 0; i < n; i++ {
			out = append(out, padInts(v[i*W:(i+1)*W], t.width)...)
		}
		return out
	}
	rows := map[string]any{
		"step": d.Step[:n], "loss": d.Loss[:n], "aux_loss": d.AuxLoss[:n], "tokens_per_expert": d.TokensPerExpert[:n*E],
		"dispatch_us": widen(d.DispatchUS), "combine_us": widen(d.CombineUS), "bytes_sent": widenInts(d.BytesSent), "wall_time": d.WallTime[:n],
		"sync_us": widen(d.SyncUS), "sync_bytes": widenInts(d.SyncBytes), "step_us": d.StepUS[:n],
		"wait_us":         widenMatrices(d.WaitUS, n, W, t.width, math.NaN()),
		"peer_sent_bytes": widenMatrices(d.PeerSent, n, W, t.width, -1),
		"peer_recv_bytes": widenMatrices(d.PeerRecv, n, W, t.width, -1),
		"copies":          widenInts(d.Copies), "copy_bytes": widenInts(d.CopyBytes), "copy_us": widen(d.CopyUS),
	}
	for _, tt := range traceTables {
		if err := t.tables[tt.name].Append(rows[tt.name]); err != nil {
			return err
		}
	}
	return nil
}

// padFloats returns v extended with NaN to n values (v itself if long enough).
func padFloats(v []float64, n int) []float64 {
	if len(v) >= n {
		return v
	}
	out := append(make([]float64, 0, n), v...)
	for len(out) < n {
		out = append(out, math.NaN())
	}
	return out
}

// padInts returns v extended with -1 to n values.
func padInts(v []int64, n int) []int64 {
	if len(v) >= n {
		return v
	}
	out := append(make([]int64, 0, n), v...)
	for len(out) < n {
		out = append(out, -1)
	}
	return out
}

// padMatrix returns the n x n matrix m (row-major) as a w x w one, filled
// out with fill (m itself if n == w).
func padMatrix[T any](m []T, n, w int, fill T) []T {
	if n == w {
		return m
	}
	out := make([]T, w*w)
	for i := range out {
		out[i] = fill
	}
	for i := 0; i < n; i++ {
		copy(out[i*w:i*w+n], m[i*n:(i+1)*n])
	}
	return out
}

// widenMatrices returns the first rows of v, each an n x n matrix, as w x w
// ones filled out with fill.
func widenMatrices[T any](v []T, rows, n, w int, fill T) []T {
	out := make([]T, 0, rows*w*w)
	for i := 0; i < rows; i++ {
		out = append(out, padMatrix(v[i*n*n:(i+1)*n*n], n, w, fill)...)
	}
	return out
}

// Flush hands the rows appended so far to the operating system: a process
// killed after it leaves a file that h5dump and ReadTrace read.
func (t *Trace) Flush() error { return t.f.Flush() }

// Close flushes and closes the file.
func (t *Trace) Close() error { return t.f.Close() }

// TraceData is a trace read back.
type TraceData struct {
	Path    string
	Version int
	RunID   string // "" in version 1 traces
	// Config is the run's configuration, with the latest segment's mode,
	// dtype and tokens; WorldSize, Nodes, StartStep, ResumedFrom and
	// StartTime are the latest segment's too (Segments has them all).
	Config      moe.TrainConfig
	WorldSize   int
	Nodes       int
	StartStep   int64
	ResumedFrom string
	StartTime   string
	// RankColumns is the row length of the per-rank tables: the largest
	// world size of the run's segments. A step of a segment with fewer
	// ranks has NaN (and -1 in BytesSent) in the columns past its ranks.
	RankColumns int
	Segments    []Segment

	Step            []int64
	Loss, AuxLoss   []float64
	TokensPerExpert []int64   // [steps][Experts]
	DispatchUS      []float64 // [steps][RankColumns]
	CombineUS       []float64 // [steps][RankColumns]
	BytesSent       []int64   // [steps][RankColumns]
	WallTime        []float64
	// The data-parallel gradient sync (schema version 3; NaN, and -1 in
	// SyncBytes, in rows read from older files).
	SyncUS    []float64 // [steps][RankColumns]
	SyncBytes []int64   // [steps][RankColumns]
	StepUS    []float64 // [steps]: rank 0's time in the step
	// Per pair of ranks (schema version 4; NaN, and -1 in the bytes, in rows
	// read from older files), [steps][RankColumns][RankColumns], [i][j] for
	// rank i and its peer j: the microseconds i waited for j in the step's
	// ep calls, and the token-row bytes i sent to and received from j.
	WaitUS             []float64
	PeerSent, PeerRecv []int64
	// The copies between the host and the ep group's memory (schema
	// version 5; -1, and NaN in CopyUS, in rows read from older files),
	// [steps][RankColumns]: their number, bytes and microseconds.
	Copies, CopyBytes []int64
	CopyUS            []float64
	// Device is the latest segment's (Segments has each one's).
	Device moe.Device
}

// RowsUpTo is the number of leading rows of steps up to step.
func (d *TraceData) RowsUpTo(step int64) int {
	n := 0
	for n < len(d.Step) && d.Step[n] <= step {
		n++
	}
	return n
}

// SegmentOf returns the index of the segment that wrote row i: the last one
// that started before the row's step.
func (d *TraceData) SegmentOf(i int) int {
	seg := 0
	for j, s := range d.Segments {
		if s.StartStep < d.Step[i] {
			seg = j
		}
	}
	return seg
}

// ReadTrace reads a trace file (schema version 1 to 5). A file cut short by
// a killed writer reads up to its last flush; tables of unequal length (a
// kill between two appends) are cut to the shortest.
func ReadTrace(path string) (*TraceData, error) {
	f, err := h5.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	bad := func(err error) error { return fmt.Errorf("runs: %s is not a readable trace: %w", path, err) }
	if format, err := f.AttrString("/", "format"); err != nil || format != TraceFormat {
		return nil, bad(fmt.Errorf("its format attribute is %q, want %q (%v)", format, TraceFormat, err))
	}
	d := &TraceData{Path: path}
	if d.Config, err = readConfigAttrs(f, "/"); err != nil {
		return nil, bad(err)
	}
	ints := map[string]*int64{"start_step": &d.StartStep}
	var ws, nodes, version int64
	ints["world_size"], ints["nodes"], ints["version"] = &ws, &nodes, &version
	for name, dst := range ints {
		if *dst, err = f.AttrInt64("/", name); err != nil {
			return nil, bad(err)
		}
	}
	d.WorldSize, d.Nodes, d.Version = int(ws), int(nodes), int(version)
	if d.Version < 1 || d.Version > TraceVersion {
		return nil, bad(fmt.Errorf("schema version %d, this program reads versions 1 to %d", d.Version, TraceVersion))
	}
	if d.ResumedFrom, err = f.AttrString("/", "resumed_from"); err != nil {
		return nil, bad(err)
	}
	if d.StartTime, err = f.AttrString("/", "start_time"); err != nil {
		return nil, bad(err)
	}
	d.RankColumns = d.WorldSize
	if d.Version >= 2 {
		if err := readTraceV2(f, d); err != nil {
			return nil, bad(err)
		}
	} else {
		s := Segment{StartStep: d.StartStep, Checkpoint: d.ResumedFrom, WorldSize: d.WorldSize, Nodes: d.Nodes,
			Mode: d.Config.Mode, DType: d.Config.DType, Tokens: d.Config.Tokens, Device: moe.Device{Backend: "cpu"}}
		s.Steps, _ = f.AttrInt64("/", "steps")
		s.Command, _ = f.AttrString("/", "command")
		s.GoVersion, _ = f.AttrString("/", "go_version")
		s.Start, _ = time.Parse(time.RFC3339Nano, d.StartTime)
		d.Segments = []Segment{s}
	}
	f64 := map[string]*[]float64{"loss": &d.Loss, "aux_loss": &d.AuxLoss, "dispatch_us": &d.DispatchUS,
		"combine_us": &d.CombineUS, "wall_time": &d.WallTime, "sync_us": &d.SyncUS, "step_us": &d.StepUS, "wait_us": &d.WaitUS,
		"copy_us": &d.CopyUS}
	i64 := map[string]*[]int64{"step": &d.Step, "tokens_per_expert": &d.TokensPerExpert, "bytes_sent": &d.BytesSent,
		"sync_bytes": &d.SyncBytes, "peer_sent_bytes": &d.PeerSent, "peer_recv_bytes": &d.PeerRecv,
		"copies": &d.Copies, "copy_bytes": &d.CopyBytes}
	rows := -1
	for _, tt := range traceTables {
		if tt.since > d.Version {
			continue // filled in below
		}
		var shape []int
		if dst, ok := f64[tt.name]; ok {
			*dst, shape, err = f.ReadFloat64("trace/" + tt.name)
		} else {
			*i64[tt.name], shape, err = f.ReadInt64("trace/" + tt.name)
		}
		if err != nil {
			return nil, bad(err)
		}
		want := map[string][]int{"": {}, "experts": {d.Config.Experts}, "ranks": {d.RankColumns},
			"ranks x ranks": {d.RankColumns, d.RankColumns}}[tt.row]
		if len(shape) != 1+len(want) || !slices.Equal(shape[1:], want) {
			return nil, bad(fmt.Errorf("/trace/%s has shape %v, want [rows %s]", tt.name, shape, strings.Trim(fmt.Sprint(want), "[]")))
		}
		if rows < 0 || shape[0] < rows {
			rows = shape[0]
		}
	}
	E, W := d.Config.Experts, d.RankColumns
	if d.Version < 3 { // no sync statistics: unknown
		d.SyncUS, d.SyncBytes, d.StepUS = make([]float64, rows*W), make([]int64, rows*W), make([]float64, rows)
		for i := range d.SyncUS {
			d.SyncUS[i], d.SyncBytes[i] = math.NaN(), -1
		}
		for i := range d.StepUS {
			d.StepUS[i] = math.NaN()
		}
	}
	if d.Version < 4 { // no per-peer statistics: unknown
		d.WaitUS, d.PeerSent, d.PeerRecv = make([]float64, rows*W*W), make([]int64, rows*W*W), make([]int64, rows*W*W)
		for i := range d.WaitUS {
			d.WaitUS[i], d.PeerSent[i], d.PeerRecv[i] = math.NaN(), -1, -1
		}
	}
	if d.Version < 5 { // no copy statistics: unknown
		d.Copies, d.CopyBytes, d.CopyUS = make([]int64, rows*W), make([]int64, rows*W), make([]float64, rows*W)
		for i := range d.Copies {
			d.Copies[i], d.CopyBytes[i], d.CopyUS[i] = -1, -1, math.NaN()
		}
	}
	d.Copies, d.CopyBytes, d.CopyUS = d.Copies[:rows*W], d.CopyBytes[:rows*W], d.CopyUS[:rows*W]
	d.Device = d.Segments[len(d.Segments)-1].Device
	d.Step, d.Loss, d.AuxLoss, d.WallTime = d.Step[:rows], d.Loss[:rows], d.AuxLoss[:rows], d.WallTime[:rows]
	d.TokensPerExpert = d.TokensPerExpert[:rows*E]
	d.DispatchUS, d.CombineUS, d.BytesSent = d.DispatchUS[:rows*W], d.CombineUS[:rows*W], d.BytesSent[:rows*W]
	d.SyncUS, d.SyncBytes, d.StepUS = d.SyncUS[:rows*W], d.SyncBytes[:rows*W], d.StepUS[:rows]
	d.WaitUS, d.PeerSent, d.PeerRecv = d.WaitUS[:rows*W*W], d.PeerSent[:rows*W*W], d.PeerRecv[:rows*W*W]
	return d, nil
}

// readTraceV2 reads what version 2 added: the run id, the per-rank width and
// the segments.
func readTraceV2(f *h5.File, d *TraceData) error {
	var err error
	if d.RunID, err = f.AttrString("/", "run_id"); err != nil {
		return err
	}
	w, err := f.AttrInt64("/", "rank_columns")
	if err != nil {
		return err
	}
	d.RankColumns = int(w)
	if d.RankColumns < d.WorldSize {
		return fmt.Errorf("rank_columns = %d is less than world_size = %d", d.RankColumns, d.WorldSize)
	}
	names, err := f.List("segments")
	if err != nil {
		return err
	}
	for _, n := range names {
		if _, err := strconv.Atoi(n); err != nil {
			return fmt.Errorf("/segments/%s: not a segment number", n)
		}
	}
	slices.SortFunc(names, func(a, b string) int {
		x, _ := strconv.Atoi(a)
		y, _ := strconv.Atoi(b)
		return x - y
	})
	for _, n := range names {
		s, err := readSegment(f, n)
		if err != nil {
			return fmt.Errorf("/segments/%s: %w", n, err)
		}
		d.Segments = append(d.Segments, s)
	}
	if len(d.Segments) == 0 {
		return errors.New("no segments")
	}
	return nil
}
