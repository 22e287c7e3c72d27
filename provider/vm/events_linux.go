package vm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/roche-sandbox/roche/provider/kit"
	"github.com/roche-sandbox/roche/provider/vm/supervisor"
)

var _ kit.Watcher = (*Provider)(nil)

// A VM's supervisor (supervisor.Main) records how its hypervisor ended beside the VM's
// directory (supervisor.EndedPath) before it removes the directory and exits. The
// process that made or found the VM watches the supervisor's exit on a pidfd, in Go's
// poller (no thread per VM), reads that record and tells its watchers (Watch).

// Watch streams the events of the VMs this process made or found: kit.EventDied when a
// VM's supervisor exits, with what its record says of the end (the hypervisor killed by
// a signal, the guest powered off, the guest kernel's panic, an OOM kill of roche-agent,
// which also sends kit.EventOOM first). The hypervisor's exit status is not the
// sandbox's main process's, so none is given as such; it is in the evidence. A VM
// saved to disk (paused) has not ended and sends nothing. Nothing is missed by a lost
// connection, so there is no resync.
func (p *Provider) Watch(ctx context.Context) (<-chan kit.SandboxEvent, error) {
	return p.events.Watch(ctx)
}

// emit tells every watcher of ev; a watcher whose channel is full misses it (the
// daemon's reconciliation still finds the sandbox gone).
func (p *Provider) emit(ev kit.SandboxEvent) {
	ev.Provider = p.Name()
	if p.events.Send(ev) > 0 {
		p.log.Warn("a watcher of sandbox events is behind: dropping an event", "id", ev.ID, "kind", ev.Kind)
	}
}

// watchEnd starts watching the supervisor of sandbox s, once per supervisor and process.
func (p *Provider) watchEnd(s *sandbox) {
	pid := readPID(filepath.Join(s.Dir, supervisor.PIDFile))
	if pid <= 0 {
		return
	}
	p.mu.Lock()
	if p.endWatches == nil {
		p.endWatches = map[string]int{}
	}
	if p.endWatches[s.ID] == pid {
		p.mu.Unlock()
		return
	}
	p.endWatches[s.ID] = pid
	p.mu.Unlock()
	unwatch := func() {
		p.mu.Lock()
		if p.endWatches[s.ID] == pid {
			delete(p.endWatches, s.ID)
		}
		p.mu.Unlock()
	}
	fd, err := unix.PidfdOpen(pid, unix.PIDFD_NONBLOCK)
	if err != nil {
		unwatch() // gone already: List finds it so, and removes what is left
		return
	}
	// The pid may have been reused before the pidfd was opened: it must still be this
	// VM's supervisor.
	if !isOurProcess(pid, s.Dir, supervisor.Subcommand) {
		unix.Close(fd)
		unwatch()
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
	if p.endClosed {
		p.mu.Unlock()
		f.Close()
		return
	}
	if p.endFiles == nil {
		p.endFiles = map[*os.File]struct{}{}
	}
	p.endFiles[f] = struct{}{}
	p.mu.Unlock()
	go func() {
		defer func() {
			p.mu.Lock()
			delete(p.endFiles, f)
			p.mu.Unlock()
		}()
		defer unwatch()
		defer f.Close()
		// A pidfd reads as ready once its process has exited.
		err := rc.Read(func(fd uintptr) bool {
			n, _ := unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, 0)
			return n > 0
		})
		if err != nil {
			return
		}
		p.supervisorExited(s.ID, s.Dir, s.Hypervisor, pid)
	}()
}

// stopEndWatches ends every watch of a supervisor (Close): closing its pidfd ends the
// wait with an error, and nothing is sent.
func (p *Provider) stopEndWatches() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.endClosed = true
	for f := range p.endFiles {
		f.Close()
	}
}

