package epgpu

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/goep/goep/ep/driver"
	"github.com/goep/goep/gpu"
	"github.com/goep/goep/mpi"
)

// engine is the GPU engine of one group: device buffers, two streams (ks
// runs the kernels and the copies to and from the host, cs the transfers),
// events between them, the communicator, and a mode that decides what goes
// where.
//
// NCCL has no timeouts and allows one call at a time on a communicator, so
// the engine polls its non-blocking communicator itself, on the goroutine
// that makes the call: while NCCL puts a group on the stream (it may wait
// for peers to connect) and while a wait's event is not reached, it reads
// the communicator's state, and past the group's timeout, or on a failure,
// it aborts the communicator there and then. From then on every call
// fails, and Close only drains and frees.
type engine struct {
	spec       driver.Spec
	rank, size int
	place      driver.Placement
	dev        gpu.Device
	mem        memory
	k          *gpu.Kernels
	comm       gpu.Comm
	failed     error // why the communicator was aborted (errStalled, or its failure); nil while it is not
	ks, cs     gpu.Stream
	diag       gpu.Stream     // reads the headers of a group that timed out
	diagHost   gpu.HostBuffer // [size] header words
	mode       mode
	names      opNames
	notes      *notes    // the reasons of refused calls
	ksEnd      gpu.Event // orders a refused call's transfers after the kernels queued before it
	met        meter
	late       []int // a probe's late peers (meter.go)
	// starts marks on ks where each half call's device work begins, by
	// kind (dispatch, combine) and buffer set; devTimes are the last
	// completed dispatch's and combine's device times (DeviceTimes).
	starts   [2][2]gpu.Event
	devTimes [2]time.Duration

	allocs []gpu.DevicePtr
	hosts  []gpu.HostBuffer
	events []gpu.Event
	bytes  int
}

// mode is LowLatency or HighThroughput on the engine.
type mode interface {
	send(d *driver.Dispatch) error
	wait(d *driver.Dispatch) error
	combineSend(c *driver.Combine) error
	combineWait(c *driver.Combine) error
	// refuse takes part in the transfers of a call this rank refused,
	// its headers saying so, and waits for them; it returns the other
	// ranks that refused the call too (ascending).
	refuse(r *driver.Refusal) ([]int, error)
	// end is the event a wait of kind (0 dispatch, 1 combine) on buffer
	// set waits for: the end of the call's device work.
	end(kind, set int) gpu.Event
}

type opNames struct{ dispatch, combine, open string }

// openEngine opens the device and communicator (collective), allocates the
// mode's buffers, agrees with the other ranks that every one succeeded and
// exchanges a word with every peer, within the group's timeout, which also
// makes NCCL connect them now. After the communicator exists, a failure returns the
// engine too: the Group closes it on every rank.
func openEngine(comm *mpi.Comm, spec driver.Spec, open func() (gpu.Device, gpu.Comm, error)) (*engine, error) {
	m := spec.Mode.String()
	e := &engine{spec: spec, rank: comm.Rank(), size: comm.Size(),
		names: opNames{dispatch: m + " dispatch", combine: m + " combine", open: "NewGroup"}}
	topo, err := comm.Topology()
	if err != nil {
		return nil, err
	}
	e.place = driver.Placement{Node: topo.Node, Nodes: topo.Nodes, NodeOf: topo.NodeOf}
	e.met, e.late = newMeter(topo.NodeOf, topo.Node), make([]int, 0, e.size)
	if err := topo.Free(); err != nil {
		return nil, err
	}
	if e.dev, e.comm, err = open(); err != nil {
		return nil, err
	}
	e.mem = memory{e.dev}
	err = e.setUp()
	if err = mpi.AgreeOnError(comm, err); err != nil {
		return e, err
	}
	// After the agreement: a rank whose device failed to open is in
	// the Group's agreement, not in this Split.
	if e.notes, err = newNotes(comm, spec.Timeout); err != nil {
		return e, err
	}
	return e, e.connect()
}

