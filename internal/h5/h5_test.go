package h5

import (
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// typeCase is one element type with 18 test values: first (two rows of shape
// [2,3]) and second (one more row), and its reader.
type typeCase struct {
	dtype  DType
	h5type string // what h5dump prints as the DATATYPE
	first  any
	second any
	all    any
	read   func(f *File, name string) (any, []int, error)
	// wrong is a reader of another type, which must refuse the dataset.
	wrong func(f *File, name string) (any, []int, error)
}

func (tc typeCase) concat() any { return tc.all }

func mkCase[T any](d DType, h5type string, vals []T, read func(*File, string) ([]T, []int, error)) typeCase {
	if len(vals) != 18 {
		panic(fmt.Sprintf("%v: %d values, want 18", d, len(vals)))
	}
	return typeCase{
		dtype: d, h5type: h5type,
		first: vals[:12], second: vals[12:18], all: vals,
		read: func(f *File, name string) (any, []int, error) { return read(f, name) },
	}
}

func seq[T any](n int, f func(i int) T, extra ...T) []T {
	out := append([]T{}, extra...)
	for i := len(out); i < n; i++ {
		out = append(out, f(i))
	}
	return out
}

var typeCases = func() []typeCase {
	cs := []typeCase{
		mkCase(Float64, "H5T_IEEE_F64LE", seq(18, func(i int) float64 { return float64(i)*0.25 - 2 }, 1e300, -0.5, math.SmallestNonzeroFloat64), (*File).ReadFloat64),
		mkCase(Float32, "H5T_IEEE_F32LE", seq(18, func(i int) float32 { return float32(i)*0.5 - 3 }, 1e30, -0.125), (*File).ReadFloat32),
		mkCase(Int64, "H5T_STD_I64LE", seq(18, func(i int) int64 { return int64(i)*1000 - 5 }, math.MinInt64, math.MaxInt64), (*File).ReadInt64),
		mkCase(Int32, "H5T_STD_I32LE", seq(18, func(i int) int32 { return int32(i)*7 - 50 }, math.MinInt32, math.MaxInt32), (*File).ReadInt32),
		mkCase(Uint64, "H5T_STD_U64LE", seq(18, func(i int) uint64 { return uint64(i) << 40 }, math.MaxUint64), (*File).ReadUint64),
		mkCase(Uint8, "H5T_STD_U8LE", seq(18, func(i int) uint8 { return uint8(i * 13) }, 255, 0), (*File).ReadUint8),
	}
	// Each type's wrong reader is the next type's reader.
	for i := range cs {
		cs[i].wrong = cs[(i+1)%len(cs)].read
	}
	return cs
}()

func TestTableRoundTrip(t *testing.T) {
	for _, tc := range typeCases {
		t.Run(tc.dtype.String(), func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "t.h5")
			f, err := Create(path)
			require.NoError(t, err)
			// chunkRows 2: three rows span two chunks.
			tb, err := f.CreateTable("trace/x", tc.dtype, []int{2, 3}, 2)
			require.NoError(t, err)
			assert.Equal(t, 0, tb.Len())
			assert.Equal(t, "/trace/x", tb.Name())
			assert.Equal(t, tc.dtype, tb.DType())
			assert.Equal(t, []int{2, 3}, tb.RowShape())

			// An empty table reads as no data, shape [0 2 3].
			got, shape, err := tc.read(f, "trace/x")
			require.NoError(t, err)
			assert.Equal(t, []int{0, 2, 3}, shape)
			assert.Equal(t, numValues(got), 0)

			require.NoError(t, tb.Append(tc.first))
			assert.Equal(t, 2, tb.Len())
			require.NoError(t, tb.Append(tc.second))
			assert.Equal(t, 3, tb.Len())

			// Read while the table is open, then after reopening.
			got, shape, err = tc.read(f, "/trace/x")
			require.NoError(t, err)
			assert.Equal(t, []int{3, 2, 3}, shape)
			assert.Equal(t, tc.all, got)
			require.NoError(t, f.Close())

			f, err = Open(path)
			require.NoError(t, err)
			got, shape, err = tc.read(f, "trace/x")
			require.NoError(t, err)
			assert.Equal(t, []int{3, 2, 3}, shape)
			assert.Equal(t, tc.all, got)
			_, _, err = tc.wrong(f, "trace/x")
			assert.ErrorIs(t, err, ErrType)
			require.NoError(t, f.Close())

			// Append to the existing table from OpenRW.
			f, err = OpenRW(path)
			require.NoError(t, err)
			tb, err = f.OpenTable("trace/x")
			require.NoError(t, err)
			assert.Equal(t, 3, tb.Len())
			assert.Equal(t, []int{2, 3}, tb.RowShape())
			again, err := f.OpenTable("/trace/x/")
			require.NoError(t, err)
			assert.Same(t, tb, again)
			require.NoError(t, tb.Append(tc.second))
			assert.Equal(t, 4, tb.Len())
			require.NoError(t, f.Close())

			f, err = Open(path)
			require.NoError(t, err)
			defer f.Close()
			got, shape, err = tc.read(f, "trace/x")
			require.NoError(t, err)
			assert.Equal(t, []int{4, 2, 3}, shape)
			assert.Equal(t, concatAny(tc.all, tc.second), got)
		})
	}
}

