//go:build faultinject

package main

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Fault injection, in builds with the faultinject tag only (the tests and
// make test-cluster build moe-serve so; a shipped binary has none of it):
// GOEP_SERVE_STALL=RANK:AFTER:DURATION (e.g. 1:200ms:3s) makes that rank
// stop itself (SIGSTOP) at its first step at least AFTER into serving in
// which it holds requests, and a helper resume it DURATION later, so that
// the others mask it (-mask-stalled) and let it rejoin.
func faultInjection(rank int) (func(int64, int), error) {
	v := os.Getenv("GOEP_SERVE_STALL")
	if v == "" {
		return nil, nil
	}
	r, after, d, err := parseStall(v)
	if err != nil || r != rank {
		return nil, err
	}
	return stallAfter(after, d), nil
}

// parseStall reads GOEP_SERVE_STALL's RANK:AFTER:DURATION.
func parseStall(v string) (rank int, after, d time.Duration, err error) {
	parts := strings.Split(v, ":")
	if len(parts) == 3 {
		rank, err = strconv.Atoi(parts[0])
		if err == nil {
			after, err = time.ParseDuration(parts[1])
		}
		if err == nil {
			d, err = time.ParseDuration(parts[2])
		}
	}
	if len(parts) != 3 || err != nil || rank < 0 || after < 0 || d <= 0 {
		return 0, 0, 0, fmt.Errorf("GOEP_SERVE_STALL=%q: want RANK:AFTER:DURATION, such as 1:200ms:3s", v)
	}
	return rank, after, d, nil
}

// stallAfter stops this process (SIGSTOP), at its first step at least
// after into serving in which it holds requests, and has a helper resume it
// (SIGCONT) d later.
func stallAfter(after, d time.Duration) func(int64, int) {
	var first time.Time
	done := false
	return func(_ int64, held int) {
		if first.IsZero() {
			first = time.Now()
		}
		if done || held == 0 || time.Since(first) < after {
			return
		}
		done = true
		cont := exec.Command("sh", "-c", fmt.Sprintf("sleep %.3f; kill -CONT %d", d.Seconds(), os.Getpid()))
		if err := cont.Start(); err != nil {
			return // no helper to resume it: do not stop
		}
		_ = syscall.Kill(os.Getpid(), syscall.SIGSTOP)
		_ = cont.Wait()
	}
}
