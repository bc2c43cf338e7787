package serve

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/goep/goep/mpi"
)

// Result is a serving run as rank 0 gathers it at the end: every step of
// every rank, every request, the phases of the micro-batches, the ranks
// masked. Times are microseconds from the start of serving, each rank's
// clock started at the end of a common barrier.
type Result struct {
	Config   Config
	Workload Workload
	Ranks    int
	Hosts    []string // per rank
	Steps    []Step
	Requests []Served // by id
	Events   []Event
	Masking  []MaskEpisode
}

// Step is one step of the run, per rank. A rank that did not take part
// (masked, or stopped) has Rows -1 and NaN times.
type Step struct {
	Step              int64
	Kind              string // "decode" or "prefill"
	Rows              []int  // tokens the rank ran
	Emitted           []int  // tokens it generated
	Dropped           []int  // (token, expert) pairs of its tokens dropped: their expert's rank was masked
	Masked            []int  // ranks masked in its group after the step
	StartUS, FinishUS []float64
}

// LatencyUS is the step's time: the longest any rank that took part spent
// in it (NaN if none did).
func (s *Step) LatencyUS() float64 {
	v := math.NaN()
	for r, n := range s.Rows {
		if n >= 0 && !(s.FinishUS[r]-s.StartUS[r] <= v) {
			v = s.FinishUS[r] - s.StartUS[r]
		}
	}
	return v
}

// TookPart counts the ranks that ran the step.
func (s *Step) TookPart() int {
	n := 0
	for _, r := range s.Rows {
		if r >= 0 {
			n++
		}
	}
	return n
}

// Served is one request as served.
type Served struct {
	ID, Rank     int
	Prompt, Gen  int
	ArrivalUS    float64 // when it arrived (rank 0's clock)
	AdmittedUS   float64 // when its rank took it
	FirstTokenUS float64 // when its first token was generated (the end of the step that did)
	DoneUS       float64 // when its last token was
	Tokens       []int32 // the tokens generated
	Hash         uint64  // FNV-1a of the bits of every logit computed for it
	DroppedPairs int     // (token, expert) pairs of its tokens dropped by masking
}

// TTFTUS is the time to first token: from arrival to the first token.
func (s *Served) TTFTUS() float64 { return s.FirstTokenUS - s.ArrivalUS }

// Event is one phase of one micro-batch in one layer of a step, on one
// rank.
type Event struct {
	Step              int64
	Rank, Layer, MB   int
	Phase             Phase
	StartUS, FinishUS float64
}

// gatherv gathers every rank's local words; all of them, by rank, on every
// rank. Collective.
func gatherv(c *mpi.Comm, local []int64) ([][]int64, error) {
	counts := make([]int64, c.Size())
	if err := mpi.AllgatherSlice(c, []int64{int64(len(local))}, counts); err != nil {
		return nil, err
	}
	most := int(slices.Max(counts))
	out := make([][]int64, c.Size())
	if most == 0 {
		return out, nil
	}
	pad := make([]int64, most)
	copy(pad, local)
	all := make([]int64, most*c.Size())
	if err := mpi.AllgatherSlice(c, pad, all); err != nil {
		return nil, err
	}
	for r := range out {
		out[r] = all[r*most : r*most+int(counts[r])]
	}
	return out, nil
}

const hostNameLen = 64

// gather brings every rank's records to rank 0 and makes the Result there
// (nil elsewhere). Collective.
func (s *server[E]) gather(sc *scheduler) (*Result, error) {
	var st, ev, rq []int64
	for _, r := range s.steps {
		st = append(st, r.step, int64(r.kind), int64(r.rows), int64(r.emitted), int64(r.dropped), int64(r.masked), r.startNS, r.endNS)
	}
	for _, e := range s.e.events {
		ev = append(ev, e.step, int64(e.layer), int64(e.mb), int64(e.phase), e.startNS, e.finishNS)
	}
	for _, f := range s.finished {
		rq = append(rq, int64(f.req.ID), f.admitted, f.first, f.done, int64(f.dropped), int64(f.hash), int64(len(f.out)))
		for _, id := range f.out {
			rq = append(rq, int64(id))
		}
	}
	var parts [3][][]int64
	for i, local := range [][]int64{st, ev, rq} {
		var err error
		if parts[i], err = gatherv(s.world, local); err != nil {
			return nil, fmt.Errorf("serve: gathering the records: %w", err)
		}
	}
	name, err := mpi.ProcessorName()
	if err != nil {
		return nil, err
	}
	mine := make([]byte, hostNameLen)
	copy(mine, name)
	hosts := make([]byte, hostNameLen*s.size)
	if err := s.world.Allgather(mine, hosts); err != nil {
		return nil, fmt.Errorf("serve: gathering host names: %w", err)
	}
	if s.rank != 0 {
		return nil, nil
	}
	R := s.size
	res := &Result{Config: s.cfg, Workload: s.opt.Workload, Ranks: R, Masking: sc.episodes}
	for r := 0; r < R; r++ {
		res.Hosts = append(res.Hosts, strings.TrimRight(string(hosts[r*hostNameLen:(r+1)*hostNameLen]), "\x00"))
	}
	res.Steps = make([]Step, len(sc.kinds))
	for i := range res.Steps {
		p := &res.Steps[i]
		p.Step, p.Kind = int64(i+1), sc.kinds[i].String()
		p.Rows, p.Emitted, p.Dropped, p.Masked = fill(R, -1), fill(R, -1), fill(R, -1), fill(R, -1)
		p.StartUS, p.FinishUS = fillF(R, nan), fillF(R, nan)
	}
	us := func(ns int64) float64 { return float64(ns) / 1e3 }
	for r, words := range parts[0] {
		for i := 0; i+8 <= len(words); i += 8 {
			w := words[i : i+8]
			if w[0] < 1 || int(w[0]) > len(res.Steps) {
				return nil, fmt.Errorf("serve: rank %d recorded step %d, of %d", r, w[0], len(res.Steps))
			}
			p := &res.Steps[w[0]-1]
			p.Rows[r], p.Emitted[r], p.Dropped[r], p.Masked[r] = int(w[2]), int(w[3]), int(w[4]), int(w[5])
			p.StartUS[r], p.FinishUS[r] = us(w[6]), us(w[7])
		}
	}
	for r, words := range parts[1] {
		for i := 0; i+6 <= len(words); i += 6 {
			w := words[i : i+6]
			res.Events = append(res.Events, Event{Step: w[0], Rank: r, Layer: int(w[1]), MB: int(w[2]), Phase: Phase(w[3]),
				StartUS: us(w[4]), FinishUS: us(w[5])})
		}
	}
	res.Requests = make([]Served, len(s.reqs))
	for i, q := range s.reqs {
		res.Requests[i] = Served{ID: i, Rank: -1, Prompt: len(q.Prompt), Gen: q.Gen, ArrivalUS: us(int64(q.Arrival)),
			AdmittedUS: nan, FirstTokenUS: nan, DoneUS: nan}
	}
	for r, words := range parts[2] {
		for i := 0; i+7 <= len(words); {
			w := words[i : i+7]
			n := int(w[6])
			id := int(w[0])
			if id < 0 || id >= len(res.Requests) || n < 0 || i+7+n > len(words) {
				return nil, fmt.Errorf("serve: rank %d sent a malformed record of request %d", r, id)
			}
			q := &res.Requests[id]
			q.Rank, q.AdmittedUS, q.FirstTokenUS, q.DoneUS = r, us(w[1]), us(w[2]), us(w[3])
			q.DroppedPairs, q.Hash = int(w[4]), uint64(w[5])
			for _, t := range words[i+7 : i+7+n] {
				q.Tokens = append(q.Tokens, int32(t))
			}
			i += 7 + n
		}
	}
	for i := range res.Requests {
		if res.Requests[i].Rank < 0 {
			return nil, fmt.Errorf("serve: request %d was not served", i)
		}
	}
	return res, nil
}

