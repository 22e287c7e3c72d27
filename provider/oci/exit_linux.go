package oci

import (
	"context"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"
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
		// A pidfd reads as ready once its process has exited. Read calls the function at
		// once, then each time the poller says the pidfd is ready, until it returns true;
		// closing the file (Close) ends the wait with an error.
		err := rc.Read(func(fd uintptr) bool {
			n, _ := unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, 0)
			return n > 0
		})
		defer unwatch() // after: exited loads the sandbox, which must not watch it again
		f.Close()
		if err == nil {
			p.exited(s.ID)
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
func (p *Provider) unwatchExit(id string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if f := p.exitWatches[id]; f != nil {
		f.Close()
	}
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
