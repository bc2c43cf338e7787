package study

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"strings"
)

// Record is one measured configuration: the fields of one JSON line of
// ep-bench -json (its Result), and the job step that produced it.
type Record struct {
	Mode    string `json:"mode"`
	Ranks   int    `json:"ranks"`
	Nodes   int    `json:"nodes"`
	Tokens  int    `json:"tokens"`
	Hidden  int    `json:"hidden"`
	TopK    int    `json:"topk"`
	Experts int    `json:"experts"`
	DType   string `json:"dtype"`
	Iters   int    `json:"iters"`

	BytesPerRank float64 `json:"bytes_per_rank"`

	DispatchUS   float64 `json:"dispatch_us"`
	CombineUS    float64 `json:"combine_us"`
	DispatchGBps float64 `json:"dispatch_gbps"`
	CombineGBps  float64 `json:"combine_gbps"`

	AlltoallvDispatchUS   float64 `json:"alltoallv_dispatch_us"`
	AlltoallvCombineUS    float64 `json:"alltoallv_combine_us"`
	AlltoallvDispatchGBps float64 `json:"alltoallv_dispatch_gbps"`
	AlltoallvCombineGBps  float64 `json:"alltoallv_combine_gbps"`
	Speedup               float64 `json:"speedup_vs_alltoallv"`

	MemcpyGBps         float64 `json:"memcpy_gbps"`
	DispatchOfMemcpy   float64 `json:"dispatch_memcpy_frac"`
	CombineOfMemcpy    float64 `json:"combine_memcpy_frac"`
	BufferBytesPerRank int     `json:"buffer_bytes_per_rank"`

	// Step is the index of the job step that produced the record (its
	// position in the study's steps attribute); set by the collector.
	Step int `json:"-"`
}

// ElemBytes is the size of one element on the wire: 4 for f32, 2 for bf16.
func (r *Record) ElemBytes() int {
	if r.DType == "f32" {
		return 4
	}
	return 2
}

// RanksPerNode is the number of ranks on each node (ranks / nodes).
func (r *Record) RanksPerNode() int {
	if r.Nodes <= 0 {
		return r.Ranks
	}
	return r.Ranks / r.Nodes
}

// validate reports what is wrong with a record read from JSON.
func (r *Record) validate() error {
	switch {
	case r.Mode != "ll" && r.Mode != "ht":
		return fmt.Errorf("mode %q is not ll or ht", r.Mode)
	case r.DType != "f32" && r.DType != "bf16":
		return fmt.Errorf("dtype %q is not f32 or bf16", r.DType)
	case r.Ranks < 1 || r.Nodes < 1 || r.Nodes > r.Ranks || r.Ranks%r.Nodes != 0:
		return fmt.Errorf("%d ranks on %d nodes: want ranks >= 1, a multiple of nodes >= 1", r.Ranks, r.Nodes)
	case r.Tokens < 0 || r.Hidden < 1 || r.TopK < 1 || r.Experts < 1 || r.Iters < 1:
		return fmt.Errorf("tokens %d, hidden %d, topk %d, experts %d, iters %d: out of range",
			r.Tokens, r.Hidden, r.TopK, r.Experts, r.Iters)
	case r.DispatchUS <= 0 || r.CombineUS <= 0:
		return fmt.Errorf("dispatch_us %g and combine_us %g must be positive", r.DispatchUS, r.CombineUS)
	}
	return nil
}

// ParseJSONL reads ep-bench -json output: one JSON object per line. Lines
// that do not start with '{' (blank lines, a launcher's messages) are
// skipped; a line that starts with '{' and is not a valid result is an error
// naming its line number. Fields ep-bench may add later are ignored.
func ParseJSONL(r io.Reader) ([]Record, error) {
	var out []Record
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 16*1024*1024)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if !strings.HasPrefix(line, "{") {
			continue
		}
		var rec Record
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			return nil, fmt.Errorf("line %d: %w", n, err)
		}
		if err := rec.validate(); err != nil {
			return nil, fmt.Errorf("line %d: %w", n, err)
		}
		out = append(out, rec)
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	return out, nil
}