func fill(n, v int) []int {
	s := make([]int, n)
	for i := range s {
		s[i] = v
	}
	return s
}

func fillF(n int, v float64) []float64 {
	s := make([]float64, n)
	for i := range s {
		s[i] = v
	}
	return s
}

// Percentiles are a distribution's nearest-rank percentiles.
type Percentiles struct {
	N                  int
	P50, P90, P99, Max float64
}

// percentiles of v (NaN values left out); zero with N 0 for none.
func percentiles(v []float64) Percentiles {
	s := make([]float64, 0, len(v))
	for _, x := range v {
		if !math.IsNaN(x) {
			s = append(s, x)
		}
	}
	if len(s) == 0 {
		return Percentiles{}
	}
	slices.Sort(s)
	at := func(p float64) float64 { return s[max(0, int(math.Ceil(p/100*float64(len(s))))-1)] }
	return Percentiles{N: len(s), P50: at(50), P90: at(90), P99: at(99), Max: s[len(s)-1]}
}

// Figures are what a service owner reads of a run.
type Figures struct {
	Requests, Tokens, PromptTokens int
	// Elapsed is from the first step's start to the last step's end.
	Elapsed time.Duration
	// Decode and Prefill are the steps' times (Step.LatencyUS), TTFT the
	// requests' times to first token, in microseconds.
	Decode, Prefill, TTFT Percentiles
	// TokensPerSecond is generated tokens over Elapsed; per rank, each
	// rank's own.
	TokensPerSecond        float64
	TokensPerSecondPerRank []float64
	// DroppedPairs are the (token, expert) pairs dropped because their
	// expert's rank was masked, DegradedRequests the requests with any,
	// StepsShort the steps that some rank did not take part in.
	DroppedPairs, DegradedRequests, StepsShort int
}

// Figures computes the run's figures.
func (r *Result) Figures() Figures {
	f := Figures{Requests: len(r.Requests), TokensPerSecondPerRank: make([]float64, r.Ranks)}
	first, last := math.Inf(1), math.Inf(-1)
	var dec, pre []float64
	perRank := make([]int, r.Ranks)
	for i := range r.Steps {
		s := &r.Steps[i]
		for rk, n := range s.Rows {
			if n < 0 {
				continue
			}
			first, last = min(first, s.StartUS[rk]), max(last, s.FinishUS[rk])
			perRank[rk] += s.Emitted[rk]
			f.DroppedPairs += s.Dropped[rk]
		}
		if s.TookPart() < r.Ranks {
			f.StepsShort++
		}
		if s.Kind == prefillStep.String() {
			pre = append(pre, s.LatencyUS())
		} else {
			dec = append(dec, s.LatencyUS())
		}
	}
	var ttft []float64
	for i := range r.Requests {
		q := &r.Requests[i]
		f.Tokens += len(q.Tokens)
		f.PromptTokens += q.Prompt
		ttft = append(ttft, q.TTFTUS())
		if q.DroppedPairs > 0 {
			f.DegradedRequests++
		}
	}
	f.Decode, f.Prefill, f.TTFT = percentiles(dec), percentiles(pre), percentiles(ttft)
	if last > first {
		f.Elapsed = time.Duration((last - first) * 1e3)
		sec := (last - first) / 1e6
		f.TokensPerSecond = float64(f.Tokens) / sec
		for rk, n := range perRank {
			f.TokensPerSecondPerRank[rk] = float64(n) / sec
		}
	}
	return f
}
