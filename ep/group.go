package ep

import (
	"errors"
	"fmt"
	"strings"
	"time"
	"unsafe"

	"github.com/goep/goep/mpi"
)

// Group is a set of ranks that dispatch and combine together, with the
// buffers they write into each other. Its methods are collective (every rank
// calls them in the same order) unless their doc says otherwise. A Group is
// not safe for concurrent use by several goroutines.
type Group[E Element] struct {
	cfg       Config
	timeout   time.Duration
	dtype     int
	dtypeName string
	rowBytes  int
	comm      *mpi.Comm
	topo      *mpi.Topology
	rank      int
	size      int
	shape     shape
	myNode    int
	localRank int
	local     []bool // per rank: on this rank's node
	rail      []int  // per node: its rank with this rank's local rank
	nodeRanks []int  // the ranks of this node, by local rank

	shm *mpi.SharedWindow
	seg []unsafe.Pointer // per rank on this node: its segment; nil elsewhere
	sl  segLayout
	rma *mpi.Window // inter-node staging; nil on one node
	rl  rmaLayout

	op          uint64        // collective calls so far: the sequence number flags carry
	dispatches  uint64        // dispatches so far: their parity picks the buffer set
	llPending   [2]*Handle[E] // LL handle per buffer set whose combine has not run
	lastCombine [2]uint64     // op of the last combine per buffer set (HT: set 0)
	htLast      uint64        // op of the newest HT dispatch
	broken      error
	closed      bool
	acc         []float32 // scratch row for reductions
	partials    []E       // HT rail duty: this node's sums of forwarded tokens, put back home
	sc          scratch
}

// ptr is a pointer into window memory.
type ptr = unsafe.Pointer

// scratch holds tables reused from call to call, so that calls in a steady
// state do not allocate in proportion to the tokens: each use truncates a
// slice and appends. Nothing in it outlives one phase of one call, and a
// table that held pointers into caller (Go) memory is cleared right after its
// cgo call: cgo checks a table's whole backing array, and those pointers are
// pinned only for that call.
type scratch struct {
	dst, src, vals  []ptr
	lens            []int64
	w               []float32
	start           []int32
	blocks, blocks2 []mpi.Block
	meta            []byte
	lists           [][]int32 // one list per rank
}

// listsFor returns n empty per-rank lists, keeping their storage.
func (s *scratch) listsFor(n int) [][]int32 {
	for len(s.lists) < n {
		s.lists = append(s.lists, nil)
	}
	for i := range s.lists {
		s.lists[i] = s.lists[i][:0]
	}
	return s.lists[:n]
}

// metaBytes returns the metadata buffer with length n.
func (s *scratch) metaBytes(n int) []byte {
	if cap(s.meta) < n {
		s.meta = make([]byte, n)
	}
	s.meta = s.meta[:n]
	return s.meta
}

// flagSlot is the stride of flags: one cache line each.
const flagSlot = 64

// segLayout places the areas of a rank's shared-memory segment (byte offsets).
type segLayout struct {
	nFlags int
	// Both modes, per buffer set: this rank's count vector (LL: pairs per
	// expert; HT: tokens per rank, then per node).
	counts [2]int
	// LowLatency, per buffer set.
	llRecv, llTok, llW, llComb, llVals [2]int
	// HighThroughput.
	htRecv, htTok, htTopk, htW, htComb, htVals int
	size                                       int
}

// Flag slots of the segment. fYSrc holds a word, not a sequence: which buffer
// a rank's combine input is in (and whether it passed row values).
func fCount(b int) int            { return b }
func fCombReady(b int) int        { return 2 + b }
func fYSrc(b int) int             { return 4 + b }
func fCombDone(b int) int         { return 6 + b }
func fData(b, s, R int) int       { return 8 + b*R + s }
func segFlags(R int) int          { return 8 + 2*R }
func rCount(b, s, R int) int      { return b*R + s }
func rData(b, s, R int) int       { return 2*R + b*R + s }
func rComb(b, d, R int) int       { return 4*R + b*R + d }
func rDataHT(a, R int) int        { return 2*R + a }
func rCombHT(b, R, nodes int) int { return 2*R + nodes + b }

