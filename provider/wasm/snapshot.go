package wasm

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"

	"github.com/roche-sandbox/roche"
)

const snapshotMeta = "snapshot.json"

func (p *Provider) snapshotDir(name string) string {
	return filepath.Join(p.dataDir, snapshotsDir, name)
}

// existingSnapshot returns snapshot name's directory, or ErrNotFound.
func (p *Provider) existingSnapshot(name string) (string, error) {
	dir := p.snapshotDir(name)
	if fi, err := os.Stat(filepath.Join(dir, rootDir)); err != nil || !fi.IsDir() {
		return "", fmt.Errorf("%w: no wasm snapshot %s (roche snapshot list --provider wasm shows them)", roche.ErrNotFound, name)
	}
	return dir, nil
}

// Snapshot implements roche.Snapshotter: the sandbox's own files, its root directory
// with /tmp and (unless it has a named workspace, which persists on its own) /workspace,
// are copied under the data directory. Host mounts are not part of it. A program running
// meanwhile may change files as they are copied: snapshot between execs.
func (p *Provider) Snapshot(ctx context.Context, id, name string) (roche.Snapshot, error) {
	if !roche.ValidWorkspaceName(name) {
		return roche.Snapshot{}, fmt.Errorf("%w: snapshot name %q: use letters, digits, '_', '.' and '-', starting with a letter or digit, at most 64 characters", roche.ErrInvalidConfig, name)
	}
	rec, err := p.lookup(id)
	if err != nil {
		return roche.Snapshot{}, err
	}
	parent, err := p.dataPath(snapshotsDir)
	if err != nil {
		return roche.Snapshot{}, err
	}
	exists := fmt.Errorf("%w: snapshot %s exists: remove it first (roche snapshot rm --provider wasm %s)", roche.ErrInvalidConfig, name, name)
	final := filepath.Join(parent, name)
	if _, err := os.Lstat(final); err == nil {
		return roche.Snapshot{}, exists
	}
	base := rec.Config.Image
	if rec.Config.FromSnapshot != "" {
		base = rec.Config.FromSnapshot + " (snapshot)"
	}
	snap := roche.Snapshot{Name: name, Provider: p.Name(), Image: base, CreatedAt: time.Now().UTC()}

	partial, err := os.MkdirTemp(parent, partialPrefix)
	if err != nil {
		return roche.Snapshot{}, fmt.Errorf("%w: snapshot %s: %v", roche.ErrUnavailable, name, err)
	}
	done := false
	defer func() {
		if !done {
			_ = removeAll(partial)
		}
	}()
	if err := copySandboxRoot(ctx, p.sandboxDir(id), partial, rec.Config.Workspace != ""); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			if _, lerr := p.lookup(id); lerr != nil {
				return roche.Snapshot{}, lerr // destroyed meanwhile
			}
		}
		return roche.Snapshot{}, fmt.Errorf("snapshot of wasm sandbox %s: %w", id, err)
	}
	if err := writeJSON(filepath.Join(partial, snapshotMeta), snap); err != nil {
		return roche.Snapshot{}, fmt.Errorf("%w: snapshot %s: %v", roche.ErrUnavailable, name, err)
	}
	// The rename is what makes the snapshot exist; it fails if another was made meanwhile.
	if err := os.Rename(partial, final); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return roche.Snapshot{}, exists
		}
		return roche.Snapshot{}, fmt.Errorf("%w: snapshot %s: %v", roche.ErrUnavailable, name, err)
	}
	done = true
	p.log.Debug("wasm: snapshot taken", "sandbox", id, "name", name)
	return snap, nil
}

// copySandboxRoot copies fromDir's root/ to toDir's root/, which must not exist; each is
// a sandbox's or a snapshot's directory. With hollowWorkspace, root/workspace is made but
// left empty: a named workspace is mounted there, and persists on its own.
func copySandboxRoot(ctx context.Context, fromDir, toDir string, hollowWorkspace bool) error {
	from, err := os.OpenRoot(fromDir)
	if err != nil {
		return err
	}
	defer from.Close()
	to, err := os.OpenRoot(toDir)
	if err != nil {
		return err
	}
	defer to.Close()
	var hollow string
	if hollowWorkspace {
		hollow = path.Join(rootDir, strings.TrimPrefix(GuestWorkspace, "/"))
	}
	return copyTree(ctx, from, to, rootDir, hollow)
}

