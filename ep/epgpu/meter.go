package epgpu

import (
	"encoding/binary"
	"time"

	"github.com/goep/goep/gpu"
)

// meter is what the engine measured since it was opened (ep.Meter): the
// bytes its groups sent to ranks on other nodes, and the time it waited
// for each peer.
//
// A wait is for a whole group (an event after it): nothing on the host
// says which peer completed last. So a wait that lasts longer than
// probeAfter reads the group's header words from the peers on the
// diagnostic stream, again and again (one copy per peer, not on the
// streams the call uses) until a read finds every header there. The time
// from the wait's start to that read is charged to the peers that the
// read before it found missing (the last to arrive), split evenly; the
// rest of the wait (the transfers' bytes landing, the device's own work
// after them) is charged to no peer, nor is a wait whose first read found
// every header there or that ended before probeAfter. A header shows that
// a peer's transfers began to land, not that all of them did, and the
// reads see it up to a read's latency late.
type meter struct {
	waits  []time.Duration // per rank
	net    int64
	remote []bool // per rank: on another node
}

// probeAfter is how long a wait lasts before it reads the peers' headers.
const probeAfter = 100 * time.Microsecond

func newMeter(nodeOf []int, node int) meter {
	m := meter{waits: make([]time.Duration, len(nodeOf)), remote: make([]bool, len(nodeOf))}
	for r, n := range nodeOf {
		m.remote[r] = n != node
	}
	return m
}

// Meter reports what the engine measured since it was opened (ep.Meter).
func (e *engine) Meter() ([]time.Duration, int64) { return e.met.waits, e.met.net }

// sent counts a group's bytes to other nodes.
func (m *meter) sent(sends []gpu.Transfer) {
	for _, t := range sends {
		if m.remote[t.Peer] {
			m.net += int64(t.Bytes)
		}
	}
}

// probe reads, during one wait, which peers' headers have not arrived.
type probe struct {
	h        headers
	start    time.Time
	inFlight bool      // a read is queued on the diagnostic stream
	late     []int     // the peers the last read that found some missing found missing
	allIn    time.Time // when a read first found every header there; zero before
	off      bool      // reading failed: charge nothing
}

// step polls the read in flight, and starts another once the wait has
// lasted probeAfter.
func (e *engine) step(p *probe) {
	if p.off || !p.allIn.IsZero() || len(p.h.peers) == 0 || e.diag == nil {
		return
	}
	if p.inFlight {
		done, err := e.diag.Done()
		if err != nil {
			p.off = true
			return
		}
		if !done {
			return
		}
		p.inFlight = false
		b := e.diagHost.Bytes()
		missing := 0
		for i := range p.h.peers {
			if binary.LittleEndian.Uint32(b[4*i:]) != p.h.op {
				missing++
			}
		}
		if missing == 0 {
			p.allIn = time.Now()
			return
		}
		p.late = p.late[:0]
		for i, peer := range p.h.peers {
			if binary.LittleEndian.Uint32(b[4*i:]) != p.h.op {
				p.late = append(p.late, peer)
			}
		}
	}
	if time.Since(p.start) < probeAfter {
		return
	}
	for i, peer := range p.h.peers {
		if err := e.diag.MemcpyDtoHAsync(e.diagHost, 4*i, p.h.at+gpu.DevicePtr(peer*p.h.stride), 4); err != nil {
			p.off = true
			return
		}
	}
	p.inFlight = true
}

// charge charges a wait that has ended to the peers it found late.
func (e *engine) charge(p *probe) {
	if p.off || len(p.late) == 0 {
		return
	}
	end := p.allIn
	if end.IsZero() {
		end = time.Now()
	}
	share := end.Sub(p.start) / time.Duration(len(p.late))
	for _, peer := range p.late {
		e.met.waits[peer] += share
	}
}
