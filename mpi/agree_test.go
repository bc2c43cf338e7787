package mpi_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goep/goep/internal/mpitesting"
	"github.com/goep/goep/mpi"
)

// One failing rank makes every rank fail with its message; the ranks that
// failed are listed, and the origin rank keeps its error for errors.Is.
func TestAgreeOnError(t *testing.T) {
	w := mpitesting.World
	R, me := w.Size(), w.Rank()
	require.NoError(t, mpi.AgreeOnError(w, nil))
	cases := []struct {
		name   string
		failed []int
	}{
		{"last rank", []int{R - 1}},
		{"every rank", allRanks(R)},
	}
	for _, c := range cases {
		var mine error
		for _, r := range c.failed {
			if r == me {
				mine = fmt.Errorf("disk %d on fire", me)
			}
		}
		err := mpi.AgreeOnError(w, mine)
		var agreed *mpi.AgreedError
		require.ErrorAs(t, err, &agreed, c.name)
		assert.Equal(t, c.failed[0], agreed.Rank, c.name)
		assert.Equal(t, c.failed, agreed.Failed, c.name)
		assert.Equal(t, fmt.Sprintf("rank %d: disk %d on fire", c.failed[0], c.failed[0]), err.Error(), c.name)
		assert.Equal(t, me == c.failed[0], errors.Is(err, mine) && mine != nil, c.name)
	}
	mpitesting.Agree(t, w)
}

func allRanks(n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = i
	}
	return out
}