// Combine input placement, published in fYSrc.
const (
	ySrcRecv   = 1
	ySrcComb   = 2
	ySrcValues = 4 // bit: row values were passed
)

// rmaLayout places the areas of a rank's inter-node staging window.
type rmaLayout struct {
	nFlags int
	// Both modes, per buffer set: the count vectors of every rank [R][len].
	counts [2]int
	// LowLatency, per buffer set: rows from each remote rank [R][llCap] with
	// token and weight; combine rows from remote experts [M*K] with values.
	llStage, llStageTok, llStageW, llCStage, llCVals [2]int
	llCap                                            int
	// HighThroughput: per source node [nodes][M] rows with token, top-k and
	// weights; combine partials per node [nodes][M] with values [M*K].
	htStage, htTok, htTopk, htW, htCStage, htCVals int
	size                                           int
}

type allocator struct{ n int }

func (a *allocator) take(size int) int {
	align := 64
	if size >= 4096 {
		align = 4096
	}
	a.n = (a.n + align - 1) / align * align
	off := a.n
	a.n += size
	return off
}

func newSegLayout(c Config, R, nodes, rowBytes int) segLayout {
	var l segLayout
	a := allocator{}
	l.nFlags = segFlags(R)
	a.take(l.nFlags * flagSlot)
	L, M, K := c.NumExperts/R, c.MaxTokensPerRank, c.TopK
	for b := 0; b < 2; b++ {
		l.counts[b] = a.take(4 * countLen(c, R, nodes))
	}
	if c.Mode == LowLatency {
		rows := L * R * M
		for b := 0; b < 2; b++ {
			l.llRecv[b] = a.take(rows * rowBytes)
			l.llTok[b] = a.take(4 * rows)
			l.llW[b] = a.take(4 * rows)
			l.llComb[b] = a.take(rows * rowBytes)
			l.llVals[b] = a.take(4 * rows)
		}
	} else {
		n := maxRecv(c, R)
		l.htRecv = a.take(n * rowBytes)
		l.htTok = a.take(4 * n)
		l.htTopk = a.take(4 * n * K)
		l.htW = a.take(4 * n * K)
		l.htComb = a.take(n * rowBytes)
		l.htVals = a.take(4 * n * K)
	}
	l.size = a.n
	return l
}

// countLen is the length of a rank's count vector.
func countLen(c Config, R, nodes int) int {
	if c.Mode == LowLatency {
		return c.NumExperts
	}
	return R + nodes
}

func maxRecv(c Config, R int) int {
	if c.MaxRecvTokensPerRank > 0 {
		return c.MaxRecvTokensPerRank
	}
	return R * c.MaxTokensPerRank
}

func newRMALayout(c Config, R, nodes, rowBytes int) rmaLayout {
	var l rmaLayout
	a := allocator{}
	L, M, K := c.NumExperts/R, c.MaxTokensPerRank, c.TopK
	l.nFlags = 2*R + 4*max(R, nodes)
	a.take(l.nFlags * flagSlot)
	for b := 0; b < 2; b++ {
		l.counts[b] = a.take(4 * R * countLen(c, R, nodes))
	}
	if c.Mode == LowLatency {
		l.llCap = M * min(K, L)
		for b := 0; b < 2; b++ {
			l.llStage[b] = a.take(R * l.llCap * rowBytes)
			l.llStageTok[b] = a.take(4 * R * l.llCap)
			l.llStageW[b] = a.take(4 * R * l.llCap)
			l.llCStage[b] = a.take(M * K * rowBytes)
			l.llCVals[b] = a.take(4 * M * K)
		}
	} else {
		l.htStage = a.take(nodes * M * rowBytes)
		l.htTok = a.take(4 * nodes * M)
		l.htTopk = a.take(4 * nodes * M * K)
		l.htW = a.take(4 * nodes * M * K)
		l.htCStage = a.take(nodes * M * rowBytes)
		l.htCVals = a.take(4 * nodes * M * K)
	}
	l.size = a.n
	return l
}

