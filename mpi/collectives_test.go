package mpi_test

import (
	"errors"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goep/goep/internal/mpitesting"
	"github.com/goep/goep/internal/race"
	"github.com/goep/goep/mpi"
)

// Every expectation below is a formula each rank evaluates for itself.

func pattern(src, dst, i int) byte { return byte(src*37 + dst*11 + i*3 + 1) }

func TestWorldMatchesLauncher(t *testing.T) {
	w := mpitesting.World
	require.GreaterOrEqual(t, w.Rank(), 0)
	require.Less(t, w.Rank(), w.Size())
	if s := os.Getenv("OMPI_COMM_WORLD_SIZE"); s != "" {
		n, _ := strconv.Atoi(s)
		assert.Equal(t, n, w.Size(), "world size against mpirun's OMPI_COMM_WORLD_SIZE")
		r, _ := strconv.Atoi(os.Getenv("OMPI_COMM_WORLD_RANK"))
		assert.Equal(t, r, w.Rank(), "world rank against OMPI_COMM_WORLD_RANK")
	}
	if mpi.Built {
		assert.Equal(t, mpi.ThreadMultiple, mpi.ThreadLevel(), "Open MPI should provide MPI_THREAD_MULTIPLE")
	}
	mpitesting.Agree(t, w)
}

func TestBcastFromEveryRoot(t *testing.T) {
	w := mpitesting.World
	for root := 0; root < w.Size(); root++ {
		buf := make([]byte, 1000)
		if w.Rank() == root {
			for i := range buf {
				buf[i] = pattern(root, 0, i)
			}
		}
		require.NoError(t, w.Bcast(buf, root))
		for i := range buf {
			if buf[i] != pattern(root, 0, i) {
				t.Fatalf("root %d: byte %d = %d, want %d", root, i, buf[i], pattern(root, 0, i))
			}
		}
		f := make([]float64, 17)
		if w.Rank() == root {
			for i := range f {
				f[i] = float64(root) + float64(i)/8
			}
		}
		require.NoError(t, mpi.BcastSlice(w, f, root))
		for i := range f {
			require.Equal(t, float64(root)+float64(i)/8, f[i])
		}
	}
	mpitesting.Agree(t, w)
}

func TestAllgather(t *testing.T) {
	w := mpitesting.World
	n := 33
	send := make([]int32, n)
	for i := range send {
		send[i] = int32(w.Rank()*1000 + i)
	}
	recv := make([]int32, n*w.Size())
	require.NoError(t, mpi.AllgatherSlice(w, send, recv))
	for r := 0; r < w.Size(); r++ {
		for i := 0; i < n; i++ {
			require.Equal(t, int32(r*1000+i), recv[r*n+i], "rank %d element %d", r, i)
		}
	}
	mpitesting.Agree(t, w)
}

func TestAlltoall(t *testing.T) {
	w := mpitesting.World
	block := 5
	send := make([]uint16, block*w.Size())
	for d := 0; d < w.Size(); d++ {
		for i := 0; i < block; i++ {
			send[d*block+i] = uint16(pattern(w.Rank(), d, i))
		}
	}
	recv := make([]uint16, len(send))
	require.NoError(t, mpi.AlltoallSlice(w, send, recv))
	for s := 0; s < w.Size(); s++ {
		for i := 0; i < block; i++ {
			require.Equal(t, uint16(pattern(s, w.Rank(), i)), recv[s*block+i], "from rank %d element %d", s, i)
		}
	}
	mpitesting.Agree(t, w)
}

// count is how many elements rank src sends to rank dst: uneven, often zero.
func count(src, dst int) int { return (src*3 + dst*5) % 4 * (src + 1) }

