package emulator

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/goep/goep/gpu"
	"github.com/goep/goep/gpu/internal/kernels"
)

// Stream is an emulated CUDA stream, a gpu.Stream: a goroutine that runs
// the operations queued on it, one after the other, later than they were
// queued.
type Stream struct {
	d   *Device
	rng *rand.Rand // the jitter's, used by the goroutine only

	// enqueuing is the communicator whose group is being put on this
	// stream in the background (gpu.ErrInProgress): until it is, the
	// stream takes no other work, as NCCL requires.
	enqueuing atomic.Pointer[Comm]

	mu        sync.Mutex
	cond      sync.Cond
	queue     []op
	queued    uint64 // operations queued so far
	completed uint64 // operations run so far
	closed    bool
}

// NewStream starts a non-blocking stream on the device (a *Stream): it
// does not wait for the legacy default stream, which runs the synchronous
// copies.
func (d *Device) NewStream() (gpu.Stream, error) {
	if err := d.err(); err != nil {
		return nil, err
	}
	return d.newStream(), nil
}

func (d *Device) newStream() *Stream {
	s := &Stream{d: d, rng: rand.New(rand.NewPCG(d.seeds.Add(1), uint64(d.ordinal)))}
	s.cond.L = &s.mu
	d.mu.Lock()
	d.streams[s] = true
	d.mu.Unlock()
	go s.run()
	return s
}

// op is one queued operation; marks (event records) run even after a
// sticky error, so that nothing waiting for them hangs.
type op struct {
	f    func() error
	mark bool
}

// enqueue queues f; an error f returns becomes the device's sticky error.
func (s *Stream) enqueue(f func() error) error { return s.push(op{f: f}) }

func (s *Stream) push(o op) error {
	if err := s.d.err(); err != nil {
		return err
	}
	if c := s.enqueuing.Load(); c != nil {
		return c.misused(errors.New("emulator: work queued on a stream while an NCCL group is still being put on it (AsyncError said ErrInProgress): NCCL requires waiting for ncclSuccess before using the stream"))
	}
	return s.pushNow(o)
}

// pushNow queues o whatever is being enqueued: the communicator's own
// group.
func (s *Stream) pushNow(o op) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return fmt.Errorf("emulator: work queued on a closed stream of %v", s.d)
	}
	s.queue = append(s.queue, o)
	s.queued++
	s.cond.Broadcast()
	return nil
}

// run is the stream's goroutine. After a sticky error it skips the work but
// still counts it, so that no wait hangs on a failed device.
func (s *Stream) run() {
	for {
		s.mu.Lock()
		for len(s.queue) == 0 && !s.closed {
			s.cond.Wait()
		}
		if len(s.queue) == 0 {
			s.mu.Unlock()
			return
		}
		o := s.queue[0]
		s.queue[0] = op{}
		s.queue = s.queue[1:]
		s.mu.Unlock()

		if j := s.d.jitter.Load(); j > 0 {
			time.Sleep(time.Duration(s.rng.Int64N(j)))
		}
		if o.mark || s.d.err() == nil {
			if err := o.f(); err != nil {
				s.d.fail(err)
			}
		}
		s.mu.Lock()
		s.completed++
		s.cond.Broadcast()
		s.mu.Unlock()
	}
}

// mark is the count of operations queued so far.
func (s *Stream) mark() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.queued
}

// wait blocks until the first n operations have run.
func (s *Stream) wait(n uint64) {
	s.mu.Lock()
	for s.completed < n {
		s.cond.Wait()
	}
	s.mu.Unlock()
}

// Synchronize waits for the work queued so far; it returns the device's
// sticky error if there is one.
func (s *Stream) Synchronize() error {
	s.wait(s.mark())
	return s.d.err()
}

// Done reports whether the work queued so far has run.
func (s *Stream) Done() (bool, error) {
	s.mu.Lock()
	done := s.completed >= s.queued
	s.mu.Unlock()
	return done, s.d.err()
}

// Close waits for the stream's work and stops its goroutine.
func (s *Stream) Close() error {
	err := s.Synchronize()
	s.mu.Lock()
	s.closed = true
	s.cond.Broadcast()
	s.mu.Unlock()
	s.d.mu.Lock()
	delete(s.d.streams, s)
	s.d.mu.Unlock()
	return err
}

// MemcpyHtoDAsync queues a copy of n bytes of src from byte off to device
// address dst. The bytes are read when the copy runs.
func (s *Stream) MemcpyHtoDAsync(dst gpu.DevicePtr, src gpu.HostBuffer, off, n int) error {
	b, err := hostRange("MemcpyHtoDAsync", src, off, n)
	if err != nil || n == 0 {
		return err
	}
	return s.enqueue(func() error {
		if err := s.d.check("MemcpyHtoDAsync", dst, n); err != nil {
			return err
		}
		kernels.Write(uint64(dst), b)
		return nil
	})
}

