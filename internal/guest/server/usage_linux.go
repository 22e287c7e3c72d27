package server

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/roche-sandbox/roche/internal/guest"
)

// usage reads what the sandbox uses now (guest.OpUsage), running nothing: in a microVM
// (the agent enforces the limits in a cgroup of its own there) the whole VM's figures,
// which is what the VM costs its host; in a container, the container's cgroup.
func (s *Server) usage() (guest.Usage, error) {
	if s.cgroupFD > 0 {
		return vmUsage("/proc")
	}
	return cgroupUsage("/proc/self/cgroup", "/proc/self/mountinfo")
}

// cgroupUsage reads the agent's own cgroup, which is the container's, as docker stats
// reads it: cgroup v2's cpu.stat, memory.current, memory.max and pids.current, else
// the v1 cpuacct, memory and pids controllers'. self (/proc/self/cgroup) names the
// agent's cgroup in each hierarchy, mountinfo where each hierarchy, or a subtree of it
// (a container's own), is mounted.
func cgroupUsage(self, mountinfo string) (guest.Usage, error) {
	cg, err := os.ReadFile(self)
	if err != nil {
		return guest.Usage{}, usageUnsupported("no cgroup to read the sandbox's usage from: %v", err)
	}
	mi, err := os.ReadFile(mountinfo)
	if err != nil {
		return guest.Usage{}, usageUnsupported("no mount table to find the sandbox's cgroup in: %v", err)
	}
	dir := func(controller string) string { return cgroupDir(string(cg), string(mi), controller) }
	if d := dir(""); d != "" && fileExists(filepath.Join(d, "memory.current")) {
		stat, _ := os.ReadFile(filepath.Join(d, "cpu.stat"))
		u := guest.Usage{Source: "cgroup"}
		if usec, ok := usageField(stat, "usage_usec"); ok {
			u.CPUTimeNS = usec * 1000
		}
		u.MemoryBytes = usageNumber(filepath.Join(d, "memory.current"))
		if ms, err := os.ReadFile(filepath.Join(d, "memory.stat")); err == nil {
			if inactive, ok := usageField(ms, "inactive_file"); ok && inactive < u.MemoryBytes {
				u.MemoryBytes -= inactive
			}
		}
		u.MemoryLimitBytes = usageNumber(filepath.Join(d, "memory.max")) // "max": 0, none
		u.Tasks = int(usageNumber(filepath.Join(d, "pids.current")))
		return u, nil
	}
	mem := dir("memory")
	if mem == "" || !fileExists(filepath.Join(mem, "memory.usage_in_bytes")) {
		return guest.Usage{}, usageUnsupported("the sandbox's cgroup is not mounted in it, so its usage cannot be read there")
	}
	u := guest.Usage{Source: "cgroup", MemoryBytes: usageNumber(filepath.Join(mem, "memory.usage_in_bytes"))}
	if d := dir("cpuacct"); d != "" {
		u.CPUTimeNS = usageNumber(filepath.Join(d, "cpuacct.usage"))
	}
	if d := dir("pids"); d != "" && fileExists(filepath.Join(d, "pids.current")) {
		u.Tasks = int(usageNumber(filepath.Join(d, "pids.current")))
	} else {
		// Its pids controller hidden (a Pod's can be): the tasks of its PID namespace,
		// the agent's own as PID 1.
		u.Tasks = countTasks("/proc")
	}
	if ms, err := os.ReadFile(filepath.Join(mem, "memory.stat")); err == nil {
		if inactive, ok := usageField(ms, "total_inactive_file"); ok && inactive < u.MemoryBytes {
			u.MemoryBytes -= inactive
		}
	}
	// No limit reads as the largest page-aligned int64.
	if limit := usageNumber(filepath.Join(mem, "memory.limit_in_bytes")); limit < 1<<62 {
		u.MemoryLimitBytes = limit
	}
	return u, nil
}

