package driver

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
