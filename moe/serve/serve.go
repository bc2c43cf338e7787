package serve

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/goep/goep/ep"
	"github.com/goep/goep/moe"
	"github.com/goep/goep/moe/runs"
	"github.com/goep/goep/mpi"
)

// Options are a serving run's inputs besides its Config.
type Options struct {
	Workload Workload
	// OnNote, on rank 0, is told what happens while serving: a rank masked,
	// a rank back.
	OnNote func(string)
	// EventSteps bounds the steps whose phases are recorded (Result.Events):
	// the first EventSteps steps; 0 records every step. A long run's events
	// take some 30 bytes per phase, 7 per micro-batch and layer.
	EventSteps int64
	// BeforeStep, when set, runs on this rank before each step's ep calls,
	// with the step's number and the requests the rank holds: for tests and
	// fault injection (stopping the process).
	BeforeStep func(step int64, held int)
}

// reqState is a request being served, on its rank.
type reqState struct {
	req                   Request
	kv                    *kvCache
	out                   []int32
	hash                  uint64
	admitted, first, done int64 // nanoseconds from the start
	dropped               int
}

// stepRec is one rank's record of a step it ran.
type stepRec struct {
	step                           int64
	kind                           stepKind
	rows, emitted, dropped, masked int
	startNS, endNS                 int64
}

// server is one rank's side of serving.
type server[E ep.Element] struct {
	cfg        Config
	opt        Options
	world      *mpi.Comm
	rank, size int
	reqs       []Request
	e          *engine[E]
	ch         *channel
	q          queue
	t0         time.Time
	steps      []stepRec
	finished   []*reqState
}

// Serve serves the workload on every rank of world: rank 0 schedules, and
// every rank runs the decoder on the requests given to it, with the
// routed experts spread over the ranks by ep (see the package doc). It
// returns the run's Result on rank 0 and nil on the others. Collective.
func Serve(world *mpi.Comm, cfg Config, opt Options) (*Result, error) {
	if err := cfg.Validate(world.Size()); err != nil {
		return nil, err
	}
	if err := opt.Workload.Validate(); err != nil {
		return nil, err
	}
	switch cfg.DType {
	case moe.BFloat16:
		return serve[ep.BF16](world, cfg, opt)
	default:
		return serve[float32](world, cfg, opt)
	}
}

func serve[E ep.Element](world *mpi.Comm, cfg Config, opt Options) (_ *Result, err error) {
	s := &server[E]{cfg: cfg, opt: opt, world: world, rank: world.Rank(), size: world.Size()}
	w := opt.Workload
	arrivals := w.Arrivals()
	s.reqs = make([]Request, w.Requests)
	for i := range s.reqs {
		s.reqs[i] = w.Request(i, arrivals, cfg.Model.Vocab)
	}
	var ck *runs.Checkpoint
	if cfg.Checkpoint != "" {
		if ck, err = runs.ReadCheckpoint(cfg.Checkpoint); err != nil {
			return nil, err
		}
	}
	L := cfg.Model.Experts / s.size
	m, err := NewModel(cfg.Model, s.rank*L, L, ck)
	if err != nil {
		return nil, err
	}
	if s.e, err = newEngine[E](world, cfg, m, time.Time{}); err != nil {
		return nil, err
	}
	s.e.eventSteps = opt.EventSteps
	defer func() {
		if cerr := s.e.close(); cerr != nil && err == nil {
			err = cerr
		}
	}()
	if s.ch, err = newChannel(world, cfg.Batch, cfg.MaskStalled, cfg.ControlTimeout); err != nil {
		return nil, err
	}
	defer func() {
		if cerr := s.ch.close(); cerr != nil && err == nil {
			err = cerr
		}
	}()
	// A common start: every rank's clock counts from the end of this barrier.
	if err := world.Barrier(); err != nil {
		return nil, fmt.Errorf("serve: start: %w", err)
	}
	s.t0 = time.Now()
	s.e.t0 = s.t0
	var sc *scheduler
	if s.rank == 0 {
		sc = newScheduler(cfg, s.size, s.reqs, &s.q)
		sc.admit0 = s.admit
		err = s.schedule(sc)
	} else {
		err = s.work()
	}
	if err != nil {
		return nil, err
	}
	return s.gather(sc)
}

func (s *server[E]) now() int64 { return int64(time.Since(s.t0)) }

// admit takes request id.
func (s *server[E]) admit(id int) error {
	if id < 0 || id >= len(s.reqs) {
		return fmt.Errorf("serve: rank 0 gave request %d, of %d", id, len(s.reqs))
	}
	r := s.reqs[id]
	st := &reqState{req: r, kv: newKVCache(s.cfg.Model.Layers), admitted: s.now()}
	s.q.slots = append(s.q.slots, &slot{id: id, prompt: len(r.Prompt), gen: r.Gen, st: st})
	return nil
}

