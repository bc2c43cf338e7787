//go:build gpu

package gpu

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goep/goep/internal/mpitesting"
	"github.com/goep/goep/mpi"
)

// Tests that need a CUDA device, built only with -tags gpu (make test-gpu
// builds them into bin/gpu/; scripts/gpu/run-on-device.sh runs them on a
// GPU machine). None of them skips for want of a device, a driver, NVRTC or
// NCCL: they fail, so a gpu-tagged run can never pass without a GPU.

func init() {
	// Two NCCL ranks on one GPU (TestGPUNCCLTwoRanksOneGPU, and mpirun runs
	// on a one-GPU machine) need NCCL 2.30's experimental switch; NCCL reads
	// it once, at its first call.
	if os.Getenv("NCCL_MULTI_RANK_GPU_ENABLE") == "" {
		os.Setenv("NCCL_MULTI_RANK_GPU_ENABLE", "1")
	}
}

// testDevice returns device $GOEP_TEST_DEVICE (default 0), failing the test
// where there is none.
func testDevice(t testing.TB) *CUDADevice {
	t.Helper()
	n, err := DeviceCount()
	require.NoError(t, err, "the gpu-tagged tests need the CUDA driver")
	require.NotZero(t, n, "the gpu-tagged tests need a CUDA device; the driver sees none")
	ordinal := 0
	if v := os.Getenv("GOEP_TEST_DEVICE"); v != "" {
		ordinal, err = strconv.Atoi(v)
		require.NoError(t, err, "GOEP_TEST_DEVICE")
	}
	d, err := OpenDevice(ordinal)
	require.NoError(t, err)
	return d
}

func TestGPUDevice(t *testing.T) {
	d := testDevice(t)
	drv, err := DriverVersion()
	require.NoError(t, err)
	n, err := DeviceCount()
	require.NoError(t, err)
	name, err := d.Name()
	require.NoError(t, err)
	assert.NotEmpty(t, name)
	major, minor, err := d.ComputeCapability()
	require.NoError(t, err)
	assert.GreaterOrEqual(t, major, 5)
	total, err := d.TotalMemory()
	require.NoError(t, err)
	assert.Positive(t, total)
	free, total2, err := d.MemoryInfo()
	require.NoError(t, err)
	assert.Equal(t, total, total2)
	assert.LessOrEqual(t, free, total)
	bus, err := d.PCIBusID()
	require.NoError(t, err)
	assert.Regexp(t, `^[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-9]$`, bus)
	sms, err := d.Attribute(AttrMultiprocessorCount)
	require.NoError(t, err)
	assert.Positive(t, sms)
	t.Logf("%v: %s, compute capability %d.%d, %d SMs, %.1f GiB (%.1f free), PCI %s; driver for CUDA %d.%d; %d device(s)",
		d, name, major, minor, sms, float64(total)/(1<<30), float64(free)/(1<<30), bus, drv/1000, drv%1000/10, n)
	t.Logf("libraries: %v", Libraries())

	again, err := OpenDevice(d.Ordinal())
	require.NoError(t, err)
	assert.Same(t, d, again, "one Device per ordinal")
	_, err = OpenDevice(n)
	assert.ErrorContains(t, err, "no such device")
	_, err = OpenDevice(-1)
	assert.ErrorContains(t, err, "no such device")
}

// TestGPUErrorsCarryCUDANames: a failed driver call reports CUDA's own
// name and description of the error.
func TestGPUErrorsCarryCUDANames(t *testing.T) {
	d := testDevice(t)
	_, err := d.Alloc(1 << 55) // 32 PiB
	var cerr *CUDAError
	require.ErrorAs(t, err, &cerr)
	assert.Equal(t, "cuMemAlloc", cerr.Call)
	assert.NotZero(t, cerr.Code)
	assert.Regexp(t, `^CUDA_ERROR_[A-Z_]+$`, cerr.Name) // CUDA_ERROR_OUT_OF_MEMORY, as drivers say
	assert.NotEqual(t, "CUDA_ERROR_UNKNOWN_CODE", cerr.Name, "the driver names its own error")
	assert.NotEmpty(t, cerr.Message)
	assert.Contains(t, err.Error(), cerr.Name)
	t.Log(err)
}

