package docker

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/provider/internal/statedir"
)

// Each sandbox has a directory of its own on the host, under a directory of its
// engine's own; its sockets are in a subdirectory, the one bind-mounted into the
// container:
//
//	STATEDIR/engine-HASH/roche-NAME/run/agent.sock (and egress.sock)
//	STATEDIR/engine-HASH/roche-NAME/claim.json, expires, start_by, egress-*
//
// where HASH names the engine's address. What the host keeps for the sandbox (its
// claim, which may hold its holder's environment; its end; its egress CA's certificate
// and its secrets' placeholders) is beside run/, never in it: run/ belongs to the host
// user, and a sandbox whose user is root has that uid (roched's, as a rule) inside, so
// it could read and forge files there, or replace them by symlinks the host's next write
// follows (TestRootSandboxCannotReachHostFiles). A sandbox that ends while nobody of ours
// watches (its lifetime, its lease) is removed by the engine, which knows nothing of
// the directory, so creates and gc sweep the directories whose container their engine
// no longer lists. Every engine on a host shares the default state directory: keyed by
// engine, a sweep reads only the directories its own engine's sandboxes were given and
// never takes another engine's live sandboxes for gone ones.
const (
	engineDirPrefix = "engine-"
	agentDirPrefix  = "roche-"
	// startByFile, in a sandbox's directory, holds when (unix seconds) the create that
	// made it gives up: until then its container may not exist yet, whatever the
	// sweeping process's own engine timeout.
	startByFile = "start_by"
	// runSubdir is the subdirectory bound into the sandbox, holding its sockets only.
	runSubdir = "run"
	// newDirSlack is how long a directory being made (".new-NAME") may take before a
	// sweep takes it for one whose maker died.
	newDirSlack = 10 * time.Minute
)

// agentRootOf is the directory of the engine at host under stateDir.
func agentRootOf(stateDir, host string) string {
	sum := sha256.Sum256([]byte(host))
	return filepath.Join(stateDir, engineDirPrefix+hex.EncodeToString(sum[:6]))
}

// makeAgentDir makes the socket directory of the sandbox name, recording when the
// create (ctx) gives up: its deadline, and at most two of this provider's engine
// timeouts from now, which bound the engine call that makes the container (a create
// without a deadline otherwise had only the sweeping process's own slack, which a
// process with a short engine timeout made short enough to take a directory from a
// create under way). The directory is made under a name no sweep reads, its record
// written, then renamed into place: a sweep never sees it without its record.
func (p *Provider) makeAgentDir(ctx context.Context, name string) (string, error) {
	// Nobody but this user (and root) may own or write the directories above the
	// sockets: whoever could would answer in the agent's place.
	if err := statedir.Make(p.agentRoot); err != nil {
		return "", err
	}
	dir := filepath.Join(p.agentRoot, name)
	tmp := filepath.Join(p.agentRoot, ".new-"+name)
	// 0700: only the host user reaches the socket; inside, the directory belongs to a
	// uid the sandbox user is not, so sandboxed code cannot reach the agent.
	if err := os.Mkdir(tmp, 0o700); err != nil {
		return "", fmt.Errorf("%w: making the agent's socket directory: %v", roche.ErrUnavailable, err)
	}
	if err := os.Mkdir(filepath.Join(tmp, runSubdir), 0o700); err != nil {
		os.RemoveAll(tmp)
		return "", fmt.Errorf("%w: making the agent's socket directory: %v", roche.ErrUnavailable, err)
	}
	by := time.Now().Add(2 * p.engineTimeout)
	if deadline, ok := ctx.Deadline(); ok && deadline.Before(by) {
		by = deadline
	}
	err := os.WriteFile(filepath.Join(tmp, startByFile), []byte(strconv.FormatInt(by.Unix()+1, 10)), 0o600)
	if err == nil {
		err = os.Rename(tmp, dir)
	}
	if err != nil {
		os.RemoveAll(tmp)
		return "", fmt.Errorf("%w: making the agent's socket directory: %v", roche.ErrUnavailable, err)
	}
	return dir, nil
}