// setUp makes the streams, events and buffers.
func (e *engine) setUp() error {
	var err error
	if e.k, err = e.dev.Kernels(); err != nil {
		return err
	}
	for _, s := range []*gpu.Stream{&e.ks, &e.cs, &e.diag} {
		if *s, err = e.dev.NewStream(); err != nil {
			return err
		}
	}
	if e.diagHost, err = e.host(8 * e.size); err != nil {
		return err
	}
	if e.ksEnd, err = e.event(); err != nil {
		return err
	}
	for k := range e.starts {
		for b := range e.starts[k] {
			if e.starts[k][b], err = e.event(); err != nil {
				return err
			}
		}
	}
	if e.spec.Mode == driver.LowLatency {
		e.mode, err = newLL(e)
	} else {
		e.mode, err = newHT(e)
	}
	if err != nil {
		return err
	}
	// The modes' set-up copies run on the legacy stream, which the
	// engine's streams do not wait for.
	return e.dev.Synchronize()
}

// connect exchanges one word with every rank, itself included.
func (e *engine) connect() error {
	buf, err := e.alloc(8 * e.size)
	if err != nil {
		return err
	}
	var sends, recvs []gpu.Transfer
	for p := 0; p < e.size; p++ {
		sends = append(sends, gpu.Transfer{Peer: p, Ptr: buf, Bytes: 4})
		recvs = append(recvs, gpu.Transfer{Peer: p, Ptr: buf + gpu.DevicePtr(4*e.size+4*p), Bytes: 4})
	}
	if err := e.cs.MemsetD8Async(buf, 0, 8*e.size); err != nil {
		return err
	}
	ev, err := e.event()
	if err != nil {
		return err
	}
	if err := e.sendRecv(e.names.open, e.cs, sends, recvs); err != nil {
		return err
	}
	if err := e.cs.Record(ev); err != nil {
		return err
	}
	return e.wait(e.names.open, "its first transfer", ev, headers{})
}

// alloc returns n bytes of device memory, freed at Close.
func (e *engine) alloc(n int) (gpu.DevicePtr, error) {
	p, err := e.dev.MemAlloc(n)
	if err != nil {
		return 0, err
	}
	e.allocs = append(e.allocs, p)
	e.bytes += n
	return p, nil
}

// host returns n bytes of host memory for asynchronous copies, freed at
// Close.
func (e *engine) host(n int) (gpu.HostBuffer, error) {
	h, err := e.dev.AllocHost(n)
	if err != nil {
		return nil, err
	}
	e.hosts = append(e.hosts, h)
	return h, nil
}

// event returns an event, destroyed at Close.
func (e *engine) event() (gpu.Event, error) {
	ev, err := e.dev.NewEvent()
	if err != nil {
		return nil, err
	}
	e.events = append(e.events, ev)
	return ev, nil
}

func (e *engine) Placement() driver.Placement { return e.place }
func (e *engine) Memory() driver.Memory       { return e.mem }
func (e *engine) BufferBytes() int            { return e.bytes }

func (e *engine) DispatchSend(d *driver.Dispatch) error {
	if err := e.ks.Record(e.starts[0][d.Set]); err != nil {
		return fmt.Errorf("epgpu: %s: %w", e.names.dispatch, err)
	}
	return e.mode.send(d)
}

func (e *engine) DispatchWait(d *driver.Dispatch) error {
	if err := e.mode.wait(d); err != nil {
		return err
	}
	e.timed(0, d.Set)
	return nil
}

func (e *engine) CombineSend(c *driver.Combine) error {
	if err := e.ks.Record(e.starts[1][c.Dispatch.Set]); err != nil {
		return fmt.Errorf("epgpu: %s: %w", e.names.combine, err)
	}
	return e.mode.combineSend(c)
}

func (e *engine) CombineWait(c *driver.Combine) error {
	if err := e.mode.combineWait(c); err != nil {
		return err
	}
	e.timed(1, c.Dispatch.Set)
	return nil
}

