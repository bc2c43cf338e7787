package mpi_test

import (
	"encoding/binary"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goep/goep/internal/mpitesting"
	"github.com/goep/goep/mpi"
)

// waitWord polls the mailbox until the 8-byte word at off holds want.
func waitWord(t *testing.T, m *mpi.Mailbox, off int, want uint64) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for binary.LittleEndian.Uint64(m.Local()[off:]) != want {
		require.NoError(t, m.Progress())
		require.False(t, time.Now().After(deadline), "word at %d never became %d", off, want)
	}
}

// Every rank writes a block into every rank's mailbox (itself included), in
// two puts that overwrite each other's bytes, then raises a flag in a third:
// when a flag is seen, the data before it is there, and the later put won.
func TestMailboxDataBeforeFlag(t *testing.T) {
	w := mpitesting.World
	n, me := w.Size(), w.Rank()
	const block = 40                                     // not a multiple of 8: records are padded
	size := func(r int) int { return 8*n + block*n + r } // ranks pass different sizes
	m, err := w.NewMailbox(size(me))
	require.NoError(t, err)
	require.Len(t, m.Local(), size(me))
	data, second := make([]byte, block*n), make([]byte, block*n)
	var first, flags []mpi.Block
	for d := 0; d < n; d++ {
		for i := 0; i < block; i++ {
			data[d*block+i] = byte(7*me + 3*d + i)
			second[d*block+i] = byte(11*me + 5*d + i + 1)
		}
		first = append(first, mpi.Block{SrcOffset: d * block, Len: block, Target: d, DstOffset: 8*n + block*me})
		flags = append(flags, mpi.Block{Len: 8, Target: d, DstOffset: 8 * me})
	}
	require.NoError(t, m.PutBlocks(data, first))
	clear(data) // the origin is free at once
	require.NoError(t, m.PutBlocks(second, first[:len(first):len(first)]))
	word := make([]byte, 8)
	binary.LittleEndian.PutUint64(word, uint64(100+me))
	require.NoError(t, m.PutBlocks(word, flags))
	for s := 0; s < n; s++ {
		waitWord(t, m, 8*s, uint64(100+s))
		got := m.Local()[8*n+block*s : 8*n+block*(s+1)]
		for i, b := range got {
			require.Equal(t, byte(11*s+5*me+i+1), b, "byte %d from rank %d", i, s)
		}
	}
	require.NoError(t, w.Barrier())
	require.NoError(t, m.Free())
	mpitesting.Agree(t, w)
}

// A message larger than any eager limit (MPI's rendezvous) lands whole.
func TestMailboxLargeMessage(t *testing.T) {
	w := mpitesting.World
	n, me := w.Size(), w.Rank()
	const big = 4 << 20
	m, err := w.NewMailbox(8 + big)
	require.NoError(t, err)
	next, prev := (me+1)%n, (me+n-1)%n
	src := make([]byte, big+8)
	for i := 0; i < big; i++ {
		src[i] = byte(i*31 + me)
	}
	binary.LittleEndian.PutUint64(src[big:], 1)
	require.NoError(t, m.PutBlocks(src, []mpi.Block{
		{SrcOffset: 0, Len: big, Target: next, DstOffset: 8},
		{SrcOffset: big, Len: 8, Target: next, DstOffset: 0},
	}))
	waitWord(t, m, 0, 1)
	got := m.Local()[8:]
	for i := 0; i < big; i++ {
		if got[i] != byte(i*31+prev) {
			require.Equal(t, byte(i*31+prev), got[i], "byte %d from rank %d", i, prev)
		}
	}
	require.NoError(t, w.Barrier())
	require.NoError(t, m.Free())
	mpitesting.Agree(t, w)
}