// NewGroup creates a group over the ranks of comm. It is collective: every
// rank must pass the same Config and element type, which it checks (a
// mismatch fails on every rank, naming the ranks and fields that differ).
// Buffers come from MPI windows and are released by Close.
func NewGroup[E Element](comm *mpi.Comm, cfg Config) (_ *Group[E], err error) {
	if comm == nil {
		return nil, errors.New("ep: NewGroup: nil communicator")
	}
	dtype, dtypeName := dtypeOf[E]()
	timeout := cfg.Timeout
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	c, err := comm.Split(0, comm.Rank(), "ep")
	if err != nil {
		return nil, fmt.Errorf("ep: NewGroup: %w", err)
	}
	c.SetTimeout(timeout)
	g := &Group[E]{cfg: cfg, timeout: timeout, dtype: dtype, dtypeName: dtypeName, comm: c,
		rank: c.Rank(), size: c.Size(), rowBytes: cfg.Hidden * sizeOf[E]()}
	defer func() {
		if err != nil {
			g.release() // every rank fails the same way, so the frees stay collective
		}
	}()
	if err := agreeOnConfig(c, cfg.fingerprint(dtype)); err != nil {
		return nil, err
	}
	if err := cfg.validate(c.Size()); err != nil {
		return nil, err
	}
	if g.topo, err = c.Topology(); err != nil {
		return nil, fmt.Errorf("ep: NewGroup: %w", err)
	}
	t := g.topo
	if t.Nodes > 1 && !t.Uniform() {
		return nil, fmt.Errorf("ep: NewGroup: %d nodes hold different numbers of ranks: inter-node paths pair each rank with the same local rank on every node, so every node needs the same count", t.Nodes)
	}
	g.myNode, g.localRank = t.Node, t.LocalRank
	g.shape = shape{E: cfg.NumExperts, L: cfg.NumExperts / g.size, R: g.size, K: cfg.TopK, nodes: t.Nodes,
		nodeOf: make([]int32, g.size)}
	g.local = make([]bool, g.size)
	for r := 0; r < g.size; r++ {
		g.shape.nodeOf[r] = int32(t.NodeOf[r])
		g.local[r] = t.NodeOf[r] == g.myNode
	}
	g.nodeRanks = t.RanksOnNode(g.myNode)
	g.rail = make([]int, t.Nodes)
	for n := 0; n < t.Nodes; n++ {
		g.rail[n] = t.RanksOnNode(n)[g.localRank]
	}

	g.sl = newSegLayout(cfg, g.size, t.Nodes, g.rowBytes)
	if g.shm, err = t.NodeComm.AllocateShared(g.sl.size); err != nil {
		return nil, fmt.Errorf("ep: NewGroup: allocating %d bytes of shared buffers: %w", g.sl.size, err)
	}
	g.seg = make([]unsafe.Pointer, g.size)
	for _, r := range g.nodeRanks {
		mem, err := g.shm.Peer(t.LocalRankOf[r])
		if err != nil {
			return nil, err
		}
		g.seg[r] = unsafe.Pointer(unsafe.SliceData(mem))
	}
	if t.Nodes > 1 {
		g.rl = newRMALayout(cfg, g.size, t.Nodes, g.rowBytes)
		if g.rma, err = c.AllocateWindow(g.rl.size); err != nil {
			return nil, fmt.Errorf("ep: NewGroup: allocating %d bytes of staging window for %d nodes: %w "+
				"(the inter-node path needs a one-sided MPI component that works across hosts with MPI_THREAD_MULTIPLE: "+
				"with Open MPI over TCP or shared memory, set OMPI_MCA_osc=sm,ucx)", g.rl.size, t.Nodes, err)
		}
		if err := g.rma.LockAll(); err != nil {
			return nil, err
		}
	}
	g.acc = make([]float32, cfg.Hidden)
	return g, nil
}

