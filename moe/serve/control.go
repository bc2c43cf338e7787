package serve

import (
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"time"

	"github.com/goep/goep/mpi"
)

// Rank 0 schedules: before every step it sends each rank that takes part
// an instruction (what kind of step, the requests newly given to it,
// whether to rejoin). Instructions are point-to-point messages
// (mpi.Comm.Exchange) on a communicator of their own, so that a stalled
// rank holds nobody up: rank 0 simply stops writing to a rank it has
// masked, and a rank that finds itself masked tells rank 0 by a message of
// its own (a "back" message with its requests' progress), which rank 0
// picks up between steps.

// ctlKind is the kind of an instruction.
type ctlKind int64

const (
	ctlStep   ctlKind = iota + 1 // run a step
	ctlIdle                      // nothing to do yet: wait for the next instruction
	ctlStop                      // serving is over
	ctlMasked                    // the others masked you: say where you are, then wait to rejoin
)

// control is one instruction of rank 0.
type control struct {
	kind   ctlKind
	step   int64    // the step's number (ctlStep), or the last step sent (ctlMasked)
	sk     stepKind // ctlStep
	rejoin bool     // ctlStep: call SetMask(nil) first, with every rank
	assign []int    // request ids newly given to the rank, in order
}

// ctlWords is an instruction's length in int64 words for a batch: kind,
// step, step kind, rejoin, count, and up to batch request ids.
func ctlWords(batch int) int { return 5 + batch }

func (c *control) encode(dst []int64) {
	clear(dst)
	dst[0], dst[1], dst[2] = int64(c.kind), c.step, int64(c.sk)
	if c.rejoin {
		dst[3] = 1
	}
	dst[4] = int64(len(c.assign))
	for i, id := range c.assign {
		dst[5+i] = int64(id)
	}
}

func decodeControl(src []int64) (control, error) {
	c := control{kind: ctlKind(src[0]), step: src[1], sk: stepKind(src[2]), rejoin: src[3] != 0}
	n := int(src[4])
	if c.kind < ctlStep || c.kind > ctlMasked || n < 0 || 5+n > len(src) {
		return control{}, fmt.Errorf("serve: malformed instruction from rank 0: %v", src[:5])
	}
	for _, id := range src[5 : 5+n] {
		c.assign = append(c.assign, int(id))
	}
	return c, nil
}

// back is a masked rank's report: the last instruction it took (acked),
// and the progress of every request it holds.
type back struct {
	rank  int
	acked int64
	slots []slot // id, prefilled, generated
}

// backWords is a report's length in int64 words: rank, acked, count and
// three words per request.
func backWords(batch int) int { return 3 + 3*batch }

func (b *back) encode(dst []int64) {
	clear(dst)
	dst[0], dst[1], dst[2] = int64(b.rank), b.acked, int64(len(b.slots))
	for i, s := range b.slots {
		dst[3+3*i], dst[4+3*i], dst[5+3*i] = int64(s.id), int64(s.prefilled), int64(s.generated)
	}
}

func decodeBack(src []int64) (back, error) {
	b := back{rank: int(src[0]), acked: src[1]}
	n := int(src[2])
	if n < 0 || 3+3*n > len(src) {
		return back{}, fmt.Errorf("serve: malformed report from rank %d: %v", b.rank, src[:3])
	}
	for i := 0; i < n; i++ {
		b.slots = append(b.slots, slot{id: int(src[3+3*i]), prefilled: int(src[4+3*i]), generated: int(src[5+3*i])})
	}
	return b, nil
}

// sendRing is how many instructions to one rank may be in flight at once.
const sendRing = 16

// channel carries instructions from rank 0 and reports to it.
type channel struct {
	c            *mpi.Comm
	rank, size   int
	ctlW, backW  int // message lengths in words
	timeout      time.Duration
	mem          *mpi.Buffer // rank 0: send ring per rank, report slot per rank; others: receive slot, report slot
	sends        [][]*mpi.Exchange
	next         []int
	backs        []*mpi.Exchange // rank 0: the report receive posted from each rank
	recv, report *mpi.Exchange   // others: in flight
	words        []int64
}

