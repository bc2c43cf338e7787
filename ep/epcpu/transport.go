package epcpu

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"strconv"
	"time"
	"unsafe"

	"github.com/goep/goep/ep/driver"
	"github.com/goep/goep/ep/internal/hostrows"
	"github.com/goep/goep/internal/dtype"
	"github.com/goep/goep/mpi"
)

// The CPU engine's transport: how its ranks reach each other. Two paths,
// the counterparts of NCCL's device API, and one wait:
//
//   - LSA (load/store access): the ranks of a node map each other's segment
//     (MPI_Win_allocate_shared), so a rank stores straight into a node peer's
//     buffers and reads a node peer's outputs in place;
//   - GIN (put with signal): a rank on another node is reached through its
//     staging memory, the data first and then a flag the same way once the
//     data is complete: by message (mpi.Mailbox, the CPU backend: the
//     receiver applies the writes while it waits) or by MPI_Put into a
//     one-sided window (MPI_Win_allocate, the CPUOneSided backend);
//   - await: every wait polls flags in this rank's own memory, with the
//     group's timeout, and names the rank that did not arrive.
//
// The modes (ll.go, ht.go) name peers by rank and say where bytes go in two
// places at once, the final place in the receiver's segment and the place in
// its staging window; the transport picks the path per peer. What every rank
// receives from every rank, flags and count vectors, lands in its inbox: the
// same offsets at the start of its segment (written by node peers) and of
// its staging window (written by other nodes).

// flagSlot is the alignment of flags: a flag and what it carries start a
// cache line of their own.
const flagSlot = 64

// flagKind says what a flag announces. Every kind has one flag per buffer
// set and per source rank in the receiver's inbox; it holds the sequence
// number of the last call that raised it.
type flagKind int

const (
	flagCounts       flagKind = iota // the source's count vector can be read
	flagData                         // the source's rows are in place (or staged)
	flagReady                        // the source's expert outputs can be read (payload: where they are)
	flagDone                         // the source finished reading this rank's buffers in place
	flagStaged                       // HT: the source's tokens' metadata is staged here, at its rail peer (payload: how many)
	flagStagedRows                   // HT: the source's first rows are staged here (payload: how many)
	flagSums                         // HT: the source (a rail peer) put its node's sums here
	flagSumRows                      // HT: the source (a rail peer) put its node's sums of this rank's first rows (payload: how many) here
	flagAborted                      // the source's abort word: call q was refused (payload: by which rank); set 0 only
	flagMask                         // the source reached SetMask number q; set 0 only
	flagYouAreMasked                 // the source masked this rank during mask epoch q-1 (payload 1); set 0 only
	numFlagKinds
)

// inbox places the flags and refusal notes at the start of both memories.
// A flag may carry words (raise's attach): they sit right after its 64-bit
// word, in the same cache line as far as they fit, and are written before
// it, so that the rank that sees the flag has them at the cost of the one
// transfer that brought the flag: a count vector beside the flag that says
// the counts are there, where it used to be read from the sender's memory
// after the flag, a second transfer between cores that waited for the
// first.
type inbox struct {
	ranks    int
	countLen int               // int32s in one rank's count vector
	slot     [numFlagKinds]int // bytes per flag of each kind: its word and what it carries, whole cache lines
	base     [numFlagKinds]int // where each kind's flags start
	carries  [numFlagKinds]int // bytes each kind's flags can carry
	callBase int               // where the ranks' call words start, a cache line each (sequence.go)
	size     int
}

// noteLen is the room for a refusing rank's reason (longer ones are cut).
const noteLen = 512

// newInbox lays out the inbox of a group of ranks whose count vectors are
// countLen int32s long (carried by flagCounts and flagData) and whose
// combine-ready flags carry readyLen int32s.
func newInbox(ranks, countLen, readyLen int) inbox {
	in := inbox{ranks: ranks, countLen: countLen}
	in.carries[flagCounts], in.carries[flagData], in.carries[flagReady] = 4*countLen, 4*countLen, 4*readyLen
	for k := range in.slot {
		in.slot[k] = (8 + in.carries[k] + flagSlot - 1) / flagSlot * flagSlot
		in.base[k] = in.size
		in.size += 2 * ranks * in.slot[k]
	}
	in.callBase = in.size
	in.size += ranks * flagSlot
	in.size += ranks * noteLen
	return in
}