// agreeOnConfig gathers every rank's fingerprint and fails, identically on
// every rank, if they differ.
func agreeOnConfig(c *mpi.Comm, fp []int64) error {
	all := make([]int64, len(fp)*c.Size())
	if err := mpi.AllgatherSlice(c, fp, all); err != nil {
		return fmt.Errorf("ep: NewGroup: comparing configs: %w", err)
	}
	var diffs []string
	for r := 1; r < c.Size(); r++ {
		for i := range fp {
			a, b := all[i], all[r*len(fp)+i]
			if a != b {
				diffs = append(diffs, fmt.Sprintf("rank %d has %s = %s, rank 0 has %s", r, fingerprintFields[i],
					fieldString(i, b), fieldString(i, a)))
			}
		}
	}
	if len(diffs) > 0 {
		return fmt.Errorf("ep: NewGroup: ranks passed different configs: %s", strings.Join(diffs, "; "))
	}
	return nil
}

func fieldString(i int, v int64) string {
	switch fingerprintFields[i] {
	case "Mode":
		return Mode(v).String()
	case "Timeout":
		return time.Duration(v).String()
	case "element type":
		if v == 0 {
			return "float32"
		}
		return "bfloat16"
	}
	return fmt.Sprint(v)
}

// Config is the group's configuration. Not collective.
func (g *Group[E]) Config() Config { return g.cfg }

// Rank and Size of the group. Not collective.
func (g *Group[E]) Rank() int { return g.rank }

// Size is the number of ranks. Not collective.
func (g *Group[E]) Size() int { return g.size }

// Nodes is the number of nodes the ranks span, and Node this rank's node.
// Not collective.
func (g *Group[E]) Nodes() int { return g.shape.nodes }

// Node is this rank's node index. Not collective.
func (g *Group[E]) Node() int { return g.myNode }

// NodeOf is the node index of a rank. Not collective.
func (g *Group[E]) NodeOf(rank int) int { return int(g.shape.nodeOf[rank]) }

// LocalExperts is the number of experts each rank owns; this rank owns
// experts [Rank()*LocalExperts(), (Rank()+1)*LocalExperts()). Not collective.
func (g *Group[E]) LocalExperts() int { return g.shape.L }

// BufferBytes is the memory the group holds on this rank: its shared segment
// and its inter-node staging window. Not collective.
func (g *Group[E]) BufferBytes() int { return g.sl.size + g.rl.size }

// Close releases the group's buffers and communicators. It is collective.
func (g *Group[E]) Close() error {
	if g == nil || g.closed {
		return nil
	}
	return g.release()
}

func (g *Group[E]) release() error {
	g.closed = true
	var errs []error
	if g.rma != nil {
		errs = append(errs, g.rma.Free())
	}
	if g.shm != nil {
		errs = append(errs, g.shm.Free())
	}
	if g.topo != nil {
		errs = append(errs, g.topo.Free())
	}
	if g.comm != nil {
		errs = append(errs, g.comm.Free())
	}
	g.rma, g.shm, g.topo, g.comm = nil, nil, nil, nil
	return errors.Join(errs...)
}

// usable reports a closed or broken group.
func (g *Group[E]) usable(op string) error {
	if g == nil {
		return fmt.Errorf("ep: %s: nil group", op)
	}
	if g.closed {
		return fmt.Errorf("ep: %s: %w", op, ErrClosed)
	}
	if g.broken != nil {
		return fmt.Errorf("ep: %s: the group is unusable after an earlier failure: %w", op, g.broken)
	}
	return nil
}

// fail marks the group broken: flags may be half-written, so no later call
// can trust them.
func (g *Group[E]) fail(err error) error {
	if g.broken == nil {
		g.broken = err
	}
	return err
}

// at is byte offset off in rank r's segment (r on this node).
func (g *Group[E]) at(r, off int) unsafe.Pointer { return unsafe.Add(g.seg[r], off) }

func (g *Group[E]) flag(r, slot int) unsafe.Pointer { return g.at(r, slot*flagSlot) }

// rmaAt is byte offset off in this rank's staging window.
func (g *Group[E]) rmaAt(off int) unsafe.Pointer {
	return unsafe.Add(unsafe.Pointer(unsafe.SliceData(g.rma.Local())), off)
}

func (g *Group[E]) rmaFlag(slot int) unsafe.Pointer { return g.rmaAt(slot * flagSlot) }

