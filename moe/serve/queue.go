package serve

// stepKind is what a step runs: the prompts of newly arrived requests, or
// one token of every request past its prompt.
type stepKind int

const (
	decodeStep stepKind = iota
	prefillStep
)

func (k stepKind) String() string {
	if k == prefillStep {
		return "prefill"
	}
	return "decode"
}

// slot is one request that a rank holds, as far as scheduling goes. Rank 0
// keeps a mirror of every rank's slots (the same type, st nil), and runs
// the same plan and commit on it, so that it knows, without being told,
// what each rank will do in a step.
type slot struct {
	id        int
	prompt    int // prompt tokens
	gen       int // tokens to generate
	prefilled int // prompt tokens in the cache
	generated int
	st        *reqState // the request's state, on the rank that serves it
}

func (s *slot) done() bool { return s.generated >= s.gen }

// running reports a request past its prompt with tokens left to generate.
func (s *slot) running() bool { return s.prefilled == s.prompt && !s.done() }

// work is one request's rows in a step: positions from..from+n-1 of its
// sequence; emits says its last row gives the request's next token.
type work struct {
	s     *slot
	from  int
	n     int
	emits bool
}

// queue is the requests a rank holds, in the order they were given to it.
type queue struct{ slots []*slot }

func (q *queue) hasPrefill() bool {
	for _, s := range q.slots {
		if s.prefilled < s.prompt {
			return true
		}
	}
	return false
}

func (q *queue) hasDecode() bool {
	for _, s := range q.slots {
		if s.running() {
			return true
		}
	}
	return false
}

// plan is the rank's work in a step of kind k: in a decode step one row for
// every running request (its last token, at position prompt+generated-1);
// in a prefill step the next prompt tokens of the requests whose prompts
// are not all in the cache, in order, at most budget rows in all (a prompt
// may take several steps). The rows a plan's works give, in order, are the
// step's rows.
func (q *queue) plan(k stepKind, budget int) []work {
	var out []work
	for _, s := range q.slots {
		switch {
		case k == decodeStep && s.running():
			out = append(out, work{s: s, from: s.prompt + s.generated - 1, n: 1, emits: true})
		case k == prefillStep && s.prefilled < s.prompt && budget > 0:
			n := min(s.prompt-s.prefilled, budget)
			budget -= n
			out = append(out, work{s: s, from: s.prefilled, n: n, emits: s.prefilled+n == s.prompt})
		}
	}
	return out
}

// commit advances the requests of a plan that ran, and returns the slots
// that finished, removed from the queue.
func (q *queue) commit(k stepKind, ws []work) (finished []*slot) {
	for _, w := range ws {
		if k == prefillStep {
			w.s.prefilled += w.n
		}
		if w.emits {
			w.s.generated++
		}
	}
	kept := q.slots[:0]
	for _, s := range q.slots {
		if s.done() {
			finished = append(finished, s)
		} else {
			kept = append(kept, s)
		}
	}
	clear(q.slots[len(kept):])
	q.slots = kept
	return finished
}

// rows is the number of rows of a plan.
func rows(ws []work) int {
	n := 0
	for _, w := range ws {
		n += w.n
	}
	return n
}

// split cuts a plan into two micro-batches of (nearly) half the rows each,
// the first holding the earlier rows: a prompt may be cut in two, its
// first positions in the first micro-batch (whose attention runs first in
// every layer, so the second's rows find their keys and values).
func split(ws []work) (a, b []work) {
	left := (rows(ws) + 1) / 2
	for i, w := range ws {
		switch {
		case left == 0:
			return ws[:i:i], ws[i:]
		case w.n > left:
			first, second := w, w
			first.n, first.emits = left, false
			second.from, second.n = w.from+left, w.n-left
			a = append(append([]work(nil), ws[:i]...), first)
			b = append([]work{second}, ws[i+1:]...)
			return a, b
		}
		left -= w.n
	}
	return ws, nil
}
