package moe

import (
	"encoding/binary"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/goep/goep/mpi"
)

// This file is the data-parallel gradient sync: how the gradient of the
// parameters every rank holds a copy of (the gate and the shared expert) is
// summed over the ranks. See the package doc, "Data-parallel gradients".

// SyncMethod names a way of summing a data-parallel gradient over ranks.
type SyncMethod int

// Sync methods. The zero value is SyncAllreduce, the exact sum.
const (
	SyncAllreduce SyncMethod = iota // exact: mpi.Allreduce of the whole gradient
	SyncA2SGD                       // A2SGD: two averages per rank, error feedback
	SyncTopK                        // Top-K sparsification with error feedback
)

// GradSync is the choice of how a Layer sums the gradient of its
// data-parallel parameters over the ranks. Its zero value is the exact
// allreduce.
type GradSync struct {
	Method SyncMethod
	K      int // SyncTopK: the entries each rank sends per step
}

// String is the form ParseGradSync reads: "allreduce", "a2sgd" or "topk:K".
func (s GradSync) String() string {
	switch s.Method {
	case SyncAllreduce:
		return "allreduce"
	case SyncA2SGD:
		return "a2sgd"
	case SyncTopK:
		return "topk:" + strconv.Itoa(s.K)
	}
	return fmt.Sprintf("GradSync(%d)", int(s.Method))
}

// ParseGradSync reads "allreduce", "a2sgd" or "topk:K" (K a positive
// integer).
func ParseGradSync(s string) (GradSync, error) {
	switch {
	case s == "allreduce":
		return GradSync{}, nil
	case s == "a2sgd":
		return GradSync{Method: SyncA2SGD}, nil
	case strings.HasPrefix(s, "topk:"):
		k, err := strconv.Atoi(strings.TrimPrefix(s, "topk:"))
		if err != nil || k <= 0 {
			return GradSync{}, fmt.Errorf("moe: grad sync %q: K must be a positive integer (topk:1000)", s)
		}
		return GradSync{Method: SyncTopK, K: k}, nil
	}
	return GradSync{}, fmt.Errorf("moe: unknown grad sync %q (want allreduce, a2sgd or topk:K)", s)
}

// PerRankState reports whether the method keeps state of its own on each
// rank (error feedback) that a checkpoint must hold.
func (s GradSync) PerRankState() bool { return s.Method != SyncAllreduce }

// Replicated reports whether every rank applies the same update, so that the
// data-parallel parameters stay identical on every rank. A2SGD's update
// depends on each rank's own signs: its copies drift apart.
func (s GradSync) Replicated() bool { return s.Method != SyncA2SGD }

// validate checks the choice for a gradient of n entries.
func (s GradSync) validate(n int) error {
	switch s.Method {
	case SyncAllreduce, SyncA2SGD:
		return nil
	case SyncTopK:
		if s.K <= 0 || s.K > n {
			return fmt.Errorf("grad sync topk:%d: K must be 1..%d, the number of data-parallel parameters", s.K, n)
		}
		if n > math.MaxInt32 {
			return fmt.Errorf("grad sync topk: %d data-parallel parameters do not fit the 32-bit indexes sent", n)
		}
		return nil
	}
	return fmt.Errorf("grad sync %v: choose allreduce, a2sgd or topk:K", s)
}

// SyncStats is what one Sync cost this rank.
type SyncStats struct {
	// BytesSent is the payload this rank sends to other ranks under the
	// bandwidth-optimal algorithms: 2(R-1)/R of the vector for an allreduce
	// (reduce-scatter, then allgather, as a ring or Rabenseifner's algorithm
	// sends), (R-1) times its own part for an allgather. It is a count of
	// logical traffic, not of what a given MPI library chose to send.
	BytesSent int64
	Time      time.Duration // in the call, computation included
}

