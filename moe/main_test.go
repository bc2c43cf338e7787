package moe_test

import (
	"testing"

	"github.com/goep/goep/internal/mpitesting"
)

// The tests run on one rank with go test, and on every rank of an MPI job
// under the mpitest harness (make test-mpi); every test is collective.
func TestMain(m *testing.M) { mpitesting.Main(m) }
