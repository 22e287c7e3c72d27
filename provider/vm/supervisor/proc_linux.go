package supervisor

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// A supervisor started as root runs as the init of a PID namespace of its own
// (CloneNewPID): when it dies, however it dies, the kernel kills every process in that
// namespace, the hypervisor first of all. Pdeathsig alone does not hold: Linux clears a
// process's parent-death signal when its credentials change, and QEMU as root drops to
// nobody (-runas) once its devices are open, as Firecracker's jailer does before it
// execs Firecracker.

// hostPID is the pid, as the host sees it, of this supervisor's child whose pid in the
// supervisor's own namespace is pid. /proc is the host's (the supervisor has no mount
// namespace of its own), so its children files name host pids, and each child's NSpid
// line ends with its pid here.
func hostPID(pid int) (int, error) {
	if os.Getpid() != 1 {
		return pid, nil // no PID namespace of its own: the pids are the host's
	}
	files, _ := filepath.Glob("/proc/self/task/*/children")
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, c := range strings.Fields(string(b)) {
			status, err := os.ReadFile("/proc/" + c + "/status")
			if err != nil {
				continue
			}
			for _, line := range strings.Split(string(status), "\n") {
				ns, ok := strings.CutPrefix(line, "NSpid:")
				if !ok {
					continue
				}
				if f := strings.Fields(ns); len(f) > 0 && f[len(f)-1] == strconv.Itoa(pid) {
					return strconv.Atoi(c)
				}
			}
		}
	}
	return 0, fmt.Errorf("the hypervisor (pid %d in the supervisor's namespace) is not among its children in /proc", pid)
}

// ReadHypervisor reads a VM directory's HypervisorFile: the hypervisor's pid and, when
// recorded, its proctree.StartTime (0 if not).
func ReadHypervisor(dir string) (pid int, start uint64) {
	b, err := os.ReadFile(filepath.Join(dir, HypervisorFile))
	if err != nil {
		return 0, 0
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0, 0
	}
	pid, _ = strconv.Atoi(f[0])
	if len(f) > 1 {
		start, _ = strconv.ParseUint(f[1], 10, 64)
	}
	return pid, start
}
