//go:build mpi

package main

import (
	"errors"
	"fmt"
	"math"
	"math/big"
	"math/rand/v2"
	"runtime"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/assert"

	"github.com/goep/goep/ep"
	"github.com/goep/goep/mpi"
)

// The checks the library makes before anything is read or written, and the
// result codes errors map to: single-rank logic, no MPI. (The interface as
// a whole is tested from C and Python under mpirun: make test-capi.)

func TestCheckRouting(t *testing.T) {
	cases := []struct {
		name string
		topk []int32
		want string // "" = accepted
	}{
		{"valid, with empty slots", []int32{0, 3, -1, -1, 2, 1}, ""},
		{"out of range", []int32{0, 4}, "topk_idx[0][1] = 4 is not an expert id in [0, 4) or -1"},
		{"below -1", []int32{0, 1, -2, 1}, "topk_idx[1][0] = -2"},
		{"repeated in a token", []int32{0, 1, 2, 2}, "topk_idx[1] names expert 2 twice (slots 0 and 1)"},
		{"repeated across tokens is fine", []int32{2, 1, 2, 1}, ""},
	}
	for _, c := range cases {
		err := checkRouting(c.topk, 2, 4)
		if c.want == "" {
			assert.NoError(t, err, c.name)
		} else {
			assert.ErrorContains(t, err, c.want, c.name)
			assert.Equal(t, 4, int(resultOf(err)), "%s: goepEpInvalidArgument", c.name)
		}
	}
}

func TestTensorWant(t *testing.T) {
	buf := make([]float32, 12)
	tensorOf := func(d dataType, off uintptr, shape ...int) *tensor {
		t := &tensor{name: "inputs->tokens", dtype: d, nd: len(shape), data: unsafe.Add(unsafe.Pointer(&buf[0]), off)}
		copy(t.dims[:], shape)
		return t
	}
	cases := []struct {
		name string
		t    *tensor
		want string
	}{
		{"matches", tensorOf(dtFloat32, 0, 3, 4), ""},
		{"any number of rows", tensorOf(dtFloat32, 0, 2, 4), ""},
		{"wrong type", tensorOf(dtFloat64, 0, 3, 4), "inputs->tokens has datatype float64, want float32 or bfloat16"},
		{"wrong shape", tensorOf(dtFloat32, 0, 4, 3), "inputs->tokens has shape [4, 3], want [rows, hidden] = [any, 4]"},
		{"wrong rank", tensorOf(dtFloat32, 0, 12), "has shape [12], want [rows, hidden] = [any, 4]"},
		{"misaligned", tensorOf(dtFloat32, 2, 3, 4), "is not aligned to its 4-byte float32 elements"},
	}
	for _, c := range cases {
		err := c.t.want("[rows, hidden]", []dataType{dtFloat32, dtBfloat16}, -1, 4)
		if c.want == "" {
			assert.NoError(t, err, c.name)
		} else {
			assert.ErrorContains(t, err, c.want, c.name)
		}
	}
	assert.ErrorContains(t, tensorOf(dtFloat32, 0, 2, 4).atLeastRows(3, "3 arrived"), "has 2 rows (shape [2, 4]) but 3 arrived")
}

func TestCheckHeader(t *testing.T) {
	assert.NoError(t, checkHeader("config", "T", 56, 7, 56, 7, "INIT"))
	assert.NoError(t, checkHeader("config", "T", 64, 7, 56, 7, "INIT"), "a newer caller's larger struct")
	assert.ErrorContains(t, checkHeader("config", "T", 40, 7, 56, 7, "INIT"), "config (T) has size 40, want at least 56")
	assert.ErrorContains(t, checkHeader("config", "T", 56, 0, 56, 7, "INIT"), "has magic 0x00000000, want 0x00000007: initialise it with INIT")
}

func TestResultCodes(t *testing.T) {
	cases := []struct {
		err  error
		code int
	}{
		{nil, 0},
		{invalidArgf("x"), 4},
		{invalidUsagef("x"), 5},
		{fmt.Errorf("wrapped: %w", &ep.TimeoutError{Op: "ll dispatch", Peer: 1, After: time.Second}), 64},
		{&mpi.MissingError{What: "mpi.Adopt", Rank: 1}, 64},
		{fmt.Errorf("ep: ll dispatch: %w", ep.ErrMasked), 65},
		{&ep.RefusedError{Op: "ll dispatch", Rank: 1, Reason: "bad"}, 6},
		{ep.InputErrorf("ll dispatch", "bad"), 4},
		{fmt.Errorf("ep: %w", ep.ErrClosed), 5},
		{&mpi.Error{Call: "MPI_Win_allocate", Code: 45}, 2},
		{errors.New("anything else"), 2},
	}
	for _, c := range cases {
		assert.Equal(t, c.code, int(resultOf(c.err)), "%v", c.err)
	}
}

