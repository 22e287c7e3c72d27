package server

import (
	"os"
	"path/filepath"
	"testing"
)

func writeFiles(t *testing.T, root string, files map[string]string) {
	t.Helper()
	for name, content := range files {
		p := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// TestUsageFiles: the agent's readers of its usage on files recorded from a container
// with a cgroup namespace of its own (v2), a Pod on a cgroup v1 node (each controller's
// subtree mounted at its place, pids hidden), and a microVM's /proc.
func TestUsageFiles(t *testing.T) {
	root := t.TempDir()
	cg := filepath.Join(root, "cg")
	writeFiles(t, root, map[string]string{
		"v2/cgroup":         "0::/\n",
		"v2/mountinfo":      "30 25 0:26 / " + cg + " ro,nosuid - cgroup2 cgroup2 rw\n",
		"cg/cpu.stat":       "usage_usec 1500000\nuser_usec 1000000\n",
		"cg/memory.current": "104857600\n", "cg/memory.stat": "anon 1\ninactive_file 4194304\n",
		"cg/memory.max": "268435456\n", "cg/pids.current": "7\n",
	})
	u, err := cgroupUsage(filepath.Join(root, "v2/cgroup"), filepath.Join(root, "v2/mountinfo"))
	if err != nil || u.CPUTimeNS != 1_500_000_000 || u.MemoryBytes != 100<<20-4<<20 || u.MemoryLimitBytes != 256<<20 || u.Tasks != 7 {
		t.Errorf("v2: %+v %v", u, err)
	}

	const pod = "/kubepods/burstable/pod1/c1"
	v1 := filepath.Join(root, "v1")
	writeFiles(t, root, map[string]string{
		"v1.cgroup": "4:memory:" + pod + "\n2:cpuacct:" + pod + "\n8:pids:" + pod + "\n0::" + pod + "\n",
		"v1.mountinfo": "125 121 0:32 " + pod + " " + v1 + "/memory ro - cgroup cgroup rw,memory\n" +
			"123 121 0:30 " + pod + " " + v1 + "/cpuacct ro - cgroup cgroup rw,cpuacct\n" +
			"130 121 0:36 " + pod + " " + v1 + "/pids ro - cgroup cgroup rw,pids\n" +
			"139 130 0:41 / " + v1 + "/pids ro - tmpfs tmpfs rw,size=4k\n",
		"v1/memory/memory.usage_in_bytes": "52428800\n", "v1/memory/memory.stat": "total_inactive_file 2097152\n",
		"v1/memory/memory.limit_in_bytes": "402653184\n", "v1/cpuacct/cpuacct.usage": "2500000000\n",
	})
	if err := os.MkdirAll(filepath.Join(v1, "pids"), 0o755); err != nil { // hidden: empty
		t.Fatal(err)
	}
	u, err = cgroupUsage(filepath.Join(root, "v1.cgroup"), filepath.Join(root, "v1.mountinfo"))
	if err != nil || u.CPUTimeNS != 2_500_000_000 || u.MemoryBytes != 48<<20 || u.MemoryLimitBytes != 384<<20 || u.Tasks < 1 {
		t.Errorf("v1: %+v %v; want the tasks of this PID namespace counted instead of the hidden pids.current", u, err)
	}

	// No cgroup mounted in the sandbox: unsupported, not zeroes.
	writeFiles(t, root, map[string]string{"none.mountinfo": "1 0 0:1 / / rw - overlay overlay rw\n"})
	if u, err := cgroupUsage(filepath.Join(root, "v1.cgroup"), filepath.Join(root, "none.mountinfo")); err == nil {
		t.Errorf("no cgroup mounted: %+v, want an error", u)
	}

	writeFiles(t, root, map[string]string{
		"proc/stat":    "cpu  100 5 50 10000 20 3 2 0 0 0\ncpu0 100 5 50 10000 20 3 2 0 0 0\n",
		"proc/meminfo": "MemTotal:         491520 kB\nMemFree:          300000 kB\nMemAvailable:     400000 kB\n",
		"proc/loadavg": "0.00 0.01 0.05 1/73 456\n",
	})
	u, err = vmUsage(filepath.Join(root, "proc"))
	if err != nil || u.CPUTimeNS != 160*10_000_000 || u.MemoryLimitBytes != 491520<<10 || u.MemoryBytes != (491520-400000)<<10 || u.Tasks != 73 {
		t.Errorf("vm: %+v %v", u, err)
	}
}