// newChannel opens the instruction channel over comm. Collective.
func newChannel(comm *mpi.Comm, batch int, reports bool, timeout time.Duration) (*channel, error) {
	c, err := comm.Split(0, comm.Rank(), "serve-control")
	if err != nil {
		return nil, fmt.Errorf("serve: instruction channel: %w", err)
	}
	ch := &channel{c: c, rank: c.Rank(), size: c.Size(), ctlW: ctlWords(batch), backW: backWords(batch), timeout: timeout}
	ch.words = make([]int64, max(ch.ctlW, ch.backW))
	size := 8 * (ch.ctlW + ch.backW)
	if ch.rank == 0 {
		size = 8 * ch.size * (sendRing*ch.ctlW + ch.backW)
		ch.sends, ch.next, ch.backs = make([][]*mpi.Exchange, ch.size), make([]int, ch.size), make([]*mpi.Exchange, ch.size)
		for r := range ch.sends {
			ch.sends[r] = make([]*mpi.Exchange, sendRing)
		}
	}
	if ch.mem, err = mpi.NewBuffer(size); err != nil {
		return nil, errors.Join(err, c.Free())
	}
	if ch.rank == 0 && reports {
		for r := 1; r < ch.size; r++ {
			if err := ch.postReport(r); err != nil {
				return nil, errors.Join(err, ch.close())
			}
		}
	}
	return ch, nil
}

// sendOff is the byte offset of rank 0's ring slot i for rank r, and
// reportOff of the report from (rank 0) or by (others) rank r.
func (ch *channel) sendOff(r, i int) int { return 8 * (r*sendRing + i) * ch.ctlW }
func (ch *channel) reportOff(r int) int {
	if ch.rank != 0 {
		return 8 * ch.ctlW
	}
	return 8*ch.size*sendRing*ch.ctlW + 8*r*ch.backW
}

func (ch *channel) put(off int, words []int64) {
	b := ch.mem.Bytes()[off:]
	for i, w := range words {
		binary.LittleEndian.PutUint64(b[8*i:], uint64(w))
	}
}

func (ch *channel) get(off, n int) []int64 {
	b := ch.mem.Bytes()[off:]
	out := ch.words[:n]
	for i := range out {
		out[i] = int64(binary.LittleEndian.Uint64(b[8*i:]))
	}
	return out
}

// poll calls test until it reports done, spinning a little and then
// sleeping between calls, for at most limit.
func poll(limit time.Duration, test func() (bool, error)) (bool, error) {
	start := time.Now()
	for i := 0; ; i++ {
		done, err := test()
		if done || err != nil {
			return done, err
		}
		if i%64 == 0 && time.Since(start) > limit {
			return false, nil
		}
		if i < 2000 {
			runtime.Gosched()
		} else {
			time.Sleep(20 * time.Microsecond)
		}
	}
}

// send gives rank r (not 0) an instruction. Rank 0 only; it does not wait
// for r to take it.
func (ch *channel) send(r int, c *control) error {
	i := ch.next[r]
	if x := ch.sends[r][i]; x != nil { // the instruction sendRing ago must be gone
		done, err := poll(ch.timeout, x.Test)
		if err != nil {
			return fmt.Errorf("serve: instruction to rank %d: %w", r, err)
		}
		if !done {
			return fmt.Errorf("serve: rank %d has not taken an instruction of %d ago within %v", r, sendRing, ch.timeout)
		}
	}
	ch.next[r] = (i + 1) % sendRing
	w := ch.words[:ch.ctlW]
	c.encode(w)
	off := ch.sendOff(r, i)
	ch.put(off, w)
	x, err := ch.c.Exchange([]mpi.Message{{Peer: r, Addr: ch.mem.Addr(off), Bytes: 8 * ch.ctlW}}, nil)
	if err != nil {
		return fmt.Errorf("serve: instruction to rank %d: %w", r, err)
	}
	ch.sends[r][i] = x
	return nil
}

