// Package race scales the timeouts of the tests that time a wait when the
// race detector is on: under it every process runs several times slower,
// and a short timeout that bounds how far apart the ranks reach a call (a
// barrier, then a call with a 300 ms arrival check) fails on a loaded
// machine for no fault of the code (make test-race).
package race