// timed sets the device time of a call of kind on set that completed:
// from its start mark to the event its wait waited for.
func (e *engine) timed(kind, set int) {
	t, err := e.mode.end(kind, set).ElapsedSince(e.starts[kind][set])
	if err != nil {
		t = 0 // both events were reached: only a device fault fails this, and the next call reports it
	}
	e.devTimes[kind] = t
}

// TransferBytes is what the IPC transport moved into this rank's buffers
// and what fixed-size transfers would have (ep.TransferMeter): zeros over
// NCCL alone.
func (e *engine) TransferBytes() (moved, full int64) {
	if c, ok := e.comm.(*gpu.NodeComm); ok {
		return c.Moved()
	}
	return 0, 0
}

// DeviceTimes are the device times of the last completed dispatch and
// combine (ep.DeviceTimer).
func (e *engine) DeviceTimes() (dispatch, combine time.Duration) { return e.devTimes[0], e.devTimes[1] }

// Refuse takes part in a call this rank refused: it sends its reason to
// every other rank, takes part in the call's transfers with headers that
// say the call is refused (so that every other rank's same call ends with
// an *ep.RefusedError), waits for them, and receives the reasons of the
// other ranks that refused the call too. See docs/gpu.md.
func (e *engine) Refuse(r *driver.Refusal) error {
	op := e.names.dispatch
	if r.Kind == driver.CallCombine {
		op = e.names.combine
	}
	if err := e.notes.send(r.Reason); err != nil {
		return fmt.Errorf("epgpu: %s: sending the reason of a refusal: %w", op, err)
	}
	others, err := e.mode.refuse(r)
	if err != nil {
		return err
	}
	if len(others) > 0 {
		_, err = e.notes.recv(op, others)
	}
	return err
}

// refusedBy ends a call that the ranks in refusers (ascending, at least
// one) refused: it receives their reasons and names the first.
func (e *engine) refusedBy(op string, refusers []int) error {
	reasons, err := e.notes.recv(op, refusers)
	if err != nil {
		return err
	}
	return &driver.RefusedError{Op: op, Rank: refusers[0], Reason: reasons[0]}
}

// afterKernels makes the transfers queued next wait for the work queued on
// the kernel stream so far: a refused call's transfers reuse buffers that
// earlier calls' kernels may still read.
func (e *engine) afterKernels(q *queue) {
	q.do(e.ks.Record(e.ksEnd))
	q.do(e.cs.WaitEvent(e.ksEnd))
}

// drainLimit bounds the wait for the streams at Close once the
// communicator is aborted: the abort ends its groups, and the kernels then
// finish by themselves.
const drainLimit = time.Minute

// Close waits for the streams, frees the buffers and closes the
// communicator. It is collective. Work still queued that waits for peers
// (a send half never waited for, whose peers never come) is given the
// group's timeout; past it, or when the communicator was aborted already,
// Close aborts the communicator first, then drains the streams, then frees
// the memory (freeing memory waits for the device's work, which would wait
// for ever behind a group whose peer is gone).
func (e *engine) Close() error {
	if e == nil {
		return nil
	}
	var errs []error
	streams := []gpu.Stream{e.ks, e.cs, e.diag}
	if e.comm != nil && e.failed == nil {
		for _, s := range streams {
			if s != nil && drain(s, e.spec.Timeout) != nil {
				e.abort(errStalled)
				break
			}
		}
	}
	drained := true
	for _, s := range streams {
		if s == nil {
			continue
		}
		if err := drain(s, drainLimit); err != nil {
			errs = append(errs, err)
			drained = false
			continue
		}
		errs = append(errs, s.Close())
	}
	e.ks, e.cs, e.diag = nil, nil, nil
	// The communicator goes first: over IPC, the node peers unmap this
	// rank's memory in their Close before any of it is freed.
	if e.comm != nil {
		errs = append(errs, e.comm.Close()) // after an abort: only what is left to free
		e.comm = nil
	}
	if drained {
		for _, p := range e.allocs {
			errs = append(errs, e.dev.MemFree(p))
		}
		for _, h := range e.hosts {
			errs = append(errs, h.Free())
		}
	} else {
		// A stream that did not end may still use them: left allocated.
		errs = append(errs, fmt.Errorf("epgpu: Close: %d bytes of device memory left allocated behind a stream that did not end", e.bytes))
	}
	for _, ev := range e.events {
		errs = append(errs, ev.Close())
	}
	e.allocs, e.hosts, e.events = nil, nil, nil
	if e.notes != nil {
		errs = append(errs, e.notes.close())
		e.notes = nil
	}
	return errors.Join(errs...)
}

