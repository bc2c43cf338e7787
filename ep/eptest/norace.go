//go:build !race

package eptest

const raceSlowdown = 1
