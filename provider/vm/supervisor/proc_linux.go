package supervisor

import (
	"bytes"
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

// StartTime is when process pid started, in clock ticks since the host booted (field 22
// of /proc/PID/stat): with the pid, it names one process for good, where a pid alone
// may be reused.
func StartTime(pid int) (uint64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	// The command name, in parentheses, may hold spaces: the fields count from its end.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	const startField = 22 - 3 // fields 3.. follow the name
	if len(f) <= startField {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f)+2)
	}
	return strconv.ParseUint(f[startField], 10, 64)
}

// ReadHypervisor reads a VM directory's HypervisorFile: the hypervisor's pid and, when
// recorded, its StartTime (0 if not).
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
