package emulator

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goep/goep/gpu"
)

var nextOrdinal = 100

// testDevice is a device of its own for each test (ordinals from 100).
func testDevice(t *testing.T) *Device {
	t.Helper()
	nextOrdinal++
	d := Open(nextOrdinal)
	t.Cleanup(func() {
		d.ResetForTest()
		assert.NoError(t, d.Synchronize())
	})
	return d
}

func alloc(t *testing.T, d *Device, n int) gpu.DevicePtr {
	t.Helper()
	p, err := d.MemAlloc(n)
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, d.MemFree(p)) })
	return p
}

func stream(t *testing.T, d *Device) gpu.Stream {
	t.Helper()
	s, err := d.NewStream()
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	return s
}

func read(t *testing.T, d *Device, p gpu.DevicePtr, n int) []byte {
	t.Helper()
	b := make([]byte, n)
	require.NoError(t, d.MemcpyDtoH(b, p))
	return b
}

// slowWork queues a kernel that takes tens of milliseconds on the
// emulator: a copy of 8 MiB in rows of 16 bytes, one thread each.
func slowWork(t *testing.T, d *Device, s gpu.Stream) {
	t.Helper()
	const rows, rowBytes = 1 << 19, 16
	src, dst := alloc(t, d, rows*rowBytes), alloc(t, d, rows*rowBytes)
	k, err := d.Kernels()
	require.NoError(t, err)
	require.NoError(t, k.CopyRows(s, gpu.CopyRowsArgs{Dst: dst, DstRows: rows, Src: src, SrcRows: rows, N: rows, RowBytes: rowBytes}))
}

func TestOpenIsOnePerOrdinal(t *testing.T) {
	assert.Same(t, Open(7), Open(7))
	assert.NotSame(t, Open(7), Open(8))
	assert.Equal(t, "emulated:7", Open(7).String())
}

// New memory is not zeroed, and copies by address move bytes.
func TestMemory(t *testing.T) {
	d := testDevice(t)
	p := alloc(t, d, 64)
	assert.Equal(t, bytes.Repeat([]byte{garbage}, 64), read(t, d, p, 64), "cuMemAlloc's memory is not zeroed, nor is ours")
	src := []byte("0123456789abcdef")
	require.NoError(t, d.MemcpyHtoD(p.Add(8), src))
	require.NoError(t, d.MemcpyDtoD(p.Add(32), p.Add(8), 16))
	require.NoError(t, d.MemsetD8(p, 0, 8))
	want := append(append(append(make([]byte, 8), src...), bytes.Repeat([]byte{garbage}, 8)...), src...)
	assert.Equal(t, want, read(t, d, p, 48))
	assert.Equal(t, 64, d.Live()-liveOther(d, p))
	assert.ErrorContains(t, d.MemFree(p.Add(1)), "not an allocation")
}

// liveOther is the live memory of d but the allocation at p.
func liveOther(d *Device, p gpu.DevicePtr) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	n := 0
	for _, a := range d.allocs {
		if a.p != p {
			n += a.n
		}
	}
	return n
}

// The synchronous copies run on the legacy default stream, as CUDA's do:
// MemcpyHtoD and MemsetD8 return before their bytes land, a non-blocking
// stream does not wait for them, MemcpyDtoH waits for the legacy stream's
// earlier work, and Synchronize for all of it.
func TestSyncCopiesRunOnTheLegacyStream(t *testing.T) {
	d := testDevice(t)
	p := alloc(t, d, 8)
	s := stream(t, d)
	h, err := d.AllocHost(8)
	require.NoError(t, err)
	defer h.Free()
	release := make(chan struct{})
	require.NoError(t, d.legacy.enqueue(func() error { <-release; return nil })) // the legacy stream is busy
	require.NoError(t, d.MemcpyHtoD(p, []byte("12345678")), "returns before the bytes land")
	require.NoError(t, d.MemsetD8(p, 'x', 2))
	require.NoError(t, s.MemcpyDtoHAsync(h, 0, p, 8))
	require.NoError(t, s.Synchronize())
	assert.Equal(t, bytes.Repeat([]byte{garbage}, 8), h.Bytes(), "a non-blocking stream does not wait for the legacy stream")
	got := make(chan []byte)
	go func() {
		b := make([]byte, 8)
		assert.NoError(t, d.MemcpyDtoH(b, p))
		got <- b
	}()
	select {
	case b := <-got:
		t.Fatalf("MemcpyDtoH returned %q before the legacy stream's earlier work ran", b)
	case <-time.After(20 * time.Millisecond):
	}
	close(release)
	assert.Equal(t, []byte("xx345678"), <-got)
}