// MemcpyDtoHAsync queues a copy of n bytes at device address src into dst
// from byte off.
func (s *Stream) MemcpyDtoHAsync(dst gpu.HostBuffer, off int, src gpu.DevicePtr, n int) error {
	b, err := hostRange("MemcpyDtoHAsync", dst, off, n)
	if err != nil || n == 0 {
		return err
	}
	return s.enqueue(func() error {
		if err := s.d.check("MemcpyDtoHAsync", src, n); err != nil {
			return err
		}
		kernels.Read(b, uint64(src))
		return nil
	})
}

// MemcpyDtoDAsync queues a device-to-device copy of n bytes.
func (s *Stream) MemcpyDtoDAsync(dst, src gpu.DevicePtr, n int) error {
	if n < 0 {
		return fmt.Errorf("emulator: MemcpyDtoDAsync: negative size %d", n)
	}
	if n == 0 {
		return nil
	}
	return s.enqueue(func() error { return s.d.copyNow(dst, src, n) })
}

// MemsetD8Async queues setting n bytes at dst to v.
func (s *Stream) MemsetD8Async(dst gpu.DevicePtr, v byte, n int) error {
	if n < 0 {
		return fmt.Errorf("emulator: MemsetD8Async: negative size %d", n)
	}
	if n == 0 {
		return nil
	}
	return s.enqueue(func() error { return s.d.memsetNow(dst, v, n) })
}

// WaitEvent makes the work queued on s from now on wait until e, an event
// of the same device, has reached the point of its latest Record (at once
// if it was never recorded).
func (s *Stream) WaitEvent(ge gpu.Event) error {
	e, err := s.event("WaitEvent", ge)
	if err != nil {
		return err
	}
	e.mu.Lock()
	target := e.recorded
	e.mu.Unlock()
	return s.enqueue(func() error {
		e.mu.Lock()
		for e.reached < target && s.d.err() == nil {
			e.cond.Wait()
		}
		e.mu.Unlock()
		return nil
	})
}

// event is the emulated event behind e, or an error naming op.
func (s *Stream) event(op string, e gpu.Event) (*Event, error) {
	ee, ok := e.(*Event)
	if !ok || ee == nil || ee.d != s.d {
		return nil, fmt.Errorf("emulator: %s: %T is not an event of %v", op, e, s.d)
	}
	return ee, nil
}

// Event marks a point in a stream's work: the gpu.Event of an emulated
// device.
type Event struct {
	d        *Device
	mu       sync.Mutex
	cond     sync.Cond
	recorded uint64    // Records so far
	reached  uint64    // the latest Record whose point a stream has reached
	at       time.Time // when it was reached
}

// NewEvent creates an event (an *Event).
func (d *Device) NewEvent() (gpu.Event, error) {
	e := &Event{d: d}
	e.cond.L = &e.mu
	return e, nil
}

// Record marks e, an event of the same device, at the current end of s's
// work; its Done and Synchronize then refer to that point.
func (s *Stream) Record(ge gpu.Event) error {
	e, err := s.event("Record", ge)
	if err != nil {
		return err
	}
	e.mu.Lock()
	e.recorded++
	g := e.recorded
	e.mu.Unlock()
	err = s.push(op{mark: true, f: func() error {
		e.mu.Lock()
		if g > e.reached {
			e.reached, e.at = g, time.Now()
		}
		e.cond.Broadcast()
		e.mu.Unlock()
		return nil
	}})
	if err != nil {
		e.mu.Lock()
		e.recorded--
		e.mu.Unlock()
	}
	return err
}

// Done reports whether the work before the latest Record has run.
func (e *Event) Done() (bool, error) {
	e.mu.Lock()
	done := e.reached >= e.recorded
	e.mu.Unlock()
	return done, e.d.err()
}

// Synchronize waits until the work before the latest Record has run.
func (e *Event) Synchronize() error {
	e.mu.Lock()
	target := e.recorded
	for e.reached < target && e.d.err() == nil {
		e.cond.Wait()
	}
	e.mu.Unlock()
	return e.d.err()
}

// ElapsedSince is the time from start's latest mark to this event's, as
// the emulated device's streams reached them; both must be reached, as
// cuEventElapsedTime requires (CUDA_ERROR_NOT_READY otherwise).
func (e *Event) ElapsedSince(gs gpu.Event) (time.Duration, error) {
	start, ok := gs.(*Event)
	if !ok || start == nil || start.d != e.d {
		return 0, fmt.Errorf("emulator: ElapsedSince: %T is not an event of %v", gs, e.d)
	}
	t0, ok0 := start.mark()
	t1, ok1 := e.mark()
	if !ok0 || !ok1 {
		return 0, errors.New("emulator: ElapsedSince: an event not recorded or not reached yet (CUDA_ERROR_NOT_READY)")
	}
	return t1.Sub(t0), nil
}

// mark is when the latest Record was reached, if it was.
func (e *Event) mark() (time.Time, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.at, e.recorded > 0 && e.reached >= e.recorded
}

// Close releases the event.
func (e *Event) Close() error { return nil }