// budget is the rows a rank may run in a step of kind k.
func (s *server[E]) budget(k stepKind) int {
	if k == prefillStep {
		return s.cfg.PrefillTokens
	}
	return s.cfg.Batch
}

// step runs one step as instructed. An error wrapping ep.ErrMasked leaves
// every request as it was before the step.
func (s *server[E]) step(c control) error {
	for _, id := range c.assign {
		if err := s.admit(id); err != nil {
			return err
		}
	}
	if c.rejoin {
		if err := s.e.ll.SetMask(nil); err != nil {
			return fmt.Errorf("serve: step %d: rejoining: %w", c.step, err)
		}
	}
	if s.opt.BeforeStep != nil {
		s.opt.BeforeStep(c.step, len(s.q.slots))
	}
	start := s.now()
	ws := s.q.plan(c.sk, s.budget(c.sk))
	out, err := s.e.run(c.step, c.sk, ws)
	if err != nil {
		H := s.cfg.Model.Hidden
		seen := map[*slot]bool{}
		for _, w := range ws { // the first work of a request starts where its cache stood
			if !seen[w.s] {
				seen[w.s] = true
				w.s.st.kv.truncate(w.from, H)
			}
		}
		return err
	}
	end := s.now()
	rec := stepRec{step: c.step, kind: c.sk, rows: rows(ws), startNS: start, endNS: end, masked: len(s.e.masked())}
	for i, w := range out.works {
		st := w.s.st
		st.dropped += out.dropped[i]
		rec.dropped += out.dropped[i]
		if out.ids[i] >= 0 {
			st.out = append(st.out, out.ids[i])
			st.hash = out.hashes[i]
			rec.emitted++
			if len(st.out) == 1 {
				st.first = end
			}
		}
	}
	for _, f := range s.q.commit(c.sk, out.works) {
		f.st.done = end
		s.finished = append(s.finished, f.st)
	}
	s.steps = append(s.steps, rec)
	return nil
}

// report tells rank 0 that this rank was masked, and where its requests
// stand.
func (s *server[E]) report(acked int64) error {
	b := back{rank: s.rank, acked: acked}
	for _, sl := range s.q.slots {
		b.slots = append(b.slots, *sl)
	}
	return s.ch.sendReport(&b)
}

// work is the loop of the ranks other than 0: take an instruction, run it.
func (s *server[E]) work() error {
	for {
		c, err := s.ch.receive()
		if err != nil {
			return err
		}
		switch c.kind {
		case ctlStop:
			return nil
		case ctlIdle:
		case ctlMasked:
			if err := s.report(c.step); err != nil {
				return err
			}
		case ctlStep:
			err := s.step(c)
			if errors.Is(err, ep.ErrMasked) {
				err = s.report(c.step)
			}
			if err != nil {
				return err
			}
		}
	}
}

// MaskEpisode is a rank masked by the others while serving, and when it
// rejoined.
type MaskEpisode struct {
	Rank int
	// MaskedAt is the step in which rank 0 found the rank masked (or, for
	// rank 0 itself, in which it was), RejoinedAt the step that began with
	// SetMask (0: it did not rejoin).
	MaskedAt, RejoinedAt     int64
	MaskedAtUS, RejoinedAtUS float64 // rank 0's clock, from the start
}

// scheduler is rank 0's view of every rank: the requests each holds (a
// mirror of its queue, planned and committed as the rank itself does), who
// is masked, the requests not yet arrived or given to a rank.
type scheduler struct {
	cfg         Config
	size        int
	reqs        []Request
	arrived     int   // requests whose arrival time has passed
	waiting     []int // arrived, not yet given to a rank
	mirrors     []*queue
	masked      []bool
	lastSent    []int64 // per rank: the last instruction's step
	reports     []*back // per masked rank: its report, once it is back
	step        int64
	kinds       []stepKind // per step
	episodes    []MaskEpisode
	open        []int // per rank: its open episode, -1 none
	admit0      func(id int) error
	rr          int // the rank that assign tries first
	lastContact time.Time
}

func newScheduler(cfg Config, size int, reqs []Request, own *queue) *scheduler {
	sc := &scheduler{cfg: cfg, size: size, reqs: reqs, mirrors: make([]*queue, size), masked: make([]bool, size),
		lastSent: make([]int64, size), reports: make([]*back, size), open: make([]int, size)}
	sc.mirrors[0] = own
	for r := 1; r < size; r++ {
		sc.mirrors[r] = &queue{}
	}
	for r := range sc.open {
		sc.open[r] = -1
	}
	return sc
}