func TestGPUMemory(t *testing.T) {
	d := testDevice(t)
	r := rand.New(rand.NewPCG(1, 2))
	for _, n := range []int{0, 1, 7, 4096, 1<<20 + 3} {
		a, err := d.Alloc(n)
		require.NoError(t, err)
		b, err := d.Alloc(n)
		require.NoError(t, err)
		assert.Equal(t, n, a.Len())
		assert.Same(t, d, a.Device())
		src := make([]byte, n)
		for i := range src {
			src[i] = byte(r.Uint32())
		}
		require.NoError(t, a.Upload(src))
		got := make([]byte, n)
		require.NoError(t, a.Download(got))
		assert.True(t, bytes.Equal(src, got), "HtoD then DtoH, %d bytes", n)

		require.NoError(t, b.CopyFrom(a))
		clear(got)
		require.NoError(t, b.Download(got))
		assert.True(t, bytes.Equal(src, got), "DtoD, %d bytes", n)

		require.NoError(t, a.Memset(0x5c))
		require.NoError(t, a.Download(got))
		assert.Equal(t, bytes.Repeat([]byte{0x5c}, n), got, "memset, %d bytes", n)

		if n >= 7 {
			v, err := b.Slice(2, 4)
			require.NoError(t, err)
			require.NoError(t, v.Upload([]byte{1, 2, 3, 4}))
			require.NoError(t, b.Download(got))
			copy(src[2:6], []byte{1, 2, 3, 4})
			assert.True(t, bytes.Equal(src, got), "a slice is a view of its parent")
			assert.ErrorContains(t, v.Free(), "a view")
			_, err = b.Slice(n-1, 2)
			assert.ErrorContains(t, err, "out of range")
		}
		assert.ErrorContains(t, a.Upload(make([]byte, n+1)), "bytes given for a buffer of")
		require.NoError(t, a.Free())
		require.NoError(t, a.Free(), "freeing twice is harmless")
		require.NoError(t, b.Free())
	}
	// Typed helpers.
	xs := []float32{1, -2.5, 3e7, 0}
	buf, err := AllocFor(d, xs)
	require.NoError(t, err)
	ys := make([]float32, len(xs))
	require.NoError(t, Download(ys, buf))
	assert.Equal(t, xs, ys)
	require.NoError(t, Upload(buf, []int32{7, 8, 9, 10}))
	is := make([]int32, 4)
	require.NoError(t, Download(is, buf))
	assert.Equal(t, []int32{7, 8, 9, 10}, is)
	require.NoError(t, buf.Free())
}

func TestGPUPinnedAsync(t *testing.T) {
	d := testDevice(t)
	s, err := d.NewStream()
	require.NoError(t, err)
	defer s.Close()
	const n = 3<<20 + 5
	h, err := d.AllocHost(n)
	require.NoError(t, err)
	defer h.Free()
	h2, err := d.AllocHost(n)
	require.NoError(t, err)
	defer h2.Free()
	assert.Len(t, h.Bytes(), n)
	for i, b := 0, h.Bytes(); i < n; i++ {
		b[i] = byte(i * 7)
	}
	a, err := d.Alloc(n)
	require.NoError(t, err)
	defer a.Free()
	b, err := d.Alloc(n)
	require.NoError(t, err)
	defer b.Free()
	require.NoError(t, a.UploadAsync(h, s))
	require.NoError(t, b.CopyFromAsync(a, s))
	require.NoError(t, b.DownloadAsync(h2, s))
	require.NoError(t, s.Synchronize())
	done, err := s.Done()
	require.NoError(t, err)
	assert.True(t, done)
	assert.True(t, bytes.Equal(h.Bytes(), h2.Bytes()), "async HtoD, DtoD, DtoH through pinned memory")

	require.NoError(t, b.MemsetAsync(0xee, s))
	require.NoError(t, b.DownloadAsync(h2, s))
	require.NoError(t, s.Synchronize())
	assert.Equal(t, bytes.Repeat([]byte{0xee}, n), h2.Bytes())
	assert.Len(t, HostSlice[float32](h), n/4)
}

