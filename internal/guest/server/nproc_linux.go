package server

import (
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// procLimit is the sandbox's process limit as one command's end saw it: the tasks
// (processes and threads) of the sandbox user counted in /proc, and RLIMIT_NPROC, the
// limit the kernel holds them to. ok is false when there was nothing to count against:
// no limit set, or the sandbox user is root, whom the limit exempts.
type procLimit struct {
	ok           bool
	tasks, limit int
	uid          int
	// reaped says the command itself was already reaped when counted, and so is not in
	// tasks: it was one more of them until it exited.
	reaped bool
}

// full says whether the sandbox user was at its limit: the kernel refuses a fork of a
// user with limit tasks (copy_process's RLIMIT_NPROC check). A reaped command counts as
// the one it was when it exited: it held a slot until then.
func (l procLimit) full() bool {
	if !l.ok {
		return false
	}
	n := l.tasks
	if l.reaped {
		n++
	}
	return n >= l.limit
}

// String is the evidence: what was counted, against which limit.
func (l procLimit) String() string {
	if l.reaped {
		return fmt.Sprintf("the sandbox at its process limit (RLIMIT_NPROC %d): %d processes and threads of uid %d still running in /proc when it was reaped, with it %d",
			l.limit, l.tasks, l.uid, l.tasks+1)
	}
	return fmt.Sprintf("the sandbox at its process limit (RLIMIT_NPROC %d): %d processes and threads of uid %d running in /proc",
		l.limit, l.tasks, l.uid)
}

// processLimit counts the sandbox user's tasks against RLIMIT_NPROC, for a command that
// ended with an error or is about to be killed at its timeout. The kernel counts no
// fork that RLIMIT_NPROC refuses, so this count, taken as the command ends, is the
// evidence there is: a command that failed while its sandbox had no slot left for
// another process. It is a sample, not the kernel's own counter: it may miss a limit
// reached and let go before the command ended, never report one that was not reached.
// A program of another uid would be missed too (the kernel counts per uid, and the
// sandbox's uid is its own unless the caller chose a shared one), so a shared uid makes
// it say less, never more.
func (s *Server) processLimit(reaped bool) procLimit {
	if s.uid == 0 {
		return procLimit{}
	}
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NPROC, &rl); err != nil || rl.Cur == unix.RLIM_INFINITY || rl.Cur == 0 {
		return procLimit{}
	}
	tasks, ok := tasksOf(s.uid)
	if !ok {
		return procLimit{}
	}
	return procLimit{ok: true, tasks: tasks, limit: int(rl.Cur), uid: s.uid, reaped: reaped}
}

// tasksOf counts the tasks whose real uid is uid, zombies included (the kernel counts a
// task against its user's RLIMIT_NPROC until it is reaped): each process's Threads from
// /proc/PID/status. ok is false when /proc cannot be read.
func tasksOf(uid int) (int, bool) {
	d, err := os.Open("/proc")
	if err != nil {
		return 0, false
	}
	defer d.Close()
	names, err := d.Readdirnames(-1)
	if err != nil {
		return 0, false
	}
	want := strconv.Itoa(uid)
	n := 0
	for _, name := range names {
		if name[0] < '0' || name[0] > '9' {
			continue
		}
		b, err := os.ReadFile("/proc/" + name + "/status")
		if err != nil {
			continue // gone meanwhile
		}
		real, threads := "", 1
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "Uid:"); ok {
				if f := strings.Fields(v); len(f) > 0 {
					real = f[0]
				}
			} else if v, ok := strings.CutPrefix(line, "Threads:"); ok {
				if t, err := strconv.Atoi(strings.TrimSpace(v)); err == nil && t > 0 {
					threads = t
				}
			}
		}
		if real == want {
			n += threads
		}
	}
	return n, true
}
