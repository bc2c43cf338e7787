//go:build !ci

package gpu

// ciBuild is true under -tags ci (see ci_test.go).
const ciBuild = false