func TestGPUStreamsEvents(t *testing.T) {
	d := testDevice(t)
	s1, err := d.NewStream()
	require.NoError(t, err)
	defer s1.Close()
	s2, err := d.NewStream()
	require.NoError(t, err)
	defer s2.Close()
	start, err := d.NewEvent()
	require.NoError(t, err)
	defer start.Close()
	end, err := d.NewEvent()
	require.NoError(t, err)
	defer end.Close()

	const n = 256 << 20
	big, err := d.Alloc(n)
	require.NoError(t, err)
	defer big.Free()
	require.NoError(t, s1.Record(start))
	for i := 0; i < 20; i++ {
		require.NoError(t, big.MemsetAsync(byte(i), s1))
	}
	require.NoError(t, s1.Record(end))
	// s2 waits for s1's work through the event, then reads the result.
	require.NoError(t, s2.WaitEvent(end))
	h, err := d.AllocHost(16)
	require.NoError(t, err)
	defer h.Free()
	first, err := big.Slice(0, 16)
	require.NoError(t, err)
	require.NoError(t, first.DownloadAsync(h, s2))
	require.NoError(t, s2.Synchronize())
	assert.Equal(t, bytes.Repeat([]byte{19}, 16), h.Bytes(), "s2 ran after s1's last memset")

	require.NoError(t, end.Synchronize())
	done, err := end.Done()
	require.NoError(t, err)
	assert.True(t, done)
	el, err := Elapsed(start, end)
	require.NoError(t, err)
	assert.Positive(t, el)
	assert.Less(t, el, 10*time.Second)
	t.Logf("20 memsets of %d MiB: %v (%.0f GB/s)", n>>20, el, 20*float64(n)/el.Seconds()/1e9)
	require.NoError(t, d.Synchronize())
}

// cudaEnv is the kernel suite's kernelEnv on a device.
type cudaEnv struct {
	d *CUDADevice
	k *Kernels
	s Stream // nil: the default stream
}

func (e *cudaEnv) kernels() *Kernels { return e.k }
func (e *cudaEnv) stream() Stream    { return e.s }

func (e *cudaEnv) sync(t testing.TB) {
	t.Helper()
	if e.s != nil {
		require.NoError(t, e.s.Synchronize())
	} else {
		require.NoError(t, e.d.Synchronize())
	}
}

func (e *cudaEnv) alloc(t testing.TB, n int) DevicePtr {
	t.Helper()
	b, err := e.d.Alloc(n)
	require.NoError(t, err)
	t.Cleanup(func() {
		e.sync(t)
		assert.NoError(t, b.Free())
	})
	return b.Ptr()
}

func (e *cudaEnv) view(p DevicePtr, n int) *Buffer {
	return &Buffer{dev: e.d, ptr: p, n: n, view: true}
}

func (e *cudaEnv) write(t testing.TB, p DevicePtr, b []byte) {
	t.Helper()
	require.NoError(t, e.view(p, len(b)).Upload(b))
}

func (e *cudaEnv) read(t testing.TB, b []byte, p DevicePtr) {
	t.Helper()
	require.NoError(t, e.view(p, len(b)).Download(b))
}

// TestGPUKernels runs the kernel suite on the device: every kernel against
// its CPU reference, on a stream and on the default stream, with the
// automatic grid and with a grid of 3 blocks (every grid-stride loop goes
// round) and layout chunks of 5 tokens, and with layout chunks of 64 tokens
// (longer than the columns: each thread checks several of its chunk's).
func TestGPUKernels(t *testing.T) {
	d := testDevice(t)
	begin := time.Now()
	k, err := d.Kernels()
	require.NoError(t, err, "compiling (NVRTC) and loading the kernels")
	maj, mnr, _ := NVRTCVersion()
	t.Logf("kernels for compute_%d by NVRTC %d.%d (%s) in %v; PTX cache %q", k.Arch(), maj, mnr, nvrtcLib.loaded(),
		time.Since(begin), PTXCacheDir())
	s, err := d.NewStream()
	require.NoError(t, err)
	defer s.Close()
	small := *k
	small.maxGrid, small.chunk = 3, 5
	t.Run("stream", func(t *testing.T) { runKernelSuite(t, &cudaEnv{d: d, k: k, s: s}) })
	t.Run("default_stream", func(t *testing.T) { runKernelSuite(t, &cudaEnv{d: d, k: k}) })
	t.Run("grid3_chunk5", func(t *testing.T) { runKernelSuite(t, &cudaEnv{d: d, k: &small, s: s}) })
	long := *k
	long.chunk = 64
	t.Run("chunk64", func(t *testing.T) { runKernelSuite(t, &cudaEnv{d: d, k: &long, s: s}) })
}

