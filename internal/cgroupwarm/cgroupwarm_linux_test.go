package cgroupwarm

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/roche-sandbox/roche/internal/testenv"
	"golang.org/x/sys/unix"
)

// TestWarmCgroupMovesMovesNothing: the warm-up writes this process's pid into the v1
// cgroup it is in already, so every thread of the process stays in every cgroup it was
// in; it names that cgroup's cgroup.procs on a host with v1 hierarchies, and nothing on
// a cgroup v2 host; and one goroutine does it for every create, stopping after the
// last.
func TestWarmCgroupMovesMovesNothing(t *testing.T) {
	testenv.Needs(t, testenv.Root)
	var root unix.Statfs_t
	if err := unix.Statfs("/sys/fs/cgroup", &root); err != nil {
		t.Fatal(err)
	}
	path := ownV1Procs()
	if root.Type != unix.TMPFS_MAGIC {
		if path != "" {
			t.Fatalf("cgroup v2 host: warming %s", path)
		}
		return
	}
	if path == "" {
		t.Fatal("cgroup v1 host: no v1 cgroup of this process found to warm")
	}
	// The path is this process's own cgroup, as /proc/self/cgroup names it.
	rel := strings.TrimPrefix(filepath.Dir(path), "/sys/fs/cgroup/")
	ctrl, cg, _ := strings.Cut(rel, "/")
	own, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, line := range strings.Split(string(own), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) == 3 && parts[2] == "/"+cg && strings.Contains(","+parts[1]+",", ","+ctrl+",") {
			found = true
		}
	}
	if !found {
		t.Fatalf("warming %s, not this process's own cgroup:\n%s", path, own)
	}
	procs, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(append([]byte("\n"), procs...), []byte("\n"+strconv.Itoa(os.Getpid())+"\n")) {
		t.Fatalf("%s does not list this process (%d)", path, os.Getpid())
	}

	before := threadCgroups(t)
	// Many creates at once share one warming goroutine, which stops when the last is
	// done.
	var dones []func()
	for range 20 {
		dones = append(dones, Start())
	}
	warmer.Lock()
	users, running := warmer.users, warmer.running
	warmer.Unlock()
	if users != 20 || !running {
		t.Fatalf("20 creates warming: users %d, running %v", users, running)
	}
	time.Sleep(4 * warmEvery) // a few of its writes
	for _, done := range dones {
		done()
		done() // twice is once
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		warmer.Lock()
		users, running = warmer.users, warmer.running
		warmer.Unlock()
		if users == 0 && !running {
			break
		}
		if users != 0 || time.Now().After(deadline) {
			t.Fatalf("all done: users %d, running %v", users, running)
		}
		time.Sleep(warmEvery)
	}
	if after := threadCgroups(t); after != before {
		t.Fatalf("the warm-up moved this process's threads:\nbefore:\n%s\nafter:\n%s", before, after)
	}
}

// threadCgroups is every thread's /proc/self/task/TID/cgroup, sorted by thread.
func threadCgroups(t *testing.T) string {
	t.Helper()
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, task := range tasks {
		c, err := os.ReadFile(filepath.Join("/proc/self/task", task.Name(), "cgroup"))
		if err != nil {
			continue // a thread that ended
		}
		b.Write(c)
	}
	// Threads come and go (the runtime's); what matters is that each cgroup line is the
	// process's own.
	lines := map[string]bool{}
	for _, l := range strings.Split(b.String(), "\n") {
		if l != "" {
			lines[l] = true
		}
	}
	var out []string
	for l := range lines {
		out = append(out, l)
	}
	slices.Sort(out)
	return strings.Join(out, "\n")
}

// TestForUntilStart: an early hold (For) counts as one user until a create's Start
// takes over, and then only the create's use is left.
func TestForUntilStart(t *testing.T) {
	users := func() int {
		warmer.Lock()
		defer warmer.Unlock()
		return warmer.users
	}
	before := users()
	For(time.Hour)
	if got := users(); got != before+1 {
		t.Fatalf("after For: %d users, want %d", got, before+1)
	}
	done := Start()
	if got := users(); got != before+1 {
		t.Fatalf("after a create's Start: %d users, want %d (the early hold's ended)", got, before+1)
	}
	done()
	if got := users(); got != before {
		t.Fatalf("after the create: %d users, want %d", got, before)
	}
}
