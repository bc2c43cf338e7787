package epcpu

import (
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/goep/goep/internal/memorder"
)

// Flags between ranks. A flag is a 64-bit word in shared (or RMA window)
// memory holding the sequence number q of the last operation its writer
// finished, in its high 32 bits, and a payload in its low 32 (flagWord):
// waits compare with q<<32, so the payload never makes a flag look newer or
// older than its call. The writer stores the data first, then the flag (signal); the
// reader waits for the flag (waitAll) and only then reads the data: a
// release store (memorder.StoreRelease) and acquire loads
// (atomic.LoadUint64), so the reader sees every byte written before the
// flag. They run in Go, not C: a flag costs a few instructions, and a cgo
// call would cost more than the flag.

// signal stores v into every flag, with release order. A raise needs no
// more: waits spin until they see the flag, and no protocol decides from a
// load right after a store whether another rank saw that store.
// (atomic.StoreUint64, sequentially consistent, is an XCHG on amd64, which
// stalls until the store owns the peer's cache line: most of the cost of a
// flag raised at a node peer.)
func signal(flags []ptr, v uint64) {
	for _, f := range flags {
		memorder.StoreRelease((*uint64)(f), v)
	}
}

// loadFlag reads a flag.
func loadFlag(f ptr) uint64 { return atomic.LoadUint64((*uint64)(f)) }

// flagWord is the value of a flag raised by call q with payload p.
func flagWord(q uint64, p uint32) uint64 { return q<<32 | uint64(p) }

// refusedBit marks an abort word: call q was refused (an input failed the
// checks on a rank); the low 24 bits hold the rank that refused it.
const refusedBit = 1 << 31

// refusedBy is the payload of an abort word for a call rank r refused.
func refusedBy(r int) uint32 { return refusedBit | uint32(r)&0xffffff }

// brokenBit marks an abort word: the rank found the group unusable (a peer
// that did not arrive, calls that no longer match) and its note says why;
// the low 24 bits hold the rank that found it first. It ends every wait for
// any flag of the rank, whatever the call.
const brokenBit = 1 << 30

// brokenBy is the payload of an abort word for a group rank r found
// unusable.
func brokenBy(r int) uint32 { return brokenBit | uint32(r)&0xffffff }

// clockAfter is how many sweeps a spinning wait makes before it reads the
// clock: a microsecond or two. A decode step's waits are shorter, and a
// clock read (tens of nanoseconds in a VM) each would be a good part of
// them; such waits are not counted in the statistics.
const clockAfter = 512

// waited is the outcome of waitAll.
type waited struct {
	missing  int           // the first flag short of the target at the timeout, or -1
	refused  int           // the rank that refused the call (an abort word said so), or -1
	ahead    int           // the first flag already past the target's call (watch.ahead), or -1
	broken   int           // the flag whose raiser says the group is unusable (its abort word), or -1
	mismatch int           // the flag whose raiser's call word says it is not in the target's call, or -1
	theirs   uint64        // with mismatch, that call word
	late     int           // the flag waited for last
	time     time.Duration // how long the wait took, when it read the clock (0: it ended at once)
	err      error         // the network failed while the wait made it progress (transport.poll)
}

func newWaited() waited { return waited{missing: -1, refused: -1, ahead: -1, broken: -1, mismatch: -1} }

// watch is what a wait polls and how it reads it: per flag, the flag, the
// abort word and the call word of the rank that raises it.
type watch struct {
	flags, aborts, calls []ptr
	peers                []int // the ranks that raise them
	target               uint64
	// refusals: an abort word that says the target's call was refused
	// ends the wait (waited.refused).
	refusals bool
	// ahead: a flag that arrived holding a later call than the target's
	// ends the wait (waited.ahead): the others went on without this rank
	// (masking), or the ranks' calls no longer match.
	ahead bool
	// mine is this rank's call word for the target's call: with it, the
	// call word of a late flag's raiser is checked against it (callsDiffer).
	// 0: no check.
	mine uint64
}