func numValues(v any) int { return len(formatValues(v)) }

// concatAny appends b to a copy of a (same slice type).
func concatAny(a, b any) any {
	switch x := a.(type) {
	case []float64:
		return append(append([]float64{}, x...), b.([]float64)...)
	case []float32:
		return append(append([]float32{}, x...), b.([]float32)...)
	case []int64:
		return append(append([]int64{}, x...), b.([]int64)...)
	case []int32:
		return append(append([]int32{}, x...), b.([]int32)...)
	case []uint64:
		return append(append([]uint64{}, x...), b.([]uint64)...)
	case []uint8:
		return append(append([]uint8{}, x...), b.([]uint8)...)
	}
	panic(fmt.Sprintf("concatAny: %T", a))
}

func TestTableOfScalars(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s.h5")
	f, err := Create(path)
	require.NoError(t, err)
	defer f.Close()
	tb, err := f.CreateTable("loss", Float32, nil, 0)
	require.NoError(t, err)
	for step := range 100 {
		require.NoError(t, tb.Append([]float32{float32(step)}))
	}
	require.NoError(t, tb.Append([]float32{}))
	got, shape, err := f.ReadFloat32("loss")
	require.NoError(t, err)
	assert.Equal(t, []int{100}, shape)
	assert.Equal(t, seq(100, func(i int) float32 { return float32(i) }), got)
}

func TestDatasetRoundTrip(t *testing.T) {
	shapes := [][]int{{18}, {3, 6}, {3, 2, 3}, {1, 1, 18}}
	for _, tc := range typeCases {
		t.Run(tc.dtype.String(), func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "d.h5")
			f, err := Create(path)
			require.NoError(t, err)
			for i, s := range shapes {
				require.NoError(t, f.WriteDataset(fmt.Sprintf("ckpt/layer%d/w", i), s, tc.all))
			}
			require.NoError(t, f.Close())

			f, err = Open(path)
			require.NoError(t, err)
			defer f.Close()
			for i, s := range shapes {
				name := fmt.Sprintf("ckpt/layer%d/w", i)
				got, shape, err := tc.read(f, name)
				require.NoError(t, err)
				assert.Equal(t, s, shape)
				assert.Equal(t, tc.all, got)
				dt, shape, err := f.DatasetInfo(name)
				require.NoError(t, err)
				assert.Equal(t, tc.dtype, dt)
				assert.Equal(t, s, shape)
				_, _, err = tc.wrong(f, name)
				require.ErrorIs(t, err, ErrType)
				assert.Contains(t, err.Error(), "dataset is "+tc.dtype.String())
			}
		})
	}
}

func TestScalarAndEmptyDatasets(t *testing.T) {
	f, err := Create(filepath.Join(t.TempDir(), "s.h5"))
	require.NoError(t, err)
	defer f.Close()
	require.NoError(t, f.WriteDataset("step", nil, []int64{42}))
	require.NoError(t, f.WriteDataset("none", []int{0}, []uint8{}))
	require.NoError(t, f.WriteDataset("none2", []int{3, 0}, []float64(nil)))
	v, shape, err := f.ReadInt64("step")
	require.NoError(t, err)
	assert.Equal(t, []int64{42}, v)
	assert.Equal(t, []int{}, shape)
	b, shape, err := f.ReadUint8("none")
	require.NoError(t, err)
	assert.Empty(t, b)
	assert.Equal(t, []int{0}, shape)
	x, shape, err := f.ReadFloat64("none2")
	require.NoError(t, err)
	assert.Empty(t, x)
	assert.Equal(t, []int{3, 0}, shape)
}

