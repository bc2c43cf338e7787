package h5

import (
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goep/goep/internal/mpitesting"
)

// dumped is what h5dump printed for one dataset or attribute.
type dumped struct {
	dtype   string   // first word after DATATYPE: "H5T_IEEE_F64LE", "H5T_STRING"
	space   string   // the DATASPACE line after the keyword
	dims    []string // current dimensions; nil for SCALAR
	maxdims []string // maximum dimensions ("H5S_UNLIMITED" for an unlimited one)
	values  []string // the DATA block's values in order, strings unquoted
}

// h5dump runs the real h5dump tool with args (e.g. "-d", "/x" or "-a",
// "/x/attr") on path and parses the first object it prints.
func h5dump(t *testing.T, path string, args ...string) dumped {
	t.Helper()
	mpitesting.RequireTool(t, "h5dump")
	all := append([]string{"-w", "0"}, args...)
	out, err := exec.Command("h5dump", append(all, path)...).CombinedOutput()
	require.NoError(t, err, "h5dump %v %s:\n%s", args, path, out)
	return parseDump(t, string(out))
}

// parseDump parses h5dump's text: the first DATATYPE, DATASPACE and DATA
// block (a dataset's own, before its attributes).
func parseDump(t *testing.T, out string) dumped {
	t.Helper()
	var d dumped
	inData := false
	for _, line := range strings.Split(out, "\n") {
		s := strings.TrimSpace(line)
		switch {
		case inData && s == "}":
			return d
		case inData:
			if i := strings.Index(s, "):"); strings.HasPrefix(s, "(") && i >= 0 {
				s = s[i+2:]
			}
			d.values = append(d.values, splitValues(s)...)
		case d.dtype == "" && strings.HasPrefix(s, "DATATYPE"):
			d.dtype = strings.Fields(s)[1]
		case d.space == "" && strings.HasPrefix(s, "DATASPACE"):
			d.space = strings.TrimSpace(strings.TrimPrefix(s, "DATASPACE"))
			if strings.HasPrefix(d.space, "SIMPLE") {
				// SIMPLE { ( 2, 3 ) / ( H5S_UNLIMITED, 3 ) }
				parts := strings.Split(strings.Trim(d.space, "SIMPLE{} "), "/")
				require.Len(t, parts, 2, "DATASPACE line %q", s)
				d.dims = splitDims(parts[0])
				d.maxdims = splitDims(parts[1])
			}
		case d.space != "" && s == "DATA {":
			inData = true
		}
	}
	require.Failf(t, "no DATA block in h5dump output", "%s", out)
	return d
}

func splitDims(s string) []string {
	var dims []string
	for _, f := range strings.Split(strings.Trim(s, "() "), ",") {
		dims = append(dims, strings.TrimSpace(f))
	}
	return dims
}

// splitValues splits one line of a DATA block into values, keeping commas
// inside quoted strings and unquoting them.
func splitValues(s string) []string {
	var vals []string
	for s = strings.TrimSpace(s); s != ""; s = strings.TrimSpace(s) {
		if s[0] == '"' {
			end := 1
			for end < len(s) && s[end] != '"' {
				if s[end] == '\\' {
					end++
				}
				end++
			}
			v, err := strconv.Unquote(s[:end+1])
			if err != nil {
				v = s[1:end]
			}
			vals = append(vals, v)
			s = strings.TrimPrefix(strings.TrimSpace(s[end+1:]), ",")
			continue
		}
		i := strings.IndexByte(s, ',')
		if i < 0 {
			vals = append(vals, s)
			break
		}
		vals = append(vals, strings.TrimSpace(s[:i]))
		s = s[i+1:]
	}
	return vals
}

// formatValues renders a supported slice as h5dump would print its values,
// for comparison: integers in decimal, floats parsed back below.
func formatValues(data any) []string {
	var out []string
	switch s := data.(type) {
	case []float64:
		for _, v := range s {
			out = append(out, strconv.FormatFloat(v, 'g', -1, 64))
		}
	case []float32:
		for _, v := range s {
			out = append(out, strconv.FormatFloat(float64(v), 'g', -1, 32))
		}
	case []int64:
		for _, v := range s {
			out = append(out, strconv.FormatInt(v, 10))
		}
	case []int32:
		for _, v := range s {
			out = append(out, strconv.FormatInt(int64(v), 10))
		}
	case []uint64:
		for _, v := range s {
			out = append(out, strconv.FormatUint(v, 10))
		}
	case []uint8:
		for _, v := range s {
			out = append(out, strconv.FormatUint(uint64(v), 10))
		}
	}
	return out
}

