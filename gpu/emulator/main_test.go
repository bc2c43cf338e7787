package emulator

import (
	"testing"

	"github.com/goep/goep/internal/mpitesting"
)

func TestMain(m *testing.M) { mpitesting.Main(m) }
