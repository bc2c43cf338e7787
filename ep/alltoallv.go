package ep

import (
	"fmt"
	"math"
	"runtime"
	"unsafe"

	"github.com/goep/goep/mpi"
)

// AlltoallvGroup does what Group does the way one writes it by hand with
// two-sided MPI: pack the rows by destination rank, exchange the counts with
// MPI_Alltoall, move rows and metadata with MPI_Alltoallv, unpack; combine
// goes back the same way and reduces with the same kernel and order. It is
// the baseline ep-bench measures Group against, and an independent reference
// for tests: on one node its results are bit-identical to Group's. Its
// buffers are on the Go heap and reused from call to call, so a handle's rows
// are valid until the next Dispatch; its collectives block inside MPI (no
// timeout).
type AlltoallvGroup[E Element] struct {
	cfg      Config
	comm     *mpi.Comm
	shape    shape
	rank     int
	size     int
	dtype    int
	rowBytes int
	acc      []float32

	// Reused buffers: packed rows and metadata out, rows and metadata in,
	// the unpacked expert-major rows (LL), and the combine's way back.
	sendRows, recvRows, unpacked, packBack, back []E
	sendMeta, recvMeta                           []int32
}

// AlltoallvHandle is the result of an AlltoallvGroup dispatch, laid out like
// a Handle's.
type AlltoallvHandle[E Element] struct {
	// Recv: LL [L][Size*MaxTokensPerRank][Hidden] expert-major; HT
	// [NumRecv][Hidden] grouped by source rank.
	Recv         []E
	ExpertCounts []int
	RecvTopK     []int32   // HT: [NumRecv][TopK] local ids
	RecvWeights  []float32 // HT: [NumRecv][TopK]; LL: per row [L][Size*MaxTokensPerRank]

	T          int
	topk       []int32
	weights    []float32
	rt         *routing
	sendCounts []int // rows to each rank in the dispatch
	recvCounts []int // rows from each rank
	// LL: where each received row went (index into Recv rows), in arrival
	// order; HT rows stay where they arrived.
	slot []int32
}

// NewAlltoallvGroup makes the baseline over comm. It is collective.
func NewAlltoallvGroup[E Element](comm *mpi.Comm, cfg Config) (*AlltoallvGroup[E], error) {
	if comm == nil {
		return nil, fmt.Errorf("ep: NewAlltoallvGroup: nil communicator")
	}
	if err := cfg.validate(comm.Size()); err != nil {
		return nil, err
	}
	c, err := comm.Split(0, comm.Rank(), "ep-alltoallv")
	if err != nil {
		return nil, err
	}
	c.SetTimeout(0) // plain blocking MPI calls, as in a hand-written program
	dtype, _ := dtypeOf[E]()
	R := c.Size()
	nodeOf := make([]int32, R) // one node: the baseline is flat
	return &AlltoallvGroup[E]{cfg: cfg, comm: c, rank: c.Rank(), size: R, dtype: dtype,
		rowBytes: cfg.Hidden * sizeOf[E](), acc: make([]float32, cfg.Hidden),
		shape: shape{E: cfg.NumExperts, L: cfg.NumExperts / R, R: R, K: cfg.TopK, nodeOf: nodeOf, nodes: 1}}, nil
}

// Close frees the baseline's communicator. It is collective.
func (a *AlltoallvGroup[E]) Close() error { return a.comm.Free() }

// exchange is Alltoall(counts) -> Alltoallv(rows) -> Alltoallv(meta).
func (a *AlltoallvGroup[E]) exchange(rows []E, sendCounts []int, meta []int32, metaPerRow int) ([]E, []int32, []int, error) {
	R := a.size
	counts := make([]int32, R)
	for d, n := range sendCounts {
		counts[d] = int32(n)
	}
	got := make([]int32, R)
	if err := mpi.AlltoallSlice(a.comm, counts, got); err != nil {
		return nil, nil, nil, err
	}
	recvCounts := make([]int, R)
	for s, n := range got {
		recvCounts[s] = int(n)
	}
	recv, rmeta, err := a.move(rows, sendCounts, recvCounts, meta, metaPerRow, a.recvRows, a.recvMeta)
	if err != nil {
		return nil, nil, nil, err
	}
	a.recvRows, a.recvMeta = recv, rmeta
	return recv, rmeta, recvCounts, nil
}

