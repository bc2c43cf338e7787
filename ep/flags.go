package ep

import (
	"sync/atomic"
	"syscall"
	"time"

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

// clockAfter is how many sweeps a spinning wait makes before it reads the
// clock: a microsecond or two. A decode step's waits are shorter, and a
// clock read (tens of nanoseconds in a VM) each would be a good part of
// them; such waits are not counted in the statistics.
const clockAfter = 512

// waited is the outcome of waitAll.
type waited struct {
	missing int           // the first flag short of the target at the timeout, or -1
	refused int           // the rank that refused the call (an abort word said so), or -1
	ahead   int           // the first flag already past the target's call (checkAhead), or -1
	late    int           // the flag waited for last
	time    time.Duration // how long the wait took, when it read the clock (0: it ended at once)
	err     error         // the network failed while the wait made it progress (transport.poll)
}

// sweepFlags checks flags once, from first (the flags before it have
// arrived): it returns the first flag still short of target (len(flags):
// all arrived) and, in w, the rank that refused the call where that flag's
// abort word says so (w.refused), or, with checkAhead, a flag already past
// the target's call (w.ahead).
func sweepFlags(flags, aborts []ptr, first int, target uint64, checkAhead bool) (int, waited) {
	w := waited{missing: -1, refused: -1, ahead: -1}
	for first < len(flags) {
		v := atomic.LoadUint64((*uint64)(flags[first]))
		if v < target {
			if aborts != nil {
				if a := atomic.LoadUint64((*uint64)(aborts[first])); a>>32 == target>>32 && a&refusedBit != 0 {
					w.refused = int(a & 0xffffff)
				}
			}
			return first, w
		}
		if checkAhead && v>>32 > target>>32 {
			w.ahead = first
			return first, w
		}
		first++
	}
	return first, w
}

// yield gives up the core to another thread that wants it.
func yield() { syscall.Syscall(syscall.SYS_SCHED_YIELD, 0, 0, 0) }

// nap sleeps for about 50 us without allocating. (time.Sleep gives a
// goroutine a timer of its own the first time it sleeps: an allocation in
// the first wait of each goroutine that lasts past 5 ms, which the
// allocation checks counted whenever a peer was late.)
func nap() {
	ts := syscall.Timespec{Nsec: 50_000}
	syscall.Nanosleep(&ts, nil)
}

// waitAll waits until every flag holds at least target, for at most
// timeout. aborts (nil: none) holds, for each flag, the abort word of the
// rank that raises it: when a flag is late and its rank's abort word says
// the target's call was refused, waitAll returns at once with the rank that
// refused it. With checkAhead, a flag that arrived holding a later call than
// the target's ends the wait too (the others went on without this rank: it
// was masked). It spins for spin first (a peer with a core of its own
// answers within microseconds, and giving up the core would cost more), then
// yields the core between sweeps (a machine may run more ranks than cores),
// and after 5 ms sleeps 50 us between sweeps.
//
// A wait that read the clock also says how long it waited and for which flag
// last: the statistics of a rank's waits on its peers. A wait that ended
// before reading the clock waited nothing worth counting.
func waitAll(flags, aborts []ptr, target uint64, timeout, spin time.Duration, checkAhead bool) waited {
	w := waited{missing: -1, refused: -1, ahead: -1}
	first := 0 // flags before it have arrived
	var start time.Time
	spinning := spin > 0
	for sweep := 0; ; sweep++ {
		for first < len(flags) {
			v := atomic.LoadUint64((*uint64)(flags[first]))
			if v < target {
				break
			}
			if checkAhead && v>>32 > target>>32 {
				w.ahead = first
				return w
			}
			first++
		}
		if first == len(flags) {
			if !start.IsZero() {
				w.time = time.Since(start)
			}
			return w
		}
		w.late = first
		if aborts != nil {
			if a := atomic.LoadUint64((*uint64)(aborts[first])); a>>32 == target>>32 && a&refusedBit != 0 {
				w.refused = int(a & 0xffffff)
				return w
			}
		}
		// When spinning, the clock is read only once the flags are late: most
		// waits end within the first sweeps, and reading it costs more than a
		// sweep.
		if spinning && sweep < clockAfter {
			continue
		}
		if start.IsZero() {
			start = time.Now()
		}
		if sweep&63 == 0 {
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
			syscall.Syscall(syscall.SYS_SCHED_YIELD, 0, 0, 0)
		}
	}
}
