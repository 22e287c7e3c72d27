package oci

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/roche-sandbox/roche/provider/kit"
)

// An oci sandbox has no daemon of its own (no dockerd, no conmon): when its roche-agent,
// PID 1, exits (its lifetime over, killed, out of memory) the runtime stops the
// container, but its directory, cgroups, overlay mounts and, for a writable root, the
// loop device under its disk stay until something removes them. The process that made or
// found the sandbox watches its PID 1 on a pidfd, in Go's poller (no thread per
// sandbox), and tears it down as soon as it exits. roched lives as long as its sandboxes,
// so under roched a sandbox is gone within moments of its end; one made by a process that
// has since exited is cleared by the next create, list or gc, by any process.

// watchExit starts watching sandbox s's PID 1, once per sandbox and process.
func (p *Provider) watchExit(s *sandbox) {
	p.mu.Lock()
	if p.exitWatches == nil {
		p.exitWatches = map[string]*os.File{}
	}
	if _, ok := p.exitWatches[s.ID]; ok || p.exitClosed {
		p.mu.Unlock()
		return
	}
	p.exitWatches[s.ID] = nil // claimed: no second watch starts meanwhile
	p.mu.Unlock()
	unwatch := func() {
		p.mu.Lock()
		delete(p.exitWatches, s.ID)
		delete(p.exitTornDown, s.ID)
		p.mu.Unlock()
	}
	pid := readPid(filepath.Join(s.dir, "pid"))
	if pid <= 0 {
		unwatch()
		return
	}
	fd, err := unix.PidfdOpen(pid, unix.PIDFD_NONBLOCK)
	if err != nil {
		p.mu.Lock()
		gone := err == unix.ESRCH && !p.exitClosed
		if gone {
			p.exitWaits.Add(1)
		}
		p.mu.Unlock()
		if !gone {
			unwatch()
			return
		}
		go func() {
			defer p.exitWaits.Done()
			defer unwatch() // after: exited loads the sandbox, which must not watch it again
			p.exited(s.ID)  // it exited before the watch began
		}()
		return
	}
	f := os.NewFile(uintptr(fd), "pidfd")
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		unwatch()
		return
	}
	p.mu.Lock()
	if p.exitClosed {
		p.mu.Unlock()
		f.Close()
		return
	}
	p.exitWatches[s.ID] = f
	p.exitWaits.Add(1)
	p.mu.Unlock()
	go func() {
		defer p.exitWaits.Done()
		// While anyone watches events (Watch), the sandbox cgroup's OOM-kill counter is
		// read every oomPoll, so that an OOM kill is told with the time it was seen.
		ooms, counted := oomKills(s.ID)
		p.mu.Lock()
		if p.oomSeen == nil {
			p.oomSeen = map[string]int64{}
		}
		p.oomSeen[s.ID] = ooms
		p.mu.Unlock()
		var err error
		for {
			if p.watched() && counted {
				_ = f.SetReadDeadline(time.Now().Add(oomPoll))
			}
			// A pidfd reads as ready once its process has exited. Read calls the function
			// at once, then each time the poller says the pidfd is ready, until it returns
			// true; closing the file (Close) ends the wait with an error.
			err = rc.Read(func(fd uintptr) bool {
				n, _ := unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, 0)
				return n > 0
			})
			if counted {
				p.sawOOMs(s.ID)
			}
			if !errors.Is(err, os.ErrDeadlineExceeded) {
				break
			}
		}
		defer unwatch() // after: exited loads the sandbox, which must not watch it again
		f.Close()
		if err != nil { // closed: no exit to tell
			p.mu.Lock()
			delete(p.oomSeen, s.ID)
			p.mu.Unlock()
		}
		if err == nil {
			p.died(s.ID)
			p.mu.Lock()
			tornDown := p.exitTornDown[s.ID]
			p.mu.Unlock()
			if !tornDown {
				p.exited(s.ID)
			}
		}
	}()
}

// exited tears down sandbox id, whose PID 1 exited, unless its runtime says its
// container still runs (a pid reused, which the pidfd cannot be) or it is gone already
// (a destroy, which the watch saw as the exit it caused).
func (p *Provider) exited(id string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := p.load(id)
	if err != nil {
		return
	}
	rt, err := p.runtimeOf(ctx, s)
	if err != nil {
		return
	}
	if st, known := rt.state(ctx, s.ID); known && st.Status != "stopped" {
		return
	}
	p.log.Info("sandbox ended (its roche-agent exited): tearing it down", "id", id)
	if err := p.teardown(ctx, rt, s); err != nil {
		p.log.Warn("tearing down an ended sandbox (the next create, list or gc retries)", "id", id, "err", err)
	}
}