// inboxFor is the inbox of s's group of ranks on nodes nodes: count
// vectors of pairs per expert (LL) or of tokens per rank, then per node
// (HT); LL's combine-ready flags carry where the receiver packed each
// source's rows of its local experts (the slot protocol).
func inboxFor(s driver.Spec, ranks, nodes int) inbox {
	if s.Mode == driver.HighThroughput {
		if s.HTExpertMajor() { // and pairs per expert (htzones.go)
			return newInbox(ranks, ranks+nodes+s.NumExperts, 0)
		}
		return newInbox(ranks, ranks+nodes, 0)
	}
	return newInbox(ranks, s.NumExperts, s.NumExperts/ranks)
}

func (in *inbox) flagOff(k flagKind, set, src int) int {
	return in.base[k] + (set*in.ranks+src)*in.slot[k]
}

func (in *inbox) noteOff(src int) int { return in.size - (in.ranks-src)*noteLen }

// callOff is where rank src's call word is.
func (in *inbox) callOff(src int) int { return in.callBase + src*flagSlot }

// transport reaches the other ranks of a group.
type transport struct {
	me, size  int
	local     []bool // per rank: on this node
	nodeRanks []int  // the ranks of this node, by local rank
	remote    []int  // the ranks of other nodes
	others    []int  // every rank but this one
	all       []int  // every rank
	stream    bool   // row copies use streaming stores (hostrows.Streams)
	// The ranks that take part: all but the masked ones (maskStalled).
	maskStalled                            bool
	masked                                 []bool
	epoch                                  uint64 // mask epoch: SetMasks so far
	live, liveOthers, liveNode, liveRemote []int
	seg                                    []ptr  // per rank on this node: its segment
	segBytes                               []byte // this rank's segment
	net                                    network
	winBase                                ptr // this rank's staging memory; nil on one node
	in                                     inbox
	timeout                                time.Duration

	// spin is how long a wait spins before it gives up the core: a few
	// microseconds when every rank of the node has a core of its own,
	// nothing when they share cores (a spinning rank would delay the one it
	// waits for).
	spin time.Duration

	// Statistics: per rank, the time this rank waited for its flags, and
	// the bytes this rank put across nodes.
	waits    []time.Duration
	netBytes int64
	netSent  []int64 // per rank: the bytes this rank put to it across nodes

	tl *timeline // the steps of the calls, when recording (nil: off)
	// waitedFor is the rank the last wait waited for last, -1 when it
	// waited for none (every flag was there): the peer of a wait's span.
	waitedFor int
	inPlace   bool // large blocks go to other nodes straight from the segment (flushInPlace)
	// landsFinal: the network reaches the other nodes' segments too, at
	// offsets from the size of their staging memory (exposeRowsFinal).
	landsFinal bool

	// What a wait for every live rank's flag (k, set) polls (liveWatch),
	// made at the first such wait and again after the mask changes.
	watches [numFlagKinds][2]*watch

	// This rank's calls (sequence.go): the call word of the last call it
	// started, the call words of the calls started and not finished (0:
	// free), and the word last sent to the other nodes.
	started   uint64
	inflight  [8]uint64
	published uint64
	callBuf   []byte // 8 bytes of their own, the word sent
	// broken is this rank's error once it has said that the group is
	// unusable (breakGroup).
	broken error

	// Reused from call to call.
	flags, aborts []ptr
	calls         []ptr
	peers         []int
	scratch       watch
	locDst        hostrows.AddrTable
	locOff, lens  []int64
	landDst       hostrows.AddrTable
	landSrc       hostrows.AddrTable
	landLens      []int64
	blocks, flagB []mpi.Block
	attachB       []mpi.Block
	one           [1]int
	word          []byte // 8 bytes of their own: cgo checks the whole object an argument points into
}