// Messages whose sizes change from call to call, from every rank at once,
// land whole: the receiver takes each message's buffer from those the
// earlier messages of any source gave back (and the sender its packing
// buffer), so a buffer given back too early, or one too small, would show
// here as a wrong byte. Each round every rank sends every rank one block of a
// size that changes with the round and the pair, then a flag.
func TestMailboxSizesChange(t *testing.T) {
	w := mpitesting.World
	n, me := w.Size(), w.Rank()
	sizes := []int{24, 300 << 10, 2<<20 + 8, 70 << 10}
	const most = 2<<20 + 8
	area := func(s int) int { return 8*n + s*most }
	m, err := w.NewMailbox(area(n))
	require.NoError(t, err)
	size := func(k, s, d int) int { return sizes[(k+s+d)%len(sizes)] }
	val := func(k, s, d, i int) byte { return byte(k*17 + s*5 + d*3 + i) }
	src := make([]byte, most)
	word := make([]byte, 8)
	for k := 1; k <= 3*len(sizes); k++ {
		for d := 0; d < n; d++ {
			for i := 0; i < size(k, me, d); i++ {
				src[i] = val(k, me, d, i)
			}
			require.NoError(t, m.PutBlocks(src, []mpi.Block{{Len: size(k, me, d), Target: d, DstOffset: area(me)}}))
		}
		binary.LittleEndian.PutUint64(word, uint64(k))
		for d := 0; d < n; d++ {
			require.NoError(t, m.PutBlocks(word, []mpi.Block{{Len: 8, Target: d, DstOffset: 8 * me}}))
		}
		for s := 0; s < n; s++ {
			waitWord(t, m, 8*s, uint64(k))
			got := m.Local()[area(s) : area(s)+size(k, s, me)]
			for i := range got {
				if got[i] != val(k, s, me, i) {
					require.Equal(t, val(k, s, me, i), got[i], "round %d: byte %d of %d from rank %d", k, i, len(got), s)
				}
			}
		}
		require.NoError(t, w.Barrier()) // every rank has read this round's blocks before the next one's land
	}
	require.NoError(t, m.Free())
	mpitesting.Agree(t, w)
}