// move sends rows (and metaPerRow int32 per row) with counts known on both
// sides, receiving into recv and rmeta (grown as needed).
func (a *AlltoallvGroup[E]) move(rows []E, sendCounts, recvCounts []int, meta []int32, metaPerRow int, recv []E, rmeta []int32) ([]E, []int32, error) {
	R, H := a.size, a.cfg.Hidden
	sc, sd, rc, rd := make([]int, R), make([]int, R), make([]int, R), make([]int, R)
	mc, md, nc, nd := make([]int, R), make([]int, R), make([]int, R), make([]int, R)
	total := 0
	for p := 0; p < R; p++ {
		if p > 0 {
			sd[p] = sd[p-1] + sc[p-1]
			md[p] = md[p-1] + mc[p-1]
			rd[p] = rd[p-1] + rc[p-1]
			nd[p] = nd[p-1] + nc[p-1]
		}
		sc[p], mc[p] = sendCounts[p]*H, sendCounts[p]*metaPerRow
		rc[p], nc[p] = recvCounts[p]*H, recvCounts[p]*metaPerRow
		total += recvCounts[p]
	}
	recv = growTo(recv, total*H)
	if err := mpi.AlltoallvSlice(a.comm, rows, sc, sd, recv, rc, rd); err != nil {
		return nil, nil, err
	}
	if metaPerRow > 0 {
		rmeta = growTo(rmeta, total*metaPerRow)
		if err := mpi.AlltoallvSlice(a.comm, meta, mc, md, rmeta, nc, nd); err != nil {
			return nil, nil, err
		}
	}
	return recv, rmeta, nil
}

// Dispatch is Group.Dispatch done by hand. It is collective.
func (a *AlltoallvGroup[E]) Dispatch(x []E, topk []int32, weights []float32) (*AlltoallvHandle[E], error) {
	op := "alltoallv " + a.cfg.Mode.String() + " dispatch"
	H, K, L, R := a.cfg.Hidden, a.cfg.TopK, a.shape.L, a.size
	if len(topk)%K != 0 || len(x) != len(topk)/K*H || len(weights) != len(topk) || len(topk)/K > a.cfg.MaxTokensPerRank {
		return nil, inputErrorf(op, "inputs of %d, %d and %d values do not fit TopK = %d, Hidden = %d, MaxTokensPerRank = %d",
			len(x), len(topk), len(weights), K, H, a.cfg.MaxTokensPerRank)
	}
	T := len(topk) / K
	rt, err := computeRouting(op, a.shape, topk, T)
	if err != nil {
		return nil, err
	}
	h := &AlltoallvHandle[E]{T: T, topk: topk, weights: weights, rt: rt, sendCounts: make([]int, R)}
	// Pack by destination: LL one row per (token, expert) pair with (expert,
	// weight bits); HT one row per (token, rank) with the token's top-k ids
	// and weights.
	rows, meta := a.sendRows[:0], a.sendMeta[:0]
	metaPerRow := 2
	if a.cfg.Mode == HighThroughput {
		metaPerRow = 2 * K
	}
	for d := 0; d < R; d++ {
		for t := 0; t < T; t++ {
			if a.cfg.Mode == LowLatency {
				for k := 0; k < K; k++ {
					if e := topk[t*K+k]; e >= 0 && int(e)/L == d {
						rows = append(rows, x[t*H:(t+1)*H]...)
						meta = append(meta, e, int32(f32bits(weights[t*K+k])))
						h.sendCounts[d]++
					}
				}
			} else if rt.tokRankOrd[t*R+d] >= 0 {
				rows = append(rows, x[t*H:(t+1)*H]...)
				meta = append(meta, topk[t*K:(t+1)*K]...)
				for k := 0; k < K; k++ {
					meta = append(meta, int32(f32bits(weights[t*K+k])))
				}
				h.sendCounts[d]++
			}
		}
	}
	a.sendRows, a.sendMeta = rows, meta
	recv, rmeta, recvCounts, err := a.exchange(rows, h.sendCounts, meta, metaPerRow)
	if err != nil {
		return nil, err
	}
	h.recvCounts = recvCounts
	n := len(recv) / H
	h.ExpertCounts = make([]int, L)
	if a.cfg.Mode == HighThroughput { // rows arrive grouped by source: already the layout
		h.Recv = recv
		h.RecvTopK = make([]int32, n*K)
		h.RecvWeights = make([]float32, n*K)
		for r := 0; r < n; r++ {
			for k := 0; k < K; k++ {
				e := rmeta[r*2*K+k]
				if e >= 0 && int(e)/L == a.rank {
					h.RecvTopK[r*K+k] = e - int32(a.rank*L)
					h.RecvWeights[r*K+k] = f32frombits(uint32(rmeta[r*2*K+K+k]))
					h.ExpertCounts[e-int32(a.rank*L)]++
				} else {
					h.RecvTopK[r*K+k] = -1
				}
			}
		}
		return h, nil
	}
	// LL: unpack each row into its expert's block.
	span := R * a.cfg.MaxTokensPerRank
	a.unpacked = growTo(a.unpacked, L*span*H)
	h.Recv = a.unpacked
	h.RecvWeights = make([]float32, L*span)
	h.slot = make([]int32, n)
	for r := 0; r < n; r++ {
		l := int(rmeta[2*r]) - a.rank*L
		j := l*span + h.ExpertCounts[l]
		h.ExpertCounts[l]++
		copy(h.Recv[j*H:(j+1)*H], recv[r*H:(r+1)*H])
		h.RecvWeights[j] = f32frombits(uint32(rmeta[2*r+1]))
		h.slot[r] = int32(j)
	}
	return h, nil
}

