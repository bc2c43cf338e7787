//go:build race

package race

// Slowdown is the factor by which a test scales the timeouts it times
// waits with: 3 under the race detector.
const Slowdown = 3
