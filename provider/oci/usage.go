package oci

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/provider/kit"
)

var _ kit.UsageReader = (*Provider)(nil)

// Usage reads sandbox id's CPU time, memory and tasks from its cgroup's files, as
// docker stats reads a container's: cgroup v2's cpu.stat, memory.current, memory.max and
// pids.current under /sys/fs/cgroup/roche-ID, else v1's cpuacct, memory and pids
// controllers' (a hybrid host's runtimes use v1). Nothing runs in the sandbox. Memory
// leaves out the page cache the kernel can drop (inactive_file), as docker stats does.
func (p *Provider) Usage(ctx context.Context, id string) (kit.Usage, error) {
	s, err := p.load(id)
	if err != nil {
		return kit.Usage{}, err
	}
	name := strings.TrimPrefix(cgroupOf(s.ID), "/")
	u, ok := usageV2(filepath.Join("/sys/fs/cgroup", name))
	if !ok {
		u, ok = usageV1("/sys/fs/cgroup", name)
	}
	if !ok {
		return kit.Usage{}, fmt.Errorf("%w: sandbox %s has no cgroup to read its usage from: it is not running", roche.ErrNotFound, id)
	}
	u.At = time.Now()
	return u, nil
}

// usageV2 reads a cgroup v2 directory; ok false when it is not one.
func usageV2(dir string) (kit.Usage, bool) {
	stat, err := os.ReadFile(filepath.Join(dir, "cpu.stat"))
	if err != nil {
		return kit.Usage{}, false
	}
	var u kit.Usage
	if usec, ok := statField(stat, "usage_usec"); ok {
		u.CPUTime = time.Duration(usec) * time.Microsecond
	}
	u.MemoryBytes = readInt(filepath.Join(dir, "memory.current"))
	if ms, err := os.ReadFile(filepath.Join(dir, "memory.stat")); err == nil {
		if inactive, ok := statField(ms, "inactive_file"); ok && inactive < u.MemoryBytes {
			u.MemoryBytes -= inactive
		}
	}
	u.MemoryLimitBytes = readInt(filepath.Join(dir, "memory.max")) // "max": 0, none
	u.Processes = int(readInt(filepath.Join(dir, "pids.current")))
	return u, true
}

// usageV1 reads the v1 controllers' directories of cgroup name below root; ok false
// when the memory controller has none.
func usageV1(root, name string) (kit.Usage, bool) {
	mem := filepath.Join(root, "memory", name)
	if _, err := os.Stat(filepath.Join(mem, "memory.usage_in_bytes")); err != nil {
		return kit.Usage{}, false
	}
	u := kit.Usage{
		CPUTime:     time.Duration(readInt(filepath.Join(root, "cpuacct", name, "cpuacct.usage"))),
		MemoryBytes: readInt(filepath.Join(mem, "memory.usage_in_bytes")),
		Processes:   int(readInt(filepath.Join(root, "pids", name, "pids.current"))),
	}
	if ms, err := os.ReadFile(filepath.Join(mem, "memory.stat")); err == nil {
		if inactive, ok := statField(ms, "total_inactive_file"); ok && inactive < u.MemoryBytes {
			u.MemoryBytes -= inactive
		}
	}
	// No limit reads as the largest page-aligned int64.
	if limit := readInt(filepath.Join(mem, "memory.limit_in_bytes")); limit < 1<<62 {
		u.MemoryLimitBytes = limit
	}
	return u, true
}

// statField is the value of key in a cgroup "key value" file.
func statField(b []byte, key string) (int64, bool) {
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, key+" "); ok {
			n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			return n, err == nil
		}
	}
	return 0, false
}

// readInt reads a cgroup file holding one number; 0 when it cannot ("max" included).
func readInt(path string) int64 {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	n, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	return n
}