// TestGPUKernelCache: the PTX for the device's architecture is compiled
// once, then read from the cache.
func TestGPUKernelCache(t *testing.T) {
	d := testDevice(t)
	major, minor, err := d.ComputeCapability()
	require.NoError(t, err)
	archs, err := NVRTCSupportedArchs()
	require.NoError(t, err)
	arch, err := pickArch(10*major+minor, archs)
	require.NoError(t, err)
	dir := t.TempDir()
	t.Setenv("GOEP_PTX_CACHE", dir)
	t0 := time.Now()
	p1, err := KernelPTX(arch)
	require.NoError(t, err)
	t1 := time.Now()
	p2, err := KernelPTX(arch)
	require.NoError(t, err)
	t2 := time.Now()
	assert.Equal(t, p1, p2)
	files, _ := filepath.Glob(filepath.Join(dir, "*.ptx"))
	assert.Len(t, files, 1)
	t.Logf("compute_%d: compiled in %v, from the cache in %v", arch, t1.Sub(t0), t2.Sub(t1))
}

// ncclExchange sends a buffer to rank `to` and receives one from rank
// `from` through c, in one group, and checks what arrived. It returns an
// error rather than failing t, so that goroutines may call it.
func ncclExchange(c *NCCLComm, to, from int) error {
	d := c.Device()
	const n = 1<<20 + 12
	src := make([]byte, n)
	for i := range src {
		src[i] = byte(i*31 + c.Rank()*7)
	}
	a, err := AllocFor(d, src)
	if err != nil {
		return err
	}
	defer a.Free()
	b, err := d.Alloc(n)
	if err != nil {
		return err
	}
	defer b.Free()
	s, err := d.NewStream()
	if err != nil {
		return err
	}
	defer s.Close()
	if err := c.SendRecv(s, []Transfer{{Peer: to, Ptr: a.Ptr(), Bytes: n}}, []Transfer{{Peer: from, Ptr: b.Ptr(), Bytes: n}}); err != nil {
		return err
	}
	// Non-blocking: the group is on the stream once the state is ncclSuccess.
	if err := c.settle("SendRecv"); err != nil {
		return err
	}
	if err := s.Synchronize(); err != nil {
		return err
	}
	got := make([]byte, n)
	if err := b.Download(got); err != nil {
		return err
	}
	for i := range got {
		if want := byte(i*31 + from*7); got[i] != want {
			return fmt.Errorf("rank %d: byte %d from rank %d is %d, want %d", c.Rank(), i, from, got[i], want)
		}
	}
	return nil
}

// TestGPUNCCLSingleRank: a communicator of one rank, from an ID this
// process made, sending to itself.
func TestGPUNCCLSingleRank(t *testing.T) {
	d := testDevice(t)
	v, err := NCCLVersion()
	require.NoError(t, err)
	t.Logf("NCCL %d.%d.%d from %s", v/10000, v/100%100, v%100, ncclLib.loaded())
	id, err := NCCLUniqueID()
	require.NoError(t, err)
	assert.NotEqual(t, mpi.UniqueID{}, id)
	c, err := NewNCCLCommFromID(d, id, 0, 1, time.Minute)
	require.NoError(t, err)
	assert.Equal(t, 0, c.Rank())
	assert.Equal(t, 1, c.Size())
	require.NoError(t, ncclExchange(c, 0, 0))
	assert.NoError(t, c.AsyncError(), "no asynchronous error after a good exchange")
	assert.ErrorContains(t, c.SendRecv(nil, []Transfer{{Peer: 1, Ptr: 1, Bytes: 1}}, nil), "bad transfer")
	require.NoError(t, c.Close())
	assert.ErrorContains(t, c.AsyncError(), "closed or aborted")
	assert.ErrorContains(t, c.SendRecv(nil, []Transfer{{Peer: 0, Ptr: 1, Bytes: 1}}, nil), "closed or aborted")
	require.NoError(t, c.Close(), "closing twice is harmless")
	_, err = NewNCCLCommFromID(d, id, 1, 1, time.Minute)
	assert.ErrorContains(t, err, "rank 1 of 1")
}

// duplicateGPU reports whether err is NCCL refusing two ranks on one GPU.
func duplicateGPU(err error) bool {
	var nerr *NCCLError
	return errors.As(err, &nerr) && (nerr.Code == 5 /* ncclInvalidUsage */ || strings.Contains(strings.ToLower(nerr.Last), "duplicate"))
}

// needMultiRankGPU skips t where the NCCL loaded refuses two ranks on one
// GPU (before 2.30, whatever NCCL_MULTI_RANK_GPU_ENABLE says), saying so:
// the test is not run, and the device command prints it as skipped.
func needMultiRankGPU(t *testing.T) {
	t.Helper()
	v, err := NCCLVersion()
	require.NoError(t, err)
	if v < 23000 {
		t.Skipf("NCCL %d.%d.%d refuses two ranks on one GPU (Duplicate GPU detected); 2.30 allows it with NCCL_MULTI_RANK_GPU_ENABLE=1", v/10000, v/100%100, v%100)
	}
}

