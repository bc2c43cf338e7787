package ep

import "fmt"

// Masked lists the ranks this rank has masked (Config.MaskStalledRanks):
// ranks that did not arrive within the timeout, which calls now go on
// without. Not collective.
func (g *Group[E]) Masked() []int {
	m, ok := g.eng.(Masker)
	if !ok {
		return nil
	}
	var out []int
	for r, masked := range m.Masked() {
		if masked {
			out = append(out, r)
		}
	}
	return out
}

// SetMask makes ranks the group's mask: the ranks masked from now on
// (others back in). It is collective over the ranks that take part (every
// rank not in ranks), which must all pass the same list; a rank that was
// masked and came back calls it with them to rejoin (its calls return
// ErrMasked until then). The calls are renumbered on every taking part rank
// and every handle made before is stale. A rank that was masked in an
// earlier SetMask cannot rejoin: it needs a new group.
func (g *Group[E]) SetMask(ranks []int) error {
	const op = "SetMask"
	if g == nil || g.closed {
		return fmt.Errorf("ep: %s: %w", op, ErrClosed)
	}
	if g.broken != nil {
		return fmt.Errorf("ep: %s: the group is unusable after an earlier failure: %w", op, g.broken)
	}
	m, ok := g.eng.(Masker)
	if !ok || !g.spec.MaskStalledRanks {
		return inputErrorf(op, "the group does not mask stalled ranks (Config.MaskStalledRanks)")
	}
	mask := make([]bool, g.size)
	for _, r := range ranks {
		if r < 0 || r >= g.size {
			return inputErrorf(op, "rank %d out of range [0, %d)", r, g.size)
		}
		mask[r] = true
	}
	if mask[g.rank] {
		return inputErrorf(op, "rank %d masks itself: only the ranks that take part call SetMask", g.rank)
	}
	calls, dispatches, err := m.SetMask(mask, g.op, g.dispatches)
	if err != nil {
		return g.engineError(err)
	}
	g.op, g.dispatches = calls, dispatches
	for _, s := range g.states { // every earlier handle is stale: no buffer set is waiting
		if s != nil {
			g.gen++
			s.gen = g.gen
			s.sent, s.ready, s.done, s.inComb = false, false, false, false
		}
	}
	g.pending = [2]*handleState[E]{}
	g.maskedOut = nil
	return nil
}

// Dropped lists the (token, slot) pairs of this dispatch, as t*TopK+k, in
// increasing order, that contribute nothing to the combine: whose expert
// was on a masked rank, not sent or not combined (Config.MaskStalledRanks),
// or whose row did not fit at its expert's rank (Config.Overflow
// OverflowDrop). Not collective.
func (h Handle[E]) Dropped() []int32 {
	if !h.valid() {
		return nil
	}
	return h.s.d.Recv.Dropped
}