// supervisorExited tells watchers how the VM of directory dir ended, from its
// supervisor's record, and removes the record.
func (p *Provider) supervisorExited(id, dir, hypervisor string, pid int) {
	if _, err := os.Stat(filepath.Join(dir, supervisor.SuspendedFile)); err == nil {
		return // saved to disk: paused, not ended
	}
	p.proxies.Stop(dir) // ended: nothing is left to relay for
	path := supervisor.EndedPath(dir)
	b, err := os.ReadFile(path)
	_ = os.Remove(path)
	var rec *supervisor.Ended
	if err == nil {
		var r supervisor.Ended
		if json.Unmarshal(b, &r) == nil {
			rec = &r
		}
	}
	for _, ev := range endEvents(id, hypervisor, pid, rec, time.Now()) {
		p.emit(ev)
	}
}

// endEvents are the events that tell of a VM's end from its supervisor's record (nil
// when the supervisor left none, killed itself). A guest out of memory as a whole, or
// whose roche-agent the OOM killer took, sends kit.EventOOM first: the guest kernel
// panics when it runs out of memory with nothing it may kill (roche-agent is its PID 1,
// which the OOM killer spares), and says so on the console.
func endEvents(id, hypervisor string, pid int, rec *supervisor.Ended, now time.Time) []kit.SandboxEvent {
	died := kit.SandboxEvent{ID: id, Kind: kit.EventDied, Time: now}
	if rec == nil {
		died.Evidence = fmt.Sprintf("the VM's supervisor (pid %d) exited without recording how %s ended: it was killed (its hypervisor dies with it)", pid, hypervisor)
		return []kit.SandboxEvent{died}
	}
	died.Time = time.UnixMilli(rec.AtUnixMS)
	died.Evidence = endEvidence(hypervisor, *rec)
	var evs []kit.SandboxEvent
	if rec.Stopped == "" && (strings.Contains(rec.Panic, "Out of memory") || strings.Contains(rec.OOM, "(roche-agent)")) {
		why := rec.Panic
		if why == "" {
			why = rec.OOM
		}
		evs = append(evs, kit.SandboxEvent{ID: id, Kind: kit.EventOOM, Time: died.Time, Evidence: "the guest kernel's console: " + why})
	}
	return append(evs, died)
}

// watchedEvents reports whether anyone watches events.
func (p *Provider) watchedEvents() bool { return p.events.Watched() }

// endEvidence says in words what the supervisor's record says of the VM's end.
func endEvidence(hypervisor string, r supervisor.Ended) string {
	var s string
	switch {
	case r.Stopped != "":
		s = fmt.Sprintf("its supervisor %s, which stopped %s (pid %d)", r.Stopped, hypervisor, r.HypervisorPID)
	case r.Signal != 0:
		s = fmt.Sprintf("%s (pid %d) was killed by signal %d (%s) from outside the VM; the guest said nothing of it",
			hypervisor, r.HypervisorPID, r.Signal, unix.SignalName(syscall.Signal(r.Signal)))
	case r.ExitKnown && r.ExitCode == 0 && r.Panic != "":
		s = fmt.Sprintf("%s (pid %d) exited with status 0 after the guest kernel panicked: %q", hypervisor, r.HypervisorPID, r.Panic)
	case r.ExitKnown && r.ExitCode == 0:
		s = fmt.Sprintf("%s (pid %d) exited with status 0: the guest powered off or rebooted", hypervisor, r.HypervisorPID)
	default:
		s = fmt.Sprintf("%s (pid %d): %s", hypervisor, r.HypervisorPID, r.Exit)
	}
	if r.OOM != "" {
		s += fmt.Sprintf("; the guest kernel's last OOM kill: %q", r.OOM)
	}
	return s
}

// removeStaleEnds removes end records nobody read (no process watched the VM) once
// they are older than maxAge.
func (p *Provider) removeStaleEnds(maxAge time.Duration) {
	names, err := filepath.Glob(filepath.Join(p.stateDir, ".*.ended.json"))
	if err != nil {
		return
	}
	for _, n := range names {
		if fi, err := os.Stat(n); err == nil && time.Since(fi.ModTime()) > maxAge {
			if err := os.Remove(n); err != nil && !errors.Is(err, os.ErrNotExist) {
				p.log.Warn("removing a VM's end record", "path", n, "err", err)
			}
		}
	}
}
