package ep

import (
	"fmt"
	"io"
	"time"
)

// Span is one step of a call on this rank, as its engine timed it: what the
// step did, the peer it concerned (-1: none in particular), the bytes it
// moved, and when it started and ended. A timeline is the spans of the
// calls made while it was on, in the order the steps ended.
type Span struct {
	Op         uint64    // the call's sequence number
	What       string    // the step: "counts", "pack node 1", "wait staged", "forward", ...
	Peer       int       // the rank the step concerns, or -1
	Bytes      int64     // the bytes it moved, where it moves any
	Start, End time.Time // when the step started and ended
}

// A Timeliner is an Engine that can record the timeline of its calls (the
// CPU engine does): Group.RecordTimeline turns it on.
type Timeliner interface {
	// RecordTimeline keeps the spans of the next calls, at most n of them
	// (0: stops recording and drops them).
	RecordTimeline(n int)
	// Timeline is what was recorded (the engine's storage: copy it to keep
	// it past the next call).
	Timeline() []Span
}

// RecordTimeline makes the engine record the steps of the calls to come,
// at most n spans, where it can (ep.Timeliner: the CPU engine); n = 0 stops
// and drops what was recorded. It is not collective, and costs a clock read
// per step while on. It reports whether the engine records timelines.
func (g *Group[E]) RecordTimeline(n int) bool {
	t, ok := g.eng.(Timeliner)
	if ok {
		t.RecordTimeline(n)
	}
	return ok
}

// Timeline is what this rank's engine recorded since RecordTimeline (a
// copy), nil where the engine records none.
func (g *Group[E]) Timeline() []Span {
	t, ok := g.eng.(Timeliner)
	if !ok {
		return nil
	}
	return append([]Span(nil), t.Timeline()...)
}

// WriteTimeline writes spans as a table, times in milliseconds from t0.
func WriteTimeline(w io.Writer, spans []Span, t0 time.Time) error {
	for _, s := range spans {
		peer := ""
		if s.Peer >= 0 {
			peer = fmt.Sprintf("rank %d", s.Peer)
		}
		mb := ""
		if s.Bytes > 0 {
			mb = fmt.Sprintf("%.1f MB", float64(s.Bytes)/1e6)
		}
		ms := func(t time.Time) float64 { return float64(t.Sub(t0).Microseconds()) / 1e3 }
		if _, err := fmt.Fprintf(w, "  %5d %9.2f %9.2f %8.2f  %-28s %-8s %s\n", s.Op, ms(s.Start), ms(s.End),
			ms(s.End)-ms(s.Start), s.What, peer, mb); err != nil {
			return err
		}
	}
	return nil
}

// timeline is an engine's record of spans; nil when off.
type timeline struct {
	spans []Span
	limit int
}

// clock is the time now when the timeline is on, and the zero time
// otherwise (no clock read).
func (t *transport) clock() time.Time {
	if t.tl == nil {
		return time.Time{}
	}
	return time.Now()
}

// span records a step of call q that started at start (from clock) and
// ends now.
func (t *transport) span(q uint64, what string, peer int, bytes int64, start time.Time) {
	if t.tl == nil || len(t.tl.spans) >= t.tl.limit {
		return
	}
	t.tl.spans = append(t.tl.spans, Span{Op: q, What: what, Peer: peer, Bytes: bytes, Start: start, End: time.Now()})
}

// RecordTimeline keeps the spans of the next calls (ep.Timeliner).
func (e *engine) RecordTimeline(n int) {
	if n <= 0 {
		e.t.tl = nil
		return
	}
	e.t.tl = &timeline{spans: make([]Span, 0, n), limit: n}
}

// Timeline is what was recorded (ep.Timeliner).
func (e *engine) Timeline() []Span {
	if e.t.tl == nil {
		return nil
	}
	return e.t.tl.spans
}