func TestAlltoallvUnevenCounts(t *testing.T) {
	w := mpitesting.World
	me, n := w.Rank(), w.Size()
	sendCounts, sendDispls := make([]int, n), make([]int, n)
	recvCounts, recvDispls := make([]int, n), make([]int, n)
	var sendLen, recvLen int
	for p := 0; p < n; p++ {
		sendCounts[p], sendDispls[p] = count(me, p), sendLen
		sendLen += count(me, p)
		recvCounts[p], recvDispls[p] = count(p, me), recvLen
		recvLen += count(p, me)
	}
	send := make([]float32, sendLen)
	for d := 0; d < n; d++ {
		for i := 0; i < sendCounts[d]; i++ {
			send[sendDispls[d]+i] = float32(me*100+d) + float32(i)/16
		}
	}
	recv := make([]float32, recvLen)
	require.NoError(t, mpi.AlltoallvSlice(w, send, sendCounts, sendDispls, recv, recvCounts, recvDispls))
	for s := 0; s < n; s++ {
		for i := 0; i < recvCounts[s]; i++ {
			require.Equal(t, float32(s*100+me)+float32(i)/16, recv[recvDispls[s]+i], "from rank %d element %d", s, i)
		}
	}
	mpitesting.Agree(t, w)
}

func TestAllreduce(t *testing.T) {
	w := mpitesting.World
	n := w.Size()
	for _, tc := range []struct {
		op   mpi.Op
		want float64
	}{
		{mpi.OpSum, float64(n * (n + 1) / 2)},
		{mpi.OpMax, float64(n)},
		{mpi.OpMin, 1},
	} {
		send := []float64{float64(w.Rank() + 1), float64(w.Rank()+1) * 2}
		recv := make([]float64, 2)
		require.NoError(t, mpi.Allreduce(w, tc.op, send, recv))
		assert.Equal(t, []float64{tc.want, 2 * tc.want}, recv, "op %v", tc.op)
		si := []int64{int64(w.Rank() + 1)}
		ri := make([]int64, 1)
		require.NoError(t, mpi.Allreduce(w, tc.op, si, ri))
		assert.Equal(t, int64(tc.want), ri[0], "int64 op %v", tc.op)
	}
	mpitesting.Agree(t, w)
}

func TestSplitOrdersByKey(t *testing.T) {
	w := mpitesting.World
	color := w.Rank() % 2
	sub, err := w.Split(color, -w.Rank(), "parity")
	require.NoError(t, err)
	members := 0
	for r := color; r < w.Size(); r += 2 {
		members++
	}
	require.Equal(t, members, sub.Size())
	// Keys are -rank: the highest world rank of the colour is rank 0.
	higher := 0
	for r := w.Rank() + 2; r < w.Size(); r += 2 {
		higher++
	}
	assert.Equal(t, higher, sub.Rank())
	got := make([]int32, sub.Size())
	require.NoError(t, mpi.AllgatherSlice(sub, []int32{int32(w.Rank())}, got))
	for i := 1; i < len(got); i++ {
		assert.Greater(t, got[i-1], got[i], "ranks of the split must follow the keys")
	}
	require.NoError(t, sub.Free())
	assert.Error(t, sub.Barrier(), "a freed communicator must refuse work")

	none, err := w.Split(-1, 0, "none")
	require.NoError(t, err)
	assert.Nil(t, none, "a negative colour puts the rank in no communicator")
	mpitesting.Agree(t, w)
}