// cgroupDir is where the agent's cgroup of controller ("" for v2's unified hierarchy)
// is mounted: a mount of that hierarchy whose root is the cgroup or above it, joined
// with the rest of the path; "" when none is.
func cgroupDir(self, mountinfo, controller string) string {
	var path string
	for _, line := range strings.Split(self, "\n") {
		f := strings.SplitN(line, ":", 3)
		if len(f) != 3 {
			continue
		}
		if controller == "" && f[0] == "0" && f[1] == "" || controller != "" && slices.Contains(strings.Split(f[1], ","), controller) {
			path = f[2]
			break
		}
	}
	if path == "" {
		return ""
	}
	for _, line := range strings.Split(mountinfo, "\n") {
		// ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTS [OPTIONAL...] - FSTYPE SOURCE SUPEROPTS
		pre, post, ok := strings.Cut(line, " - ")
		f, g := strings.Fields(pre), strings.Fields(post)
		if !ok || len(f) < 5 || len(g) < 3 {
			continue
		}
		if controller == "" && g[0] != "cgroup2" ||
			controller != "" && (g[0] != "cgroup" || !slices.Contains(strings.Split(g[2], ","), controller)) {
			continue
		}
		root, point := f[3], f[4]
		if rest, ok := strings.CutPrefix(path, root); ok && (root == "/" || rest == "" || rest[0] == '/') {
			return filepath.Join(point, rest)
		}
	}
	return ""
}

// countTasks counts the threads of every process proc shows.
func countTasks(proc string) int {
	ents, err := os.ReadDir(proc)
	if err != nil {
		return 0
	}
	n := 0
	for _, e := range ents {
		if e.Name()[0] < '0' || e.Name()[0] > '9' {
			continue
		}
		if tasks, err := os.ReadDir(filepath.Join(proc, e.Name(), "task")); err == nil {
			n += len(tasks)
		}
	}
	return n
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// vmUsage reads the whole VM's figures from the guest kernel's proc (mounted at proc):
// every CPU's non-idle time, memory in use (MemTotal less MemAvailable) against
// MemTotal, and the kernel's count of tasks (/proc/loadavg's fourth field).
func vmUsage(proc string) (guest.Usage, error) {
	u := guest.Usage{Source: "vm"}
	stat, err := os.ReadFile(filepath.Join(proc, "stat"))
	if err != nil {
		return guest.Usage{}, usageUnsupported("reading the VM's /proc/stat: %v", err)
	}
	line, _, _ := strings.Cut(string(stat), "\n")
	f := strings.Fields(line)
	if len(f) < 8 || f[0] != "cpu" {
		return guest.Usage{}, usageUnsupported("the VM's /proc/stat begins %q", line)
	}
	// user nice system idle iowait irq softirq steal ...: all but idle and iowait, in
	// USER_HZ (100 a second on Linux, whatever the kernel's HZ).
	var ticks int64
	for i, v := range f[1:min(len(f), 9)] {
		if i == 3 || i == 4 {
			continue
		}
		n, _ := strconv.ParseInt(v, 10, 64)
		ticks += n
	}
	u.CPUTimeNS = ticks * 10_000_000
	if mi, err := os.ReadFile(filepath.Join(proc, "meminfo")); err == nil {
		total, avail := usageKB(mi, "MemTotal:"), usageKB(mi, "MemAvailable:")
		u.MemoryLimitBytes, u.MemoryBytes = total, max(total-avail, 0)
	}
	if la, err := os.ReadFile(filepath.Join(proc, "loadavg")); err == nil {
		if f := strings.Fields(string(la)); len(f) > 3 {
			_, all, _ := strings.Cut(f[3], "/")
			u.Tasks, _ = strconv.Atoi(all)
		}
	}
	return u, nil
}

// usageField is the value of key in a "key value" file.
func usageField(b []byte, key string) (int64, bool) {
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, key+" "); ok {
			n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			return n, err == nil
		}
	}
	return 0, false
}

// usageKB is /proc/meminfo's key in bytes.
func usageKB(b []byte, key string) int64 {
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, key); ok {
			n, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return n << 10
		}
	}
	return 0
}

// usageNumber reads a file holding one number; 0 when it cannot ("max" included).
func usageNumber(path string) int64 {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	n, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	return n
}

func usageUnsupported(format string, args ...any) error {
	return &guest.Error{Code: guest.CodeUnsupported, Message: fmt.Sprintf(format, args...)}
}