// TestGPUNCCLTwoRanksOneGPU: two ranks of one communicator in this process,
// one goroutine each, on the same GPU, exchanging buffers. NCCL before 2.30
// refuses it ("Duplicate GPU detected"): the test then skips, saying so.
func TestGPUNCCLTwoRanksOneGPU(t *testing.T) {
	d := testDevice(t)
	needMultiRankGPU(t)
	id, err := NCCLUniqueID()
	require.NoError(t, err)
	comms := make([]*NCCLComm, 2)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for r := range comms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			comms[r], errs[r] = NewNCCLCommFromID(d, id, r, 2, 2*time.Minute)
		}()
	}
	if !waitTimeout(&wg, 2*time.Minute) {
		t.Fatal("ncclCommInitRank of two ranks on one GPU did not return in 2 minutes")
	}
	if errs[0] != nil || errs[1] != nil {
		for _, c := range comms {
			if c != nil {
				_ = c.Abort()
			}
		}
		v, _ := NCCLVersion()
		if duplicateGPU(errs[0]) || duplicateGPU(errs[1]) {
			t.Skipf("NCCL %d refuses two ranks on one GPU (NCCL_MULTI_RANK_GPU_ENABLE=%s): %v; %v", v,
				os.Getenv("NCCL_MULTI_RANK_GPU_ENABLE"), errs[0], errs[1])
		}
		t.Fatalf("ncclCommInitRank: %v; %v", errs[0], errs[1])
	}
	for r, c := range comms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[r] = ncclExchange(c, 1-r, 1-r)
		}()
	}
	if !waitTimeout(&wg, 2*time.Minute) {
		t.Fatal("the exchange between two ranks on one GPU did not finish in 2 minutes")
	}
	require.NoError(t, errs[0], "rank 0")
	require.NoError(t, errs[1], "rank 1")
	for _, c := range comms {
		require.NoError(t, c.Close())
	}
}

func waitTimeout(wg *sync.WaitGroup, d time.Duration) bool {
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
		return true
	case <-time.After(d):
		return false
	}
}

// TestGPUNewNCCLComm: NewNCCLComm over the MPI world (one rank in a build
// without the mpi tag; every rank under mpirun with -tags "gpu mpi"), each
// rank on DeviceForRank's device, then a ring exchange.
func TestGPUNewNCCLComm(t *testing.T) {
	w := mpitesting.World
	testDevice(t)
	dev, err := DeviceForRank(w)
	require.NoError(t, err)
	c, err := NewNCCLComm(w, -1)
	if err != nil && duplicateGPU(err) {
		n, _ := DeviceCount()
		t.Skipf("NCCL refuses %d ranks on %d GPU(s): %v", w.Size(), n, err)
	}
	require.NoError(t, err)
	defer func() { assert.NoError(t, c.Close()) }()
	assert.Equal(t, w.Rank(), c.Rank())
	assert.Equal(t, w.Size(), c.Size())
	assert.Equal(t, dev, c.Device().Ordinal())
	assert.NoError(t, ncclExchange(c, (c.Rank()+1)%c.Size(), (c.Rank()+c.Size()-1)%c.Size()))
	mpitesting.Agree(t, w)
}

// TestGPUNewNCCLCommWithID: the ID made on rank 0 beforehand (as
// moe-train -device cuda does at start) and handed over MPI; a ring
// exchange on the communicator made from it.
func TestGPUNewNCCLCommWithID(t *testing.T) {
	w := mpitesting.World
	testDevice(t)
	id, err := mpi.BootstrapID(w, 0, NCCLUniqueID)
	require.NoError(t, err)
	c, err := NewNCCLCommWithID(w, -1, id)
	if err != nil && duplicateGPU(err) {
		n, _ := DeviceCount()
		t.Skipf("NCCL refuses %d ranks on %d GPU(s): %v", w.Size(), n, err)
	}
	require.NoError(t, err)
	defer func() { assert.NoError(t, c.Close()) }()
	assert.Equal(t, w.Rank(), c.Rank())
	assert.NoError(t, ncclExchange(c, (c.Rank()+1)%c.Size(), (c.Rank()+c.Size()-1)%c.Size()))
	mpitesting.Agree(t, w)
}

