package alltoallv

import (
	"bytes"
	"errors"
	"math"
	"runtime"
	"unsafe"

	"github.com/goep/goep/ep/driver"
	"github.com/goep/goep/ep/internal/hostrows"
	"github.com/goep/goep/internal/dtype"
	"github.com/goep/goep/internal/grow"
	"github.com/goep/goep/mpi"
)

// New is the Backend that does what CPU does the way one writes it by
// hand with two-sided MPI: pack the rows by destination rank, exchange the
// counts with MPI_Alltoall, move rows and metadata with MPI_Alltoallv,
// unpack; combine goes back the same way and reduces with the same kernel in
// the same order, so on one node its results are bit-identical to CPU's. Its
// buffers are on the Go heap, two sets as CPU's, and it treats the ranks as
// one flat node. Its collectives run under the group's timeout; a rank that
// stops makes the others return a *TimeoutError that cannot name it (Peer
// -1: a collective does not say who is missing), and the communicator it
// used is then left to MPI_Finalize.
func New() driver.Backend { return alltoallvBackend{} }

// NewBlocking is New with plain blocking MPI calls and no
// timeout, exactly as a hand-written program: the baseline ep-bench times.
func NewBlocking() driver.Backend { return alltoallvBackend{blocking: true} }

type alltoallvBackend struct{ blocking bool }

// Supports says that the baseline dispatches in every dispatch format of
// the table (it packs rows with the CPU engine's row formats,
// hostrows.RowFormat: FP8 cast while it packs, forwarded rows copied as
// they are, their side data moved beside them), has every receive layout
// and id kind (it unpacks into them: layouts.go) and fails a refused call
// on every rank. Its combine moves the element type only. Its timeouts
// cannot name a peer, it measures no waits, and its calls allocate.
func (alltoallvBackend) Supports(f driver.Feature) bool {
	switch f {
	case driver.FeatureFP8Wire, driver.FeatureFP8Forward, driver.FeatureNVFP4Forward, driver.FeatureRefusals,
		driver.FeatureHTExpertMajor, driver.FeatureLLRankMajor, driver.FeatureGlobalExpertIDs:
		return true
	}
	return false
}

// The baseline and its engine, a Refuser.
var (
	_ driver.Capable = alltoallvBackend{}
	_ driver.Engine  = (*alltoallvEngine)(nil)
	_ driver.Refuser = (*alltoallvEngine)(nil)
)

func (b alltoallvBackend) Name() string {
	if b.blocking {
		return "alltoallv-blocking"
	}
	return "alltoallv"
}

func (b alltoallvBackend) Open(comm *mpi.Comm, spec driver.Spec) (driver.Engine, error) {
	c, err := comm.Split(0, comm.Rank(), "ep-alltoallv")
	if err != nil {
		return nil, err
	}
	if b.blocking {
		c.SetTimeout(0)
	}
	R := c.Size()
	a := &alltoallvEngine{spec: spec, comm: c, R: R, me: c.Rank(), L: spec.NumExperts / R, K: spec.TopK,
		H: spec.Hidden, M: spec.MaxTokensPerRank, rowBytes: spec.RowBytes, wire: hostrows.NewRowFormat(spec),
		nodeOf: make([]int, R)}
	a.wire.Reserve(a.M * a.K) // a row per pair at most (HT: per (token, rank), fewer)
	a.span = R * a.M
	if spec.Mode == driver.LowLatency {
		rows, perRow := a.L*a.span, 1
		if spec.LLRankMajor() {
			rows, perRow = R*a.M, a.K
		}
		for b := range a.sets {
			s := &a.sets[b]
			s.rows, s.area = a.layRows(nil, rows)
			s.outputs = make([]byte, rows*a.rowBytes)
			s.weights = make([]float32, rows*perRow)
			s.tokens = make([]int32, rows)
			if spec.LLRankMajor() {
				s.topk = make([]int32, rows*perRow)
			}
		}
	}
	return a, nil
}

// alltoallvEngine is the baseline's engine.
type alltoallvEngine struct {
	spec                    driver.Spec
	comm                    *mpi.Comm
	R, me, L, K, H, M, span int
	rowBytes                int
	wire                    hostrows.RowFormat // how a dispatched row travels, the CPU engine's
	nodeOf                  []int
	sets                    [2]a2aSet
	send                    []byte           // the packed rows of a dispatch, by destination rank
	sendArea                hostrows.RowArea // and where their rows and side data lie in it
	sendTok                 []int32          // each packed row's token
	packd                   []byte
	sendMeta                []int32
	sendVals                []float32
	pin                     runtime.Pinner
	sc, sd, rc, rd          []int // alltoallv counts and displacements, in elements
	counts, got             []int32
	src                     hostrows.AddrTable
	w                       []float32
	start                   []int32
	next                    []int   // scratch: per expert or rank, the next row
	idx                     []int32 // scratch: per (token, slot), its pair's row back
}

