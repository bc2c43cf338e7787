package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseLayouts(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []config
		bad  string // a substring of the error
	}{
		{in: "", want: nil},
		{in: "2x2", want: []config{{np: 4, hosts: []int{2, 2}}}},
		{in: "4x1, 2+2+1", want: []config{{np: 4, hosts: []int{1, 1, 1, 1}}, {np: 5, hosts: []int{2, 2, 1}}}},
		{in: "3", want: []config{{np: 3, hosts: []int{3}}}},
		{in: "2x0", bad: `"2x0"`},
		{in: "2+x", bad: `"2+x"`},
		{in: "1+0", bad: `"1+0"`},
	} {
		got, err := parseLayouts(tc.in)
		if tc.bad != "" {
			require.Error(t, err, tc.in)
			assert.Contains(t, err.Error(), tc.bad)
			continue
		}
		require.NoError(t, err, tc.in)
		assert.Equal(t, tc.want, got, tc.in)
	}
	assert.Equal(t, "hosts=2+2+1", config{np: 5, hosts: []int{2, 2, 1}}.String())
}

func TestReadHostfile(t *testing.T) {
	dir := t.TempDir()
	f := filepath.Join(dir, "hosts")
	require.NoError(t, os.WriteFile(f, []byte("# the cluster\ngoep-h1 slots=2\n\n  goep-h2 slots=2 # second\n"), 0o644))
	hosts, err := readHostfile(f)
	require.NoError(t, err)
	assert.Equal(t, []string{"goep-h1", "goep-h2"}, hosts)

	empty := filepath.Join(dir, "empty")
	require.NoError(t, os.WriteFile(empty, []byte("# nothing\n"), 0o644))
	_, err = readHostfile(empty)
	assert.ErrorContains(t, err, "lists no hosts")
	_, err = readHostfile(filepath.Join(dir, "missing"))
	assert.ErrorContains(t, err, "missing")
}

func TestHostsNeedHostfile(t *testing.T) {
	var out, errs strings.Builder
	assert.Equal(t, 2, run(&out, &errs, []string{"-np", "", "-sim", "", "-hosts", "2x2", "./mpi"}))
	assert.Contains(t, errs.String(), "-hosts needs -hostfile")
	errs.Reset()
	assert.Equal(t, 2, run(&out, &errs, []string{"-np", "", "-sim", "", "./mpi"}))
	assert.Contains(t, errs.String(), "nothing to run")
}

// The build makes every package's binary in one go command, asks for the
// race detector when told, and inherits the environment (GOFLAGS,
// GOEXPERIMENT=cgocheck2).
func TestBuildCommand(t *testing.T) {
	c := buildCommand([]string{"./ep", "./moe/runs"}, "/tmp/bin", false)
	assert.Equal(t, []string{"go", "test", "-c", "-tags", "mpi", "-o", "/tmp/bin/", "./ep", "./moe/runs"}, c.Args)
	assert.Nil(t, c.Env, "the environment is inherited")
	c = buildCommand([]string{"./ep"}, "/tmp/bin", true)
	assert.Equal(t, []string{"go", "test", "-c", "-tags", "mpi", "-race", "-o", "/tmp/bin/", "./ep"}, c.Args)
	assert.Equal(t, "runs.test", testBinary("./moe/runs"))
	assert.Equal(t, "ep.test", testBinary("./ep/"))
}

// -skip-one-node adds to -skip only where every rank is on one node.
func TestSkipFor(t *testing.T) {
	tests := []struct {
		skip, oneNode string
		cfg           config
		want          string
	}{
		{"", "", config{np: 2}, ""},
		{"A", "", config{np: 2}, "A"},
		{"", "B", config{np: 2}, "B"},
		{"A", "B", config{np: 2}, "A|B"},
		{"A", "B", config{np: 4, perNode: 2}, "A"},
		{"", "B", config{np: 4, perNode: 2}, ""},
		{"A", "B", config{np: 4, hosts: []int{2, 2}}, "A"},
	}
	for _, tc := range tests {
		rn := runner{skipExpr: tc.skip, skipOneNode: tc.oneNode}
		assert.Equal(t, tc.want, rn.skipFor(tc.cfg), "%+v", tc)
	}
}