// lsa is byte off of node peer r's segment.
func (t *transport) lsa(r, off int) ptr { return unsafe.Add(t.seg[r], off) }

// staged is byte off of this rank's staging window. Only a group that
// spans nodes has one: a pointer computed from nil would be a bad pointer
// (checkptr), even if never used.
func (t *transport) staged(off int) ptr {
	if t.winBase == nil {
		panic("ep: staging memory used on a group of one node")
	}
	return unsafe.Add(t.winBase, off)
}

// inboxOf is the memory where rank via's writes to this rank land.
func (t *transport) inboxOf(via, off int) ptr {
	if t.local[via] {
		return t.lsa(t.me, off)
	}
	return t.staged(off)
}

// raise sets this rank's flag of kind k and set to call q with payload p at
// every rank of to (on behalf of rank of: this rank, or a rank whose rows
// this one forwarded). Data written before raise is visible to a rank that
// sees the flag. attach (nil: nothing), at most what the kind carries, lands
// beside the flag at every rank of to, before the flag: attached reads it.
func (t *transport) raise(to []int, k flagKind, set, of int, q uint64, p uint32, attach []byte) error {
	v := flagWord(q, p)
	off := t.in.flagOff(k, set, of)
	local, blocks, attached := t.flags[:0], t.flagB[:0], t.attachB[:0]
	for _, d := range to {
		if t.local[d] {
			if len(attach) > 0 {
				copy(unsafe.Slice((*byte)(t.lsa(d, off+8)), len(attach)), attach)
			}
			local = append(local, t.lsa(d, off))
			continue
		}
		blocks = append(blocks, mpi.Block{Len: 8, Target: d, DstOffset: off})
		if len(attach) > 0 {
			attached = append(attached, mpi.Block{Len: len(attach), Target: d, DstOffset: off + 8})
		}
	}
	t.flags, t.flagB, t.attachB = local, blocks, attached
	signal(local, v)
	if len(blocks) == 0 {
		return nil
	}
	if len(attached) > 0 { // a put of its own: a network keeps the order of puts, not of one put's blocks
		t.count(attached)
		if err := t.net.PutBlocks(attach, attached); err != nil {
			return err
		}
	}
	if t.word == nil {
		t.word = make([]byte, 8)
	}
	*(*uint64)(unsafe.Pointer(&t.word[0])) = v
	t.count(blocks)
	return t.net.PutBlocks(t.word, blocks)
}

// count adds blocks put across nodes to the statistics.
func (t *transport) count(blocks []mpi.Block) {
	for _, b := range blocks {
		t.netBytes += int64(b.Len)
		t.netSent[b.Target] += int64(b.Len)
	}
}

// just is the list of one rank, r, for raise (reused from call to call).
func (t *transport) just(r int) []int {
	t.one[0] = r
	return t.one[:]
}

// attached is where the words that rank of's flag (k, set), raised by via,
// carried land in this rank's inbox.
func (t *transport) attached(k flagKind, set, of, via int) ptr {
	return t.inboxOf(via, t.in.flagOff(k, set, of)+8)
}

// await waits until flag (k, set, from[i]) holds call q for every i, as
// raised by via[i] (via nil: by from[i] itself). A timeout names via[i], the
// rank that should have raised it, and what it stands for; a late rank
// whose abort word says call q was refused ends the wait with a *refusal
// naming the rank that refused it. Where q is the call this rank is in
// (every kind but flagDone, which a call awaits for an earlier one), a
// wait also checks that the ranks' calls match (sequence.go): a
// *SequenceError where they do not.
func (t *transport) await(op, what string, k flagKind, set int, from, via []int, q uint64) error {
	return t.wait(op, what, k, set, from, via, q, true)
}

