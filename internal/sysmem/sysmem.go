// Package sysmem reads how much memory this machine can still give a
// process: the free space of the shared-memory file system (where MPI's
// shared-memory windows live), the kernel's estimate of available memory,
// and the memory limit of the process's cgroup (v2 or v1), so that a library
// can refuse a configuration before allocating it instead of being killed
// by the kernel half way.
package sysmem

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// Unknown marks a figure that could not be read.
const Unknown = -1

// Avail is what the machine can still give, in bytes (Unknown where it
// could not be read).
type Avail struct {
	ShmDir       string // the shared-memory file system read (/dev/shm)
	ShmFree      int64  // its free space
	MemAvailable int64  // /proc/meminfo's MemAvailable
	CgroupLimit  int64  // this process's cgroup memory limit; Unknown when none
	CgroupUsage  int64  // and the cgroup's usage
}

// Read reads the machine's figures.
func Read() Avail {
	a := Avail{ShmDir: "/dev/shm", ShmFree: Unknown, MemAvailable: Unknown, CgroupLimit: Unknown, CgroupUsage: Unknown}
	var st syscall.Statfs_t
	if syscall.Statfs(a.ShmDir, &st) == nil {
		a.ShmFree = int64(st.Bavail) * st.Bsize
	}
	a.MemAvailable = memAvailable("/proc/meminfo")
	a.CgroupLimit, a.CgroupUsage = cgroupMemory("/proc/self/cgroup", "/sys/fs/cgroup")
	return a
}

// Memory is the most memory a new allocation may take: the least of
// MemAvailable and the cgroup's headroom (Unknown if neither is known).
func (a Avail) Memory() int64 {
	return least(a.MemAvailable, a.cgroupHeadroom())
}

// Shared is the most shared memory a new allocation may take: Memory, and
// the shared-memory file system's free space.
func (a Avail) Shared() int64 { return least(a.Memory(), a.ShmFree) }

func (a Avail) cgroupHeadroom() int64 {
	if a.CgroupLimit == Unknown {
		return Unknown
	}
	return max(a.CgroupLimit-max(a.CgroupUsage, 0), 0)
}

func least(a, b int64) int64 {
	switch {
	case a == Unknown:
		return b
	case b == Unknown:
		return a
	}
	return min(a, b)
}

// String lists the figures, for messages.
func (a Avail) String() string {
	var parts []string
	if a.ShmFree != Unknown {
		parts = append(parts, fmt.Sprintf("%s free %s", a.ShmDir, Bytes(a.ShmFree)))
	}
	if a.MemAvailable != Unknown {
		parts = append(parts, "MemAvailable "+Bytes(a.MemAvailable))
	}
	if a.CgroupLimit != Unknown {
		parts = append(parts, fmt.Sprintf("cgroup limit %s, %s used", Bytes(a.CgroupLimit), Bytes(a.CgroupUsage)))
	} else {
		parts = append(parts, "no cgroup limit")
	}
	return strings.Join(parts, ", ")
}

// Bytes formats n bytes for people: "15.2 GB".
func Bytes(n int64) string {
	switch {
	case n >= 1e9:
		return fmt.Sprintf("%.1f GB", float64(n)/1e9)
	case n >= 1e6:
		return fmt.Sprintf("%.1f MB", float64(n)/1e6)
	case n >= 1e3:
		return fmt.Sprintf("%.1f kB", float64(n)/1e3)
	}
	return fmt.Sprintf("%d B", n)
}

// memAvailable reads MemAvailable from a meminfo file.
func memAvailable(path string) int64 {
	f, err := os.Open(path)
	if err != nil {
		return Unknown
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) >= 2 && fields[0] == "MemAvailable:" {
			if kb, err := strconv.ParseInt(fields[1], 10, 64); err == nil {
				return kb * 1024
			}
		}
	}
	return Unknown
}

// noLimit is the limit cgroup v1 reports when there is none (a page short
// of the largest int64), and anything above it counts as none too.
const noLimit = 1 << 62

// cgroupMemory reads this process's cgroup memory limit and usage: cgroup v2
// (memory.max, memory.current) or v1 (memory.limit_in_bytes,
// memory.usage_in_bytes), at the process's cgroup path under root, or at
// the root of the mount (a container sees its own cgroup there).
func cgroupMemory(selfCgroup, root string) (limit, usage int64) {
	b, err := os.ReadFile(selfCgroup)
	if err != nil {
		return Unknown, Unknown
	}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		var dirs []string
		var limitFile, usageFile string
		switch {
		case parts[0] == "0" && parts[1] == "": // v2
			dirs = []string{filepath.Join(root, parts[2]), root}
			limitFile, usageFile = "memory.max", "memory.current"
		case strings.Contains(","+parts[1]+",", ",memory,"): // v1
			dirs = []string{filepath.Join(root, "memory", parts[2]), filepath.Join(root, "memory")}
			limitFile, usageFile = "memory.limit_in_bytes", "memory.usage_in_bytes"
		default:
			continue
		}
		for _, d := range dirs {
			l, ok := readBytes(filepath.Join(d, limitFile))
			if !ok {
				continue
			}
			u, _ := readBytes(filepath.Join(d, usageFile))
			if l >= noLimit {
				return Unknown, u
			}
			return l, u
		}
	}
	return Unknown, Unknown
}

// readBytes reads a cgroup figure ("max" is no limit).
func readBytes(path string) (int64, bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Unknown, false
	}
	s := strings.TrimSpace(string(b))
	if s == "max" {
		return noLimit, true
	}
	n, err := strconv.ParseInt(s, 10, 64)
	return n, err == nil
}