// sweep checks the flags once, from first (the flags before it have
// arrived): it returns the first flag still short of the target
// (len(flags): all arrived) and, in w, why the wait ends early, if it
// does: a flag past the target's call (w.ahead), or what the late flag's
// raiser says in its abort word (a refusal, the group unusable) and, when
// slow, in its call word (not in this call: w.mismatch).
func (ws *watch) sweep(first int, slow bool, w *waited) (int, bool) {
	for first < len(ws.flags) {
		v := atomic.LoadUint64((*uint64)(ws.flags[first]))
		if v < ws.target {
			break
		}
		if ws.ahead && v>>32 > ws.target>>32 {
			w.ahead = first
			return first, true
		}
		first++
	}
	if first == len(ws.flags) {
		return first, true
	}
	w.late = first
	a := atomic.LoadUint64((*uint64)(ws.aborts[first]))
	if a&brokenBit != 0 {
		w.broken = first
		return first, true
	}
	if ws.refusals && a>>32 == ws.target>>32 && a&refusedBit != 0 {
		w.refused = int(a & 0xffffff)
		return first, true
	}
	if slow && ws.mine != 0 {
		c := atomic.LoadUint64((*uint64)(ws.calls[first]))
		// The flag again, after the call word: a rank raises its flags of
		// a call before its word says it is past the call.
		if atomic.LoadUint64((*uint64)(ws.flags[first])) < ws.target && callsDiffer(ws.mine, c) {
			w.mismatch, w.theirs = first, c
			return first, true
		}
	}
	return first, false
}

// yield gives up the core to another thread that wants it.
func yield() { syscall.RawSyscall(syscall.SYS_SCHED_YIELD, 0, 0, 0) }

// nap sleeps for about 50 us without allocating. (time.Sleep gives a
// goroutine a timer of its own the first time it sleeps: an allocation in
// the first wait of each goroutine that lasts past 5 ms, which the
// allocation checks counted whenever a peer was late.) Both are raw system
// calls: the thread keeps its P, so that the runtime does not start another
// thread to run it meanwhile (a new M is an allocation too).
func nap() {
	ts := syscall.Timespec{Nsec: 50_000}
	syscall.RawSyscall(syscall.SYS_NANOSLEEP, uintptr(unsafe.Pointer(&ts)), 0, 0)
}

// waitAll waits until every flag of ws holds at least its target, for at
// most timeout, or until sweep says why it ends early: a refusal or the
// group unusable (the late flag's raiser's abort word), a flag already past
// the target's call, or, checked whenever the wait reads the clock, a
// raiser whose call word says it is not in the target's call. It spins for
// spin first (a peer with a core of its own answers within microseconds,
// and giving up the core would cost more), then yields the core between
// sweeps (a machine may run more ranks than cores), and after 5 ms sleeps
// 50 us between sweeps.
//
// A wait that read the clock also says how long it waited and for which flag
// last: the statistics of a rank's waits on its peers. A wait that ended
// before reading the clock waited nothing worth counting.
func waitAll(ws *watch, timeout, spin time.Duration) waited {
	w := newWaited()
	first := 0 // flags before it have arrived
	var start time.Time
	spinning := spin > 0
	for sweep := 0; ; sweep++ {
		// When spinning, the clock is read only once the flags are late: most
		// waits end within the first sweeps, and reading it costs more than a
		// sweep.
		clock := (!spinning || sweep >= clockAfter) && sweep&63 == 0
		var done bool
		if first, done = ws.sweep(first, clock, &w); done {
			if !start.IsZero() && first == len(ws.flags) {
				w.time = time.Since(start)
			}
			return w
		}
		if spinning && sweep < clockAfter {
			continue
		}
		if start.IsZero() {
			start = time.Now()
		}
		if clock {
			w.time = time.Since(start)
			if w.time > timeout {
				w.missing = first
				return w
			}
			spinning = w.time < spin
			if w.time > 5*time.Millisecond {
				nap()
				continue
			}
		}
		if !spinning {
			yield()
		}
	}
}