// wait is await; with watchAborts false it does not look at abort words
// for refusals, nor at the ranks' calls (the rendezvous that ends a refused
// call waits for those abort words themselves, SetMask for its own flags).
// An abort word that says the group is unusable ends any wait.
//
// With masking on (maskStalled), a rank whose flag does not come within the
// timeout is masked instead (setMasked): the wait goes on without it, and so
// do later calls; and a flag already past call q means that the others went
// on without this rank: the wait returns ErrMasked.
func (t *transport) wait(op, what string, k flagKind, set int, from, via []int, q uint64, watchAborts bool) error {
	return t.waitWord(op, what, k, set, from, via, q, 0, watchAborts)
}

// awaitPayload is await for flags of call q whose payload is at least p (a
// count that grows within the call, as flagSumRows's).
func (t *transport) awaitPayload(op, what string, k flagKind, from []int, q uint64, p uint32) error {
	return t.waitWord(op, what, k, 0, from, nil, q, p, true)
}

// waitWord is wait for flag words of at least flagWord(q, p).
func (t *transport) waitWord(op, what string, k flagKind, set int, from, via []int, q uint64, p uint32, watchAborts bool) error {
	sequence := watchAborts && k != flagDone && !t.maskStalled
	for {
		ws := t.liveWatch(k, set, from, via)
		if ws == nil {
			ws = &t.scratch
			ws.flags, ws.aborts, ws.calls, ws.peers = t.flags[:0], t.aborts[:0], t.calls[:0], t.peers[:0]
			for i, s := range from {
				v := s
				if via != nil {
					v = via[i]
				}
				if v == t.me && via == nil || t.masked[v] {
					continue
				}
				ws.flags = append(ws.flags, t.inboxOf(v, t.in.flagOff(k, set, s)))
				ws.aborts = append(ws.aborts, t.inboxOf(v, t.in.flagOff(flagAborted, 0, v)))
				ws.calls = append(ws.calls, t.callWordOf(v))
				ws.peers = append(ws.peers, v)
			}
			t.flags, t.aborts, t.calls, t.peers = ws.flags, ws.aborts, ws.calls, ws.peers
		}
		if len(ws.flags) == 0 {
			return nil
		}
		ws.target, ws.refusals, ws.ahead, ws.mine = flagWord(q, p), watchAborts, t.maskStalled || sequence, 0
		if sequence {
			ws.mine = t.callOf(q)
		}
		w := t.poll(ws)
		t.waitedFor = -1
		if w.time > 0 {
			t.waitedFor = ws.peers[w.late]
		}
		switch {
		case w.err != nil:
			return fmt.Errorf("ep: %s: waiting for %s: %w", op, what, w.err)
		case w.broken >= 0:
			return &brokenPeer{peer: ws.peers[w.broken]}
		case w.refused >= 0:
			return &refusal{origin: w.refused}
		case w.ahead >= 0 && t.maskStalled:
			return fmt.Errorf("ep: %s: rank %d is already past this call (waiting for %s): %w", op, ws.peers[w.ahead], what, driver.ErrMasked)
		case w.ahead >= 0:
			p := ws.peers[w.ahead]
			v := loadFlag(ws.flags[w.ahead])
			theirs := fmt.Sprintf("already at call %d (its flag for %s came from that call)", v>>32, what)
			if c := loadFlag(ws.calls[w.ahead]); callOp(c) >= v>>32 {
				theirs += "; its call word says it is " + describeCall(c)
			}
			return t.sequenceError(op, q, p, theirs)
		case w.mismatch >= 0:
			return t.sequenceError(op, q, ws.peers[w.mismatch], describeCall(w.theirs)+", without having raised its flag for "+what)
		case w.missing >= 0 && t.maskStalled:
			p := ws.peers[w.missing]
			t.setMasked(p, true)
			// Tell it, for when it comes back: it must not write any more.
			if err := t.raise([]int{p}, flagYouAreMasked, 0, t.me, t.epoch+1, 1, nil); err != nil {
				return err
			}
			continue
		case w.missing >= 0:
			return &driver.TimeoutError{Op: op, Peer: ws.peers[w.missing], What: what, After: t.timeout}
		}
		return nil
	}
}

