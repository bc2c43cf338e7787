package ep

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
