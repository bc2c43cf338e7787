package eptest

import (
	"fmt"
	"runtime"
	"strings"
)

// engineAllocs runs f and counts the heap allocations that the code under
// test made meanwhile: those whose call stack passes through goep's own
// packages (ep, mpi, internal/...), the suite's excepted. It reads them
// from the memory profile, with every allocation recorded while f runs:
// runtime.MemStats counts every allocation of the process, the runtime's
// own background work included (its scavenger growing a timer heap, a GC
// worker taking a sudog), which a loaded machine makes more likely to fall
// inside f and which is not the engine's. where lists each allocating call
// stack found, for the failure message.
func engineAllocs(f func()) (n int64, where string) {
	defer func(rate int) { runtime.MemProfileRate = rate }(runtime.MemProfileRate)
	before := allocProfile()
	runtime.MemProfileRate = 1 // every allocation from here, at once (the next one sees the change)
	f()
	runtime.MemProfileRate = 0
	after := allocProfile()
	var stacks []string
	for key, rec := range after {
		extra := rec.AllocObjects - before[key].AllocObjects
		if extra <= 0 || !ours(rec.Stack()) {
			continue
		}
		n += extra
		stacks = append(stacks, fmt.Sprintf("%d allocation(s) at\n%s", extra, stackString(rec.Stack())))
	}
	return n, strings.Join(stacks, "\n")
}

// allocProfile is the memory profile by call stack. A record reaches the
// profile once two garbage collections have completed after it.
func allocProfile() map[[32]uintptr]runtime.MemProfileRecord {
	runtime.GC()
	runtime.GC()
	n, _ := runtime.MemProfile(nil, true)
	recs := make([]runtime.MemProfileRecord, n+64)
	n, _ = runtime.MemProfile(recs, true)
	out := make(map[[32]uintptr]runtime.MemProfileRecord, n)
	for _, r := range recs[:n] {
		if old, ok := out[r.Stack0]; ok { // the same stack twice: add up
			r.AllocObjects += old.AllocObjects
		}
		out[r.Stack0] = r
	}
	return out
}

// ours reports a call stack that passes through goep's code under test.
func ours(stack []uintptr) bool {
	frames := runtime.CallersFrames(stack)
	for {
		f, more := frames.Next()
		if strings.HasPrefix(f.Function, "github.com/goep/goep/") && !strings.HasPrefix(f.Function, "github.com/goep/goep/ep/eptest.") {
			return true
		}
		if !more {
			return false
		}
	}
}

func stackString(stack []uintptr) string {
	var b strings.Builder
	frames := runtime.CallersFrames(stack)
	for {
		f, more := frames.Next()
		fmt.Fprintf(&b, "    %s (%s:%d)\n", f.Function, f.File, f.Line)
		if !more {
			return b.String()
		}
	}
}
