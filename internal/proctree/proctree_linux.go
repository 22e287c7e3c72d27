package docker

import (
	"errors"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// killTree kills a process and all its descendants, seen through the host's /proc (the
// engine runs on this machine). Killing a parent first would orphan its children to the
// container's init, out of reach of a walk by parent pid, so the tree is first frozen
// with SIGSTOP, re-walked until no new process appears, and only then killed.
func killTree(root int) error {
	stopped := map[int]bool{}
	for round := 0; round < 50; round++ {
		tree := descendants(root)
		added := false
		for _, pid := range tree {
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
	if len(stopped) == 0 {
		return nil // already gone
	}
	var errs []error
	for pid := range stopped {
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// descendants returns root and every process below it.
func descendants(root int) []int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	children := map[int][]int{}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if ppid, ok := parentOf(pid); ok {
			children[ppid] = append(children[ppid], pid)
		}
	}
	if _, err := os.Stat("/proc/" + strconv.Itoa(root)); err != nil {
		return nil
	}
	out := []int{root}
	for i := 0; i < len(out); i++ {
		out = append(out, children[out[i]]...)
	}
	return out
}

func parentOf(pid int) (int, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, false
	}
	// The command name may contain spaces and parentheses: fields start after the last ')'.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, false
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 2 {
		return 0, false
	}
	ppid, err := strconv.Atoi(f[1])
	return ppid, err == nil
}