// a2aSet is one buffer set: what a dispatch fills and its combine reads.
type a2aSet struct {
	rows     []byte           // the received rows, with their side data
	area     hostrows.RowArea // where they lie in rows, as the layout has them
	outputs  []byte
	weights  []float32
	topk     []int32
	tokens   []int32
	back     []byte    // the outputs of this set's combine, back home
	backVals []float32 // and their row values
	passed   []int32   // per rank: whether it passed row values
	// The rows (with their side data, laid out as inArea says) and meta
	// words of its dispatch as they arrived, until its wait unpacks them:
	// the other set's dispatch may be sent meanwhile.
	in       []byte
	inArea   hostrows.RowArea
	recvMeta []int32
}

// a2aState is what one dispatch keeps.
type a2aState struct {
	sendCounts, recvCounts []int   // rows to and from each rank
	slot                   []int32 // LL, HT expert-major: the row of Recv each arriving row (or pair) went to, in arrival order
	expert, source         []int
	cached                 bool
	// HT expert-major: where each zone starts ([L+1]); the rows that go
	// back in a combine from (backFrom) and to (backTo) each rank: a pair
	// each (the other layouts: recvCounts and sendCounts).
	zoneOff          []int
	backFrom, backTo []int
}

func (a *alltoallvEngine) Placement() driver.Placement {
	return driver.Placement{Node: 0, Nodes: 1, NodeOf: a.nodeOf}
}

func (a *alltoallvEngine) Memory() driver.Memory { return driver.HostMemory }

func (a *alltoallvEngine) BufferBytes() int {
	n := 0
	for _, s := range a.sets {
		n += len(s.rows) + len(s.outputs) + len(s.back) + 4*(len(s.weights)+len(s.topk)+len(s.tokens)+len(s.backVals))
	}
	return n
}

func (a *alltoallvEngine) Close() error {
	if err := a.comm.Free(); err != nil && !errors.Is(err, mpi.ErrTimeout) {
		return err
	}
	return nil // a communicator left broken by a timeout cannot be freed: MPI_Finalize takes it
}

// timeout turns an MPI timeout into the contract's TimeoutError.
func (a *alltoallvEngine) timeout(op, what string, err error) error {
	if errors.Is(err, mpi.ErrTimeout) {
		return &driver.TimeoutError{Op: op, Peer: -1, What: what, After: a.spec.Timeout}
	}
	return err
}

// refusedCount is what a rank that refused a call sends in the call's first
// MPI_Alltoall instead of its counts.
const refusedCount = -1

// status is the first collective of every call: an MPI_Alltoall of send
// (counts, or whether values were passed) into a.got. When a rank sent
// refusedCount, every rank learns the lowest such rank's reason (an
// MPI_Bcast) and the call ends with a *RefusedError.
func (a *alltoallvEngine) status(op, what string, send []int32) error {
	a.got = grow.To(a.got, a.R)
	if err := mpi.AlltoallSlice(a.comm, send, a.got); err != nil {
		return a.timeout(op, what, err)
	}
	for r, v := range a.got {
		if v == refusedCount {
			reason, err := a.noteOf(r, "")
			if err != nil {
				return a.timeout(op, "a refusal's reason in an MPI_Bcast", err)
			}
			return &driver.RefusedError{Op: op, Rank: r, Reason: reason}
		}
	}
	return nil
}

// noteOf broadcasts rank origin's reason (mine, on origin).
func (a *alltoallvEngine) noteOf(origin int, mine string) (string, error) {
	note := make([]byte, noteLen) // a refused call is no hot path
	copy(note[:noteLen-1], mine)
	if err := a.comm.Bcast(note, origin); err != nil {
		return "", err
	}
	if i := bytes.IndexByte(note, 0); i >= 0 {
		note = note[:i]
	}
	return string(note), nil
}