// unwatchExit ends the watch of sandbox id's PID 1 without a teardown: the caller is
// tearing the sandbox down itself, and the exit its destroy causes would otherwise start
// a second teardown (one more run of the runtime to ask the container's state, one more
// delete), which Close, and so a one-shot roche run, waits for.
//
// While anyone watches events (Watch) the watch goes on to the exit, which it tells them
// of with its OOM kills (a destroy of a sandbox that had just died, its connection's
// end seen before the exit: the exit says why it died), and only the teardown is left
// out; otherwise it ends at once.
func (p *Provider) unwatchExit(id string) {
	watched := p.watched()
	p.mu.Lock()
	defer p.mu.Unlock()
	f := p.exitWatches[id]
	if f == nil {
		return
	}
	if watched {
		if p.exitTornDown == nil {
			p.exitTornDown = map[string]bool{}
		}
		p.exitTornDown[id] = true
		return
	}
	f.Close()
}

// killWatched sends SIGKILL to sandbox id's PID 1 through the exit watch's pidfd, if
// this process watches it: a teardown does so first, so that the kernel is already
// taking the sandbox's processes down while the runtime starts (its run costs a few
// milliseconds before it sends its own kill and waits for them), instead of after. A
// pidfd names that one process, never one that reused its pid; a PID 1 that has
// exited already (or a watch that has just ended) makes it a no-op. The runtime's
// delete still kills and waits for whatever is left, as before.
func (p *Provider) killWatched(id string) {
	p.mu.Lock()
	f := p.exitWatches[id]
	if f != nil {
		// The exit this kill causes is the teardown's, not one to tear down again: marked
		// before the kill, since the watch may see the exit before unwatchExit runs.
		if p.exitTornDown == nil {
			p.exitTornDown = map[string]bool{}
		}
		p.exitTornDown[id] = true
	}
	p.mu.Unlock()
	if f == nil {
		return
	}
	rc, err := f.SyscallConn()
	if err != nil {
		return
	}
	_ = rc.Control(func(fd uintptr) {
		_ = unix.PidfdSendSignal(int(fd), unix.SIGKILL, nil, 0)
	})
}

// stopExitWatches ends every watch (Close) and waits for the teardowns under way.
func (p *Provider) stopExitWatches() {
	p.mu.Lock()
	p.exitClosed = true
	for _, f := range p.exitWatches {
		if f != nil {
			f.Close()
		}
	}
	p.mu.Unlock()
	p.exitWaits.Wait()
}

// sawOOMs reads sandbox id's OOM-kill counter and tells watchers of an OOM kill when it
// grew past the count last seen. Only a sandbox whose PID 1 is watched is read.
func (p *Provider) sawOOMs(id string) {
	p.oomTell.Lock()
	defer p.oomTell.Unlock()
	p.sawOOMsLocked(id)
}

func (p *Provider) sawOOMsLocked(id string) {
	p.mu.Lock()
	last, watched := p.oomSeen[id]
	p.mu.Unlock()
	if !watched {
		return
	}
	n, ok := oomKills(id)
	if !ok || n <= last {
		return
	}
	p.mu.Lock()
	if _, still := p.oomSeen[id]; still {
		p.oomSeen[id] = n
	}
	p.mu.Unlock()
	p.emit(kit.SandboxEvent{ID: id, Kind: kit.EventOOM, Time: time.Now()})
}

// sawOOMsBeforeTeardown reads sandbox id's OOM-kill counter, while watchers want it,
// before a teardown removes its cgroup. A sandbox whose roche-agent the OOM killer took
// is often torn down before its PID 1's exit is seen: the agent's connection breaks at
// once, and a caller (roched, finding the sandbox stopped under a command) destroys it,
// while PID 1 is still waiting for the rest of its PID namespace to die, and its pidfd
// reads as ready only after that. By then the cgroup, and the count in it, may be gone
// (it empties as soon as its last process has left, before PID 1's exit is told). The
// kernel counts an OOM kill before it sends the SIGKILL, so this read, after the death
// that made the caller tear down, sees it.
func (p *Provider) sawOOMsBeforeTeardown(id string) {
	if p.watched() {
		p.sawOOMs(id)
	}
}

// died tells watchers that sandbox id's PID 1 exited, after any OOM kill its cgroup
// counted since last seen, once per sandbox.
func (p *Provider) died(id string) {
	p.oomTell.Lock()
	defer p.oomTell.Unlock()
	p.sawOOMsLocked(id)
	p.mu.Lock()
	_, once := p.oomSeen[id]
	delete(p.oomSeen, id)
	p.mu.Unlock()
	if once {
		p.emit(kit.SandboxEvent{ID: id, Kind: kit.EventDied, Time: time.Now()})
	}
}

// oomKills reads the OOM-kill counter of sandbox id's cgroup: memory.events (cgroup v2)
// or memory.oom_control (v1), its oom_kill line; ok false when neither is readable.
func oomKills(id string) (int64, bool) {
	name := strings.TrimPrefix(cgroupOf(id), "/")
	for _, f := range []string{filepath.Join("/sys/fs/cgroup", name, "memory.events"),
		filepath.Join("/sys/fs/cgroup/memory", name, "memory.oom_control")} {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "oom_kill "); ok {
				n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
				return n, err == nil
			}
		}
	}
	return 0, false
}

// pidGone reports whether no process pid exists (a pid reused since reads as alive).
func pidGone(pid int) bool { return unix.Kill(pid, 0) == unix.ESRCH }
