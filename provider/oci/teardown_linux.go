package oci

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// A process that made sandboxes and was killed outright (roched, kill -9) may leave its
// runtime's "run --detach" of a sandbox still at work: it goes on making the container
// (its cgroups first) after the next process has torn the sandbox down, and leaves its
// cgroups behind. A teardown of a sandbox whose container never reported its pid
// therefore stops such a run first, and any teardown removes the sandbox's cgroups that
// its runtime's delete did not (empty by then: rmdir refuses one with processes).

// stopRunsOf kills the runtime processes still making the container of the bundle dir
// (their command line names it) and waits, a little, for them to be gone. It reports
// whether it killed any: their runtime state may then be half written (forgetHalfMade).
func stopRunsOf(dir string) (killed bool) {
	marker := []byte("\x00--bundle\x00" + dir + "\x00")
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		cmdline, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil || !bytes.Contains(cmdline, marker) {
			continue
		}
		wait, ok := exitWaiter(pid)
		if !ok {
			continue
		}
		if unix.Kill(pid, unix.SIGKILL) == nil {
			killed = true
			wait(2 * time.Second)
		} else {
			wait(0)
		}
	}
	return killed
}

// forgetHalfMade removes the runtime's state of container id when a run killed midway
// left it without its status file: the runtime neither knows nor deletes such a
// container, and its list of every container fails on it.
func forgetHalfMade(root, id string) error {
	dir := filepath.Join(root, id)
	if _, err := os.Stat(dir); err != nil {
		return nil
	}
	if _, err := os.Stat(filepath.Join(dir, "status")); !errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return os.RemoveAll(dir)
}

// removeCgroups removes what is left of the cgroups named cgroup (the bundle's
// cgroupsPath) in every hierarchy. A process still in one is the sandbox's (a container
// the runtime started for a killed maker after its teardown began, which the runtime
// never registered, so its delete missed it): it is killed first.
func removeCgroups(cgroup string) error {
	name := filepath.Base(cgroup)
	dirs, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", "*", name))
	if _, err := os.Stat(filepath.Join("/sys/fs/cgroup", name)); err == nil {
		dirs = append(dirs, filepath.Join("/sys/fs/cgroup", name))
	}
	for range 3 {
		pids := procsIn(dirs)
		if len(pids) == 0 {
			break
		}
		for _, pid := range pids {
			if wait, ok := exitWaiter(pid); ok {
				if unix.Kill(pid, unix.SIGKILL) == nil {
					wait(2 * time.Second)
				} else {
					wait(0)
				}
			}
		}
	}
	var errs []error
	for _, d := range dirs {
		if err := unix.Rmdir(d); err != nil && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("removing cgroup %s: %w", d, err))
		}
	}
	return errors.Join(errs...)
}

// procsIn lists the processes in the cgroup directories dirs.
func procsIn(dirs []string) []int {
	seen := map[int]bool{}
	var out []int
	for _, d := range dirs {
		b, err := os.ReadFile(filepath.Join(d, "cgroup.procs"))
		if err != nil {
			continue
		}
		for _, f := range bytes.Fields(b) {
			if pid, err := strconv.Atoi(string(f)); err == nil && pid > 0 && !seen[pid] {
				seen[pid] = true
				out = append(out, pid)
			}
		}
	}
	return out
}

// A create makes the sandbox's directory, then, once it has drawn a uid under the state
// directory's lock (which many creates at once wait for), its record: a maker killed in
// between leaves a directory without a record, which List does not show, so no teardown
// ever reaches it. The create marks the directory with when it gives up (startByFile);
// GC removes such directories past it.
const startByFile = "start_by"

// markStartBy records in dir when its create gives up, if it has a deadline.
func markStartBy(dir string, by time.Time) {
	if !by.IsZero() {
		_ = os.WriteFile(filepath.Join(dir, startByFile), []byte(strconv.FormatInt(by.Unix(), 10)), 0o600)
	}
}

// sweepUnrecorded removes the sandbox directories without a record whose create has
// given up: past their startByFile, or, without one (a create without a deadline),
// twice the create timeout after they were made; and the hidden ones a maker was
// killed in before it renamed them into place (a moment's work), a minute on. Nothing
// was mounted or run for them: that comes after the record.
func (p *Provider) sweepUnrecorded() {
	entries, err := os.ReadDir(p.stateDir)
	if err != nil {
		return
	}
	for _, e := range entries {
		dir := filepath.Join(p.stateDir, e.Name())
		if hidden, ok := strings.CutPrefix(e.Name(), "."); ok && e.IsDir() && validID(hidden) {
			if fi, err := e.Info(); err == nil && time.Since(fi.ModTime()) > time.Minute {
				p.log.Info("removing the directory of a create that died before its record", "dir", dir)
				_ = os.RemoveAll(dir)
			}
			continue
		}
		if !e.IsDir() || !validID(e.Name()) {
			continue
		}
		if _, err := os.Stat(filepath.Join(dir, "record.json")); !errors.Is(err, os.ErrNotExist) {
			continue
		}
		giveUp := time.Time{}
		if b, err := os.ReadFile(filepath.Join(dir, startByFile)); err == nil {
			if by, err := strconv.ParseInt(string(bytes.TrimSpace(b)), 10, 64); err == nil {
				giveUp = time.Unix(by, 0)
			}
		}
		if giveUp.IsZero() {
			fi, err := e.Info()
			if err != nil {
				continue
			}
			giveUp = fi.ModTime().Add(2 * p.createTimeout)
		}
		if time.Now().After(giveUp) {
			p.log.Info("removing the directory of a create that died before its record", "dir", dir)
			_ = os.RemoveAll(dir)
		}
	}
}