// Refuse takes part in the first collective of a call this rank refused,
// saying so, then in the broadcast of the lowest refusing rank's reason.
func (a *alltoallvEngine) Refuse(r *driver.Refusal) error {
	op := "alltoallv " + a.spec.Mode.String() + " dispatch"
	if r.Kind == driver.CallCombine {
		op = "alltoallv " + a.spec.Mode.String() + " combine"
	}
	refusal := make([]int32, a.R)
	for i := range refusal {
		refusal[i] = refusedCount
	}
	a.got = grow.To(a.got, a.R)
	if err := mpi.AlltoallSlice(a.comm, refusal, a.got); err != nil {
		return a.timeout(op, "an MPI_Alltoall", err)
	}
	origin := a.me
	for s, v := range a.got {
		if v == refusedCount {
			origin = s
			break
		}
	}
	if _, err := a.noteOf(origin, r.Reason); err != nil {
		return a.timeout(op, "a refusal's reason in an MPI_Bcast", err)
	}
	return nil
}

func (a *alltoallvEngine) state(d *driver.Dispatch) *a2aState {
	st, ok := d.State.(*a2aState)
	if !ok {
		st = &a2aState{}
		d.State = st
	}
	st.sendCounts = grow.To(st.sendCounts, a.R)
	st.recvCounts = grow.To(st.recvCounts, a.R)
	st.expert = grow.To(st.expert, a.L)
	st.source = grow.To(st.source, a.R*a.L)
	return st
}

// DispatchSend packs by destination (LL: one row per (token, expert) pair
// with its expert, token and weight; HT: one row per (token, rank) with the
// token and its top-k ids and weights), each row in the group's wire format
// with its side data (a.wire, as the CPU engine writes them), exchanges the
// counts (unless cached) and moves everything: the rows, their side data
// and the metadata words, an MPI_Alltoallv each.
func (a *alltoallvEngine) DispatchSend(d *driver.Dispatch) error {
	op := "alltoallv " + a.spec.Mode.String() + " dispatch"
	st := a.state(d)
	rt, K, L := d.Route, a.K, a.L
	meta := a.metaWords()
	toks, words := a.sendTok[:0], a.sendMeta[:0]
	clear(st.sendCounts)
	for dst := 0; dst < a.R; dst++ {
		for t := 0; t < rt.T; t++ {
			if a.spec.WeightedCombine() {
				for k := 0; k < K; k++ {
					if e := d.TopK[t*K+k]; e >= 0 && int(e)/L == dst {
						toks = append(toks, int32(t))
						words = append(words, e, int32(t), int32(math.Float32bits(d.Weights[t*K+k])))
						st.sendCounts[dst]++
					}
				}
			} else if rt.TokRankOrd[t*a.R+dst] >= 0 {
				toks = append(toks, int32(t))
				words = append(words, int32(t))
				words = append(words, d.TopK[t*K:(t+1)*K]...)
				for k := 0; k < K; k++ {
					words = append(words, int32(math.Float32bits(d.Weights[t*K+k])))
				}
				st.sendCounts[dst]++
			}
		}
	}
	a.sendTok, a.sendMeta = toks, words
	a.pack(d)
	// The counts go first, also in a cached dispatch: the exchange is how a
	// rank that refused the call says so (status).
	a.counts = grow.To(a.counts, a.R)
	for i, n := range st.sendCounts {
		a.counts[i] = int32(n)
	}
	if err := a.status(op, "the counts of an MPI_Alltoall", a.counts); err != nil {
		return err
	}
	total := 0
	for i, n := range a.got {
		st.recvCounts[i] = int(n)
		total += int(n)
	}
	if a.spec.Mode == driver.HighThroughput && a.spec.MaxRecvTokensPerRank > 0 {
		// Only a receiver sees its total: every rank learns the largest.
		most := []int64{0}
		if err := mpi.Allreduce(a.comm, mpi.OpMax, []int64{int64(total)}, most); err != nil {
			return a.timeout(op, "the largest receive count (MPI_Allreduce)", err)
		}
		if int(most[0]) > a.spec.MaxRecvTokensPerRank {
			return driver.InputErrorf(op, "a rank would receive %d rows, more than MaxRecvTokensPerRank = %d", most[0], a.spec.MaxRecvTokensPerRank)
		}
	}
	st.cached = d.From != nil
	set := &a.sets[d.Set]
	set.in, set.inArea = a.layRows(set.in, total)
	if _, err := moveV(a, regionOf(a.send, a.sendArea.Rows), st.sendCounts, st.recvCounts, a.sendArea.Rows.Stride, regionOf(set.in, set.inArea.Rows)); err != nil {
		return a.timeout(op, "the rows of an MPI_Alltoallv", err)
	}
	if a.sendArea.Side.Stride > 0 {
		if _, err := moveV(a, regionOf(a.send, a.sendArea.Side), st.sendCounts, st.recvCounts, a.sendArea.Side.Stride, regionOf(set.in, set.inArea.Side)); err != nil {
			return a.timeout(op, "the side data (scales) of an MPI_Alltoallv", err)
		}
	}
	var err error
	if set.recvMeta, err = moveV(a, a.sendMeta, st.sendCounts, st.recvCounts, meta, set.recvMeta); err != nil {
		return a.timeout(op, "the metadata of an MPI_Alltoallv", err)
	}
	return nil
}

