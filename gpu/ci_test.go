//go:build ci

package gpu

// ciBuild is true under -tags ci: a missing tool (NVRTC) fails the tests
// that need it instead of skipping them, as GOEP_REQUIRE_TOOLS=1 does.
const ciBuild = true