// receive waits, up to the channel's timeout, for rank 0's next
// instruction. Not rank 0.
func (ch *channel) receive() (control, error) {
	if ch.recv == nil {
		x, err := ch.c.Exchange(nil, []mpi.Message{{Peer: 0, Addr: ch.mem.Addr(0), Bytes: 8 * ch.ctlW}})
		if err != nil {
			return control{}, fmt.Errorf("serve: instruction from rank 0: %w", err)
		}
		ch.recv = x
	}
	done, err := poll(ch.timeout, ch.recv.Test)
	if err != nil {
		return control{}, fmt.Errorf("serve: instruction from rank 0: %w", err)
	}
	if !done {
		return control{}, fmt.Errorf("serve: no instruction from rank 0 within %v", ch.timeout)
	}
	ch.recv = nil
	return decodeControl(ch.get(0, ch.ctlW))
}

// sendReport tells rank 0 where this rank is. Not rank 0.
func (ch *channel) sendReport(b *back) error {
	if ch.report != nil {
		done, err := poll(ch.timeout, ch.report.Test)
		if err != nil || !done {
			return fmt.Errorf("serve: report to rank 0 not taken within %v: %v", ch.timeout, err)
		}
	}
	w := ch.words[:ch.backW]
	b.encode(w)
	off := ch.reportOff(ch.rank)
	ch.put(off, w)
	x, err := ch.c.Exchange([]mpi.Message{{Peer: 0, Addr: ch.mem.Addr(off), Bytes: 8 * ch.backW}}, nil)
	if err != nil {
		return fmt.Errorf("serve: report to rank 0: %w", err)
	}
	ch.report = x
	return nil
}

func (ch *channel) postReport(r int) error {
	off := ch.reportOff(r)
	x, err := ch.c.Exchange(nil, []mpi.Message{{Peer: r, Addr: ch.mem.Addr(off), Bytes: 8 * ch.backW}})
	if err != nil {
		return fmt.Errorf("serve: report from rank %d: %w", r, err)
	}
	ch.backs[r] = x
	return nil
}

// reports returns the reports that have arrived since the last call,
// without waiting. Rank 0 only.
func (ch *channel) reports() ([]back, error) {
	var out []back
	for r, x := range ch.backs {
		if x == nil {
			continue
		}
		for {
			done, err := x.Test()
			if err != nil {
				return nil, fmt.Errorf("serve: report from rank %d: %w", r, err)
			}
			if !done {
				break
			}
			b, err := decodeBack(ch.get(ch.reportOff(r), ch.backW))
			if err != nil {
				return nil, err
			}
			out = append(out, b)
			if err := ch.postReport(r); err != nil {
				return nil, err
			}
			x = ch.backs[r]
		}
	}
	return out, nil
}

// close cancels the receives still posted, waits for the sends and frees
// the channel. Collective.
func (ch *channel) close() error {
	var errs []error
	if ch.rank == 0 {
		if _, err := ch.reports(); err != nil { // take what was sent last, so that no sender waits for it
			errs = append(errs, err)
		}
	}
	for _, x := range ch.backs {
		if x != nil {
			x.Cancel()
		}
	}
	if ch.recv != nil {
		ch.recv.Cancel()
	}
	for _, ring := range ch.sends {
		for _, x := range ring {
			if x != nil {
				if done, err := poll(ch.timeout, x.Test); err != nil || !done {
					errs = append(errs, fmt.Errorf("serve: an instruction was not taken within %v: %v", ch.timeout, err))
				}
			}
		}
	}
	if ch.report != nil {
		if done, err := poll(ch.timeout, ch.report.Test); err != nil || !done {
			errs = append(errs, fmt.Errorf("serve: a report was not taken within %v: %v", ch.timeout, err))
		}
	}
	errs = append(errs, ch.c.Free())
	if len(errs) == 1 && errs[0] == nil {
		errs = nil
	}
	// The buffer may still be MPI's if a send was left: leave it mapped then.
	if len(errs) == 0 {
		errs = append(errs, ch.mem.Free())
	}
	return errors.Join(errs...)
}