// drain waits for a stream's work, for at most limit.
func drain(s gpu.Stream, limit time.Duration) error {
	start := time.Now()
	for {
		done, err := s.Done()
		if err != nil || done {
			return err
		}
		if time.Since(start) > limit {
			return fmt.Errorf("epgpu: a stream's work did not finish within %v of Close", limit)
		}
		gpu.Backoff(time.Since(start))
	}
}

// errStalled is the reason of an abort past the group's timeout.
var errStalled = errors.New("epgpu: a wait on the peers outlived the group's timeout")

// abort aborts the communicator, once, for reason: its queued groups end,
// and every later call fails with reason.
func (e *engine) abort(reason error) {
	if e.failed != nil {
		return
	}
	e.failed = reason
	_ = e.comm.Abort()
}

// broken is the error of a call after the communicator was aborted.
func (e *engine) broken(op string) error {
	return fmt.Errorf("epgpu: %s: the group's communicator was aborted after an earlier failure (%v): close the group", op, e.failed)
}

// pollEvery is how often a wait reads the communicator's state.
const pollEvery = time.Millisecond

// sendRecv posts a group of transfers and polls the communicator until
// NCCL has put it on the stream (it may wait for peers to connect), for at
// most the group's timeout.
func (e *engine) sendRecv(op string, s gpu.Stream, sends, recvs []gpu.Transfer) error {
	if e.failed != nil {
		return e.broken(op)
	}
	if err := e.comm.SendRecv(s, sends, recvs); err != nil {
		return fmt.Errorf("epgpu: %s: %w", op, err)
	}
	start := time.Now()
	waiting, _ := e.comm.(interface{ WaitingFor() int })
	last := start
	for {
		err := e.comm.AsyncError()
		if waiting != nil { // a transport that completes the group on the host: charge the peer it waits for
			now := time.Now()
			if p := waiting.WaitingFor(); p >= 0 && p < len(e.met.waits) {
				e.met.waits[p] += now.Sub(last)
			}
			last = now
		}
		if err == nil {
			break
		}
		if !errors.Is(err, gpu.ErrInProgress) {
			e.abort(err)
			return e.failure(op, "the transfers", err, headers{})
		}
		if time.Since(start) > e.spec.Timeout {
			peer := -1
			if waiting != nil {
				peer = waiting.WaitingFor() // a transport that completes the transfers on the host knows whom it waits for
			}
			e.abort(errStalled)
			if peer >= 0 {
				return &driver.TimeoutError{Op: op, Peer: peer, What: "its part of the transfers", After: e.spec.Timeout}
			}
			return e.failure(op, "the peers to post the transfers", errStalled, headers{})
		}
		gpu.Backoff(time.Since(start))
	}
	e.met.sent(sends)
	return nil
}

// headers say where the peers' header words of a group land, to name the
// peer that did not arrive: word 0 of each is the call's sequence number.
type headers struct {
	at     gpu.DevicePtr // peer p's word is at at + p*stride
	stride int
	peers  []int // the peers expected, in order
	op     uint32
}