// pending is the number of requests not yet finished.
func (sc *scheduler) pending() int {
	n := len(sc.reqs) - sc.arrived + len(sc.waiting)
	for _, q := range sc.mirrors {
		n += len(q.slots)
	}
	return n
}

func (sc *scheduler) anyMasked() bool { return slices.Contains(sc.masked, true) }

// assign gives the waiting requests, in order of arrival, to the live rank
// holding the fewest, while one has room; among equals, round robin (the
// next after the last one given a request), so that a light load spreads
// over the ranks too.
func (sc *scheduler) assign() ([][]int, error) {
	out := make([][]int, sc.size)
	for len(sc.waiting) > 0 {
		best := -1
		for i := 0; i < sc.size; i++ {
			r := (sc.rr + i) % sc.size
			q := sc.mirrors[r]
			if !sc.masked[r] && len(q.slots) < sc.cfg.Batch && (best < 0 || len(q.slots) < len(sc.mirrors[best].slots)) {
				best = r
			}
		}
		if best < 0 {
			break
		}
		sc.rr = (best + 1) % sc.size
		id := sc.waiting[0]
		sc.waiting = sc.waiting[1:]
		if best == 0 { // rank 0's mirror is its own queue: it admits them now
			if err := sc.admit0(id); err != nil {
				return nil, err
			}
			continue
		}
		out[best] = append(out[best], id)
		r := sc.reqs[id]
		sc.mirrors[best].slots = append(sc.mirrors[best].slots, &slot{id: id, prompt: len(r.Prompt), gen: r.Gen})
	}
	return out, nil
}

// kind chooses the next step: prefill while a live rank has prompt tokens
// not in its cache (prompts first, as SGLang's scheduler does), else
// decode while one has a running request; ok false when no live rank has
// work.
func (sc *scheduler) kind() (stepKind, bool) {
	decode := false
	for r, q := range sc.mirrors {
		if sc.masked[r] {
			continue
		}
		if q.hasPrefill() {
			return prefillStep, true
		}
		decode = decode || q.hasDecode()
	}
	return decodeStep, decode
}

// note tells OnNote.
func (s *server[E]) note(format string, a ...any) {
	if s.opt.OnNote != nil {
		s.opt.OnNote(fmt.Sprintf(format, a...))
	}
}

// learnMasks takes in the ranks rank 0's group has masked and the reports
// of masked ranks that are back, and says whether every masked rank is
// back (so that all can rejoin now).
func (s *server[E]) learnMasks(sc *scheduler) (rejoin bool, err error) {
	if !s.cfg.MaskStalled {
		return false, nil
	}
	nowUS := float64(s.now()) / 1e3
	for _, v := range s.e.masked() {
		if sc.masked[v] {
			continue
		}
		sc.masked[v] = true
		sc.open[v] = len(sc.episodes)
		sc.episodes = append(sc.episodes, MaskEpisode{Rank: v, MaskedAt: sc.step, MaskedAtUS: nowUS})
		sc.lastSent[v] = sc.step
		s.note("rank %d masked in step %d: it did not arrive within %v; serving goes on without it", v, sc.step, s.cfg.Timeout)
		if err := s.ch.send(v, &control{kind: ctlMasked, step: sc.step}); err != nil {
			return false, err
		}
	}
	reps, err := s.ch.reports()
	if err != nil {
		return false, err
	}
	for _, b := range reps {
		if b.rank > 0 && b.rank < sc.size && sc.masked[b.rank] && b.acked >= sc.lastSent[b.rank] {
			sc.reports[b.rank] = &b
		}
	}
	if !sc.anyMasked() {
		return false, nil
	}
	for r, m := range sc.masked {
		if m && r != 0 && sc.reports[r] == nil {
			return false, nil
		}
	}
	// Every masked rank is back: they rejoin in the next step, rank 0's
	// mirrors of them as they report.
	for r, m := range sc.masked {
		if !m {
			continue
		}
		if r != 0 {
			q := &queue{}
			for _, sl := range sc.reports[r].slots {
				if sl.id < 0 || sl.id >= len(sc.reqs) {
					return false, fmt.Errorf("serve: rank %d reports request %d, of %d", r, sl.id, len(sc.reqs))
				}
				req := sc.reqs[sl.id]
				q.slots = append(q.slots, &slot{id: sl.id, prompt: len(req.Prompt), gen: req.Gen, prefilled: sl.prefilled, generated: sl.generated})
			}
			sc.mirrors[r] = q
			sc.reports[r] = nil
		}
		sc.masked[r] = false
		if i := sc.open[r]; i >= 0 {
			sc.episodes[i].RejoinedAt, sc.episodes[i].RejoinedAtUS = sc.step+1, nowUS
			sc.open[r] = -1
		}
		s.note("rank %d is back: it rejoins (SetMask) in step %d", r, sc.step+1)
	}
	return true, nil
}

