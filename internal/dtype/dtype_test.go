package dtype

import (
	"strings"
	"testing"
)

func TestCodesMatchHeader(t *testing.T) {
	cases := []struct {
		code Code
		name string
		size int
		line string
	}{
		{F32, "float32", 4, "GOEP_ELEM_F32 = 0"},
		{BF16, "bfloat16", 2, "GOEP_ELEM_BF16 = 1"},
	}
	for _, c := range cases {
		if c.code.String() != c.name || c.code.Size() != c.size || !c.code.Valid() {
			t.Errorf("%d: got %q size %d valid %v, want %q size %d", int(c.code), c.code, c.code.Size(), c.code.Valid(), c.name, c.size)
		}
		if !strings.Contains(Header, c.line) {
			t.Errorf("Header does not define %s", c.line)
		}
	}
	if Code(7).Valid() {
		t.Error("code 7 should be invalid")
	}
}

func TestBytes(t *testing.T) {
	b := Bytes([]uint16{0x0102, 0x0304})
	if len(b) != 4 || b[0] != 0x02 || b[3] != 0x03 {
		t.Errorf("Bytes = %x", b)
	}
	if Bytes([]float32(nil)) != nil {
		t.Error("Bytes of an empty slice should be nil")
	}
	if SizeOf[float64]() != 8 || SizeOf[int16]() != 2 {
		t.Error("SizeOf")
	}
}
