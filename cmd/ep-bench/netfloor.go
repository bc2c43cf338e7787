package main

import (
	"fmt"
	"strings"
	"time"

	"github.com/goep/goep/ep"
	"github.com/goep/goep/mpi"
)

// The network floor: the least that ep's own traffic across nodes can cost.
// ep's transport counts, per peer, the bytes it puts across nodes (rows,
// metadata, count vectors, flags: Stats.NetworkSent); one untimed
// dispatch and combine give this rank's row of each matrix. The floor moves
// exactly those bytes between exactly those ranks, one plain MPI exchange
// per half (dispatch, then combine, as ep must), from buffers filled
// beforehand: no packing, no forwarding, no flags in the timed part. Two
// plain exchanges are timed, and the faster is the floor: a blocking
// MPI_Alltoallv, whose algorithm for large messages (Open MPI's pairwise
// exchange) may move one pair at a time, and every MPI_Isend and MPI_Irecv
// posted at once then polled to completion, which keeps every link busy. A
// transport that kept every link busy with no copy in the way would take
// that long; "x floor" is ep's time over it.

// netFloor is the floor's exchange of one configuration: the buffers and
// the counts of both halves, and a communicator whose collectives are plain
// blocking MPI calls.
type netFloor struct {
	comm       *mpi.Comm
	halves     [2]floorHalf // dispatch, combine
	sbuf, rbuf *mpi.Buffer  // the halves' bytes, outside the Go heap
}

// floorHalf is one MPI_Alltoallv: what this rank sends to and receives from
// each rank.
type floorHalf struct {
	send, recv                 []byte
	sendN, sendD, recvN, recvD []int
	bytes                      int64 // sent by this rank
	ns, nr                     int   // the lengths of send and recv
	sends, recvs               []mpi.Message
}

// newNetFloor measures the traffic of one dispatch and combine of g (after
// its warm-up, so that the counts are a steady call's) and sets up the
// exchange that moves the same bytes. nil on one node. It is collective.
func newNetFloor[E ep.Element](b *bench[E]) (*netFloor, error) {
	if b.g.Nodes() < 2 {
		return nil, nil
	}
	disp, comb, err := trafficOf(b)
	if err != nil || disp == nil {
		return nil, err // disp nil: the backend does not count them, on every rank
	}
	c, err := b.world.Split(0, b.world.Rank(), "ep-bench/floor")
	if err != nil {
		return nil, err
	}
	c.SetTimeout(0) // plain MPI_Alltoallv, as a hand-written program calls it
	f := &netFloor{comm: c}
	for i, sent := range [2][]int64{disp, comb} {
		if err := f.halves[i].setup(c, sent); err != nil {
			_ = c.Free()
			return nil, err
		}
	}
	// The halves run one after the other: one pair of buffers serves both.
	ns, nr := max(f.halves[0].ns, f.halves[1].ns), max(f.halves[0].nr, f.halves[1].nr)
	if f.sbuf, err = mpi.NewBuffer(ns); err == nil {
		f.rbuf, err = mpi.NewBuffer(nr)
	}
	if err != nil {
		f.close()
		return nil, err
	}
	for i := range f.halves {
		f.halves[i].place(c, f.sbuf, f.rbuf)
	}
	return f, nil
}

// trafficOf runs one dispatch and combine of b.g, untimed, and returns the
// bytes this rank put to each rank across nodes in each (nil where the
// backend does not count them).
func trafficOf[E ep.Element](b *bench[E]) (disp, comb []int64, err error) {
	g := b.g
	if err := b.world.Barrier(); err != nil {
		return nil, nil, err
	}
	g.ResetStats()
	h, err := g.Dispatch(ep.Tokens(b.x, b.topk, b.weights))
	if err != nil {
		return nil, nil, err
	}
	st := g.Stats()
	disp = st.NetworkSent // nil where the backend does not count them (ep.NetworkMeter): no floor
	if disp == nil {
		return nil, nil, g.Combine(h, h.Recv(), b.out, nil)
	}
	y := h.Recv()
	if g.Config().Wire.FP8() {
		if err := dequantizeValid(g, h); err != nil {
			return nil, nil, err
		}
		y = h.CombineBuffer()
	}
	if err := g.Combine(h, y, b.out, nil); err != nil {
		return nil, nil, err
	}
	total := g.Stats().NetworkSent
	comb = make([]int64, len(total))
	for r := range total {
		comb[r] = total[r] - disp[r]
	}
	return disp, comb, nil
}