// metaWords is the metadata words of a packed row: LL expert-major its
// expert, token and weight bits; a row per (token, rank) its token, top-k
// ids and weight bits.
func (a *alltoallvEngine) metaWords() int {
	if a.spec.WeightedCombine() {
		return 3
	}
	return 1 + 2*a.K
}

// pack writes the rows of a.sendTok, in order, into the send buffer in the
// group's wire format, each with its side data: one kernel call per part.
func (a *alltoallvEngine) pack(d *driver.Dispatch) {
	n := len(a.sendTok)
	a.send, a.sendArea = a.layRows(a.send, n)
	if n == 0 {
		return
	}
	base := unsafe.Pointer(unsafe.SliceData(a.send))
	a.pin.Pin(base) // the kernels' tables point into it
	defer a.pin.Unpin()
	for i, t := range a.sendTok {
		a.wire.Put(base, a.sendArea, i, int(t))
	}
	a.wire.Flush(hostBytes(d.X), hostBytes(d.Scales))
}

// layRows lays out n rows of the wire format in buf (grown as needed): the
// rows, then their side data where the format has any, as the CPU engine
// lays out its areas.
func (a *alltoallvEngine) layRows(buf []byte, n int) ([]byte, hostrows.RowArea) {
	var m hostrows.Arena
	area := m.TakeRows("rows", n, a.wire)
	return grow.To(buf, m.N), area
}

// regionOf is region r of buf, all its rows.
func regionOf(buf []byte, r hostrows.Region) []byte { return buf[r.Off : r.Off+r.Len(r.Rows)] }

// copyRow copies row i of area from in src to row j of area to in dst,
// with its side data.
func copyRow(dst []byte, to hostrows.RowArea, j int, src []byte, from hostrows.RowArea, i int) {
	copy(dst[to.Rows.At(j):to.Rows.At(j)+to.Rows.Stride], src[from.Rows.At(i):from.Rows.At(i)+from.Rows.Stride])
	if to.Side.Stride > 0 {
		copy(dst[to.Side.At(j):to.Side.At(j)+to.Side.Stride], src[from.Side.At(i):from.Side.At(i)+from.Side.Stride])
	}
}

// received sets the rows and side data of d.Recv: set's rows as laid out.
func received(d *driver.Dispatch, set *a2aSet) {
	d.Recv.Rows = driver.Host(regionOf(set.rows, set.area.Rows))
	if set.area.Side.Stride > 0 {
		d.Recv.Side = driver.Host(regionOf(set.rows, set.area.Side))
	}
}

// moveV is one MPI_Alltoallv of per-rank counts of rows of width elements,
// into recv (grown as needed).
func moveV[T dtype.Number](a *alltoallvEngine, send []T, sendRows, recvRows []int, width int, recv []T) ([]T, error) {
	a.sc, a.sd, a.rc, a.rd = grow.To(a.sc, a.R), grow.To(a.sd, a.R), grow.To(a.rc, a.R), grow.To(a.rd, a.R)
	total := 0
	for p := 0; p < a.R; p++ {
		a.sc[p], a.rc[p] = sendRows[p]*width, recvRows[p]*width
		a.sd[p], a.rd[p] = 0, total
		if p > 0 {
			a.sd[p] = a.sd[p-1] + a.sc[p-1]
		}
		total += a.rc[p]
	}
	recv = grow.To(recv, total)
	return recv, mpi.AlltoallvSlice(a.comm, send, a.sc, a.sd, recv, a.rc, a.rd)
}