// A Syncer sums a data-parallel gradient over the ranks of a communicator,
// exactly or approximately. A Layer holds one for its gate and shared
// expert; NewSyncer makes the three of this package.
type Syncer interface {
	// Sync replaces g, this rank's part of the gradient of a loss that is a
	// sum over ranks, with the gradient of the whole loss: the sum over
	// ranks, or an estimate of it. Collective: every rank calls it with a g
	// of the same length.
	Sync(g []float64) (SyncStats, error)
	// Residual is this rank's error feedback: the part of its gradients it
	// has not yet applied, which the next Sync adds back; nil for an exact
	// sync. The caller may read it and, to restore a checkpoint, write it.
	Residual() []float64
}

// NewSyncer returns the Syncer of s for gradients of n entries on comm.
func NewSyncer(comm *mpi.Comm, s GradSync, n int) (Syncer, error) {
	if err := s.validate(n); err != nil {
		return nil, fmt.Errorf("moe: %w", err)
	}
	switch s.Method {
	case SyncA2SGD:
		return &a2sgdSync{comm: comm, e: make([]float64, n)}, nil
	case SyncTopK:
		return &topKSync{comm: comm, k: s.K, e: make([]float64, n)}, nil
	}
	return &allreduceSync{comm: comm, sum: make([]float64, n)}, nil
}

// ringAllreduceBytes is what each of R ranks sends in a bandwidth-optimal
// allreduce of payload bytes.
func ringAllreduceBytes(R int, payload int64) int64 { return 2 * int64(R-1) * payload / int64(R) }

// allreduceSync is the exact sum.
type allreduceSync struct {
	comm *mpi.Comm
	sum  []float64
}

func (s *allreduceSync) Residual() []float64 { return nil }

func (s *allreduceSync) Sync(g []float64) (SyncStats, error) {
	start := time.Now()
	if len(g) != len(s.sum) {
		return SyncStats{}, fmt.Errorf("moe: allreduce sync: %d gradient entries, want %d", len(g), len(s.sum))
	}
	if err := mpi.Allreduce(s.comm, mpi.OpSum, g, s.sum); err != nil {
		return SyncStats{}, fmt.Errorf("moe: allreduce sync: %w", err)
	}
	copy(g, s.sum)
	return SyncStats{BytesSent: ringAllreduceBytes(s.comm.Size(), 8*int64(len(g))), Time: time.Since(start)}, nil
}

// a2sgdSync is A2SGD's two-level gradient averaging (Bhattacharya, Yu,
// Chowdhury, arXiv 2006.07405). With e the rank's residual and R ranks:
//
//	v   = g + e                          the gradient plus the error carried
//	mu+ = mean of the positive entries of v, mu- = of the negative ones (0 if none)
//	M+- = (sum over ranks of mu+-) / R   one allreduce of two float64
//	u_i = M+ if v_i > 0, M- if v_i < 0, 0 if v_i = 0    this rank's share, applied
//	e   = v - u                          kept, added back at the next Sync
//	g   = R * u                          the sum over ranks, as the exact sync returns
//
// A non-finite entry of v makes mu+ and mu- NaN on its rank, so that every
// rank's update is NaN and the loss shows it, as with the exact sum.
type a2sgdSync struct {
	comm *mpi.Comm
	e    []float64
}

func (s *a2sgdSync) Residual() []float64 { return s.e }

// addAndMeans adds g into e (e becomes v = g + e) and returns the means of
// the positive and of the negative entries of v (0 where there are none;
// NaN for both if an entry is not finite). One pass, without branches on
// the signs, which are random: mispredicted branches cost more than the
// arithmetic here.
func addAndMeans(e, g []float64) (pos, neg float64) {
	var sp, sn float64
	var np, nn uint64
	e = e[:len(g)]
	for i, x := range g {
		v := e[i] + x
		e[i] = v
		s := math.Float64bits(v) >> 63 // 1: negative
		nz := uint64(1)
		if v == 0 { // rare, and predicted: counts in neither mean
			nz = 0
		}
		np += (1 - s) & nz
		nn += s & nz
		sp += v * float64(1-s) // NaN or an infinity makes both sums NaN
		sn += v * float64(s)
	}
	if math.IsNaN(sp) || math.IsNaN(sn) || math.IsInf(sp, 0) || math.IsInf(sn, 0) {
		return math.NaN(), math.NaN()
	}
	if np > 0 {
		pos = sp / float64(np)
	}
	if nn > 0 {
		neg = sn / float64(nn)
	}
	return pos, neg
}

