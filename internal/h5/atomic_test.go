package h5

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// writeCkpt is a write function for WriteAtomic: one dataset and the step.
func writeCkpt(step int, w []float32) func(*File) error {
	return func(f *File) error {
		if err := f.WriteDataset("model/w", []int{len(w)}, w); err != nil {
			return err
		}
		return f.SetAttr("", "step", step)
	}
}

// tempFiles lists what WriteAtomic may have left next to path.
func tempFiles(t *testing.T, path string) []string {
	t.Helper()
	m, err := filepath.Glob(path + ".tmp-*")
	require.NoError(t, err)
	return m
}

func TestWriteAtomicReplaces(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ckpt.h5")
	require.NoError(t, WriteAtomic(path, writeCkpt(1, []float32{1, 2, 3})))
	require.NoError(t, WriteAtomic(path, writeCkpt(2, []float32{4, 5})))
	assert.Empty(t, tempFiles(t, path))

	f, err := Open(path)
	require.NoError(t, err)
	defer f.Close()
	w, shape, err := f.ReadFloat32("model/w")
	require.NoError(t, err)
	assert.Equal(t, []float32{4, 5}, w)
	assert.Equal(t, []int{2}, shape)
	step, err := f.AttrInt64("", "step")
	require.NoError(t, err)
	assert.Equal(t, int64(2), step)
}

func TestWriteAtomicErrorKeepsOld(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ckpt.h5")
	require.NoError(t, WriteAtomic(path, writeCkpt(1, []float32{1, 2, 3})))
	before, err := os.ReadFile(path)
	require.NoError(t, err)

	boom := errors.New("boom")
	err = WriteAtomic(path, func(f *File) error {
		if err := writeCkpt(2, []float32{9, 9})(f); err != nil {
			return err
		}
		require.NotEmpty(t, tempFiles(t, path), "the temporary file is written next to the target")
		return boom
	})
	require.ErrorIs(t, err, boom)
	assert.Contains(t, err.Error(), path)

	// A failing HDF5 call inside write is reported the same way.
	err = WriteAtomic(path, func(f *File) error {
		return f.WriteDataset("w", []int{2}, []float64{1})
	})
	require.ErrorIs(t, err, ErrShape)

	// A panic in write leaves nothing behind either.
	assert.Panics(t, func() {
		WriteAtomic(path, func(f *File) error { panic("write panicked") })
	})

	after, err := os.ReadFile(path)
	require.NoError(t, err)
	assert.Equal(t, before, after, "the old file must be byte-identical")
	assert.Empty(t, tempFiles(t, path))
}

func TestWriteAtomicNewFileAndBadDir(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "ckpt.h5")
	err := WriteAtomic(path, func(*File) error { return errors.New("no") })
	require.Error(t, err)
	_, statErr := os.Stat(path)
	assert.ErrorIs(t, statErr, os.ErrNotExist, "a failed first write creates nothing")
	assert.Empty(t, tempFiles(t, path))

	err = WriteAtomic(filepath.Join(dir, "missing", "ckpt.h5"), writeCkpt(1, []float32{1}))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "missing")
}