// Nothing unwinds into C: a panic in a function's body is
// goepEpInternalError with its message; errors keep theirs as the thread's
// last error, which a success leaves as it was.
func TestGuard(t *testing.T) {
	runtime.LockOSThread() // the last error is the OS thread's
	defer runtime.UnlockOSThread()
	rows := []int{1, 2}
	rc := guard("goepEpTest", func() error {
		_ = rows[len(rows)+len(t.Name())]
		return nil
	})
	assert.Equal(t, 3, int(rc), "goepEpInternalError")
	assert.Contains(t, lastError(), "goepEpTest: internal error (a Go panic, recovered; please report it): runtime error: index out of range")
	rc = guard("goepEpTest", func() error {
		var p *tensor
		return checkHeader(p.name, "", 0, 0, 0, 0, "")
	})
	assert.Equal(t, 3, int(rc), "a nil dereference")
	assert.Contains(t, lastError(), "invalid memory address or nil pointer dereference")
	assert.Equal(t, 4, int(guard("goepEpTest", func() error { return invalidArgf("x = %d", 3) })))
	assert.Equal(t, "goepEpTest: x = 3", lastError())
	assert.Equal(t, 0, int(guard("goepEpTest", func() error { return nil })))
	assert.Equal(t, "goepEpTest: x = 3", lastError(), "a success leaves the last error")
}

// TestGlobalScaleOK checks the rule an NVFP4 combine's caller scales are
// held to against a correctly rounded quotient computed apart (math/big):
// 2688/amax as float32, or one of its two float32 neighbours; 0 for a row
// of zeros (and an infinite amax); nothing for a NaN row.
func TestGlobalScaleOK(t *testing.T) {
	quotient := func(amax float32) float32 {
		q, _ := new(big.Float).SetPrec(200).Quo(big.NewFloat(2688), big.NewFloat(float64(amax))).Float32()
		return q
	}
	up := func(f float32) float32 { return math.Nextafter32(f, float32(math.Inf(1))) }
	down := func(f float32) float32 { return math.Nextafter32(f, 0) }
	rng := rand.New(rand.NewPCG(7, 38))
	amaxes := []float32{3, 0.1, 1, 448 * 6, 1e-30, 6.5e4, math.MaxFloat32, math.SmallestNonzeroFloat32}
	for range 200 {
		amaxes = append(amaxes, float32(math.Ldexp(1+rng.Float64(), rng.IntN(200)-100)))
	}
	for _, amax := range amaxes {
		ref := quotient(amax)
		want, ok := globalScaleOK(ref, amax)
		assert.True(t, ok, "amax %v: the quotient %v itself", amax, ref)
		assert.Equal(t, math.Float32bits(ref), math.Float32bits(want), "amax %v: wanted scale", amax)
		for _, s := range []float32{up(ref), down(ref)} {
			_, ok := globalScaleOK(s, amax)
			assert.True(t, ok, "amax %v: %v, a neighbour of %v", amax, s, ref)
		}
		if math.IsInf(float64(ref), 1) {
			continue // its only finite neighbour is MaxFloat32, accepted above
		}
		for _, s := range []float32{up(up(ref)), down(down(ref)), -ref, 0, float32(math.NaN()), ref * 1.01} {
			_, ok := globalScaleOK(s, amax)
			assert.False(t, ok, "amax %v: %v accepted for %v", amax, s, ref)
		}
	}
	_, ok := globalScaleOK(896, 3)
	assert.True(t, ok, "2688/3 is 896 exactly")
	_, ok = globalScaleOK(0, 0)
	assert.True(t, ok, "a row of zeros has scale 0")
	_, ok = globalScaleOK(math.SmallestNonzeroFloat32, 0)
	assert.False(t, ok, "a row of zeros with a scale other than 0")
	_, ok = globalScaleOK(0, float32(math.Inf(1)))
	assert.True(t, ok, "2688/inf is 0")
	_, ok = globalScaleOK(float32(math.NaN()), float32(math.NaN()))
	assert.False(t, ok, "a NaN row has no scale")
	assert.Equal(t, float32(6), rowAmax([]ep.BF16{ep.ElementOf[ep.BF16](2), ep.ElementOf[ep.BF16](-6), ep.ElementOf[ep.BF16](5)}))
	assert.True(t, math.IsNaN(float64(rowAmax([]float32{1, float32(math.NaN()), 2}))), "a NaN anywhere makes amax NaN")
}
