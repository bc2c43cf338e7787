package gpu

import (
	"os"
	"testing"
)

// toolsRequired reports whether a missing tool must fail a test rather than
// skip it: under make test and CI (GOEP_REQUIRE_TOOLS=1) or -tags ci.
func toolsRequired() bool { return ciBuild || os.Getenv("GOEP_REQUIRE_TOOLS") == "1" }

// requireNVRTC skips t when NVRTC cannot be loaded, or fails it where tools
// are required, so that CI can never pass by skipping the PTX tests.
func requireNVRTC(t testing.TB) {
	t.Helper()
	if err := nvrtcLib.load(); err != nil {
		if toolsRequired() {
			t.Fatalf("NVRTC is required (GOEP_REQUIRE_TOOLS=1 or -tags ci) but missing: run scripts/install-deps.sh --nvrtc: %v", err)
		}
		t.Skipf("NVRTC missing (run scripts/install-deps.sh --nvrtc; make test fails instead of skipping): %v", err)
	}
}