func TestBadArgumentsAreErrors(t *testing.T) {
	w := mpitesting.World
	n := w.Size()
	var arg *mpi.ArgError
	err := w.Bcast(make([]byte, 4), -1)
	require.ErrorAs(t, err, &arg)
	assert.Contains(t, err.Error(), "root -1 out of range")

	err = w.Bcast(make([]byte, 4), n)
	assert.ErrorAs(t, err, &arg)

	counts := make([]int, n)
	err = w.Alltoallv(nil, counts[:n-1+0*n], counts, nil, counts, counts)
	if n > 1 {
		assert.ErrorAs(t, err, &arg)
	}
	err = w.Alltoallv(nil, counts, counts[:0], nil, counts, counts)
	require.ErrorAs(t, err, &arg)
	assert.Contains(t, err.Error(), "len(sendDispls) = 0")

	big := make([]int, n)
	big[0] = 10
	err = w.Alltoallv(make([]byte, 4), big, make([]int, n), make([]byte, 100), big, make([]int, n))
	require.ErrorAs(t, err, &arg)
	assert.Contains(t, err.Error(), "exceeds len(send) = 4")

	neg := make([]int, n)
	neg[n-1] = -3
	err = w.Alltoallv(nil, neg, make([]int, n), nil, make([]int, n), make([]int, n))
	require.ErrorAs(t, err, &arg)
	assert.Contains(t, err.Error(), "-3")

	err = w.Allgather(make([]byte, 3), make([]byte, 3*n+1))
	assert.ErrorAs(t, err, &arg)
	err = mpi.Allreduce(w, mpi.OpSum, make([]float32, 2), make([]float32, 3))
	assert.ErrorAs(t, err, &arg)

	// Nothing above reached MPI: the ranks are still in step.
	require.NoError(t, w.Barrier())
	mpitesting.Agree(t, w)
}

func TestCollectiveTimeoutNamesTheStall(t *testing.T) {
	w := mpitesting.World
	if w.Size() < 2 {
		t.Skip("needs a peer that stalls: run under mpirun with 2 or more ranks")
	}
	c, err := w.Split(0, w.Rank(), "stall-test")
	require.NoError(t, err)
	c.SetTimeout(300 * time.Millisecond)
	if w.Rank() != 0 {
		start := time.Now()
		err := c.Barrier()
		require.Error(t, err)
		assert.True(t, errors.Is(err, mpi.ErrTimeout), "want a timeout, got %v", err)
		assert.Contains(t, err.Error(), "stall-test")
		assert.GreaterOrEqual(t, time.Since(start), 300*time.Millisecond, "it waited for the stalled rank")
		err = c.Barrier()
		assert.ErrorContains(t, err, "unusable", "after a timeout the communicator must refuse work")
	}
	// Rank 0 stalled; now everybody meets on the world communicator, and rank
	// 0 joins the stale barrier so that the others' requests complete.
	require.NoError(t, w.Barrier())
	if w.Rank() == 0 {
		c.SetTimeout(time.Minute) // non-blocking, to match the others' MPI_Ibarrier
		require.NoError(t, c.Barrier())
	}
	mpitesting.Agree(t, w)
}

func TestArriveNamesTheMissingRank(t *testing.T) {
	w := mpitesting.World
	if w.Size() < 2 {
		t.Skip("needs a rank that stays away: run under mpirun with 2 or more ranks")
	}
	require.NoError(t, w.Arrive("everyone", 0), "every rank arrives")
	// It also bounds how far apart the ranks reach the second Arrive after
	// the barrier, which the race detector's slowdown can stretch.
	const within = race.Slowdown * 300 * time.Millisecond
	for _, absent := range []int{w.Size() - 1, 0} {
		t.Run(strconv.Itoa(absent), func(t *testing.T) {
			c, err := w.Split(0, w.Rank(), "arrive-test")
			require.NoError(t, err)
			if w.Rank() != absent {
				err := c.Arrive("the test's point", within)
				var missing *mpi.MissingError
				require.ErrorAs(t, err, &missing, "rank %d stayed away", absent)
				assert.Equal(t, absent, missing.Rank)
				assert.Equal(t, "the test's point", missing.What)
				assert.Equal(t, "arrive-test", missing.Comm)
				assert.ErrorIs(t, err, mpi.ErrTimeout)
			}
			require.NoError(t, w.Barrier())
			if absent != 0 {
				// Nothing of the failed round is left: all arrive again.
				require.NoError(t, c.Arrive("again", within), "rank %d", w.Rank())
				require.NoError(t, c.Free())
			} else if w.Rank() != 0 {
				assert.ErrorContains(t, c.Arrive("again", within), "unusable", "rank 0 was missing: the communicator is done")
			}
			mpitesting.Agree(t, w)
		})
	}
}