// attrCase is one attribute value and what h5dump prints for it.
type attrCase struct {
	name   string
	value  any
	h5type string
	space  string
	dumped []string
}

var attrCases = []attrCase{
	{"run", "moe-ep, 4 ranks", "H5T_STRING", "SCALAR", []string{"moe-ep, 4 ranks"}},
	{"empty", "", "H5T_STRING", "SCALAR", []string{""}},
	{"np", 4, "H5T_STD_I64LE", "SCALAR", []string{"4"}},
	{"seed", int64(-1) << 40, "H5T_STD_I64LE", "SCALAR", []string{"-1099511627776"}},
	{"lr", 0.125, "H5T_IEEE_F64LE", "SCALAR", []string{"0.125"}},
	{"shape", []int64{2, 3, math.MaxInt64}, "H5T_STD_I64LE", "SIMPLE { ( 3 ) / ( 3 ) }", []string{"2", "3", "9223372036854775807"}},
	{"dims", []int{7, -1}, "H5T_STD_I64LE", "SIMPLE { ( 2 ) / ( 2 ) }", []string{"7", "-1"}},
	{"lat", []float64{0.5, -1.25, 1e-3}, "H5T_IEEE_F64LE", "SIMPLE { ( 3 ) / ( 3 ) }", []string{"0.5", "-1.25", "0.001"}},
	{"labels", []string{"ll", "ht, big", ""}, "H5T_STRING", "SIMPLE { ( 3 ) / ( 3 ) }", []string{"ll", "ht, big", ""}},
	{"nothing", []float64{}, "H5T_IEEE_F64LE", "SIMPLE { ( 0 ) / ( 0 ) }", nil},
}

// readAttrBack reads attribute a with the reader matching its Go type.
func readAttrBack(f *File, obj string, a attrCase) (any, error) {
	switch v := a.value.(type) {
	case string:
		return f.AttrString(obj, a.name)
	case int:
		x, err := f.AttrInt64(obj, a.name)
		return int(x), err
	case int64:
		return f.AttrInt64(obj, a.name)
	case float64:
		return f.AttrFloat64(obj, a.name)
	case []int64:
		return f.AttrInt64s(obj, a.name)
	case []int:
		x, err := f.AttrInt64s(obj, a.name)
		out := make([]int, len(x))
		for i := range x {
			out[i] = int(x[i])
		}
		return out, err
	case []float64:
		return f.AttrFloat64s(obj, a.name)
	case []string:
		return f.AttrStrings(obj, a.name)
	default:
		return nil, fmt.Errorf("no reader for %T", v)
	}
}

func TestAttrRoundTrip(t *testing.T) {
	path := filepath.Join(t.TempDir(), "a.h5")
	f, err := Create(path)
	require.NoError(t, err)
	_, err = f.CreateTable("results/ll/latency", Float64, []int{2}, 0)
	require.NoError(t, err)
	require.NoError(t, f.WriteDataset("ckpt/w", []int{2}, []float32{1, 2}))
	objs := []string{"", "/", "results", "results/ll/latency", "ckpt/w", "meta/new/group"}
	for _, obj := range objs {
		for _, a := range attrCases {
			require.NoError(t, f.SetAttr(obj, a.name, a.value), "%s@%s", obj, a.name)
		}
	}
	require.NoError(t, f.Close())

	f, err = Open(path)
	require.NoError(t, err)
	defer f.Close()
	var names []string
	for _, a := range attrCases {
		names = append(names, a.name)
	}
	for _, obj := range objs {
		for _, a := range attrCases {
			got, err := readAttrBack(f, obj, a)
			require.NoError(t, err, "%s@%s", obj, a.name)
			assert.Equal(t, a.value, got, "%s@%s", obj, a.name)
		}
		got, err := f.AttrNames(obj)
		require.NoError(t, err)
		assert.ElementsMatch(t, names, got)
		assert.IsIncreasing(t, got)
	}
	assert.True(t, f.Exists("meta/new/group"), "SetAttr creates a missing group")

	// Scalars read as one-element slices.
	xs, err := f.AttrInt64s("", "np")
	require.NoError(t, err)
	assert.Equal(t, []int64{4}, xs)
	ss, err := f.AttrStrings("", "run")
	require.NoError(t, err)
	assert.Equal(t, []string{"moe-ep, 4 ranks"}, ss)
}