func TestMailboxBadInput(t *testing.T) {
	w := mpitesting.World
	n := w.Size()
	m, err := w.NewMailbox(64)
	require.NoError(t, err)
	src := make([]byte, 16)
	for _, tc := range []struct {
		name  string
		block mpi.Block
		want  string
	}{
		{"target beyond the communicator", mpi.Block{Len: 8, Target: n}, "target"},
		{"negative target", mpi.Block{Len: 8, Target: -1}, "target"},
		{"beyond the target's mailbox", mpi.Block{Len: 8, DstOffset: 60}, "[60, 68) lie beyond rank 0's mailbox of 64 bytes"},
		{"negative offset", mpi.Block{Len: 8, DstOffset: -8}, "offset -8"},
		{"beyond the origin", mpi.Block{SrcOffset: 12, Len: 8}, "origin[12:20]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := m.PutBlocks(src, []mpi.Block{tc.block})
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
	_, err = w.NewMailbox(-1)
	assert.ErrorContains(t, err, "size -1")
	require.NoError(t, m.Free())
	assert.ErrorContains(t, m.PutBlocks(src, []mpi.Block{{Len: 8}}), "freed")
	assert.ErrorContains(t, m.Progress(), "freed")
	mpitesting.Agree(t, w)
}

// Blocks sent in place (large ones straight from the origin, as messages of
// their own, received straight into the target's memory) keep the order of
// writes: from every rank to every other, a large block, a small one over
// its tail, a second large one over its head, then a flag; the flag's rank
// sees the data as the later writes left it. The origin is a Buffer (outside
// the Go heap), untouched until InPlaceSent says its sends have left.
func TestMailboxInPlaceOrder(t *testing.T) {
	w := mpitesting.World
	n, me := w.Size(), w.Rank()
	big := mpi.DirectMin + 4096 + 24 // not a multiple of a page or of 8
	area := func(s int) int { return 8*n + s*big }
	m, err := w.NewMailbox(area(n))
	require.NoError(t, err)
	origin, err := mpi.NewBuffer(3*big + 8)
	require.NoError(t, err)
	src := origin.Bytes()
	for i := 0; i < 3*big; i++ {
		src[i] = byte(i*7 + me*13)
	}
	binary.LittleEndian.PutUint64(src[3*big:], uint64(500+me))
	var blocks []mpi.Block
	for d := 0; d < n; d++ {
		if d == me {
			continue
		}
		blocks = append(blocks,
			mpi.Block{SrcOffset: 0, Len: big, Target: d, DstOffset: area(me)},                 // big, direct
			mpi.Block{SrcOffset: big, Len: 100, Target: d, DstOffset: area(me) + big - 100},   // small, over the tail
			mpi.Block{SrcOffset: 2 * big, Len: mpi.DirectMin, Target: d, DstOffset: area(me)}, // direct again, over the head
			mpi.Block{SrcOffset: 3 * big, Len: 8, Target: d, DstOffset: 8 * me})               // the flag
	}
	put, err := m.PutBlocksInPlace(src, blocks)
	require.NoError(t, err)
	for s := 0; s < n; s++ {
		if s == me {
			continue
		}
		waitWord(t, m, 8*s, uint64(500+s))
		got := m.Local()[area(s) : area(s)+big]
		want := func(i int) byte { // what rank s wrote at byte i of its area here
			switch {
			case i < mpi.DirectMin:
				return byte((2*big+i)*7 + s*13)
			case i >= big-100:
				return byte((big+i-(big-100))*7 + s*13)
			}
			return byte(i*7 + s*13)
		}
		for i := range got {
			if got[i] != want(i) {
				require.Equal(t, want(i), got[i], "byte %d from rank %d", i, s)
			}
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		sent, to := m.InPlaceSent(put)
		if sent {
			break
		}
		require.NotEqual(t, me, to, "a send to this rank itself")
		require.NoError(t, m.Progress())
		require.False(t, time.Now().After(deadline), "a send to rank %d never completed", to)
	}
	require.NoError(t, w.Barrier())
	require.NoError(t, m.Free())
	require.NoError(t, origin.Free())
	mpitesting.Agree(t, w)
}

// A mailbox over attached memory: every rank writes a small block and a
// large (in place) one past the mailbox's own bytes, into the other's
// attached memory, then a flag into its own; the flag's rank finds both in
// the attached memory, and writes beyond it are refused.
func TestMailboxAttached(t *testing.T) {
	w := mpitesting.World
	n, me := w.Size(), w.Rank()
	const own = 8 * 64
	big := mpi.DirectMin + 40
	ext, err := mpi.NewBuffer(n * (big + 64))
	require.NoError(t, err)
	m, err := w.NewMailboxAttached(own, ext.Bytes())
	require.NoError(t, err)
	origin, err := mpi.NewBuffer(big + 64 + 8)
	require.NoError(t, err)
	src := origin.Bytes()
	for i := range src {
		src[i] = byte(i*5 + me)
	}
	binary.LittleEndian.PutUint64(src[big+64:], uint64(900+me))
	var blocks []mpi.Block
	for d := 0; d < n; d++ {
		if d == me {
			continue
		}
		at := own + me*(big+64) // this rank's part of d's attached memory
		blocks = append(blocks,
			mpi.Block{SrcOffset: 0, Len: big, Target: d, DstOffset: at},
			mpi.Block{SrcOffset: big, Len: 64, Target: d, DstOffset: at + big},
			mpi.Block{SrcOffset: big + 64, Len: 8, Target: d, DstOffset: 8 * me})
	}
	put, err := m.PutBlocksInPlace(src, blocks)
	require.NoError(t, err)
	for s := 0; s < n; s++ {
		if s == me {
			continue
		}
		waitWord(t, m, 8*s, uint64(900+s))
		got := ext.Bytes()[s*(big+64) : (s+1)*(big+64)]
		for i := range got {
			if got[i] != byte(i*5+s) {
				require.Equal(t, byte(i*5+s), got[i], "byte %d from rank %d", i, s)
			}
		}
	}
	for {
		if sent, _ := m.InPlaceSent(put); sent {
			break
		}
		require.NoError(t, m.Progress())
	}
	if n > 1 {
		err := m.PutBlocks(src, []mpi.Block{{Len: 8, Target: (me + 1) % n, DstOffset: own + n*(big+64) - 4}})
		assert.ErrorContains(t, err, "beyond rank")
	}
	require.NoError(t, w.Barrier())
	require.NoError(t, m.Free())
	require.NoError(t, origin.Free())
	require.NoError(t, ext.Free())
	mpitesting.Agree(t, w)
}
