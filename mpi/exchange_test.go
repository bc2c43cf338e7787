package mpi_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goep/goep/internal/mpitesting"
	"github.com/goep/goep/mpi"
)

// waitExchange polls x until it completes, for at most d.
func waitExchange(t *testing.T, x *mpi.Exchange, d time.Duration) error {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		done, err := x.Test()
		if err != nil || done {
			return err
		}
		if time.Now().After(deadline) {
			t.Fatalf("the exchange did not complete in %v; pending %v", d, x.Pending())
		}
		time.Sleep(20 * time.Microsecond)
	}
}

// Every rank sends to every other rank three messages of sizes that depend
// on the pair (one empty), posted in one Exchange with the receives; each
// arrives in posting order with the sender's bytes.
func TestExchangeAllPairs(t *testing.T) {
	w := mpitesting.World
	defer mpitesting.Agree(t, w)
	R, me := w.Size(), w.Rank()
	size := func(src, dst, k int) int { return []int{(src*7+dst*3)%40 + 1, 0, 1000 + src + dst}[k] }
	total := 0
	for p := 0; p < R; p++ {
		for k := 0; k < 3; k++ {
			total += size(me, p, k) + size(p, me, k)
		}
	}
	buf, err := mpi.NewBuffer(total + 1)
	require.NoError(t, err)
	defer buf.Free()
	var sends, recvs []mpi.Message
	type span struct{ off, n, src, k int }
	var expect []span
	off := 0
	for p := 0; p < R; p++ {
		if p == me {
			continue
		}
		for k := 0; k < 3; k++ {
			n := size(me, p, k)
			for i := 0; i < n; i++ {
				buf.Bytes()[off+i] = pattern(me, p, i+k)
			}
			sends = append(sends, mpi.Message{Peer: p, Addr: buf.Addr(off), Bytes: n})
			off += n
			n = size(p, me, k)
			recvs = append(recvs, mpi.Message{Peer: p, Addr: buf.Addr(off), Bytes: n})
			expect = append(expect, span{off, n, p, k})
			off += n
		}
	}
	x, err := w.Exchange(sends, recvs)
	require.NoError(t, err)
	require.NoError(t, waitExchange(t, x, 30*time.Second))
	assert.Empty(t, x.Pending())
	for _, e := range expect {
		for i := 0; i < e.n; i++ {
			if got := buf.Bytes()[e.off+i]; got != pattern(e.src, me, i+e.k) {
				t.Fatalf("message %d from rank %d: byte %d = %d, want %d", e.k, e.src, i, got, pattern(e.src, me, i+e.k))
			}
		}
	}
}

// A receive posted for more bytes than its sender sends is an error that
// names the peer and both sizes.
func TestExchangeSizeMismatch(t *testing.T) {
	w := mpitesting.World
	if w.Size() < 2 {
		t.Skip("needs two ranks: run under mpirun")
	}
	defer mpitesting.Agree(t, w)
	buf, err := mpi.NewBuffer(64)
	require.NoError(t, err)
	defer buf.Free()
	var x *mpi.Exchange
	switch w.Rank() {
	case 0:
		x, err = w.Exchange([]mpi.Message{{Peer: 1, Addr: buf.Addr(0), Bytes: 8}}, nil)
	case 1:
		x, err = w.Exchange(nil, []mpi.Message{{Peer: 0, Addr: buf.Addr(0), Bytes: 16}})
	default:
		x, err = w.Exchange(nil, nil)
	}
	require.NoError(t, err)
	err = waitExchange(t, x, 30*time.Second)
	if w.Rank() == 1 {
		assert.ErrorContains(t, err, "the message from rank 0 has 8 bytes, 16 were posted for it")
	} else {
		assert.NoError(t, err)
	}
	require.NoError(t, w.Barrier())
}

// A peer that never sends leaves the receive pending, naming it; Cancel
// abandons it, and the communicator stays usable.
func TestExchangeCancelPendingReceive(t *testing.T) {
	w := mpitesting.World
	if w.Size() < 2 {
		t.Skip("needs two ranks: run under mpirun")
	}
	defer mpitesting.Agree(t, w)
	buf, err := mpi.NewBuffer(64)
	require.NoError(t, err)
	defer buf.Free()
	last := w.Size() - 1
	if w.Rank() == 0 {
		x, err := w.Exchange(nil, []mpi.Message{{Peer: last, Addr: buf.Addr(0), Bytes: 32}})
		require.NoError(t, err)
		time.Sleep(50 * time.Millisecond)
		done, err := x.Test()
		require.NoError(t, err)
		assert.False(t, done)
		assert.Equal(t, []int{last}, x.Pending())
		assert.False(t, x.Cancel(), "no send was left")
		_, err = x.Test()
		assert.ErrorContains(t, err, "cancelled")
	}
	require.NoError(t, w.Barrier())
}

func TestExchangeRefusesBadMessages(t *testing.T) {
	w := mpitesting.World
	buf, err := mpi.NewBuffer(16)
	require.NoError(t, err)
	defer buf.Free()
	for _, c := range []struct {
		sends, recvs []mpi.Message
		want         string
	}{
		{[]mpi.Message{{Peer: w.Size(), Addr: buf.Addr(0), Bytes: 1}}, nil, "send 0: peer"},
		{nil, []mpi.Message{{Peer: -1, Addr: buf.Addr(0), Bytes: 1}}, "receive 0: peer -1 out of range"},
		{nil, []mpi.Message{{Peer: w.Rank(), Addr: buf.Addr(0), Bytes: 1}}, "is this rank"},
		{[]mpi.Message{{Peer: (w.Rank() + 1) % w.Size(), Addr: 0, Bytes: 4}}, nil, "at address 0"},
		{[]mpi.Message{{Peer: (w.Rank() + 1) % w.Size(), Addr: buf.Addr(0), Bytes: -4}}, nil, "-4 bytes"},
	} {
		if w.Size() == 1 && c.want == "at address 0" || w.Size() == 1 && c.want == "-4 bytes" {
			continue // the only peer is this rank, refused first
		}
		_, err := w.Exchange(c.sends, c.recvs)
		assert.ErrorContains(t, err, c.want)
	}
	x, err := w.Exchange(nil, nil)
	require.NoError(t, err)
	done, err := x.Test()
	assert.True(t, done)
	assert.NoError(t, err)
	assert.Zero(t, buf.Addr(16), "an address past the end")
	require.NoError(t, buf.Free())
	assert.Nil(t, buf.Bytes())
}
