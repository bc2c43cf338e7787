package sysmem

import (
	"os"
	"path/filepath"
	"testing"
)

func write(t *testing.T, path, text string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestCgroupMemory(t *testing.T) {
	cases := []struct {
		name         string
		self         string
		files        map[string]string
		limit, usage int64
	}{
		{"v2 with a limit", "0::/job/7\n", map[string]string{"job/7/memory.max": "1000000\n", "job/7/memory.current": "250000\n"}, 1000000, 250000},
		{"v2 unlimited", "0::/job/7\n", map[string]string{"job/7/memory.max": "max\n", "job/7/memory.current": "5\n"}, Unknown, 5},
		{"v1 at its path", "4:memory:/slurm/uid_0/job_3\n0::/\n", map[string]string{
			"memory/slurm/uid_0/job_3/memory.limit_in_bytes": "2048\n", "memory/slurm/uid_0/job_3/memory.usage_in_bytes": "1024\n"}, 2048, 1024},
		{"v1 at the mount's root (a container)", "4:memory:/process_api/abc\n", map[string]string{
			"memory/memory.limit_in_bytes": "9223372036854771712\n", "memory/memory.usage_in_bytes": "77\n"}, Unknown, 77},
		{"none", "1:cpu:/\n", nil, Unknown, Unknown},
	}
	for _, c := range cases {
		dir := t.TempDir()
		write(t, filepath.Join(dir, "self"), c.self)
		for f, text := range c.files {
			write(t, filepath.Join(dir, "root", f), text)
		}
		limit, usage := cgroupMemory(filepath.Join(dir, "self"), filepath.Join(dir, "root"))
		if limit != c.limit || usage != c.usage {
			t.Errorf("%s: limit %d usage %d, want %d %d", c.name, limit, usage, c.limit, c.usage)
		}
	}
}

func TestAvailLeast(t *testing.T) {
	a := Avail{ShmFree: 500, MemAvailable: 800, CgroupLimit: 1000, CgroupUsage: 400}
	if a.Memory() != 600 || a.Shared() != 500 {
		t.Errorf("Memory %d Shared %d, want 600 500", a.Memory(), a.Shared())
	}
	a = Avail{ShmFree: Unknown, MemAvailable: 800, CgroupLimit: Unknown, CgroupUsage: Unknown}
	if a.Memory() != 800 || a.Shared() != 800 {
		t.Errorf("Memory %d Shared %d, want 800 800", a.Memory(), a.Shared())
	}
	if got := Read(); got.MemAvailable <= 0 {
		t.Errorf("this machine's MemAvailable: %d", got.MemAvailable)
	}
	if Bytes(15_200_000_000) != "15.2 GB" || Bytes(512) != "512 B" {
		t.Error(Bytes(15_200_000_000), Bytes(512))
	}
}
