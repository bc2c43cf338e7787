//go:build !faultinject

package main

// faultInjection is nothing in a shipped binary: see stall.go (the
// faultinject build tag).
func faultInjection(int) (func(int64, int), error) { return nil, nil }