func (s *a2sgdSync) Sync(g []float64) (SyncStats, error) {
	start := time.Now()
	if len(g) != len(s.e) {
		return SyncStats{}, fmt.Errorf("moe: a2sgd sync: %d gradient entries, want %d", len(g), len(s.e))
	}
	pos, neg := addAndMeans(s.e, g) // s.e holds v = g + e until the reconstruction below
	var sums [2]float64
	if err := mpi.Allreduce(s.comm, mpi.OpSum, []float64{pos, neg}, sums[:]); err != nil {
		return SyncStats{}, fmt.Errorf("moe: a2sgd sync: %w", err)
	}
	R := float64(s.comm.Size())
	levels := [2]float64{sums[0] / R, sums[1] / R} // by sign bit: positive, negative
	e := s.e[:len(g)]
	for i, v := range e {
		u := levels[math.Float64bits(v)>>63]
		if v == 0 {
			u = 0
		}
		e[i] = v - u
		g[i] = R * u
	}
	return SyncStats{BytesSent: ringAllreduceBytes(s.comm.Size(), 16), Time: time.Since(start)}, nil
}

// topKSync is Top-K sparsification with error feedback (the baseline of the
// A2SGD paper; Aji and Heafield, Stich et al.). With e the rank's residual:
//
//	v = g + e
//	s = the K entries of v of largest magnitude (ties: the lower index), 0 elsewhere
//	e = v - s                            kept, added back at the next Sync
//	g = sum over ranks of s              an allgather of K (int32 index, float64 value) pairs
//
// Every rank sums the gathered entries in rank order, so every rank gets the
// same g, bit for bit, and the parameters stay replicated.
type topKSync struct {
	comm   *mpi.Comm
	k      int
	e      []float64
	keys   []float64 // scratch: magnitudes
	cand   []int     // scratch: candidate indexes
	picked []int     // scratch: the chosen indexes, ascending
	send   []byte
	recv   []byte
}

func (s *topKSync) Residual() []float64 { return s.e }

// topKEntryBytes is the size of one sent entry: an int32 index and a float64.
const topKEntryBytes = 12

// magnitude is the selection key of x: |x|, and +Inf for NaN, so that a NaN
// is sent (and shows in every rank's update) rather than hidden in e.
func magnitude(x float64) float64 {
	if math.IsNaN(x) {
		return math.Inf(1)
	}
	return math.Abs(x)
}