// setup exchanges the counts (sent[d]: this rank's bytes for rank d) and
// allocates and fills the buffers.
func (h *floorHalf) setup(c *mpi.Comm, sent []int64) error {
	R := c.Size()
	mine, theirs := make([]int64, R), make([]int64, R)
	copy(mine, sent)
	if err := mpi.AlltoallSlice(c, mine, theirs); err != nil {
		return err
	}
	h.sendN, h.sendD, h.recvN, h.recvD = make([]int, R), make([]int, R), make([]int, R), make([]int, R)
	var ns, nr int
	for r := 0; r < R; r++ {
		h.sendN[r], h.sendD[r], h.recvN[r], h.recvD[r] = int(mine[r]), ns, int(theirs[r]), nr
		ns += int(mine[r])
		nr += int(theirs[r])
		h.bytes += mine[r]
	}
	h.ns, h.nr = max(ns, 1), max(nr, 1)
	return nil
}

// place puts the half's bytes in the floor's buffers (as long as the
// longer half's) and makes its messages.
func (h *floorHalf) place(c *mpi.Comm, sbuf, rbuf *mpi.Buffer) {
	h.send, h.recv = sbuf.Bytes()[:h.ns], rbuf.Bytes()[:h.nr]
	for i := range h.send {
		h.send[i] = byte(i)
	}
	for r := 0; r < c.Size(); r++ {
		if r == c.Rank() {
			continue
		}
		if h.sendN[r] > 0 {
			h.sends = append(h.sends, mpi.Message{Peer: r, Addr: sbuf.Addr(h.sendD[r]), Bytes: h.sendN[r]})
		}
		if h.recvN[r] > 0 {
			h.recvs = append(h.recvs, mpi.Message{Peer: r, Addr: rbuf.Addr(h.recvD[r]), Bytes: h.recvN[r]})
		}
	}
}

// p2p posts every send and receive of the half at once and polls them to
// completion.
func (h *floorHalf) p2p(c *mpi.Comm) error {
	x, err := c.Exchange(h.sends, h.recvs)
	if err != nil {
		return err
	}
	for {
		done, err := x.Test()
		if err != nil || done {
			return err
		}
	}
}

// exchange times each half from a barrier, as ep's calls are timed, by
// MPI_Alltoallv (a2a) and by point-to-point messages all posted at once
// (p2p), and says how much processor time this rank used in the latter.
func (f *netFloor) exchange() (a2a, p2p [2]time.Duration, cpu time.Duration, err error) {
	for i := range f.halves {
		h := &f.halves[i]
		if err := f.comm.Barrier(); err != nil {
			return a2a, p2p, 0, err
		}
		t0 := time.Now()
		if err := f.comm.Alltoallv(h.send, h.sendN, h.sendD, h.recv, h.recvN, h.recvD); err != nil {
			return a2a, p2p, 0, err
		}
		a2a[i] = time.Since(t0)
		if err := f.comm.Barrier(); err != nil {
			return a2a, p2p, 0, err
		}
		c0 := cpuTime()
		t0 = time.Now()
		if err := h.p2p(f.comm); err != nil {
			return a2a, p2p, 0, err
		}
		p2p[i] = time.Since(t0)
		cpu += cpuTime() - c0
	}
	return a2a, p2p, cpu, nil
}

func (f *netFloor) close() {
	if f == nil {
		return
	}
	for _, b := range []*mpi.Buffer{f.sbuf, f.rbuf} {
		if b != nil {
			_ = b.Free()
		}
	}
	_ = f.comm.Free()
}

// timelineOf runs one more dispatch and combine of b.g with the engine's
// timeline on and returns every rank's steps as text, times from the
// barrier that starts the round (on every rank; rank 0 prints them).
func timelineOf[E ep.Element](b *bench[E]) (string, error) {
	g := b.g
	if !g.RecordTimeline(256) {
		return "", nil
	}
	defer g.RecordTimeline(0)
	if err := b.world.Barrier(); err != nil {
		return "", err
	}
	t0 := time.Now()
	if _, _, err := round(b.world, g, b.x, b.out, b.topk, b.weights); err != nil {
		return "", err
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, " rank %d (node %d):\n", b.world.Rank(), g.Node())
	fmt.Fprintf(&sb, "  %5s %9s %9s %8s  %-28s %-8s %s\n", "call", "start ms", "end ms", "ms", "step", "peer", "bytes")
	if err := ep.WriteTimeline(&sb, g.Timeline(), t0); err != nil {
		return "", err
	}
	mine := []byte(sb.String())
	most := []int64{0}
	if err := mpi.Allreduce(b.world, mpi.OpMax, []int64{int64(len(mine))}, most); err != nil {
		return "", err
	}
	padded := make([]byte, most[0])
	copy(padded, mine)
	all := make([]byte, int(most[0])*b.world.Size())
	if err := b.world.Allgather(padded, all); err != nil {
		return "", err
	}
	return strings.ReplaceAll(string(all), "\x00", ""), nil
}