// DispatchWait unpacks: LL rows into their experts' blocks in arrival order
// (by source rank, then token: the CPU engine's order); HT rows stay as they
// arrived, grouped by source, with their top-k ids made local. A row's side
// data goes with it.
func (a *alltoallvEngine) DispatchWait(d *driver.Dispatch) error {
	st := d.State.(*a2aState)
	set := &a.sets[d.Set]
	K, L := a.K, a.L
	n := 0
	for _, c := range st.recvCounts {
		n += c
	}
	clear(st.expert)
	clear(st.source)
	switch {
	case a.spec.HTExpertMajor():
		a.unpackZones(d, st, n)
		return nil
	case a.spec.LLRankMajor():
		a.unpackRankMajor(d, st, n)
		return nil
	}
	if a.spec.Mode == driver.HighThroughput {
		// Laid out as they arrived: one copy moves them all.
		set.rows, set.area = a.layRows(set.rows, n)
		copy(set.rows, set.in)
		set.outputs = grow.To(set.outputs, n*a.rowBytes)
		set.tokens, set.topk, set.weights = grow.To(set.tokens, n), grow.To(set.topk, n*K), grow.To(set.weights, n*K)
		meta := a.metaWords()
		s, left := 0, 0
		for r := 0; r < n; r++ {
			for left == 0 {
				left, s = st.recvCounts[s], s+1
			}
			left--
			st.source[s-1]++
			w := set.recvMeta[r*meta:]
			set.tokens[r] = w[0]
			for k := 0; k < K; k++ {
				if e := int(w[1+k]); e >= 0 && e/L == a.me {
					set.topk[r*K+k] = int32(e - a.idBase())
					set.weights[r*K+k] = math.Float32frombits(uint32(w[1+K+k]))
					st.expert[e-a.me*L]++
				} else {
					set.topk[r*K+k], set.weights[r*K+k] = -1, 0
				}
			}
		}
		d.Recv = driver.Received{Outputs: driver.Host(set.outputs[:n*a.rowBytes]), Weights: driver.Host(set.weights[:n*K]),
			TopK: driver.Host(set.topk[:n*K]), Tokens: driver.Host(set.tokens[:n]), ExpertCounts: st.expert, SourceCounts: st.source[:a.R],
			NumRecv: n}
		received(d, set)
		return nil
	}
	st.slot = grow.To(st.slot, n)
	s, left := 0, 0
	for r := 0; r < n; r++ {
		for left == 0 {
			left, s = st.recvCounts[s], s+1
		}
		left--
		w := set.recvMeta[3*r:]
		l := int(w[0]) - a.me*L
		j := l*a.span + st.expert[l]
		st.expert[l]++
		st.source[(s-1)*L+l]++
		copyRow(set.rows, set.area, j, set.in, set.inArea, r)
		set.tokens[j], set.weights[j] = w[1], math.Float32frombits(uint32(w[2]))
		st.slot[r] = int32(j)
	}
	d.Recv = driver.Received{Outputs: driver.Host(set.outputs), Weights: driver.Host(set.weights),
		Tokens: driver.Host(set.tokens), ExpertCounts: st.expert, SourceCounts: st.source, NumRecv: n}
	received(d, set)
	return nil
}

// CombineSend moves the expert outputs (and row values) back the way the
// rows came.
func (a *alltoallvEngine) CombineSend(c *driver.Combine) error {
	op := "alltoallv " + a.spec.Mode.String() + " combine"
	d := c.Dispatch
	st := d.State.(*a2aState)
	set := &a.sets[d.Set]
	y, H := hostBytes(c.Y), a.rowBytes
	withValues := !c.RowValues.IsZero()
	send, vals := y, a.sendVals[:0]
	if a.spec.Mode == driver.LowLatency || a.spec.HTExpertMajor() { // pack back in arrival order
		a.packd = grow.To(a.packd, len(st.slot)*H)
		send = a.packd
		width := a.valuesPerRow()
		for r, j := range st.slot {
			copy(send[r*H:(r+1)*H], y[int(j)*H:(int(j)+1)*H])
			if withValues {
				vals = append(vals, c.RowValues.Host()[int(j)*width:(int(j)+1)*width]...)
			}
		}
	} else if withValues {
		vals = append(vals, c.RowValues.Host()...)
	}
	a.sendVals = vals
	// Every rank says first whether it passed values (the others need to
	// know, and it is how a rank that refused the call says so), then the
	// outputs go back, then the values if every rank passed them.
	a.counts = grow.To(a.counts, a.R)
	for i := range a.counts {
		a.counts[i] = 0
		if withValues {
			a.counts[i] = 1
		}
	}
	if err := a.status(op, "an MPI_Alltoall", a.counts); err != nil {
		return err
	}
	set.passed = append(set.passed[:0], a.got...)
	var err error
	backFrom, backTo := st.recvCounts, st.sendCounts
	if a.spec.HTExpertMajor() {
		backFrom, backTo = st.backFrom, st.backTo
	}
	if set.back, err = moveV(a, send, backFrom, backTo, H, set.back); err != nil {
		return a.timeout(op, "the outputs of an MPI_Alltoallv", err)
	}
	width := a.valuesPerRow()
	missing := false
	for _, v := range a.got {
		missing = missing || v == 0
	}
	if withValues && !missing {
		if set.backVals, err = moveV(a, a.sendVals, backFrom, backTo, width, set.backVals); err != nil {
			return a.timeout(op, "the values of an MPI_Alltoallv", err)
		}
	}
	return nil
}