// waitFlags waits for every flag to reach target; peers[i] names the rank
// behind flags[i] for the error.
func (g *Group[E]) waitFlags(op, what string, flags []unsafe.Pointer, peers []int, target uint64) error {
	if g.rma != nil {
		// Make completed remote puts visible before polling the staging window.
		if err := g.rma.Sync(); err != nil {
			return g.fail(err)
		}
	}
	if i := waitAll(flags, target, g.timeout); i >= 0 {
		return g.fail(&TimeoutError{Op: op, Peer: peers[i], What: what, After: g.timeout})
	}
	return nil
}

// putFlags posts value into slot of each target's staging window.
func (g *Group[E]) putFlags(targets []int, slotOf func(target int) int, value uint64) error {
	if len(targets) == 0 {
		return nil
	}
	word := make([]byte, 8)
	*(*uint64)(unsafe.Pointer(&word[0])) = value
	blocks := make([]mpi.Block, len(targets))
	for i, t := range targets {
		blocks[i] = mpi.Block{SrcOffset: 0, Len: 8, Target: t, DstOffset: slotOf(t) * flagSlot}
	}
	if err := g.rma.PutBlocks(word, blocks); err != nil {
		return g.fail(err)
	}
	return nil
}

// remoteRanks lists the ranks on other nodes.
func (g *Group[E]) remoteRanks() []int {
	var out []int
	for r := 0; r < g.size; r++ {
		if !g.local[r] {
			out = append(out, r)
		}
	}
	return out
}

// view makes a slice of n values of type T at p (window memory).
func view[T any](p unsafe.Pointer, n int) []T {
	if n == 0 {
		return []T{}
	}
	return unsafe.Slice((*T)(p), n)
}

func bytesOf[T any](s []T) []byte {
	if len(s) == 0 {
		return nil
	}
	var z T
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(s))), len(s)*int(unsafe.Sizeof(z)))
}

// sameSlice reports whether a and b are the same memory.
func sameSlice[T any](a, b []T) bool {
	return len(a) == len(b) && len(a) > 0 && unsafe.SliceData(a) == unsafe.SliceData(b)
}

// publishCounts makes this rank's count vector for buffer set b visible to
// every rank: a store into its own segment, puts to the other nodes.
func (g *Group[E]) publishCounts(b int, q uint64, vec []int32) error {
	me, n := g.rank, len(vec)
	copy(view[int32](g.at(me, g.sl.counts[b]), n), vec)
	signal([]ptr{g.flag(me, fCount(b))}, q)
	if g.rma == nil {
		return nil
	}
	remote := g.remoteRanks()
	blocks := make([]mpi.Block, len(remote))
	for i, d := range remote {
		blocks[i] = mpi.Block{Len: 4 * n, Target: d, DstOffset: g.rl.counts[b] + 4*me*n}
	}
	if err := g.rma.PutBlocks(bytesOf(vec), blocks); err != nil {
		return g.fail(err)
	}
	return g.putFlags(remote, func(int) int { return rCount(b, me, g.size) }, q)
}

// gatherCounts waits for the count vectors of ranks [lo, hi), this one
// excepted, and copies them into all ([R][n]).
func (g *Group[E]) gatherCounts(op string, b int, q uint64, all []int32, lo, hi int) error {
	n := len(all) / g.size
	var flags []ptr
	var peers []int
	for s := lo; s < hi; s++ {
		if s == g.rank {
			continue
		}
		if g.local[s] {
			flags = append(flags, g.flag(s, fCount(b)))
		} else {
			flags = append(flags, g.rmaFlag(rCount(b, s, g.size)))
		}
		peers = append(peers, s)
	}
	if err := g.waitFlags(op, "its counts", flags, peers, q); err != nil {
		return err
	}
	for _, s := range peers {
		if g.local[s] {
			copy(all[s*n:(s+1)*n], view[int32](g.at(s, g.sl.counts[b]), n))
		} else {
			copy(all[s*n:(s+1)*n], view[int32](g.rmaAt(g.rl.counts[b]+4*s*n), n))
		}
	}
	return nil
}

// growTo returns s with length n, reallocating only when it is too small.
func growTo[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	return s[:n]
}