// MemFree waits for the work queued on every stream first, as cuMemFree
// does: behind a stream that never ends, it never returns.
func TestMemFreeWaitsForTheStreams(t *testing.T) {
	d := testDevice(t)
	s := stream(t, d)
	p, err := d.MemAlloc(8)
	require.NoError(t, err)
	release := make(chan struct{})
	require.NoError(t, s.(*Stream).enqueue(func() error { <-release; return nil }))
	freed := make(chan error)
	go func() { freed <- d.MemFree(p) }()
	select {
	case err := <-freed:
		t.Fatalf("MemFree returned (%v) while a stream's work was still queued", err)
	case <-time.After(20 * time.Millisecond):
	}
	close(release)
	require.NoError(t, <-freed)
	assert.False(t, d.Inside(p, 8))
}

// A copy past the end of an allocation is CUDA's illegal address: sticky,
// every later call fails, as on a device.
func TestIllegalAddressIsSticky(t *testing.T) {
	d := testDevice(t)
	p := alloc(t, d, 16)
	s := stream(t, d)
	h, err := d.AllocHost(32)
	require.NoError(t, err)
	defer h.Free()
	require.NoError(t, s.MemcpyHtoDAsync(p, h, 0, 32), "queued: checked when it runs, as on a device")
	err = s.Synchronize()
	require.ErrorIs(t, err, ErrIllegalAddress)
	assert.ErrorContains(t, err, "MemcpyHtoDAsync of 32 bytes")
	_, err = d.MemAlloc(4)
	assert.ErrorIs(t, err, ErrIllegalAddress)
	assert.ErrorIs(t, s.MemsetD8Async(p, 0, 4), ErrIllegalAddress)
	assert.ErrorIs(t, d.Synchronize(), ErrIllegalAddress)
}

// Work on a stream runs later than it is queued, in parallel with the host
// and other streams: a read that neither waits for the stream nor follows
// an event sees the old bytes; one ordered by an event sees the new ones.
func TestStreamsRunLaterAndOnlyEventsOrderThem(t *testing.T) {
	d := testDevice(t)
	p := alloc(t, d, 8)
	a, b := stream(t, d), stream(t, d)
	h, err := d.AllocHost(8)
	require.NoError(t, err)
	defer h.Free()

	slowWork(t, d, a)
	require.NoError(t, a.MemsetD8Async(p, 1, 8))
	assert.Equal(t, bytes.Repeat([]byte{garbage}, 8), read(t, d, p, 8), "a synchronous copy does not wait for streams")
	require.NoError(t, b.MemcpyDtoHAsync(h, 0, p, 8))
	require.NoError(t, b.Synchronize())
	assert.Equal(t, bytes.Repeat([]byte{garbage}, 8), h.Bytes(), "stream b does not wait for stream a")
	done, err := a.Done()
	require.NoError(t, err)
	assert.False(t, done, "the slow work is still running")

	require.NoError(t, a.Synchronize())
	assert.Equal(t, bytes.Repeat([]byte{1}, 8), read(t, d, p, 8))

	// The same with an event between the streams.
	e, err := d.NewEvent()
	require.NoError(t, err)
	slowWork(t, d, a)
	require.NoError(t, a.MemsetD8Async(p, 2, 8))
	require.NoError(t, a.Record(e))
	require.NoError(t, b.WaitEvent(e))
	require.NoError(t, b.MemcpyDtoHAsync(h, 0, p, 8))
	done, err = e.Done()
	require.NoError(t, err)
	assert.False(t, done, "the event is not reached before the slow work")
	require.NoError(t, b.Synchronize())
	assert.Equal(t, bytes.Repeat([]byte{2}, 8), h.Bytes(), "b waited for a's event")
	require.NoError(t, e.Synchronize())
	done, err = e.Done()
	require.NoError(t, err)
	assert.True(t, done)

	// An event never recorded is done, and waiting for it waits for nothing.
	e2, err := d.NewEvent()
	require.NoError(t, err)
	done, err = e2.Done()
	require.NoError(t, err)
	assert.True(t, done)
	require.NoError(t, b.WaitEvent(e2))
	require.NoError(t, b.Synchronize())
}