func TestAttrErrors(t *testing.T) {
	path := filepath.Join(t.TempDir(), "a.h5")
	f, err := Create(path)
	require.NoError(t, err)
	defer f.Close()
	require.NoError(t, f.SetAttr("", "np", 4))
	require.NoError(t, f.SetAttr("", "lat", []float64{1, 2}))
	require.NoError(t, f.SetAttr("", "name", "x"))

	_, err = f.AttrFloat64("", "np")
	require.ErrorIs(t, err, ErrType)
	assert.EqualError(t, err, fmt.Sprintf(`h5: read attribute %q /: attribute "np": wrong type: it is an integer, not a float`, path))
	_, err = f.AttrString("", "np")
	assert.ErrorIs(t, err, ErrType)
	_, err = f.AttrInt64("", "name")
	assert.ErrorIs(t, err, ErrType)
	_, err = f.AttrFloat64("", "lat")
	require.ErrorIs(t, err, ErrShape)
	assert.Contains(t, err.Error(), "holds 2 values, not 1")
	_, err = f.AttrInt64("", "missing")
	require.ErrorIs(t, err, ErrNotFound)
	assert.Contains(t, err.Error(), `attribute "missing"`)
	_, err = f.AttrInt64("no/such/group", "np")
	assert.ErrorIs(t, err, ErrNotFound)
	err = f.SetAttr("", "bad", []float32{1})
	require.ErrorIs(t, err, ErrType)
	assert.Contains(t, err.Error(), "[]float32")
	assert.ErrorIs(t, f.SetAttr("", "nul", "a\x00b"), ErrType)
	assert.ErrorIs(t, f.SetAttr("", "", 1), ErrPath)

	// Replacing an attribute may change its type.
	require.NoError(t, f.SetAttr("", "np", "four"))
	s, err := f.AttrString("", "np")
	require.NoError(t, err)
	assert.Equal(t, "four", s)
}

func TestGroupsListExists(t *testing.T) {
	f, err := Create(filepath.Join(t.TempDir(), "g.h5"))
	require.NoError(t, err)
	defer f.Close()
	_, err = f.CreateTable("results/ll/latency", Float64, nil, 0)
	require.NoError(t, err)
	_, err = f.CreateTable("/results/ll/bandwidth", Float64, nil, 0)
	require.NoError(t, err)
	require.NoError(t, f.WriteDataset("results/ht/np4/latency", []int{1}, []float64{1}))
	require.NoError(t, f.SetAttr("results/empty", "note", "no data"))

	for _, tc := range []struct {
		group string
		want  []string
	}{
		{"", []string{"results"}},
		{"/", []string{"results"}},
		{"results", []string{"empty", "ht", "ll"}},
		{"/results/ll/", []string{"bandwidth", "latency"}},
		{"results/ht", []string{"np4"}},
		{"results/empty", []string{}},
	} {
		got, err := f.List(tc.group)
		require.NoError(t, err, tc.group)
		assert.Equal(t, tc.want, got, tc.group)
	}
	for path, want := range map[string]bool{
		"": true, "/": true, "results": true, "results/ll/latency": true, "/results/ht/np4/latency": true,
		"results/ll/latency/x": false, "results/nope": false, "a/b/c": false, "results//ll": false, "..": false,
	} {
		assert.Equal(t, want, f.Exists(path), path)
	}

	_, err = f.List("results/ll/latency")
	assert.ErrorIs(t, err, ErrType)
	_, err = f.List("results/nope")
	assert.ErrorIs(t, err, ErrNotFound)
	_, err = f.List("a//b")
	assert.ErrorIs(t, err, ErrPath)
	// A dataset cannot be a parent.
	err = f.WriteDataset("results/ll/latency/x", []int{1}, []float64{1})
	require.ErrorIs(t, err, ErrPath)
	assert.Contains(t, err.Error(), "/results/ll/latency is a dataset, not a group")
	assert.ErrorIs(t, f.SetAttr("results/ll/latency/x", "a", 1), ErrPath)
	// Names are taken once.
	assert.ErrorIs(t, f.WriteDataset("results/ll/latency", []int{1}, []float64{1}), ErrExist)
	_, err = f.CreateTable("results", Float64, nil, 0)
	assert.ErrorIs(t, err, ErrExist)
}