// poll is waitAll with the group's timeout, charging the time waited to
// the rank waited for last. Across nodes it lets MPI progress between
// single sweeps of the flags: the other nodes' writes land only while this
// rank calls MPI (no progress thread), and a transfer between hosts moves
// only while both ends do, so the wait polls MPI as a blocking MPI call
// would, with no slice of flag polling in between (a 20 us slice held
// every large transfer to one fragment per socket per slice). After
// napAfter it naps between sweeps (nap); the clock is read every 64 sweeps, when
// the late flag's raiser's call word is checked too, and this rank's own is
// sent to the other nodes the first time (publishCall).
func (t *transport) poll(ws *watch) waited {
	if t.net == nil {
		w := waitAll(ws, t.timeout, t.spin)
		t.waits[ws.peers[w.late]] += w.time
		return w
	}
	var start time.Time
	first, late := 0, 0 // late: the flag waited for last
	idle := false       // the wait has lasted napAfter: it naps between sweeps
	for sweep := 0; ; sweep++ {
		if err := t.net.Progress(); err != nil {
			w := newWaited()
			w.err = err
			return w
		}
		w := newWaited()
		slow := sweep&63 == 63
		var done bool
		if first, done = ws.sweep(first, slow, &w); done {
			if first == len(ws.flags) {
				w.late = late
			}
			if !start.IsZero() {
				w.time = time.Since(start)
				t.waits[ws.peers[w.late]] += w.time
			}
			return w
		}
		late = first
		if start.IsZero() {
			start = time.Now()
		}
		if slow {
			if err := t.publishCall(); err != nil {
				w.err = err
				return w
			}
			waited := time.Since(start)
			if waited > t.timeout {
				w.missing, w.time = first, waited
				t.waits[ws.peers[first]] += waited
				return w
			}
			idle = waited > napAfter
		}
		if idle {
			nap()
		}
	}
}

// liveWatch is the watch of a wait for flag (k, set) of every live rank
// but this one, each raised by itself (from is t.live, via nil), kept from
// call to call; nil for any other wait, which makes its lists itself.
func (t *transport) liveWatch(k flagKind, set int, from, via []int) *watch {
	if via != nil || len(from) == 0 || len(from) != len(t.live) || &from[0] != &t.live[0] {
		return nil
	}
	w := t.watches[k][set]
	if w == nil {
		w = &watch{}
		for _, v := range t.live {
			if v != t.me {
				w.flags = append(w.flags, t.inboxOf(v, t.in.flagOff(k, set, v)))
				w.aborts = append(w.aborts, t.inboxOf(v, t.in.flagOff(flagAborted, 0, v)))
				w.calls = append(w.calls, t.callWordOf(v))
				w.peers = append(w.peers, v)
			}
		}
		t.watches[k][set] = w
	}
	return w
}

// setMasked masks rank r (or unmasks it) and recomputes the lists of the
// ranks that take part.
func (t *transport) setMasked(r int, masked bool) {
	t.masked[r] = masked
	t.watches = [numFlagKinds][2]*watch{} // the live ranks change
	t.live, t.liveOthers, t.liveNode, t.liveRemote = t.live[:0], t.liveOthers[:0], t.liveNode[:0], t.liveRemote[:0]
	for _, p := range t.all {
		if t.masked[p] {
			continue
		}
		t.live = append(t.live, p)
		if p != t.me {
			t.liveOthers = append(t.liveOthers, p)
		}
		if t.local[p] {
			t.liveNode = append(t.liveNode, p)
		} else {
			t.liveRemote = append(t.liveRemote, p)
		}
	}
}

// refusal is what await returns when the call it waits in was refused by
// a rank (origin): the engine ends the call (endRefused) and reports a
// *RefusedError with that rank's note.
type refusal struct{ origin int }