// TestGPUCopiesByAddress: the copies by device address, synchronous and on
// a stream through pinned memory at an offset.
func TestGPUCopiesByAddress(t *testing.T) {
	d := testDevice(t)
	const n = 4099
	a, err := d.Alloc(n)
	require.NoError(t, err)
	defer a.Free()
	b, err := d.Alloc(n)
	require.NoError(t, err)
	defer b.Free()
	src := make([]byte, n)
	for i := range src {
		src[i] = byte(i * 13)
	}
	require.NoError(t, d.MemcpyHtoD(a.Ptr(), src))
	require.NoError(t, d.MemcpyDtoD(b.Ptr().Add(1), a.Ptr(), n-1))
	got := make([]byte, n-1)
	require.NoError(t, d.MemcpyDtoH(got, b.Ptr().Add(1)))
	assert.Equal(t, src[:n-1], got)
	require.NoError(t, d.MemsetD8(b.Ptr(), 0x3c, 10))
	require.NoError(t, d.MemcpyDtoH(got[:10], b.Ptr()))
	assert.Equal(t, bytes.Repeat([]byte{0x3c}, 10), got[:10])
	assert.ErrorContains(t, d.MemcpyDtoD(0, a.Ptr(), 4), "address 0")

	s, err := d.NewStream()
	require.NoError(t, err)
	defer s.Close()
	h, err := d.AllocHost(2 * n)
	require.NoError(t, err)
	defer h.Free()
	copy(h.Bytes()[n:], src)
	require.NoError(t, s.MemcpyHtoDAsync(b.Ptr(), h, n, n))
	require.NoError(t, s.MemsetD8Async(a.Ptr(), 0, n))
	require.NoError(t, s.MemcpyDtoDAsync(a.Ptr(), b.Ptr(), n))
	require.NoError(t, s.MemcpyDtoHAsync(h, 0, a.Ptr(), n))
	require.NoError(t, s.Synchronize())
	assert.Equal(t, src, h.Bytes()[:n])
	assert.ErrorContains(t, s.MemcpyHtoDAsync(b.Ptr(), h, n+1, n), "out of range")
	var none *CUDAStream
	assert.ErrorContains(t, none.MemcpyDtoDAsync(a.Ptr(), b.Ptr(), 4), "needs a stream")
}

// TestGPUNCCLAbortEndsAStalledReceive: rank 1 of a two-rank communicator on
// one GPU never sends; rank 0's receive would wait for ever, and Abort, on
// the goroutine that polls the communicator, ends it: the stream completes
// and AsyncError reports the communicator gone. Package epgpu's waits rely
// on exactly this.
func TestGPUNCCLAbortEndsAStalledReceive(t *testing.T) {
	d := testDevice(t)
	needMultiRankGPU(t)
	id, err := NCCLUniqueID()
	require.NoError(t, err)
	comms := make([]*NCCLComm, 2)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for r := range comms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			comms[r], errs[r] = NewNCCLCommFromID(d, id, r, 2, 2*time.Minute)
		}()
	}
	if !waitTimeout(&wg, 2*time.Minute) {
		t.Fatal("ncclCommInitRank of two ranks on one GPU did not return in 2 minutes")
	}
	require.NoError(t, errs[0])
	require.NoError(t, errs[1])
	defer comms[1].Close()
	buf, err := d.Alloc(1 << 20)
	require.NoError(t, err)
	defer buf.Free()
	s, err := d.NewStream()
	require.NoError(t, err)
	defer s.Close()
	require.NoError(t, comms[0].SendRecv(s, nil, []Transfer{{Peer: 1, Ptr: buf.Ptr(), Bytes: 1 << 20}}))
	start := time.Now()
	for time.Since(start) < 300*time.Millisecond {
		err := comms[0].AsyncError()
		if err != nil && !errors.Is(err, ErrInProgress) {
			t.Fatalf("the communicator failed: %v", err)
		}
		time.Sleep(time.Millisecond)
	}
	fin, err := s.Done()
	require.NoError(t, err)
	assert.False(t, fin, "a receive from a silent peer completed")
	require.NoError(t, comms[0].Abort())
	ended := make(chan error, 1)
	go func() { ended <- s.Synchronize() }()
	select {
	case err := <-ended:
		t.Logf("the stream ended after the abort: %v", err)
	case <-time.After(time.Minute):
		t.Fatal("the stream of the aborted receive did not complete in a minute")
	}
	assert.Error(t, comms[0].AsyncError(), "an aborted communicator reports it")
}
