package epgpu

import (
	"errors"
	"sync"
	"time"

	"github.com/goep/goep/gpu"
)

// errStalled is the watchdog's verdict when a wait outlived the timeout.
var errStalled = errors.New("epgpu: a wait on the peers outlived the group's timeout")

// watchdog ends waits on peers that NCCL would let last for ever. While
// armed (during every call that waits on peers: a group's enqueueing, which
// NCCL may block in while it connects, and every wait for a group's event)
// its goroutine polls the communicator's asynchronous error and the
// deadline; on either it aborts the communicator, which ends the queued
// groups, and keeps the reason for the waiter.
type watchdog struct {
	comm     gpu.Comm
	timeout  time.Duration
	interval time.Duration

	mu       sync.Mutex
	armed    bool
	deadline time.Time
	fired    error // why the communicator was aborted; nil while it is not
	wake     chan struct{}
	stop     chan struct{}
	done     chan struct{}
}

func newWatchdog(c gpu.Comm, timeout time.Duration) *watchdog {
	w := &watchdog{comm: c, timeout: timeout, interval: min(max(timeout/100, time.Millisecond), 10*time.Millisecond),
		wake: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
	go w.run()
	return w
}

// arm starts the clock of one wait.
func (w *watchdog) arm() {
	w.mu.Lock()
	w.armed, w.deadline = true, time.Now().Add(w.timeout)
	w.mu.Unlock()
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

func (w *watchdog) disarm() {
	w.mu.Lock()
	w.armed = false
	w.mu.Unlock()
}

// err is why the communicator was aborted, or nil.
func (w *watchdog) err() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.fired
}

func (w *watchdog) run() {
	defer close(w.done)
	t := time.NewTicker(w.interval)
	defer t.Stop()
	for {
		w.mu.Lock()
		armed, deadline, fired := w.armed, w.deadline, w.fired != nil
		w.mu.Unlock()
		if fired {
			<-w.stop
			return
		}
		if !armed {
			select {
			case <-w.wake:
				continue
			case <-w.stop:
				return
			}
		}
		select {
		case <-t.C:
		case <-w.stop:
			return
		}
		reason := w.comm.AsyncError()
		if reason == nil && time.Now().After(deadline) {
			reason = errStalled
		}
		if reason == nil {
			continue
		}
		w.mu.Lock()
		if !w.armed { // the wait ended in time after all
			w.mu.Unlock()
			continue
		}
		w.fired = reason
		w.mu.Unlock()
		_ = w.comm.Abort()
	}
}

// close stops the goroutine.
func (w *watchdog) close() {
	close(w.stop)
	<-w.done
}
