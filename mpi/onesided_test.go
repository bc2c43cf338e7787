package mpi

import (
	"errors"
	"io/fs"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestDecideOneSided(t *testing.T) {
	const (
		home   = "/home/u/.openmpi/mca-params.conf"
		site   = "/etc/openmpi/openmpi-mca-params.conf"
		debian = "btl_base_warn_component_unused=0\nmtl = ^ofi\nbtl = ^uct,openib,ofi\npml = ^ucx\nosc = ^ucx,pt2pt\n"
	)
	for _, tc := range []struct {
		name    string
		env     map[string]string
		files   map[string]string
		missing string
		want    string // "" = left alone
		reason  string // a substring of the reason
	}{
		{name: "nobody chose", want: "sm,ucx", reason: "nobody chose"},
		{name: "Debian's exclusion is not a choice", files: map[string]string{site: debian}, want: "sm,ucx",
			reason: "in place of osc = ^ucx,pt2pt of " + site},
		{name: "environment", env: map[string]string{"OMPI_MCA_osc": "rdma"}, files: map[string]string{site: debian},
			reason: `OMPI_MCA_osc="rdma"`},
		{name: "empty environment value is a choice (every component)", env: map[string]string{"OMPI_MCA_osc": ""},
			reason: `OMPI_MCA_osc=""`},
		{name: "user file", files: map[string]string{home: "# mine\n osc = pt2pt # old\n", site: debian},
			reason: home + " sets osc = pt2pt"},
		{name: "user file exclusion is a choice", files: map[string]string{home: "osc=^ucx"}, reason: home + " sets osc = ^ucx"},
		{name: "site list is a choice", files: map[string]string{site: "osc = sm,rdma\n"}, reason: site + " sets osc = sm,rdma"},
		{name: "last line wins", files: map[string]string{site: "osc = rdma\nosc = ^pt2pt\n"}, want: "sm,ucx"},
		{name: "other parameters only", files: map[string]string{home: "oscx = 1\nbtl = self,tcp\n# osc = rdma\n"},
			want: "sm,ucx"},
		{name: "no ucx component", missing: "ucx", files: map[string]string{site: debian},
			reason: "no osc/ucx component"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := oscInputs{
				lookupEnv: func(k string) (string, bool) { v, ok := tc.env[k]; return v, ok },
				readFile: func(p string) ([]byte, error) {
					if s, ok := tc.files[p]; ok {
						return []byte(s), nil
					}
					return nil, fs.ErrNotExist
				},
				userFiles: []string{home}, siteFiles: []string{site}, missing: tc.missing,
			}
			got, set, reason := decideOneSided(in)
			assert.Equal(t, tc.want, got)
			assert.Equal(t, tc.want != "", set)
			assert.Contains(t, reason, tc.reason)
		})
	}
}

func TestParamFiles(t *testing.T) {
	env := func(m map[string]string) func(string) (string, bool) {
		return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
	}
	user, site := paramFiles(env(nil), "/opt/ompi")
	assert.Len(t, user, 1)
	assert.True(t, strings.HasSuffix(user[0], "/.openmpi/mca-params.conf"), user[0])
	assert.Equal(t, []string{"/opt/ompi/etc/openmpi-mca-params.conf", "/etc/openmpi/openmpi-mca-params.conf",
		"/etc/openmpi-mca-params.conf"}, site)

	_, site = paramFiles(env(map[string]string{"OPAL_PREFIX": "/sw/ompi"}), "/usr")
	assert.Equal(t, "/sw/ompi/etc/openmpi-mca-params.conf", site[0])

	user, site = paramFiles(env(map[string]string{"OMPI_MCA_mca_base_param_files": "/a.conf::/b.conf"}), "/usr")
	assert.Equal(t, []string{"/a.conf", "/b.conf"}, user, "files the user names are the user's")
	assert.Empty(t, site)
}

func TestParamInFileUnreadable(t *testing.T) {
	_, ok := paramInFile(func(string) ([]byte, error) { return nil, errors.New("denied") }, "/x", "osc")
	assert.False(t, ok)
}

func TestInstallPrefix(t *testing.T) {
	for lib, want := range map[string]string{
		"/usr/lib/x86_64-linux-gnu/libmpi.so.40.30.4": "/usr",
		"/opt/ompi-4.1/lib/libmpi.so.40":              "/opt/ompi-4.1",
		"/sw/ompi/lib64/libmpi.so":                    "/sw/ompi",
		"/weird/place/libmpi.so":                      "",
		"":                                            "",
	} {
		assert.Equal(t, want, installPrefix(lib), lib)
	}
}