func (r *refusal) Error() string { return "ep: the call was refused by rank " + strconv.Itoa(r.origin) }

// flagPayload reads the payload of flag (k, set, of) as raised by via.
func (t *transport) flagPayload(k flagKind, set, of, via int) uint32 {
	return uint32(loadFlag(t.inboxOf(via, t.in.flagOff(k, set, of))))
}

// writeNote makes reason this rank's refusal note of call q: in its segment
// for the node's ranks, put into the other nodes' inboxes. It precedes the
// refused flags, which make it visible, and names its call (its first 8
// bytes), so that a rank that learns of the refusal from a third rank's
// abort word, which may come before the note across nodes, knows whether
// the note it holds is this call's (note).
func (t *transport) writeNote(q uint64, reason string) error {
	note := make([]byte, noteLen) // a refused call is no hot path
	binary.LittleEndian.PutUint64(note, q)
	copy(note[8:noteLen-1], reason)
	return t.writeNoteBytes(note)
}

// writeNoteBytes makes note (noteLen bytes) this rank's note.
func (t *transport) writeNoteBytes(note []byte) error {
	off := t.in.noteOff(t.me)
	copy(unsafe.Slice((*byte)(t.lsa(t.me, off)), noteLen), note)
	var blocks []mpi.Block
	for _, d := range t.liveRemote {
		blocks = append(blocks, mpi.Block{Len: noteLen, Target: d, DstOffset: off})
	}
	if len(blocks) == 0 {
		return nil
	}
	return t.net.PutBlocks(note, blocks)
}

// note is rank origin's refusal note of call q. Across nodes it lets the
// network progress until the note is call q's: the abort word that ended
// the call may have come from a rank other than origin, before origin's
// note. A note that does not come within the timeout leaves the reason
// unknown, not the call hanging.
func (t *transport) note(origin int, q uint64) string {
	b := t.noteBytes(origin)
	start := time.Now()
	for binary.LittleEndian.Uint64(b) != q {
		if t.net == nil || time.Since(start) > t.timeout {
			return fmt.Sprintf("(rank %d's reason did not arrive within %v)", origin, t.timeout)
		}
		if err := t.net.Progress(); err != nil {
			return fmt.Sprintf("(rank %d's reason did not arrive: %v)", origin, err)
		}
	}
	b = b[8:]
	if i := bytes.IndexByte(b, 0); i >= 0 {
		b = b[:i]
	}
	return string(b)
}

// noteBytes is rank origin's note, in place.
func (t *transport) noteBytes(origin int) []byte {
	off := t.in.noteOff(origin)
	if t.local[origin] {
		return unsafe.Slice((*byte)(t.lsa(origin, off)), noteLen)
	}
	return unsafe.Slice((*byte)(t.staged(off)), noteLen)
}

// shareCounts raises flagCounts of set b at every other rank, carrying vec,
// this rank's count vector: counts reads it there.
func (t *transport) shareCounts(b int, q uint64, vec []int32) error {
	return t.raise(t.liveOthers, flagCounts, b, t.me, q, 0, dtype.Bytes(vec))
}

// counts is the count vector rank s's flag (k, b) carried to this rank,
// once the flag arrived: flagCounts (shareCounts), or flagData where the
// counts ride on the data.
func (t *transport) counts(k flagKind, b, s int) []int32 {
	return unsafe.Slice((*int32)(t.attached(k, b, s, s)), t.in.countLen)
}

// post queues n bytes at srcOff of the batch's origin for rank d: to
// finalOff of its segment if d is a node peer, else to stagedOff of its
// staging window. flush sends the queue.
func (t *transport) post(d, finalOff, stagedOff int, srcOff int64, n int) {
	if n == 0 {
		return
	}
	if t.local[d] {
		t.locDst.Add(t.lsa(d, finalOff))
		t.locOff = append(t.locOff, srcOff)
		t.lens = append(t.lens, int64(n))
		return
	}
	t.blocks = append(t.blocks, mpi.Block{SrcOffset: int(srcOff), Len: n, Target: d, DstOffset: stagedOff})
}