// assertSameValues compares h5dump's values with want's, numerically for
// floats (h5dump's float format differs from Go's).
func assertSameValues(t *testing.T, want any, got []string) {
	t.Helper()
	exp := formatValues(want)
	require.Len(t, got, len(exp))
	for i := range exp {
		switch want.(type) {
		case []float64, []float32:
			g, err := strconv.ParseFloat(got[i], 64)
			require.NoError(t, err, "value %d: %q", i, got[i])
			e, _ := strconv.ParseFloat(exp[i], 64)
			assert.Equal(t, e, g, "value %d", i)
		default:
			assert.Equal(t, exp[i], got[i], "value %d", i)
		}
	}
}

// TestH5dumpReadsTables: what Append writes, h5dump reads back, with the
// unlimited first dimension, for every element type.
func TestH5dumpReadsTables(t *testing.T) {
	mpitesting.RequireTool(t, "h5dump")
	path := filepath.Join(t.TempDir(), "tables.h5")
	f, err := Create(path)
	require.NoError(t, err)
	for _, tc := range typeCases {
		tb, err := f.CreateTable("tables/"+tc.dtype.String(), tc.dtype, []int{2, 3}, 4)
		require.NoError(t, err)
		require.NoError(t, tb.Append(tc.first))
		require.NoError(t, tb.Append(tc.second))
	}
	require.NoError(t, f.Close())

	for _, tc := range typeCases {
		t.Run(tc.dtype.String(), func(t *testing.T) {
			d := h5dump(t, path, "-d", "/tables/"+tc.dtype.String())
			assert.Equal(t, tc.h5type, d.dtype)
			assert.Equal(t, "SIMPLE { ( 3, 2, 3 ) / ( H5S_UNLIMITED, 2, 3 ) }", d.space)
			assert.Equal(t, []string{"3", "2", "3"}, d.dims)
			assert.Equal(t, []string{"H5S_UNLIMITED", "2", "3"}, d.maxdims)
			assertSameValues(t, tc.concat(), d.values)
		})
	}
}

// TestH5dumpReadsDatasets: fixed datasets of every type and shape, scalar and
// empty ones included.
func TestH5dumpReadsDatasets(t *testing.T) {
	mpitesting.RequireTool(t, "h5dump")
	path := filepath.Join(t.TempDir(), "fixed.h5")
	f, err := Create(path)
	require.NoError(t, err)
	for _, tc := range typeCases {
		require.NoError(t, f.WriteDataset("ckpt/"+tc.dtype.String(), []int{3, 2, 3}, tc.concat()))
	}
	require.NoError(t, f.WriteDataset("scalar", nil, []int64{-7}))
	require.NoError(t, f.WriteDataset("empty", []int{0, 4}, []float32{}))
	require.NoError(t, f.Close())

	for _, tc := range typeCases {
		t.Run(tc.dtype.String(), func(t *testing.T) {
			d := h5dump(t, path, "-d", "/ckpt/"+tc.dtype.String())
			assert.Equal(t, tc.h5type, d.dtype)
			assert.Equal(t, "SIMPLE { ( 3, 2, 3 ) / ( 3, 2, 3 ) }", d.space)
			assertSameValues(t, tc.concat(), d.values)
		})
	}
	d := h5dump(t, path, "-d", "/scalar")
	assert.Equal(t, "SCALAR", d.space)
	assert.Equal(t, []string{"-7"}, d.values)
	d = h5dump(t, path, "-d", "/empty")
	assert.Equal(t, "H5T_IEEE_F32LE", d.dtype)
	assert.Equal(t, []string{"0", "4"}, d.dims)
	assert.Empty(t, d.values)
}

// TestH5dumpReadsAttributes: every attribute type, on the root, a group and
// a dataset.
func TestH5dumpReadsAttributes(t *testing.T) {
	mpitesting.RequireTool(t, "h5dump")
	path := filepath.Join(t.TempDir(), "attrs.h5")
	f, err := Create(path)
	require.NoError(t, err)
	tb, err := f.CreateTable("results/ll/latency", Float64, nil, 0)
	require.NoError(t, err)
	require.NoError(t, tb.Append([]float64{1.5}))
	for _, obj := range []string{"", "results/ll", "results/ll/latency"} {
		for _, a := range attrCases {
			require.NoError(t, f.SetAttr(obj, a.name, a.value))
		}
	}
	require.NoError(t, f.Close())

	for _, obj := range []string{"", "/results/ll", "/results/ll/latency"} {
		for _, a := range attrCases {
			t.Run(obj+"@"+a.name, func(t *testing.T) {
				d := h5dump(t, path, "-a", obj+"/"+a.name)
				assert.Equal(t, a.h5type, d.dtype)
				assert.Equal(t, a.space, d.space)
				assert.Equal(t, a.dumped, d.values)
			})
		}
	}
}
