// Package grow resizes the scratch slices that hot paths keep from call to
// call, so that a call in the steady state allocates nothing.
package grow

// To returns s with length n, reallocating only when its capacity is too
// small. It never returns nil: an empty result is a zero-length slice, which
// costs nothing and reads as "set" where nil means "absent".
func To[T any](s []T, n int) []T {
	if cap(s) < n || s == nil {
		return make([]T, n)
	}
	return s[:n]
}
