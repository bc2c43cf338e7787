package epgpu

import (
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"time"

	"github.com/goep/goep/ep"
	"github.com/goep/goep/gpu"
	"github.com/goep/goep/mpi"
)

// engine is the GPU engine of one group: device buffers, two streams (ks
// runs the kernels and the copies to and from the host, cs the transfers),
// events between them, the communicator and its watchdog, and a mode that
// decides what goes where.
type engine struct {
	spec       ep.Spec
	rank, size int
	place      ep.Placement
	dev        gpu.Device
	mem        memory
	k          *gpu.Kernels
	comm       gpu.Comm
	wd         *watchdog
	ks, cs     gpu.Stream
	diag       gpu.Stream     // reads the headers of a group that timed out
	diagHost   gpu.HostBuffer // [size] header words
	mode       mode
	names      opNames
	notes      *notes    // the reasons of refused calls
	ksEnd      gpu.Event // orders a refused call's transfers after the kernels queued before it
	met        meter
	late       []int // a probe's late peers (meter.go)

	allocs []gpu.DevicePtr
	hosts  []gpu.HostBuffer
	events []gpu.Event
	bytes  int
}

// mode is LowLatency or HighThroughput on the engine.
type mode interface {
	send(d *ep.Dispatch) error
	wait(d *ep.Dispatch) error
	combineSend(c *ep.Combine) error
	combineWait(c *ep.Combine) error
	// refuse takes part in the transfers of a call this rank refused,
	// its headers saying so, and waits for them; it returns the other
	// ranks that refused the call too (ascending).
	refuse(r *ep.Refusal) ([]int, error)
}

type opNames struct{ dispatch, combine, open string }

