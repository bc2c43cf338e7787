package mpitesting

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestHostLayout(t *testing.T) {
	t.Setenv("GOEP_TEST_HOSTS", "")
	got, err := HostLayout(4)
	require.NoError(t, err)
	assert.Equal(t, []int{4}, got, "no layout: one host")

	t.Setenv("GOEP_TEST_HOSTS", "2,2,1")
	got, err = HostLayout(5)
	require.NoError(t, err)
	assert.Equal(t, []int{2, 2, 1}, got)

	_, err = HostLayout(4)
	assert.ErrorContains(t, err, "places 5 ranks, the world has 4")
	t.Setenv("GOEP_TEST_HOSTS", "2,x")
	_, err = HostLayout(4)
	assert.ErrorContains(t, err, `"x"`)
}
