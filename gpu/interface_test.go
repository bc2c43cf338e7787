package gpu

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// otherEvent, otherHost and otherStream are another device's: the CUDA
// types refuse them with an error naming the type, before any driver call
// (so these run with no GPU).
type otherEvent struct{}

func (otherEvent) Done() (bool, error) { return true, nil }
func (otherEvent) Synchronize() error  { return nil }
func (otherEvent) Close() error        { return nil }

func (otherEvent) ElapsedSince(Event) (time.Duration, error) { return 0, nil }

type otherHost struct{ b []byte }

func (h otherHost) Bytes() []byte { return h.b }
func (otherHost) Free() error     { return nil }

type otherQueue struct{}

func (otherQueue) Synchronize() error { return nil }

func TestCUDARefusesAnotherDevicesObjects(t *testing.T) {
	var s *CUDAStream // the default stream: Record needs no stream of its own
	assert.ErrorContains(t, s.Record(otherEvent{}), "gpu: Record: gpu.otherEvent is not a live event of a CUDA device")
	assert.ErrorContains(t, s.Record(nil), "gpu: Record: <nil> is not a live event of a CUDA device")
	assert.ErrorContains(t, s.Record(&CUDAEvent{}), "*gpu.CUDAEvent is not a live event", "a closed event")
	_, err := Elapsed(otherEvent{}, otherEvent{})
	assert.ErrorContains(t, err, "gpu: Elapsed: gpu.otherEvent is not a live event of a CUDA device")

	_, err = cudaHost("MemcpyHtoDAsync", otherHost{})
	assert.ErrorContains(t, err, "gpu: MemcpyHtoDAsync: gpu.otherHost is not pinned memory of a CUDA device")
	b := &Buffer{n: 8}
	assert.ErrorContains(t, b.UploadAsync(otherHost{make([]byte, 8)}, nil), "gpu.otherHost is not pinned memory")
	assert.ErrorContains(t, b.DownloadAsync(otherHost{make([]byte, 8)}, nil), "gpu.otherHost is not pinned memory")

	_, err = cudaStream(otherQueue{})
	assert.ErrorContains(t, err, "gpu.otherQueue is not a CUDA stream")
	cs, err := cudaStream(nil)
	require.NoError(t, err, "nil is the default stream")
	assert.Nil(t, cs)
}

// HostSlice views any device's host memory.
func TestHostSlice(t *testing.T) {
	h := otherHost{make([]byte, 10)}
	assert.Len(t, HostSlice[float32](h), 2, "rounded down")
	h.b[4] = 1
	assert.Equal(t, float32(1.4e-45), HostSlice[float32](h)[1])
	assert.Nil(t, HostSlice[uint64](otherHost{make([]byte, 7)}))
}
