package kernels

import (
	"bytes"
	"os"
	"testing"
)

// TestTablesAreCurrent: the launch table, the emulator's dispatch and
// package gpu's launch functions are what the kernels' signatures give
// (go generate ./gpu/internal/kernels writes them): a kernel whose
// parameters changed in its .cu file and not in the Go side fails here, or
// fails to build.
func TestTablesAreCurrent(t *testing.T) {
	files, err := Generated()
	if err != nil {
		t.Fatal(err)
	}
	for path, want := range files {
		got, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s is not what the kernels' signatures give: run go generate ./gpu/internal/kernels", path)
		}
	}
}

func TestSignatures(t *testing.T) {
	sigs, err := Signatures()
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]Signature{}
	for _, s := range sigs {
		byName[s.Name] = s
	}
	s := byName["goep_copy_rows"]
	if s.File != "rows.cu" || s.Letters() != "pplpplll" || s.Params[1].Name != "dst_idx" || s.Params[1].C != "const i32 *" {
		t.Errorf("goep_copy_rows parsed as %+v", s)
	}
	if _, err := parseParam("float x"); err == nil {
		t.Error("a float parameter has no slot letter, and is refused")
	}
}
