package epcpu

import (
	"time"

	"github.com/goep/goep/ep/driver"
)

// timeline is an engine's record of spans; nil when off.
type timeline struct {
	spans []driver.Span
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
	t.tl.spans = append(t.tl.spans, driver.Span{Op: q, What: what, Peer: peer, Bytes: bytes, Start: start, End: time.Now()})
}

// RecordTimeline keeps the spans of the next calls (driver.Timeliner).
func (e *engine) RecordTimeline(n int) {
	if n <= 0 {
		e.t.tl = nil
		return
	}
	e.t.tl = &timeline{spans: make([]driver.Span, 0, n), limit: n}
}

// Timeline is what was recorded (driver.Timeliner).
func (e *engine) Timeline() []driver.Span {
	if e.t.tl == nil {
		return nil
	}
	return e.t.tl.spans
}