// copyTree copies rel from one host directory to the same place in another, refusing
// symbolic links and special files as the rest of the provider does (a sandbox's own
// directories hold neither unless someone on the host put them there). Permissions are
// kept, less setuid bits and plus the owner's read and write (and search), so that the
// copy can be copied and removed in turn; so are modification times. The directory
// hollow, if any, is made but its contents are not copied.
func copyTree(ctx context.Context, from, to *os.Root, rel, hollow string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	fi, err := from.Lstat(rel)
	if err != nil {
		return err
	}
	switch {
	case fi.Mode().IsRegular():
		if err := copyFile(ctx, from, to, rel, fi.Mode().Perm()|0o600); err != nil {
			return err
		}
	case fi.IsDir():
		if err := to.Mkdir(rel, 0o700); err != nil {
			return err
		}
		if rel != hollow {
			d, err := from.Open(rel)
			if err != nil {
				return err
			}
			entries, err := d.ReadDir(-1)
			d.Close()
			if err != nil {
				return err
			}
			for _, e := range entries {
				if err := copyTree(ctx, from, to, path.Join(rel, e.Name()), hollow); err != nil {
					return err
				}
			}
		}
		// Last, so that a directory the guest made read-only could be filled first.
		if err := to.Chmod(rel, fi.Mode().Perm()|0o700); err != nil {
			return err
		}
	case fi.Mode()&fs.ModeSymlink != 0:
		return fmt.Errorf("%w: %s is a symbolic link, and wasm sandboxes hold none", roche.ErrUnsupported, rel)
	default:
		return fmt.Errorf("%w: %s is neither a regular file nor a directory", roche.ErrUnsupported, rel)
	}
	return to.Chtimes(rel, fi.ModTime(), fi.ModTime())
}

func copyFile(ctx context.Context, from, to *os.Root, rel string, perm fs.FileMode) error {
	in, err := from.Open(rel)
	if err != nil {
		return err
	}
	defer in.Close()
	// What was opened is checked again, in case it changed since the Lstat.
	if fi, err := in.Stat(); err != nil || !fi.Mode().IsRegular() {
		return fmt.Errorf("%w: %s changed while it was copied", roche.ErrUnsupported, rel)
	}
	out, err := to.OpenFile(rel, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, ctxReader{ctx, in}); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// Snapshots implements roche.Snapshotter.
func (p *Provider) Snapshots(_ context.Context) ([]roche.Snapshot, error) {
	entries, err := os.ReadDir(filepath.Join(p.dataDir, snapshotsDir))
	if errors.Is(err, fs.ErrNotExist) {
		return []roche.Snapshot{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("%w: listing wasm snapshots: %v", roche.ErrUnavailable, err)
	}
	out := []roche.Snapshot{}
	for _, e := range entries {
		name := e.Name()
		if !e.IsDir() || !roche.ValidWorkspaceName(name) {
			continue
		}
		var snap roche.Snapshot
		if err := readJSON(filepath.Join(p.snapshotDir(name), snapshotMeta), &snap); err != nil {
			p.log.Warn("wasm: skipping unreadable snapshot", "name", name, "err", err)
			continue
		}
		snap.Name, snap.Provider = name, p.Name()
		out = append(out, snap)
	}
	return out, nil
}

// RemoveSnapshot implements roche.Snapshotter. A sandbox made from a snapshot has its own
// copy of the files, but resetting it makes it again from the snapshot, so the snapshot
// stays while such a sandbox lives.
func (p *Provider) RemoveSnapshot(_ context.Context, name string) error {
	if !roche.ValidWorkspaceName(name) {
		return fmt.Errorf("%w: no snapshot %q", roche.ErrNotFound, name)
	}
	unlock, err := p.lockData()
	if err != nil {
		return err
	}
	defer unlock()
	users, err := p.users(func(c roche.Config) string { return c.FromSnapshot })
	if err != nil {
		return err
	}
	if ids := users[name]; len(ids) > 0 {
		return fmt.Errorf("%w: snapshot %s is what sandbox %s was made from (and would be reset to): destroy it first (roche destroy %s)",
			roche.ErrInUse, name, strings.Join(ids, ", "), strings.Join(ids, " "))
	}
	if _, err := os.Lstat(p.snapshotDir(name)); errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("%w: no wasm snapshot %s (roche snapshot list --provider wasm shows them)", roche.ErrNotFound, name)
	}
	return removeDataEntry(p.snapshotDir(name), "snapshot "+name)
}