// topKIndexes returns, in ascending order, the indexes of the k entries of v
// of largest magnitude (see magnitude), ties going to the lower index. keys,
// cand and out are scratch space, grown as needed and returned for reuse.
//
// A full selection over v costs several passes of unpredictable branches.
// Instead a threshold is first estimated from a strided sample of v, low
// enough that about twice k entries reach it; one pass gathers those
// candidates (the branch is predictable: few pass) and an exact selection
// runs on them alone. Whenever fewer than k entries reach the estimate, the
// selection runs on all of v: the result is exact either way.
func topKIndexes(v []float64, k int, keys []float64, cand, out []int) ([]float64, []int, []int) {
	n := len(v)
	est := math.Inf(-1) // every entry is a candidate
	if m := 64 * (n / k); k < n && m < n/2 {
		// Every (n/m)-th entry; in it, the 2*64th largest magnitude: expected
		// to be reached by about 2k entries of v.
		stride := n / m
		keys = keys[:0]
		for i := 0; i < n; i += stride {
			keys = append(keys, magnitude(v[i]))
		}
		est = kthLargest(keys, min(128, len(keys)))
	}
	cand = cand[:0]
	for i, x := range v {
		if magnitude(x) >= est {
			cand = append(cand, i)
		}
	}
	if len(cand) < k { // the estimate was too high: all of v
		cand = cand[:0]
		for i := range v {
			cand = append(cand, i)
		}
	}
	keys = keys[:0]
	for _, i := range cand {
		keys = append(keys, magnitude(v[i]))
	}
	t := kthLargest(keys, k) // the k-th largest magnitude of v
	above := 0
	for _, i := range cand {
		if magnitude(v[i]) > t {
			above++
		}
	}
	ties := k - above // entries equal to t to take, the first ones
	out = out[:0]
	for _, i := range cand { // ascending
		m := magnitude(v[i])
		if m > t || (m == t && ties > 0) {
			if m == t {
				ties--
			}
			out = append(out, i)
		}
	}
	return keys, cand, out
}

// kthLargest returns the k-th largest (1-based) of a, which it reorders:
// Hoare's selection with a median-of-three pivot, O(len(a)) expected.
func kthLargest(a []float64, k int) float64 {
	target := k - 1 // its index in descending order
	lo, hi := 0, len(a)-1
	for lo < hi {
		mid := lo + (hi-lo)/2
		p := median3(a[lo], a[mid], a[hi])
		i, j := lo, hi
		for i <= j {
			for a[i] > p {
				i++
			}
			for a[j] < p {
				j--
			}
			if i <= j {
				a[i], a[j] = a[j], a[i]
				i++
				j--
			}
		}
		// a[lo..j] >= p, a[j+1..i-1] == p, a[i..hi] <= p
		switch {
		case target <= j:
			hi = j
		case target >= i:
			lo = i
		default:
			return a[target]
		}
	}
	return a[target]
}

func median3(a, b, c float64) float64 {
	if a > b {
		a, b = b, a
	}
	if b > c {
		b = c
	}
	return max(a, b)
}

func (s *topKSync) Sync(g []float64) (SyncStats, error) {
	start := time.Now()
	if len(g) != len(s.e) {
		return SyncStats{}, fmt.Errorf("moe: topk sync: %d gradient entries, want %d", len(g), len(s.e))
	}
	e := s.e
	for i, x := range g {
		e[i] += x // v = g + e
	}
	s.keys, s.cand, s.picked = topKIndexes(e, s.k, s.keys, s.cand, s.picked)
	n := s.k * topKEntryBytes
	if cap(s.send) < n {
		s.send = make([]byte, n)
	}
	s.send = s.send[:n]
	for j, i := range s.picked {
		b := s.send[j*topKEntryBytes:]
		binary.LittleEndian.PutUint32(b, uint32(i))
		binary.LittleEndian.PutUint64(b[4:], math.Float64bits(e[i]))
		e[i] = 0 // sent: nothing of it is kept
	}
	R := s.comm.Size()
	if cap(s.recv) < n*R {
		s.recv = make([]byte, n*R)
	}
	s.recv = s.recv[:n*R]
	if err := s.comm.Allgather(s.send, s.recv); err != nil {
		return SyncStats{}, fmt.Errorf("moe: topk sync: %w", err)
	}
	clear(g)
	for j := 0; j < s.k*R; j++ { // rank by rank, in rank order
		b := s.recv[j*topKEntryBytes:]
		i := int(binary.LittleEndian.Uint32(b))
		if i >= len(g) {
			return SyncStats{}, fmt.Errorf("moe: topk sync: rank %d sent index %d, beyond the %d entries", j/s.k, i, len(g))
		}
		g[i] += math.Float64frombits(binary.LittleEndian.Uint64(b[4:]))
	}
	return SyncStats{BytesSent: int64(R-1) * int64(n), Time: time.Since(start)}, nil
}
