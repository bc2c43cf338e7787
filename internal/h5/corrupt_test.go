package h5

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// validFile writes a file with a table, a fixed dataset and attributes, big
// enough that cutting it loses data as well as metadata.
func validFile(t *testing.T, dir string) string {
	t.Helper()
	path := filepath.Join(dir, "valid.h5")
	f, err := Create(path)
	require.NoError(t, err)
	tb, err := f.CreateTable("trace/loss", Float64, []int{4}, 64)
	require.NoError(t, err)
	for i := range 1000 {
		require.NoError(t, tb.Append([]float64{float64(i), 1, 2, 3}))
	}
	require.NoError(t, f.WriteDataset("ckpt/w", []int{100, 100}, make([]float32, 10000)))
	require.NoError(t, f.SetAttr("", "run", "corrupt-test"))
	require.NoError(t, f.Close())
	return path
}

func TestTruncatedFile(t *testing.T) {
	dir := t.TempDir()
	valid := validFile(t, dir)
	data, err := os.ReadFile(valid)
	require.NoError(t, err)
	for _, cut := range []struct {
		name string
		size int
	}{
		{"half", len(data) / 2},
		{"tenth", len(data) / 10},
		{"most", len(data) * 9 / 10},
		{"last byte", len(data) - 1},
		{"signature only", 8},
		{"empty", 0},
	} {
		t.Run(cut.name, func(t *testing.T) {
			path := filepath.Join(dir, fmt.Sprintf("cut-%d.h5", cut.size))
			require.NoError(t, os.WriteFile(path, data[:cut.size], 0o644))
			f, err := Open(path)
			if err == nil {
				// If HDF5 ever opened it, reading must still fail cleanly
				// or return the data.
				defer f.Close()
				_, _, err = f.ReadFloat64("trace/loss")
			}
			require.Error(t, err)
			assert.ErrorIs(t, err, ErrNotHDF5)
			assert.Contains(t, err.Error(), fmt.Sprintf("%q", path), "the error names the file")
			t.Log(err)
		})
	}
	// The half-file error is what the package doc promises.
	path := filepath.Join(dir, "half.h5")
	require.NoError(t, os.WriteFile(path, data[:len(data)/2], 0o644))
	_, err = Open(path)
	assert.Regexp(t, `^h5: open ".*half.h5": not an HDF5 file or truncated: truncated file: eof = \d+`, err.Error())
	_, err = OpenRW(path)
	assert.ErrorIs(t, err, ErrNotHDF5)
}

func TestRandomBytes(t *testing.T) {
	path := filepath.Join(t.TempDir(), "random.h5")
	rng := rand.New(rand.NewPCG(1, 2))
	b := make([]byte, 64<<10)
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
	require.NoError(t, os.WriteFile(path, b, 0o644))
	_, err := Open(path)
	require.ErrorIs(t, err, ErrNotHDF5)
	assert.Equal(t, fmt.Sprintf(`h5: open %q: not an HDF5 file or truncated: no HDF5 signature`, path), err.Error())
	_, err = OpenRW(path)
	assert.ErrorIs(t, err, ErrNotHDF5)
}

// TestCorruptData: a file whose superblock is intact but whose contents were
// overwritten with zeros past the superblock must give errors, not a crash.
func TestCorruptData(t *testing.T) {
	dir := t.TempDir()
	data, err := os.ReadFile(validFile(t, dir))
	require.NoError(t, err)
	bad := append([]byte{}, data...)
	for i := 96; i < len(bad); i++ { // superblock v0 with its root symbol table entry
		bad[i] = 0
	}
	path := filepath.Join(dir, "zeroed.h5")
	require.NoError(t, os.WriteFile(path, bad, 0o644))
	f, err := Open(path)
	if err != nil {
		assert.Contains(t, err.Error(), fmt.Sprintf("%q", path))
		t.Log(err)
		return
	}
	defer f.Close()
	_, _, err = f.ReadFloat64("trace/loss")
	require.Error(t, err)
	assert.Contains(t, err.Error(), fmt.Sprintf("%q", path))
	t.Log(err)
}

// TestCorruptChunkIndex: the file opens but a table's chunk index (its v1
// B-tree, signature "TREE" and node type 1) is damaged: the read fails with
// an error naming the file and the dataset.
func TestCorruptChunkIndex(t *testing.T) {
	dir := t.TempDir()
	data, err := os.ReadFile(validFile(t, dir))
	require.NoError(t, err)
	i := bytes.Index(data, []byte("TREE\x01"))
	require.GreaterOrEqual(t, i, 0, "no chunk B-tree in the file")
	bad := append([]byte{}, data...)
	copy(bad[i:], "XXXX")
	path := filepath.Join(dir, "badtree.h5")
	require.NoError(t, os.WriteFile(path, bad, 0o644))

	f, err := Open(path)
	require.NoError(t, err)
	defer f.Close()
	w, _, err := f.ReadFloat32("ckpt/w")
	require.NoError(t, err, "the contiguous dataset is intact")
	assert.Len(t, w, 10000)
	_, _, err = f.ReadFloat64("trace/loss")
	require.Error(t, err)
	assert.Contains(t, err.Error(), fmt.Sprintf("h5: read %q /trace/loss: ", path))
	t.Log(err)
}