// expose queues n bytes at off of this rank's segment for rank r: a node
// peer reads them in place (nothing to send), another node gets them put at
// stagedOff of its staging window. flush(t.segBytes) sends the queue.
func (t *transport) expose(r, off, stagedOff, n int) {
	if n > 0 && !t.local[r] {
		t.blocks = append(t.blocks, mpi.Block{SrcOffset: off, Len: n, Target: r, DstOffset: stagedOff})
	}
}

// exposed is where rank r's bytes at off of its segment, exposed to this
// rank at stagedOff, can be read.
func (t *transport) exposed(r, off, stagedOff int) ptr {
	if t.local[r] {
		return t.lsa(r, off)
	}
	return t.staged(stagedOff)
}

// flush sends what post and expose queued, from origin: stores into node
// peers' segments, puts into other nodes' staging (origin free at return).
func (t *transport) flush(origin []byte) error {
	_, err := t.flushFrom(origin, false)
	return err
}

// flushInPlace is flush from this rank's segment, whose large blocks go to
// other nodes straight from it where the group allows (inPlace): the bytes
// queued must then stay as they are until sent(put) says they have left.
func (t *transport) flushInPlace() (put uint64, err error) {
	return t.flushFrom(t.segBytes, t.inPlace)
}

func (t *transport) flushFrom(origin []byte, inPlace bool) (put uint64, err error) {
	if t.locDst.Len() > 0 {
		hostrows.ScatterBlocks(&t.locDst, origin, t.locOff, t.lens, t.stream)
	}
	if len(t.blocks) > 0 {
		t.count(t.blocks)
		if inPlace {
			put, err = t.net.PutBlocksInPlace(origin, t.blocks)
		} else {
			err = t.net.PutBlocks(origin, t.blocks)
		}
	}
	t.locDst.Reset()
	t.locOff, t.lens, t.blocks = t.locOff[:0], t.lens[:0], t.blocks[:0]
	return put, err
}

// flushStaged is flush from this rank's staging memory (HT's forwarding).
func (t *transport) flushStaged() error { return t.flush(t.net.Local()) }

// progress lets the network move what is in flight, both ways (nothing on
// one node).
func (t *transport) progress() error {
	if t.net == nil {
		return nil
	}
	return t.net.Progress()
}

// spansNodes says whether the group has ranks on other nodes.
func (t *transport) spansNodes() bool { return len(t.remote) > 0 }

// awaitSent waits until the bytes of flushInPlace's put numbered put (and
// earlier ones) have left this rank's segment, before they are written
// again. A peer that stops receiving is a *TimeoutError naming it.
func (t *transport) awaitSent(op string, put uint64) error {
	if put == 0 || t.net == nil {
		return nil
	}
	var start time.Time
	for {
		sent, to := t.net.InPlaceSent(put)
		if sent {
			return nil
		}
		if start.IsZero() {
			start = time.Now()
		} else if time.Since(start) > t.timeout {
			return &driver.TimeoutError{Op: op, Peer: to, What: "its receipt of the rows this rank sent it in the last call on these buffers", After: t.timeout}
		}
		if err := t.net.Progress(); err != nil {
			return fmt.Errorf("ep: %s: %w", op, err)
		}
		if time.Since(start) > napAfter {
			nap()
		}
	}
}

// writeRow queues, in the wire format f, the row of the caller's token tk
// for rank d: straight into row final of area fin in d's segment when d is
// on this node; else into row out of this rank's outbox area ob, from which
// exposeRows sends it.
func (t *transport) writeRow(f hostrows.RowFormat, d int, fin hostrows.RowArea, final int, ob hostrows.RowArea, out int, tk int) {
	if t.local[d] {
		f.Put(t.seg[d], fin, final, tk)
	} else {
		f.Put(t.seg[t.me], ob, out, tk)
	}
}

