//go:build mpi

package main

import (
	"encoding/binary"
	"strings"
	"testing"
)

// Fuzz targets of the checks the C entry points make on what a C caller
// passes, before anything is read or written: any bytes in a struct's
// fields, with its pointers valid or NULL. A check accepts (and then what it
// made agrees with the bytes) or refuses with goepEpInvalidArgument or
// goepEpInvalidUsage and a message naming the field; it never panics, and
// goepEpBufferPlan, a whole entry point, never returns goepEpInternalError.
// make test runs each for a bounded time; their corpus is testdata/fuzz.

// dimsOf reads up to 8 extents from b, 8 bytes each (nil when b is empty:
// a NULL sizes).
func dimsOf(b []byte) []uint64 {
	if len(b) == 0 {
		return nil
	}
	var dims []uint64
	for len(b) > 0 && len(dims) < 8 {
		var w [8]byte
		n := copy(w[:], b)
		b = b[n:]
		dims = append(dims, binary.LittleEndian.Uint64(w[:]))
	}
	return dims
}

func FuzzTensorDescriptor(f *testing.F) {
	f.Add([]byte{}, true, uint8(2), int8(9), []byte{3, 0, 0, 0, 0, 0, 0, 0, 16, 0, 0, 0, 0, 0, 0, 0}, uint16(96), int16(3), int16(16))
	f.Add([]byte{}, true, uint8(1), int8(4), []byte{255, 255, 255, 255, 255, 255, 255, 255}, uint16(0), int16(-1), int16(0))
	f.Add([]byte{}, true, uint8(9), int8(7), []byte{1}, uint16(4), int16(1), int16(1))
	f.Add([]byte{1, 2, 3}, false, uint8(0), int8(0), []byte{}, uint16(0), int16(0), int16(0))
	f.Fuzz(func(t *testing.T, raw []byte, fix bool, ndim uint8, dtype int8, dimBytes []byte, dataBytes uint16, want0, want1 int16) {
		d := newDescTensor(raw, dimsOf(dimBytes), int(dataBytes))
		defer d.free()
		if fix {
			d.fix(uint32(ndim), int32(dtype))
		}
		tens, err := readTensor("inputs->tokens", d.t)
		if err != nil {
			refusedNaming(t, err, "inputs->tokens")
			return
		}
		if !tens.given() {
			t.Fatal("a non-NULL descriptor accepted as no tensor")
		}
		if tens.nd < 1 || tens.nd > maxDims {
			t.Fatalf("accepted ndim %d", tens.nd)
		}
		elems := 1
		for _, s := range tens.shape() {
			elems *= s
		}
		if elems != tens.elems || elems*tens.dtype.size() > maxBytes || elems < 0 {
			t.Fatalf("accepted shape %v of %d elements (%d counted), %d bytes each", tens.shape(), elems, tens.elems, tens.dtype.size())
		}
		if tens.data == nil && elems > 0 {
			t.Fatalf("accepted shape %v with NULL data", tens.shape())
		}
		// What the entry points ask of it: a type and a shape, any or fixed extents.
		err = tens.want("[rows, hidden]", []dataType{dtBfloat16, dtFloat32}, int(want0), int(want1))
		if err != nil {
			refusedNaming(t, err, "inputs->tokens")
			return
		}
		if tens.nd != 2 || (want0 >= 0 && tens.dims[0] != int(want0)) || (want1 >= 0 && tens.dims[1] != int(want1)) {
			t.Fatalf("want accepted shape %v for [%d, %d]", tens.shape(), want0, want1)
		}
		if err := tens.atLeastRows(int(want0), "that many arrived"); err != nil {
			refusedNaming(t, err, "inputs->tokens")
		}
	})
}

func FuzzConfigStructs(f *testing.F) {
	// A valid LL group config in NCCL EP's version 2 layout: 4 experts, 8 tokens, hidden 16 in
	// bfloat16, top-2 (num_topk at byte 104).
	group := make([]byte, 112)
	for i, v := range []uint32{112, 0x60E9E9A1, 2, 0, 4, 8, 0, 32} {
		binary.LittleEndian.PutUint32(group[4*i:], v)
	}
	binary.LittleEndian.PutUint32(group[104:], 2)
	f.Add(uint8(descGroupConfig), group, true, int16(2), int16(1))
	f.Add(uint8(descGroupConfig), group, false, int16(4), int16(2))
	f.Add(uint8(descDispatchConfig), []byte{0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0}, true, int16(0), int16(0))
	f.Add(uint8(descCombineConfig), []byte{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1}, true, int16(0), int16(0))
	f.Add(uint8(descHandleConfig), []byte{0, 0, 0, 0, 0, 0, 0, 0, 7}, true, int16(0), int16(0))
	f.Add(uint8(descCompleteConfig), []byte{}, false, int16(0), int16(0))
	// Options: float32 tokens and the FP8 combine.
	f.Add(uint8(descGroupOptions), []byte{24, 0, 0, 0, 0xA1, 0xE9, 0xE9, 0x60, 7, 0, 0, 0, 0, 1, 0, 0}, false, int16(2), int16(1))
	f.Fuzz(func(t *testing.T, kind uint8, raw []byte, fix bool, nranks, nnodes int16) {
		k := int(kind) % numDescStructs
		d := newDescStruct(k, raw, fix)
		defer d.free()
		rc, err := d.check(k, int(nranks), int(nnodes))
		if err != nil {
			refusedNaming(t, err, "")
			return
		}
		switch rc {
		case 0, 4, 5: // success, goepEpInvalidArgument, goepEpInvalidUsage
		default:
			t.Fatalf("goepEpBufferPlan returned %d (%s)", int(rc), lastError())
		}
	})
}

// refusedNaming fails t unless err is a refusal (goepEpInvalidArgument or
// goepEpInvalidUsage) whose message names what (when given).
func refusedNaming(t *testing.T, err error, what string) {
	t.Helper()
	if rc := int(resultOf(err)); rc != 4 && rc != 5 {
		t.Fatalf("refused with result %d, want goepEpInvalidArgument or goepEpInvalidUsage: %v", rc, err)
	}
	if msg := err.Error(); msg == "" || !strings.Contains(msg, what) {
		t.Fatalf("the refusal %q does not name %q", msg, what)
	}
}