// An event re-recorded refers to its latest point: a wait queued after the
// second Record waits for the second point.
func TestEventLatestRecord(t *testing.T) {
	d := testDevice(t)
	p := alloc(t, d, 4)
	a, b := stream(t, d), stream(t, d)
	h, err := d.AllocHost(4)
	require.NoError(t, err)
	defer h.Free()
	e, err := d.NewEvent()
	require.NoError(t, err)
	require.NoError(t, a.MemsetD8Async(p, 3, 4))
	require.NoError(t, a.Record(e))
	require.NoError(t, a.Synchronize())
	slowWork(t, d, a)
	require.NoError(t, a.MemsetD8Async(p, 4, 4))
	require.NoError(t, a.Record(e))
	require.NoError(t, b.WaitEvent(e))
	require.NoError(t, b.MemcpyDtoHAsync(h, 0, p, 4))
	require.NoError(t, b.Synchronize())
	assert.Equal(t, []byte{4, 4, 4, 4}, h.Bytes())
}

// Jitter delays each operation but keeps a stream's order.
func TestJitterKeepsStreamOrder(t *testing.T) {
	d := testDevice(t)
	d.SetJitter(200 * time.Microsecond)
	defer d.SetJitter(0)
	p := alloc(t, d, 1)
	s := stream(t, d)
	for i := 0; i < 50; i++ {
		require.NoError(t, s.MemsetD8Async(p, byte(i), 1))
	}
	require.NoError(t, s.Synchronize())
	assert.Equal(t, []byte{49}, read(t, d, p, 1))
}

// Kernels run through gpu.Kernels on a stream, with its argument checks,
// and only on the device's streams.
func TestKernelsOnStreams(t *testing.T) {
	d := testDevice(t)
	s := stream(t, d)
	k, err := d.Kernels()
	require.NoError(t, err)
	k2, err := d.Kernels()
	require.NoError(t, err)
	assert.Same(t, k, k2)
	x := []float32{1, 2, 3, 4, 5, 6}
	src := alloc(t, d, 24)
	out := alloc(t, d, 16)
	ptrs := alloc(t, d, 24)
	start := alloc(t, d, 12)
	require.NoError(t, d.MemcpyHtoD(src, f32bytes(x)))
	require.NoError(t, d.MemcpyHtoD(start, i32bytes([]int32{0, 3, 3})))
	require.NoError(t, d.Synchronize(), "the synchronous copies land before the kernels read them")
	require.NoError(t, k.RowPointers(s, ptrs, src, 0, 3, 8))
	require.NoError(t, k.ReduceRows(s, gpu.ReduceArgs{Out: out, OutType: gpu.F32, Src: ptrs, Start: start, N: 2, Hidden: 2, InType: gpu.F32}))
	require.NoError(t, s.Synchronize())
	assert.Equal(t, f32bytes([]float32{9, 12, 0, 0}), read(t, d, out, 16)[:16])
	assert.ErrorContains(t, k.ToBF16(nil, out, src, 2), "no default stream")
	other := stream(t, Open(99))
	assert.ErrorContains(t, k.ToBF16(other, out, src, 2), "a stream of emulated:99 used on")
}

func TestClosedStreamRefusesWork(t *testing.T) {
	d := testDevice(t)
	s, err := d.NewStream()
	require.NoError(t, err)
	require.NoError(t, s.Close())
	p := alloc(t, d, 4)
	assert.ErrorContains(t, s.MemsetD8Async(p, 0, 4), "closed stream")
	assert.False(t, errors.Is(d.Synchronize(), ErrIllegalAddress))
}

// A stream takes events and host memory of its own device only, and a
// communicator its device's streams: anything else is an error naming it,
// never a crash.
func TestForeignObjectsRefused(t *testing.T) {
	d, other := testDevice(t), Open(98)
	s := stream(t, d)
	p := alloc(t, d, 8)
	e, err := other.NewEvent()
	require.NoError(t, err)
	assert.ErrorContains(t, s.WaitEvent(e), "*emulator.Event is not an event of "+d.String())
	assert.ErrorContains(t, s.Record(e), "*emulator.Event is not an event of "+d.String())
	assert.ErrorContains(t, s.Record(nil), "<nil> is not an event of "+d.String())
	var h foreignHost
	assert.ErrorContains(t, s.MemcpyHtoDAsync(p, h, 0, 8), "emulator.foreignHost is not host memory of an emulated device")
	assert.ErrorContains(t, s.MemcpyDtoHAsync(h, 0, p, 8), "emulator.foreignHost is not host memory of an emulated device")
	require.NoError(t, s.Synchronize())
	assert.NoError(t, d.Synchronize(), "nothing was queued")
}

// foreignHost is host memory of some other device.
type foreignHost struct{}

func (foreignHost) Bytes() []byte { return make([]byte, 8) }
func (foreignHost) Free() error   { return nil }