func TestWriteAndAppendErrors(t *testing.T) {
	path := filepath.Join(t.TempDir(), "e.h5")
	f, err := Create(path)
	require.NoError(t, err)
	tb, err := f.CreateTable("trace/loss", Float64, []int{3}, 0)
	require.NoError(t, err)

	err = tb.Append(make([]float64, 7))
	require.ErrorIs(t, err, ErrShape)
	assert.EqualError(t, err, fmt.Sprintf(`h5: append %q /trace/loss: bad shape: length 7 is not a multiple of the row length 3 (row shape [3])`, path))
	err = tb.Append([]float32{1, 2, 3})
	require.ErrorIs(t, err, ErrType)
	assert.Contains(t, err.Error(), "rows are []float32, the table holds float64")
	err = tb.Append([]int{1, 2, 3})
	require.ErrorIs(t, err, ErrType)
	assert.Contains(t, err.Error(), "rows are []int;")
	assert.Equal(t, 0, tb.Len())

	err = f.WriteDataset("w", []int{2, 3}, make([]float64, 5))
	require.ErrorIs(t, err, ErrShape)
	assert.Contains(t, err.Error(), "length 5 does not match shape [2 3] (6 elements)")
	assert.ErrorIs(t, f.WriteDataset("w", []int{-1}, []float64{}), ErrShape)
	assert.ErrorIs(t, f.WriteDataset("w", []int{1}, []int{1}), ErrType)
	assert.ErrorIs(t, f.WriteDataset("", []int{1}, []float64{1}), ErrPath)
	assert.False(t, f.Exists("w"), "a refused write creates nothing")

	_, err = f.CreateTable("t0", 0, nil, 0)
	assert.ErrorIs(t, err, ErrType)
	_, err = f.CreateTable("t1", Float64, []int{0}, 0)
	assert.ErrorIs(t, err, ErrShape)
	_, err = f.CreateTable("t2", Float64, nil, -1)
	assert.ErrorIs(t, err, ErrShape)
	_, err = f.CreateTable("t3", Float64, []int{1 << 20}, 1<<20)
	assert.ErrorIs(t, err, ErrShape)

	_, _, err = f.ReadFloat64("nope")
	require.ErrorIs(t, err, ErrNotFound)
	assert.EqualError(t, err, fmt.Sprintf(`h5: read %q /nope: not found`, path))
	_, _, err = f.ReadFloat64("trace")
	assert.ErrorIs(t, err, ErrType)
	_, err = f.OpenTable("trace")
	assert.ErrorIs(t, err, ErrType)
	require.NoError(t, f.WriteDataset("fixed", []int{2}, []float64{1, 2}))
	_, err = f.OpenTable("fixed")
	require.ErrorIs(t, err, ErrShape)
	assert.Contains(t, err.Error(), "not a table")
	require.NoError(t, f.Close())

	// Closed: every use is ErrClosed; Close again is fine.
	assert.ErrorIs(t, tb.Append([]float64{1, 2, 3}), ErrClosed)
	_, _, err = f.ReadFloat64("trace/loss")
	assert.ErrorIs(t, err, ErrClosed)
	assert.ErrorIs(t, f.Flush(), ErrClosed)
	assert.False(t, f.Exists("trace"))
	assert.NoError(t, f.Close())

	// Read-only.
	f, err = Open(path)
	require.NoError(t, err)
	defer f.Close()
	assert.ErrorIs(t, f.WriteDataset("x", []int{1}, []float64{1}), ErrReadOnly)
	assert.ErrorIs(t, f.SetAttr("", "x", 1), ErrReadOnly)
	_, err = f.CreateTable("y", Float64, nil, 0)
	assert.ErrorIs(t, err, ErrReadOnly)
	tb, err = f.OpenTable("trace/loss")
	require.NoError(t, err)
	assert.ErrorIs(t, tb.Append([]float64{1, 2, 3}), ErrReadOnly)
	assert.NoError(t, f.Flush())
}

func TestOpenMissing(t *testing.T) {
	path := filepath.Join(t.TempDir(), "missing.h5")
	_, err := Open(path)
	require.ErrorIs(t, err, fs.ErrNotExist)
	assert.EqualError(t, err, fmt.Sprintf(`h5: open %q: no such file or directory`, path))
	_, err = Create(filepath.Join(t.TempDir(), "no", "dir", "x.h5"))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "No such file or directory")
}