// runDirOf is the directory of a sandbox's sockets, the one bound into it, for the
// sandbox directory dir. A container made before the sockets had a subdirectory of their
// own (its labels lack LabelRunDir) has them in dir itself.
func runDirOf(dir string, labels map[string]string) string {
	if dir == "" || labels[LabelRunDir] != runSubdir {
		return dir
	}
	return filepath.Join(dir, runSubdir)
}

// removeAgentDir removes a sandbox's socket directory, if it is one of this engine's.
func (p *Provider) removeAgentDir(dir string) {
	if dir == "" || filepath.Dir(dir) != p.agentRoot || !strings.HasPrefix(filepath.Base(dir), agentDirPrefix) {
		return
	}
	p.stopEgress(dir)
	if err := os.RemoveAll(dir); err != nil {
		p.log.Warn("removing the agent's socket directory", "dir", dir, "err", err)
	}
}

// sweepAgentDirs removes socket directories whose container is gone: a sandbox that
// reached the end of its lifetime is removed by the engine, which knows nothing of them.
func (p *Provider) sweepAgentDirs(ctx context.Context) (err error) {
	ctx, done := p.bound(ctx, "listing sandboxes")
	defer done(&err)
	cs, err := p.containers(ctx, container.ListOptions{All: true, Filters: filters.NewArgs(filters.Arg("label", LabelManaged+"=true"))})
	if err != nil {
		return p.engineErr("listing sandboxes", err)
	}
	p.sweepAgentDirsOf(cs)
	return nil
}

// sweepAgentDirsOf removes the socket directories of this engine that none of cs, every
// Roche container on the engine, carries, and whose create has given up.
func (p *Provider) sweepAgentDirsOf(cs []container.Summary) {
	entries, err := os.ReadDir(p.agentRoot)
	if err != nil {
		return
	}
	live := map[string]bool{}
	for _, c := range cs {
		live[c.Labels[LabelAgentDir]] = true
	}
	for _, e := range entries {
		dir := filepath.Join(p.agentRoot, e.Name())
		if strings.HasPrefix(e.Name(), ".new-") {
			// A directory its maker never renamed into place: the maker died in between.
			if fi, err := e.Info(); err == nil && time.Since(fi.ModTime()) > newDirSlack {
				os.RemoveAll(dir)
			}
			continue
		}
		if !e.IsDir() || !strings.HasPrefix(e.Name(), agentDirPrefix) || live[dir] || creating(dir, e, 2*p.engineTimeout) {
			continue
		}
		p.removeAgentDir(dir)
	}
}

// startPending reports whether the create that made dir may still be making a
// container for it: its startByFile is there and its time has not come. A create
// removes the file once its container carries the directory (settled), so a container
// drawn again for another uid, which carried the directory before it was removed, does
// not take the directory from the one made next (an event watcher in any process
// removes the directory of a container destroyed).
func startPending(dir string) bool {
	b, err := os.ReadFile(filepath.Join(dir, startByFile))
	if err != nil {
		return false
	}
	by, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	return err == nil && time.Now().Before(time.Unix(by, 0))
}

// settleAgentDir marks dir's create as past the point where its container may not exist.
func settleAgentDir(dir string) {
	if dir != "" {
		os.Remove(filepath.Join(dir, startByFile))
	}
}

// creating reports whether a create (here or in another process, with an engine timeout
// of its own) may still be making the container of the directory: it makes the
// directory first. Its startByFile says until when; a directory without one is given
// slack after it last changed.
func creating(dir string, e os.DirEntry, slack time.Duration) bool {
	if startPending(dir) {
		return true
	}
	fi, err := e.Info()
	return err == nil && time.Since(fi.ModTime()) < slack
}

// writeNew writes b to a file made at path (mode 0600), after removing what was there,
// following no symlink: the temporary half of an atomic write in a sandbox's directory.
// (A sandbox made before run/ existed can write in its directory.)
func writeNew(path string, b []byte) error {
	_ = os.Remove(path)
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(b)
	return errors.Join(err, f.Close())
}
