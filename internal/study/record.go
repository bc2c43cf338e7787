package study

import (
	"bufio"
	"encoding/json"
	"fmt"
	"github.com/goep/goep/internal/benchfmt"
	"io"
	"strings"
)

// Record is one measured configuration: one JSON line of ep-bench -json,
// and the job step that produced it.
type Record = benchfmt.Record

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
		if err := rec.Validate(); err != nil {
			return nil, fmt.Errorf("line %d: %w", n, err)
		}
		out = append(out, rec)
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	return out, nil
}