// wait waits for ev, polling the communicator, for at most the group's
// timeout. A stalled peer becomes a *ep.TimeoutError naming it where h can
// tell (-1 otherwise); an asynchronous failure of the transport an error of
// op; either aborts the communicator. The time waited is charged to the
// peers h finds late (meter.go).
func (e *engine) wait(op, what string, ev gpu.Event, h headers) error {
	if e.failed != nil {
		return e.broken(op)
	}
	start := time.Now()
	p := probe{h: h, start: start, late: e.late[:0]}
	polled := start
	for {
		done, err := ev.Done()
		if err != nil {
			return fmt.Errorf("epgpu: %s: waiting for %s: %w", op, what, err)
		}
		now := time.Now()
		if done || now.Sub(polled) >= pollEvery {
			polled = now
			if err := e.comm.AsyncError(); err != nil && !errors.Is(err, gpu.ErrInProgress) {
				e.abort(err)
				return e.failure(op, what, err, h)
			}
		}
		if done {
			e.charge(&p)
			return nil
		}
		if now.Sub(start) > e.spec.Timeout {
			e.abort(errStalled)
			return e.failure(op, what, errStalled, h)
		}
		e.step(&p)
		gpu.Backoff(now.Sub(start))
	}
}

// failure is the error of a wait or a post that ended in an abort.
func (e *engine) failure(op, what string, reason error, h headers) error {
	if reason == errStalled {
		return &driver.TimeoutError{Op: op, Peer: e.missing(h), What: what, After: e.spec.Timeout}
	}
	return fmt.Errorf("epgpu: %s: waiting for %s: the transport failed: %w", op, what, reason)
}

// diagLimit bounds the read of the headers after a timeout.
const diagLimit = 2 * time.Second

// missing reads the header words of h on the diagnostic stream (which
// does not wait for the stalled one) and returns the first expected peer
// whose word is not of this call, or -1.
func (e *engine) missing(h headers) int {
	if len(h.peers) == 0 || e.diag == nil {
		return -1
	}
	for i, p := range h.peers {
		if err := e.diag.MemcpyDtoHAsync(e.diagHost, 4*i, h.at+gpu.DevicePtr(p*h.stride), 4); err != nil {
			return -1
		}
	}
	if drain(e.diag, diagLimit) != nil {
		return -1
	}
	b := e.diagHost.Bytes()
	for i, p := range h.peers {
		if binary.LittleEndian.Uint32(b[4*i:]) != h.op {
			return p
		}
	}
	return -1
}

// others lists the ranks but this one.
func (e *engine) others() []int {
	var out []int
	for p := 0; p < e.size; p++ {
		if p != e.rank {
			out = append(out, p)
		}
	}
	return out
}

// tensor is n bytes of device memory at p as a tensor of the group's memory.
func tensor[T driver.Scalar](e *engine, p gpu.DevicePtr, n int) driver.Tensor[T] {
	t, err := driver.FromBytes[T](driver.OnDevice[byte](e.mem, uint64(p), n))
	if err != nil {
		panic(err) // sizes are whole elements by construction
	}
	return t
}

// ptrOf is the device address of a tensor of device memory.
func ptrOf[T driver.Scalar](t driver.Tensor[T]) gpu.DevicePtr { return gpu.DevicePtr(t.Addr()) }

// allocator makes a mode's buffers and events, keeping the first error.
type allocator struct {
	e   *engine
	err error
}

func (a *allocator) dev(n int) gpu.DevicePtr {
	if a.err != nil {
		return 0
	}
	p, err := a.e.alloc(n)
	a.err = err
	return p
}

func (a *allocator) host(n int) gpu.HostBuffer {
	if a.err != nil {
		return nil
	}
	h, err := a.e.host(n)
	a.err = err
	return h
}

func (a *allocator) event() gpu.Event {
	if a.err != nil {
		return nil
	}
	ev, err := a.e.event()
	a.err = err
	return ev
}

// queue runs the steps of one half call in order, keeping the first error.
type queue struct{ err error }

func (q *queue) do(err error) {
	if q.err == nil {
		q.err = err
	}
}
