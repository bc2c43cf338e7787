//go:build race

package eptest

// raceSlowdown scales the timeouts of the checks that time a stall: under
// the race detector every rank runs several times slower.
const raceSlowdown = 3
