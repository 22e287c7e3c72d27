package cgroupwarm

import (
	"bufio"
	"bytes"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// On a cgroup v1 host (and a hybrid one, whose controllers are v1) the runtime moves each
// sandbox's first process into its cgroups by writing its pid to cgroup.procs. The first
// such move takes the kernel's cgroup_threadgroup_rwsem for writing, whose percpu
// rcu_sync first waits out a whole RCU grace period when no writer held it lately: 9 to
// 22 ms measured here, a sixth of a one-shot roche run, in which crun's start of the
// container waits while nothing runs. A writer that comes within about a grace period
// of the last one finds the rcu_sync still open and does not wait (kernel/rcu/sync.c).
//
// Start starts that grace period early, beside the work a create does before
// the runtime's move (the root's mounts, the bundle, the runtime's exec and start), and
// keeps the rcu_sync open until the create calls done (once the runtime's run
// returned). A create calls it once its image is ready: through an image's unpack
// (seconds) the moves would only stall the host's forks and exits. It writes this process's own pid to the cgroup.procs of the v1 cgroup it
// is already in, a move that moves nothing (the kernel skips a task already in its
// destination) but takes and releases the lock as the runtime's does, and again every
// warmEvery (less than a grace period), each of those without a wait. One goroutine
// does it for every create under way in the process, so that many at once (roched's)
// cost no more moves than one. It changes no cgroup of this process or of any other,
// and needs nothing the runtime does not (root, a writable cgroup filesystem); any
// failure only leaves the runtime to wait as before. While the rcu_sync is open, forks
// and exits on the host take the lock's slower reading path, as they do after any
// cgroup move. A cgroup v2 host needs none of it: there the runtime starts the process
// in its cgroup (clone3's CLONE_INTO_CGROUP), which takes that lock only for reading.
func Start() (done func()) {
	done = start()
	// A create takes over from a process's early hold (For).
	early.Lock()
	release := early.done
	early.done = nil
	early.Unlock()
	if release != nil {
		release()
	}
	return done
}

// start counts one more user of the warm-up, starting its goroutine if none runs, and
// returns what ends that use (once, however often called).
func start() (done func()) {
	warmer.Lock()
	warmer.users++
	if !warmer.running {
		warmer.running = true
		go warmLoop()
	}
	warmer.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			warmer.Lock()
			warmer.users--
			warmer.Unlock()
		})
	}
}

// For keeps the rcu_sync open as Start does, until d has passed or a create's Start
// takes over, whichever comes first: for a process that knows, as it starts, that it
// will make a sandbox soon (roche-run given a one-shot oci run), so that the grace
// period begins before the create does. Once the create has its own, the hold ends,
// so that the warm-up's moves stop with the create's run rather than go on through the
// command and the teardown.
func For(d time.Duration) {
	done := start()
	early.Lock()
	early.done = done
	early.Unlock()
	time.AfterFunc(d, done)
}

// early is For's hold, until a Start takes over.
var early struct {
	sync.Mutex
	done func()
}

// warmer counts the creates that want the rcu_sync open, and whether warmLoop runs.
var warmer struct {
	sync.Mutex
	users   int
	running bool
}

// warmLoop moves this process into its own cgroup every warmEvery while a create wants
// it (warmer.users), and at least once.
func warmLoop() {
	stop := func() bool {
		warmer.Lock()
		defer warmer.Unlock()
		if warmer.users == 0 {
			warmer.running = false
			return true
		}
		return false
	}
	path := ownV1Procs()
	var f *os.File
	if path != "" {
		f, _ = os.OpenFile(path, os.O_WRONLY, 0)
	}
	if f == nil {
		warmer.Lock()
		warmer.running = false
		warmer.Unlock()
		return
	}
	defer f.Close()
	pid := []byte(strconv.Itoa(os.Getpid()))
	for {
		if _, err := f.Write(pid); err != nil {
			warmer.Lock()
			warmer.running = false
			warmer.Unlock()
			return
		}
		time.Sleep(warmEvery)
		if stop() {
			return
		}
	}
}

// warmEvery is under a grace period (~10 ms here, more on a loaded host, never under a
// few milliseconds).
const warmEvery = 3 * time.Millisecond

// ownV1Procs is the cgroup.procs file of this process's cgroup in one v1 hierarchy
// mounted under /sys/fs/cgroup (the pids hierarchy if mounted, else the first found), or
// "" on a host without one.
func ownV1Procs() string {
	var root syscall.Statfs_t
	if syscall.Statfs("/sys/fs/cgroup", &root) != nil || root.Type != tmpfsMagic {
		return ""
	}
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return ""
	}
	best := ""
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		// hierarchy-ID:controller-list:cgroup-path; v2's line has an empty list.
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) != 3 || parts[1] == "" || !strings.HasPrefix(parts[2], "/") {
			continue
		}
		for _, ctrl := range strings.Split(parts[1], ",") {
			if ctrl == "" || strings.HasPrefix(ctrl, "name=") || strings.Contains(ctrl, "/") || ctrl == "." || ctrl == ".." {
				continue
			}
			// Joined by hand: path/filepath, which Go initialises late, would hold back
			// a package that calls For as it initialises (internal/rocherun/ociwarm).
			dir := "/sys/fs/cgroup/" + ctrl + strings.TrimSuffix(parts[2], "/")
			if strings.Contains(parts[2], "/..") || strings.Contains(parts[2], "/./") {
				continue
			}
			p := dir + "/cgroup.procs"
			var st syscall.Statfs_t
			if syscall.Statfs(dir, &st) != nil || st.Type != cgroupSuperMagic {
				continue
			}
			if ctrl == "pids" {
				return p
			}
			if best == "" {
				best = p
			}
		}
	}
	return best
}

// The file system types of statfs(2) this needs (linux/magic.h), from syscall rather than
// golang.org/x/sys/unix, which Go initialises later than a package that calls For as it
// initialises wants.
const (
	tmpfsMagic       = 0x01021994
	cgroupSuperMagic = 0x27e0eb
)