// exposeRows queues n rows of area a of this rank's segment from row i, with
// their side data, for rank d of another node: put at row j of area staged
// in its staging memory. flushInPlace (or flush(t.segBytes)) sends them.
func (t *transport) exposeRows(d int, a hostrows.RowArea, i, n int, staged hostrows.RowArea, j int) {
	t.expose(d, a.Rows.At(i), staged.Rows.At(j), a.Rows.Len(n))
	if a.Side.Stride > 0 {
		t.expose(d, a.Side.At(i), staged.Side.At(j), a.Side.Len(n))
	}
}

// exposeRowsFinal is exposeRows straight into row j of area fin of rank
// d's segment, where the network reaches it (landsFinal): no staging and
// no move at the receiver. The mode uses it only where nothing reads that
// place until the receiver's call that expects the rows.
func (t *transport) exposeRowsFinal(d int, a hostrows.RowArea, i, n int, fin hostrows.RowArea, j int) {
	base := len(t.net.Local())
	t.expose(d, a.Rows.At(i), base+fin.Rows.At(j), a.Rows.Len(n))
	if a.Side.Stride > 0 {
		t.expose(d, a.Side.At(i), base+fin.Side.At(j), a.Side.Len(n))
	}
}

// settleRows queues the move of n rows (and their side data) that rank s
// sent this rank into row final of area a of its segment: from row slot of
// the same area, where a node peer stored them, or from row j of area
// staged of the staging memory. flushLands moves them.
func (t *transport) settleRows(s int, staged hostrows.RowArea, j int, a hostrows.RowArea, slot, final, n int) {
	t.settle(s, staged.Rows.At(j), a.Rows.At(slot), a.Rows.At(final), a.Rows.Len(n))
	if a.Side.Stride > 0 {
		t.settle(s, staged.Side.At(j), a.Side.At(slot), a.Side.At(final), a.Side.Len(n))
	}
}

// settle queues the move of n bytes that rank s posted to this rank into
// finalOff of its segment: from slotOff of the segment, where a node peer
// stored them (nothing to do when the two are the same place), or from
// stagedOff of the staging window. Moves run in order and may overlap (a
// block moved down over its own old place), as compacting needs.
func (t *transport) settle(s, stagedOff, slotOff, finalOff, n int) {
	if n == 0 || t.local[s] && slotOff == finalOff {
		return
	}
	if t.local[s] {
		t.landSrc.Add(t.lsa(t.me, slotOff))
	} else {
		t.landSrc.Add(t.staged(stagedOff))
	}
	t.landDst.Add(t.lsa(t.me, finalOff))
	t.landLens = append(t.landLens, int64(n))
}

// flushLands does what land and settle queued, in order.
func (t *transport) flushLands() {
	hostrows.MoveBlocks(&t.landDst, &t.landSrc, t.landLens)
	t.landDst.Reset()
	t.landSrc.Reset()
	t.landLens = t.landLens[:0]
}

// awaitReaders waits until every rank that reads this rank's buffers of set
// b in place (its node peers) has finished the combine numbered last.
func (t *transport) awaitReaders(op string, b int, last uint64) error {
	if last == 0 {
		return nil
	}
	return t.await(op, "the end of its combine", flagDone, b, t.liveNode, nil, last)
}

// releaseReaders tells the ranks whose buffers of set b this rank read in
// place (its node peers) that combine q is over.
func (t *transport) releaseReaders(b int, q uint64) error {
	return t.raise(t.liveNode, flagDone, b, t.me, q, 0, nil)
}

// napAfter is how long a wait across nodes polls the network before it
// naps between polls (nap). A wait that lasts longer waits for bulk data:
// the kernel sends and receives it while the rank sleeps, whereas each poll
// is a system call (Open MPI's TCP progress polls every socket) and a
// spinning or yielding rank takes the core from ranks that still copy and
// sum where ranks share cores. Across 2 emulated hosts of 2 ranks on 2 cores
// napping took a fifth off each rank's processor time in HT and LL rounds.
const napAfter = 100 * time.Microsecond