// Combine is Group.Combine done by hand: y laid out like h.Recv. It is
// collective.
func (a *AlltoallvGroup[E]) Combine(h *AlltoallvHandle[E], y, out []E) error {
	H, K, R := a.cfg.Hidden, a.cfg.TopK, a.size
	if len(y) != len(h.Recv) || len(out) != h.T*H {
		return inputErrorf("alltoallv combine", "len(y) = %d (want %d), len(out) = %d (want %d)", len(y), len(h.Recv), len(out), h.T*H)
	}
	send := y
	if a.cfg.Mode == LowLatency { // pack back in arrival order
		a.packBack = growTo(a.packBack, len(h.slot)*H)
		send = a.packBack
		for r, j := range h.slot {
			copy(send[r*H:(r+1)*H], y[int(j)*H:(int(j)+1)*H])
		}
	}
	back, _, err := a.move(send, h.recvCounts, h.sendCounts, nil, 0, a.back, nil)
	if err != nil {
		return err
	}
	a.back = back
	// Rows come back grouped by the rank that held them, in the order this
	// rank packed them; reduce each token's rows in top-k order (LL) or rank
	// order (HT).
	first := make([]int, R+1)
	for d := 0; d < R; d++ {
		first[d+1] = first[d] + h.sendCounts[d]
	}
	next := append([]int(nil), first[:R]...)
	var pin runtime.Pinner
	defer pin.Unpin()
	base := pinned(&pin, back)
	rowAt := func(i int) ptr { return unsafe.Add(base, i*a.rowBytes) }
	start := make([]int32, h.T+1)
	var src []ptr
	var w []float32
	L := a.shape.L
	if a.cfg.Mode == LowLatency {
		// Packed per destination in (token, slot) order: walk in that order.
		idx := make([]int32, h.T*K)
		for d := 0; d < R; d++ {
			for t := 0; t < h.T; t++ {
				for k := 0; k < K; k++ {
					if e := h.topk[t*K+k]; e >= 0 && int(e)/L == d {
						idx[t*K+k] = int32(next[d])
						next[d]++
					}
				}
			}
		}
		for t := 0; t < h.T; t++ {
			start[t] = int32(len(src))
			for k := 0; k < K; k++ {
				if h.topk[t*K+k] >= 0 {
					src = append(src, rowAt(int(idx[t*K+k])))
					w = append(w, h.weights[t*K+k])
				}
			}
		}
	} else {
		for t := 0; t < h.T; t++ {
			start[t] = int32(len(src))
			for d := 0; d < R; d++ {
				if h.rt.tokRankOrd[t*R+d] >= 0 {
					src = append(src, rowAt(first[d]+int(h.rt.tokRankOrd[t*R+d])))
				}
			}
		}
	}
	start[h.T] = int32(len(src))
	reduceRows(pinned(&pin, out), a.dtype, src, w, start, h.T, H, a.dtype, a.acc)
	return nil
}

func f32bits(f float32) uint32     { return math.Float32bits(f) }
func f32frombits(u uint32) float32 { return math.Float32frombits(u) }