// schedule is rank 0's loop: learn of masked ranks and arrivals, give
// requests to ranks, choose the step, tell every live rank, run it.
func (s *server[E]) schedule(sc *scheduler) error {
	sc.lastContact = time.Now()
	var idleSince time.Time
	for {
		rejoin, err := s.learnMasks(sc)
		if err != nil {
			return err
		}
		now := time.Duration(s.now())
		for sc.arrived < len(sc.reqs) && sc.reqs[sc.arrived].Arrival <= now {
			sc.waiting = append(sc.waiting, sc.arrived)
			sc.arrived++
		}
		var assigned [][]int
		kind, ok := decodeStep, false
		if !sc.masked[0] || rejoin {
			if assigned, err = sc.assign(); err != nil {
				return err
			}
			kind, ok = sc.kind()
		}
		if !ok && !rejoin {
			// Nothing to run now: no live rank has work (requests given
			// have prompts to run, so none were given), or rank 0 itself
			// is masked and waits for the others masked with it.
			if !sc.masked[0] && sc.pending() == 0 && !sc.anyMasked() {
				return s.stop(sc)
			}
			if idleSince.IsZero() {
				idleSince = time.Now()
			}
			if sc.anyMasked() && time.Since(idleSince) > s.cfg.ControlTimeout {
				var who []int
				for r, m := range sc.masked {
					if m {
						who = append(who, r)
					}
				}
				return fmt.Errorf("serve: masked rank(s) %v did not come back within %v, and %d request(s) are not served", who, s.cfg.ControlTimeout, sc.pending())
			}
			s.idle(sc)
			if err := s.heartbeat(sc); err != nil {
				return err
			}
			continue
		}
		idleSince = time.Time{}
		sc.step++
		sc.kinds = append(sc.kinds, kind)
		for r := 1; r < sc.size; r++ {
			if sc.masked[r] {
				continue
			}
			c := control{kind: ctlStep, step: sc.step, sk: kind, rejoin: rejoin, assign: assigned[r]}
			if err := s.ch.send(r, &c); err != nil {
				return err
			}
			sc.lastSent[r] = sc.step
			sc.mirrors[r].commit(kind, sc.mirrors[r].plan(kind, s.budget(kind)))
		}
		sc.lastContact = time.Now()
		err = s.step(control{kind: ctlStep, step: sc.step, sk: kind, rejoin: rejoin, assign: assigned[0]})
		if errors.Is(err, ep.ErrMasked) {
			// The others went on without rank 0 in this step: it rejoins
			// them, its requests as they were, in the next.
			sc.masked[0] = true
			sc.open[0] = len(sc.episodes)
			sc.episodes = append(sc.episodes, MaskEpisode{Rank: 0, MaskedAt: sc.step, MaskedAtUS: float64(s.now()) / 1e3})
			s.note("rank 0 was masked by the others in step %d", sc.step)
			continue
		}
		if err != nil {
			return err
		}
	}
}

// idle waits a little for arrivals or reports.
func (s *server[E]) idle(sc *scheduler) {
	wait := time.Millisecond
	if sc.arrived < len(sc.reqs) {
		wait = min(wait, max(0, sc.reqs[sc.arrived].Arrival-time.Duration(s.now())))
	}
	time.Sleep(wait)
}

// heartbeat tells the live ranks, every so often while nothing runs, that
// there is nothing to do, so that they know rank 0 lives.
func (s *server[E]) heartbeat(sc *scheduler) error {
	if time.Since(sc.lastContact) < min(time.Second, s.cfg.ControlTimeout/4) {
		return nil
	}
	for r := 1; r < sc.size; r++ {
		if !sc.masked[r] {
			if err := s.ch.send(r, &control{kind: ctlIdle, step: sc.step}); err != nil {
				return err
			}
		}
	}
	sc.lastContact = time.Now()
	return nil
}

// stop ends serving on every rank.
func (s *server[E]) stop(sc *scheduler) error {
	for r := 1; r < sc.size; r++ {
		if err := s.ch.send(r, &control{kind: ctlStop, step: sc.step}); err != nil {
			return err
		}
	}
	return nil
}

// nan is a NaN for the trace's missing values.
var nan = math.NaN()
