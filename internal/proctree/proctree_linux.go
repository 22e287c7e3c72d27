// Package proctree kills whole process trees on Linux, for the Docker provider (from the
// host) and for roche-agent (inside the sandbox).
package proctree

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// KillTree kills a process, all its descendants and every process in its process group
// (a command started as a group leader keeps orphaned members in that group).
//
// Killing a parent first would orphan its children to init, out of reach of a walk by
// parent pid, so the tree is first frozen with SIGSTOP, re-walked until no new process
// appears, and only then killed.
//
// The group is stopped first, in one call: a fork bomb's processes all stay in it, and
// until they stop they take the CPUs the walk needs. Under gVisor, whose tasks share
// the sandbox's CPU with the agent's, a bomb held at the pids limit (60-odd processes
// spinning on a failing fork) made the walk take 4 to 7 s; stopped first, it takes
// milliseconds.
// A group whose id is root's is root's own: no other process can have that id.
func KillTree(root int) error {
	_ = syscall.Kill(-root, syscall.SIGSTOP)
	stopped := map[int]bool{}
	for round := 0; round < 50; round++ {
		added := false
		for _, pid := range members(root) {
			if !stopped[pid] {
				_ = syscall.Kill(pid, syscall.SIGSTOP)
				stopped[pid] = true
				added = true
			}
		}
		if !added {
			break
		}
	}
	var errs []error
	for pid := range stopped {
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// EachMember calls f once for every process of root's tree and process group besides
// root, walking /proc again until a walk finds none it has not seen (at most 50 walks):
// one started while a walk runs is found by the next.
func EachMember(root int, f func(pid int)) {
	seen := map[int]bool{root: true}
	for round := 0; round < 50; round++ {
		added := false
		for _, pid := range members(root) {
			if !seen[pid] {
				seen[pid] = true
				added = true
				f(pid)
			}
		}
		if !added {
			return
		}
	}
}

// members returns root, every process below it and every process in the group root leads.
func members(root int) []int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	children := map[int][]int{}
	var out []int
	rootAlive := false
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		st, ok := stat(pid)
		if !ok {
			continue
		}
		if pid == root {
			rootAlive = true
			continue
		}
		children[st.ppid] = append(children[st.ppid], pid)
		if st.pgrp == root {
			out = append(out, pid)
		}
	}
	if rootAlive {
		out = append(out, root)
	}
	seen := map[int]bool{}
	for _, p := range out {
		seen[p] = true
	}
	for i := 0; i < len(out); i++ {
		for _, c := range children[out[i]] {
			if !seen[c] {
				seen[c] = true
				out = append(out, c)
			}
		}
	}
	return out
}

// procStat is what KillTree and StartTime need of /proc/PID/stat (and its test, the state).
type procStat struct {
	state      byte // R, S, D, Z, T...
	ppid, pgrp int
	start      uint64 // field 22, clock ticks since the host booted (0 if absent)
}

// stat reads a process's state, parent, process group and start time from /proc/PID/stat.
func stat(pid int) (procStat, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return procStat{}, false
	}
	// The command name may contain spaces and parentheses: fields start after the last ')'.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return procStat{}, false
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 3 || len(f[0]) != 1 {
		return procStat{}, false
	}
	ppid, err1 := strconv.Atoi(f[1])
	pgrp, err2 := strconv.Atoi(f[2])
	st := procStat{state: f[0][0], ppid: ppid, pgrp: pgrp}
	const startField = 22 - 3 // fields 3.. follow the name
	if len(f) > startField {
		st.start, _ = strconv.ParseUint(f[startField], 10, 64)
	}
	return st, err1 == nil && err2 == nil
}

// StartTime is when process pid started, in clock ticks since the host booted (field 22
// of /proc/PID/stat): with the pid, it names one process for good, where a pid alone
// may be reused.
func StartTime(pid int) (uint64, error) {
	st, ok := stat(pid)
	if !ok || st.start == 0 {
		return 0, fmt.Errorf("reading /proc/%d/stat: no such process, or no start time in it", pid)
	}
	return st.start, nil
}

// Leftover counts the processes of root's tree and process group still running besides
// root itself (zombies aside): what a command that has exited left behind (`sleep 100 &`).
func Leftover(root int) int {
	n := 0
	for _, pid := range members(root) {
		if pid == root {
			continue
		}
		if st, ok := stat(pid); ok && st.state != 'Z' {
			n++
		}
	}
	return n
}
