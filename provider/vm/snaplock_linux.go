package vm

import (
	"errors"
	"os"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// A snapshot directory ("snap-..." under memRoot: a pool's template, or the snapshot a
// fork of a running VM is made from) belongs to the process using it, which holds a
// shared flock on it for as long as it does. The kernel lets go of the lock when that
// process ends, however it ends, so List removes the directories nobody holds: those of
// a roched killed with its pools' templates, or mid-fork. A directory younger than
// staleSnap is left alone, as its maker may not hold it yet.
const staleSnap = time.Minute

// snapLocks are the snapshot directories this provider holds.
type snapLocks struct {
	mu   sync.Mutex
	held map[string]*os.File
}

// lockSnap holds snapshot directory id (made by makeMemDir) until unlockSnap.
func (p *Provider) lockSnap(id string) error {
	f, err := os.Open(p.memDir(id))
	if err != nil {
		return err
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_SH); err != nil {
		f.Close()
		return err
	}
	p.snaps.mu.Lock()
	defer p.snaps.mu.Unlock()
	if p.snaps.held == nil {
		p.snaps.held = map[string]*os.File{}
	}
	if old := p.snaps.held[id]; old != nil {
		old.Close()
	}
	p.snaps.held[id] = f
	return nil
}

// unlockSnap lets go of snapshot directory id, if held.
func (p *Provider) unlockSnap(id string) {
	p.snaps.mu.Lock()
	f := p.snaps.held[id]
	delete(p.snaps.held, id)
	p.snaps.mu.Unlock()
	if f != nil {
		f.Close()
	}
}

// sweepSnaps removes the snapshot directories under memRoot that no process holds and
// that are older than staleSnap.
func (p *Provider) sweepSnaps() {
	entries, err := os.ReadDir(p.memRoot())
	if err != nil {
		return
	}
	for _, e := range entries {
		id := e.Name()
		if !e.IsDir() || !strings.HasPrefix(id, "snap-") || strings.ContainsAny(id, `/\.`) {
			continue
		}
		if fi, err := e.Info(); err != nil || time.Since(fi.ModTime()) < staleSnap {
			continue
		}
		f, err := os.Open(p.memDir(id))
		if err != nil {
			continue
		}
		err = unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			p.log.Info("removing a snapshot nobody holds (its maker ended)", "dir", p.memDir(id))
			p.removeMemDir(id)
		} else if !errors.Is(err, unix.EWOULDBLOCK) {
			p.log.Warn("checking a snapshot directory", "dir", p.memDir(id), "err", err)
		}
		f.Close()
	}
}