// CombineWait reduces each token's rows in top-k order (LL) or rank order
// (HT), as the CPU engine does on one node.
func (a *alltoallvEngine) CombineWait(c *driver.Combine) error {
	op := "alltoallv " + a.spec.Mode.String() + " combine"
	d := c.Dispatch
	st, rt := d.State.(*a2aState), d.Route
	set := &a.sets[d.Set]
	K, L, H := a.K, a.L, a.rowBytes
	if len(set.back) > 0 {
		a.pin.Pin(unsafe.SliceData(set.back)) // the reduce's table points into it
		defer a.pin.Unpin()
	}
	base := unsafe.Pointer(unsafe.SliceData(set.back))
	rowAt := func(i int) ptr { return unsafe.Add(base, i*H) }
	a.start = grow.To(a.start, rt.T+1)
	src, w := &a.src, a.w[:0]
	src.Reset()
	first := make([]int, a.R+1) // where each rank's rows start among those back
	for r := 0; r < a.R; r++ {
		if a.spec.HTExpertMajor() {
			first[r+1] = first[r] + st.backTo[r]
		} else {
			first[r+1] = first[r] + st.sendCounts[r]
		}
	}
	missing := -1
	for r, v := range set.passed {
		if v == 0 && missing < 0 {
			missing = r
		}
	}
	withValues := !c.SlotValues.IsZero() && missing < 0
	var slots []float32
	if !c.SlotValues.IsZero() {
		slots = c.SlotValues.Host()
		clear(slots)
	}
	switch {
	case a.spec.HTExpertMajor():
		var vals []float32
		if withValues {
			vals = slots
		}
		a.zoneSources(d, first, rowAt, set.backVals, vals)
	case a.spec.WeightedCombine():
		// Packed per destination in (token, slot) order: number them in that order.
		idx := make([]int32, rt.T*K)
		next := append([]int(nil), first[:a.R]...)
		for dst := 0; dst < a.R; dst++ {
			for t := 0; t < rt.T; t++ {
				for k := 0; k < K; k++ {
					if e := d.TopK[t*K+k]; e >= 0 && int(e)/L == dst {
						idx[t*K+k] = int32(next[dst])
						next[dst]++
					}
				}
			}
		}
		for t := 0; t < rt.T; t++ {
			a.start[t] = int32(src.Len())
			for k := 0; k < K; k++ {
				if d.TopK[t*K+k] >= 0 {
					src.Add(rowAt(int(idx[t*K+k])))
					w = append(w, c.Weights[t*K+k])
					if withValues {
						slots[t*K+k] = set.backVals[idx[t*K+k]]
					}
				}
			}
		}
	default:
		for t := 0; t < rt.T; t++ {
			a.start[t] = int32(src.Len())
			for r := 0; r < a.R; r++ {
				if o := rt.TokRankOrd[t*a.R+r]; o >= 0 {
					i := first[r] + int(o)
					src.Add(rowAt(i))
					if withValues {
						for k := 0; k < K; k++ {
							slots[t*K+k] += set.backVals[i*K+k]
						}
					}
				}
			}
		}
		w = nil
	}
	a.start[rt.T] = int32(src.Len())
	a.w = w
	hostrows.ReduceRows(unsafe.Pointer(unsafe.SliceData(hostBytes(c.Out))), a.spec.Elem, src, w, a.start, rt.T, a.H, a.spec.Elem)
	if !c.SlotValues.IsZero() && missing >= 0 {
		return driver.InputErrorf(op, "SlotValues asked for, but rank %d passed no RowValues (set both on every rank, or neither)", missing)
	}
	return nil
}

// noteLen is the room for a refusing rank's reason (longer ones are cut).
const noteLen = 512

func hostBytes(x driver.Tensor[byte]) []byte { return x.Host() }

// ptr is an address of memory outside the Go heap, or pinned for a call.
type ptr = unsafe.Pointer