// openEngine opens the device and communicator (collective), allocates the
// mode's buffers, agrees with the other ranks that every one succeeded and
// exchanges a word with every peer under the watchdog, which also makes NCCL
// connect them now. After the communicator exists, a failure returns the
// engine too: the Group closes it on every rank.
func openEngine(comm *mpi.Comm, spec ep.Spec, open func() (gpu.Device, gpu.Comm, error)) (*engine, error) {
	m := spec.Mode.String()
	e := &engine{spec: spec, rank: comm.Rank(), size: comm.Size(),
		names: opNames{dispatch: m + " dispatch", combine: m + " combine", open: "NewGroup"}}
	topo, err := comm.Topology()
	if err != nil {
		return nil, err
	}
	e.place = ep.Placement{Node: topo.Node, Nodes: topo.Nodes, NodeOf: topo.NodeOf}
	e.met, e.late = newMeter(topo.NodeOf, topo.Node), make([]int, 0, e.size)
	if err := topo.Free(); err != nil {
		return nil, err
	}
	if e.dev, e.comm, err = open(); err != nil {
		return nil, err
	}
	e.mem = memory{e.dev}
	e.wd = newWatchdog(e.comm, spec.Timeout)
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
	if e.spec.Mode == ep.LowLatency {
		e.mode, err = newLL(e)
	} else {
		e.mode, err = newHT(e)
	}
	return err
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
	if err := e.dev.MemsetD8(buf, 0, 8*e.size); err != nil {
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

func (e *engine) Placement() ep.Placement { return e.place }
func (e *engine) Memory() ep.Memory       { return e.mem }
func (e *engine) BufferBytes() int        { return e.bytes }

func (e *engine) DispatchSend(d *ep.Dispatch) error { return e.mode.send(d) }
func (e *engine) DispatchWait(d *ep.Dispatch) error { return e.mode.wait(d) }
func (e *engine) CombineSend(c *ep.Combine) error   { return e.mode.combineSend(c) }
func (e *engine) CombineWait(c *ep.Combine) error   { return e.mode.combineWait(c) }

// Refuse takes part in a call this rank refused: it sends its reason to
// every other rank, takes part in the call's transfers with headers that
// say the call is refused (so that every other rank's same call ends with
// an *ep.RefusedError), waits for them, and receives the reasons of the
// other ranks that refused the call too. See docs/gpu.md.
func (e *engine) Refuse(r *ep.Refusal) error {
	op := e.names.dispatch
	if r.Kind == ep.CallCombine {
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
	return &ep.RefusedError{Op: op, Rank: refusers[0], Reason: reasons[0]}
}

// afterKernels makes the transfers queued next wait for the work queued on
// the kernel stream so far: a refused call's transfers reuse buffers that
// earlier calls' kernels may still read.
func (e *engine) afterKernels(q *queue) {
	q.do(e.ks.Record(e.ksEnd))
	q.do(e.cs.WaitEvent(e.ksEnd))
}

// drainLimit bounds the wait for the streams at Close: they end by
// themselves, the communicator aborted if a peer stalled.
const drainLimit = time.Minute

// Close waits for the streams, frees the buffers and closes the
// communicator. It is collective.
func (e *engine) Close() error {
	if e == nil {
		return nil
	}
	var errs []error
	if e.wd != nil {
		e.wd.close()
		e.wd = nil
	}
	for _, s := range []gpu.Stream{e.ks, e.cs, e.diag} {
		if s == nil {
			continue
		}
		if err := drain(s, drainLimit); err != nil {
			errs = append(errs, err)
			continue
		}
		errs = append(errs, s.Close())
	}
	e.ks, e.cs, e.diag = nil, nil, nil
	for _, p := range e.allocs {
		errs = append(errs, e.dev.MemFree(p))
	}
	for _, h := range e.hosts {
		errs = append(errs, h.Free())
	}
	for _, ev := range e.events {
		errs = append(errs, ev.Close())
	}
	e.allocs, e.hosts, e.events = nil, nil, nil
	if e.comm != nil {
		errs = append(errs, e.comm.Close())
		e.comm = nil
	}
	if e.notes != nil {
		errs = append(errs, e.notes.close())
		e.notes = nil
	}
	return errors.Join(errs...)
}

// drain waits for a stream's work, for at most limit.
func drain(s gpu.Stream, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for spin := 0; ; spin++ {
		done, err := s.Done()
		if err != nil || done {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("epgpu: a stream's work did not finish within %v of Close", limit)
		}
		pause(spin)
	}
}

// pause backs off between polls: yield at first, then sleep a little
// longer each time, up to 200 us (a machine may run more ranks than cores).
func pause(spin int) {
	if spin < 32 {
		runtime.Gosched()
		return
	}
	time.Sleep(time.Duration(min(spin-31, 200)) * time.Microsecond)
}

// sendRecv queues a group of transfers under the watchdog: NCCL may block
// while it connects to a peer.
func (e *engine) sendRecv(op string, s gpu.Stream, sends, recvs []gpu.Transfer) error {
	e.wd.arm()
	err := e.comm.SendRecv(s, sends, recvs)
	e.wd.disarm()
	if f := e.wd.err(); f != nil {
		return e.failure(op, "the transfers", f, headers{})
	}
	if err != nil {
		return fmt.Errorf("epgpu: %s: %w", op, err)
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

// wait waits for ev under the watchdog. A stalled peer becomes a
// *ep.TimeoutError naming it where h can tell (-1 otherwise); an
// asynchronous failure of the transport an error of op. The time waited
// is charged to the peers h finds late (meter.go).
func (e *engine) wait(op, what string, ev gpu.Event, h headers) error {
	e.wd.arm()
	defer e.wd.disarm()
	p := probe{h: h, start: time.Now(), late: e.late[:0]}
	for spin := 0; ; spin++ {
		done, err := ev.Done()
		if err != nil {
			return fmt.Errorf("epgpu: %s: waiting for %s: %w", op, what, err)
		}
		if done {
			// The watchdog's verdict first: its abort also ends the
			// group, and then the event, before this loop sees it.
			if f := e.wd.err(); f != nil {
				return e.failure(op, what, f, h)
			}
			if err := e.comm.AsyncError(); err != nil {
				return e.failure(op, what, err, h)
			}
			e.charge(&p)
			return nil
		}
		if f := e.wd.err(); f != nil {
			return e.failure(op, what, f, h)
		}
		e.step(&p)
		pause(spin)
	}
}

// failure is the error of a wait that the watchdog ended, or of a failed
// transport.
func (e *engine) failure(op, what string, reason error, h headers) error {
	if reason == errStalled {
		return &ep.TimeoutError{Op: op, Peer: e.missing(h), What: what, After: e.spec.Timeout}
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
func tensor[T ep.Scalar](e *engine, p gpu.DevicePtr, n int) ep.Tensor[T] {
	t, err := ep.FromBytes[T](ep.OnDevice[byte](e.mem, uint64(p), n))
	if err != nil {
		panic(err) // sizes are whole elements by construction
	}
	return t
}

// ptrOf is the device address of a tensor of device memory.
func ptrOf[T ep.Scalar](t ep.Tensor[T]) gpu.DevicePtr { return gpu.DevicePtr(t.Addr()) }

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
