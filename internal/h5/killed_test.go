package h5

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goep/goep/internal/mpitesting"
)

// writerEnv selects the child's writer mode in TestKilledWriter and names
// the file it writes.
const writerEnv = "GOEP_H5_TEST_WRITER"

const (
	writerCols       = 3  // values per row: step, step*0.5, -(step+1)
	writerFlushEvery = 7  // rows between flushes
	writerMinFlushed = 70 // rows flushed before the parent kills the writer
)

// runWriter is the child: it appends rows to a table forever, flushing every
// writerFlushEvery rows and printing "flushed N" after each flush, so that
// when the parent kills it some rows are always appended but not flushed.
func runWriter(path string) {
	fail := func(err error) {
		fmt.Println("error", err)
		os.Exit(3)
	}
	f, err := Create(path)
	if err != nil {
		fail(err)
	}
	if err := f.SetAttr("", "run", "killed-writer"); err != nil {
		fail(err)
	}
	tb, err := f.CreateTable("trace/step", Float64, []int{writerCols}, 4)
	if err != nil {
		fail(err)
	}
	deadline := time.Now().Add(2 * time.Minute) // never outlive a lost parent
	for step := 0; time.Now().Before(deadline); step++ {
		s := float64(step)
		if err := tb.Append([]float64{s, s * 0.5, -(s + 1)}); err != nil {
			fail(err)
		}
		if (step+1)%writerFlushEvery == 0 {
			if err := f.SetAttr("", "flushed", step+1); err != nil {
				fail(err)
			}
			if err := f.Flush(); err != nil {
				fail(err)
			}
			fmt.Printf("flushed %d\n", step+1)
		}
		if step > 2*writerMinFlushed {
			time.Sleep(time.Millisecond) // keep the file small while the parent reacts
		}
	}
	os.Exit(4)
}

// TestKilledWriter re-executes this test binary as a writer, SIGKILLs it after
// it has flushed at least writerMinFlushed rows, and reads the abandoned file
// with h5dump and with Open: both must see at least the flushed rows.
func TestKilledWriter(t *testing.T) {
	if path := os.Getenv(writerEnv); path != "" {
		runWriter(path)
		return
	}
	mpitesting.RequireTool(t, "h5dump")
	path := filepath.Join(t.TempDir(), "trace.h5")
	cmd := exec.Command(os.Args[0], "-test.run=^TestKilledWriter$", "-test.count=1")
	cmd.Env = append(os.Environ(), writerEnv+"="+path)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	killed := false
	defer func() {
		if !killed {
			cmd.Process.Kill()
			cmd.Wait()
		}
	}()

	flushed := 0
	sc := bufio.NewScanner(out)
	for flushed < writerMinFlushed && sc.Scan() {
		line := sc.Text()
		require.False(t, strings.HasPrefix(line, "error"), "writer: %s", line)
		if n, ok := strings.CutPrefix(line, "flushed "); ok {
			flushed, err = strconv.Atoi(n)
			require.NoError(t, err)
		}
	}
	require.GreaterOrEqual(t, flushed, writerMinFlushed, "writer stopped early: %v", sc.Err())
	// While the writer holds the file, HDF5's file lock keeps readers out
	// with an error that says so.
	if os.Getenv("HDF5_USE_FILE_LOCKING") == "" {
		_, err := Open(path)
		require.ErrorIs(t, err, ErrLocked)
		assert.Contains(t, err.Error(), "HDF5_USE_FILE_LOCKING=FALSE")
		t.Logf("open during the write: %v", err)
	}

	// Let it run on a little, so that it dies with rows appended but not
	// flushed, or in the middle of a flush.
	time.Sleep(25 * time.Millisecond)
	require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
	killed = true
	// Lines printed before the kill count as flushed too. Read them before
	// Wait, which closes the pipe.
	for sc.Scan() {
		if n, ok := strings.CutPrefix(sc.Text(), "flushed "); ok {
			if v, err := strconv.Atoi(n); err == nil {
				flushed = v
			}
		}
	}
	err = cmd.Wait()
	require.Error(t, err)
	st := cmd.ProcessState.Sys().(syscall.WaitStatus)
	require.True(t, st.Signaled() && st.Signal() == syscall.SIGKILL, "writer was not killed: %v", err)
	t.Logf("writer killed after flushing %d rows", flushed)

	// h5dump reads the abandoned file.
	d := h5dump(t, path, "-d", "/trace/step")
	assert.Equal(t, "H5T_IEEE_F64LE", d.dtype)
	require.Len(t, d.dims, 2, "DATASPACE %s", d.space)
	assert.Equal(t, []string{"H5S_UNLIMITED", strconv.Itoa(writerCols)}, d.maxdims)
	dumpedRows, err := strconv.Atoi(d.dims[0])
	require.NoError(t, err)
	t.Logf("h5dump: DATASPACE %s", d.space)
	assert.GreaterOrEqual(t, dumpedRows, flushed)
	require.Len(t, d.values, dumpedRows*writerCols)
	for i := range flushed {
		require.Equal(t, []string{strconv.Itoa(i), strconv.FormatFloat(float64(i)*0.5, 'g', -1, 64), strconv.Itoa(-(i + 1))},
			d.values[i*writerCols:(i+1)*writerCols], "row %d", i)
	}

	// So does Open.
	f, err := Open(path)
	require.NoError(t, err)
	defer f.Close()
	got, shape, err := f.ReadFloat64("trace/step")
	require.NoError(t, err)
	require.Len(t, shape, 2)
	assert.GreaterOrEqual(t, shape[0], flushed)
	assert.Equal(t, writerCols, shape[1])
	for i := range flushed {
		s := float64(i)
		require.Equal(t, []float64{s, s * 0.5, -(s + 1)}, got[i*writerCols:(i+1)*writerCols], "row %d", i)
	}
	run, err := f.AttrString("", "run")
	require.NoError(t, err)
	assert.Equal(t, "killed-writer", run)
	n, err := f.AttrInt64("", "flushed")
	require.NoError(t, err)
	assert.GreaterOrEqual(t, n, int64(flushed))
	tb, err := f.OpenTable("trace/step")
	require.NoError(t, err)
	assert.Equal(t, shape[0], tb.Len())
}