// TestConcurrentUse: goroutines appending to their own tables of one file,
// and to another file, reading and setting attributes; run under -race too.
func TestConcurrentUse(t *testing.T) {
	dir := t.TempDir()
	files := make([]*File, 2)
	for i := range files {
		var err error
		files[i], err = Create(filepath.Join(dir, fmt.Sprintf("c%d.h5", i)))
		require.NoError(t, err)
	}
	const workers, rows = 8, 200
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f := files[w%2]
			tb, err := f.CreateTable(fmt.Sprintf("w%d", w), Int64, []int{2}, 16)
			if err != nil {
				errs <- err
				return
			}
			for i := range rows {
				if err := tb.Append([]int64{int64(w), int64(i)}); err != nil {
					errs <- err
					return
				}
				if i%50 == 0 {
					if err := f.SetAttr(tb.Name(), "rows", tb.Len()); err != nil {
						errs <- err
						return
					}
					if err := f.Flush(); err != nil {
						errs <- err
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	for w := range workers {
		got, shape, err := files[w%2].ReadInt64(fmt.Sprintf("w%d", w))
		require.NoError(t, err)
		assert.Equal(t, []int{rows, 2}, shape)
		for i := range rows {
			require.Equal(t, []int64{int64(w), int64(i)}, got[2*i:2*i+2])
		}
	}
	for _, f := range files {
		require.NoError(t, f.Close())
	}
}

// TestEarliestFileFormat: files use superblock version 0, the format in which
// a file abandoned by a killed writer stays readable (see doc.go).
func TestEarliestFileFormat(t *testing.T) {
	path := filepath.Join(t.TempDir(), "v.h5")
	f, err := Create(path)
	require.NoError(t, err)
	_, err = f.CreateTable("x", Float64, nil, 0)
	require.NoError(t, err)
	require.NoError(t, f.Close())
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Greater(t, len(b), 9)
	assert.Equal(t, "\x89HDF\r\n\x1a\n", string(b[:8]), "signature")
	assert.Equal(t, byte(0), b[8], "superblock version")
}

func TestErrorFormat(t *testing.T) {
	e := &Error{Op: "read", File: "out/ckpt.h5", Object: "/w", Err: wrap(ErrType, "dataset is float32, not float64")}
	assert.Equal(t, `h5: read "out/ckpt.h5" /w: wrong type: dataset is float32, not float64`, e.Error())
	assert.True(t, errors.Is(e, ErrType))
	e = &Error{Op: "open", File: "x.h5", Err: ErrNotHDF5}
	assert.Equal(t, `h5: open "x.h5": not an HDF5 file or truncated`, e.Error())
}

// TestForeignTypes reads testdata/foreign.h5 (written by testdata/foreign.c
// with the C API, as other tools write): variable-length strings, other
// integer and float widths, and a dataset type this package does not read.
func TestForeignTypes(t *testing.T) {
	f, err := Open("testdata/foreign.h5")
	require.NoError(t, err)
	defer f.Close()

	s, err := f.AttrString("", "vlen")
	require.NoError(t, err)
	assert.Equal(t, "variable length", s)
	ss, err := f.AttrStrings("", "vlens")
	require.NoError(t, err)
	assert.Equal(t, []string{"alpha", "beta, gamma"}, ss)
	s, err = f.AttrString("", "nullpad")
	require.NoError(t, err)
	assert.Equal(t, "full", s)

	is, err := f.AttrInt64s("", "i32")
	require.NoError(t, err)
	assert.Equal(t, []int64{-3, 7}, is)
	u, err := f.AttrInt64("", "u32")
	require.NoError(t, err)
	assert.Equal(t, int64(4000000000), u)
	_, err = f.AttrInt64("", "u64")
	assert.ErrorIs(t, err, ErrType, "uint64 does not fit int64 in general")
	x, err := f.AttrFloat64("", "f32")
	require.NoError(t, err)
	assert.Equal(t, 0.25, x)

	_, _, err = f.ReadInt32("i16")
	require.ErrorIs(t, err, ErrType)
	assert.Contains(t, err.Error(), "dataset is of a type this package does not read, not int32")
	_, err = f.OpenTable("i16")
	assert.ErrorIs(t, err, ErrType)
}
