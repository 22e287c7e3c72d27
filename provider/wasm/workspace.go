package wasm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/internal/size"
	"github.com/roche-sandbox/roche/provider/kit"
)

// The data directory (WithDataDir) holds what outlives sandboxes:
//
//	workspaces/NAME/workspace.json   when it was made
//	workspaces/NAME/files/           mounted at /workspace
//	snapshots/NAME/snapshot.json     the roche.Snapshot
//	snapshots/NAME/root/             the sandbox's root directory as it was
//	.lock                            see lockData
//
// Entries are made under a partialPrefix name and renamed into place, and removed by
// renaming them to a trashPrefix name first, so that no one ever sees half of one; names
// starting with '.' are never valid workspace or snapshot names.
const (
	dataSubdir    = "data" // of the state directory, when WithStateDir names it
	workspacesDir = "workspaces"
	snapshotsDir  = "snapshots"
	workspaceMeta = "workspace.json"
	workspaceData = "files"
	lockName      = ".lock"
	partialPrefix = ".partial-"
	trashPrefix   = ".trash-"
)

// workspaceRecord is a workspace's workspace.json.
type workspaceRecord struct {
	Name      string    `json:"name"`
	CreatedAt time.Time `json:"created_at"`
	// SizeBytes is what its files may hold, fixed when it is made; 0 in a workspace made
	// before workspaces had sizes, which has the default size.
	SizeBytes int64 `json:"size_bytes,omitempty"`
}

// size is what the workspace may hold.
func (r workspaceRecord) size() int64 {
	if r.SizeBytes > 0 {
		return r.SizeBytes
	}
	return kit.DefaultWorkspaceBytes
}

// workspaceSize reads what workspace name may hold.
func (p *Provider) workspaceSize(name string) (int64, error) {
	var rec workspaceRecord
	if err := readJSON(filepath.Join(p.workspaceDir(name), workspaceMeta), &rec); err != nil {
		return 0, fmt.Errorf("%w: workspace %s: %v: destroy the sandbox and create it again", roche.ErrNotFound, name, err)
	}
	return rec.size(), nil
}

func (p *Provider) workspaceDir(name string) string {
	return filepath.Join(p.dataDir, workspacesDir, name)
}

// workspaceFiles is the host directory mounted at /workspace for workspace name.
func (p *Provider) workspaceFiles(name string) string {
	return filepath.Join(p.workspaceDir(name), workspaceData)
}

// dataPath returns sub (a directory) of the data directory, making both as needed. The
// data directory must be the current user's alone, as the state directory must.
func (p *Provider) dataPath(sub string) (string, error) {
	if err := os.MkdirAll(p.dataDir, 0o700); err != nil {
		return "", fmt.Errorf("%w: creating wasm data directory %s: %v", roche.ErrUnavailable, p.dataDir, err)
	}
	if err := checkPrivateDir(p.dataDir); err != nil {
		return "", fmt.Errorf("%w: wasm data directory %s: %v; remove it or choose another with WithDataDir", roche.ErrUnavailable, p.dataDir, err)
	}
	dir := filepath.Join(p.dataDir, sub)
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return "", fmt.Errorf("%w: creating %s: %v", roche.ErrUnavailable, dir, err)
	}
	return dir, nil
}

// lockData serialises, across processes, what decides whether a workspace or snapshot
// is in use against what starts or stops using one: Create and Reset with a workspace or
// snapshot hold it until the sandbox's record is written, RemoveWorkspace and
// RemoveSnapshot while they look for users and take the files away. Without it a
// sandbox could be created on a workspace that a concurrent remove had already judged
// unused.
func (p *Provider) lockData() (func(), error) {
	if _, err := p.dataPath(""); err != nil {
		return nil, err
	}
	unlock, err := lockFile(filepath.Join(p.dataDir, lockName))
	if err != nil {
		return nil, fmt.Errorf("%w: locking wasm data directory %s: %v", roche.ErrUnavailable, p.dataDir, err)
	}
	return unlock, nil
}

// ensureWorkspace makes workspace name unless it exists, with want bytes (or the
// default size), and reports whether it made it. An existing workspace keeps the size it
// was made with: want, when given, must be that size. The caller holds the data lock.
func (p *Provider) ensureWorkspace(name string, want int64) (made bool, err error) {
	parent, err := p.dataPath(workspacesDir)
	if err != nil {
		return false, err
	}
	dir := filepath.Join(parent, name)
	if fi, err := os.Stat(filepath.Join(dir, workspaceData)); err == nil && fi.IsDir() {
		var rec workspaceRecord
		if err := readJSON(filepath.Join(dir, workspaceMeta), &rec); err != nil {
			return false, fmt.Errorf("%w: workspace %s: %v: remove it (roche workspace rm --provider wasm %s)", roche.ErrUnavailable, name, err, name)
		}
		if want != 0 && want != rec.size() {
			return false, fmt.Errorf("%w: workspace %s has a size of %s, fixed when it was made, and %s was asked for: leave the size out to use it as it is, or remove it (roche workspace rm %s) and make it again with the new size",
				roche.ErrInvalidConfig, name, size.String(rec.size()), size.String(want), name)
		}
		return false, nil
	}
	if want == 0 {
		want = kit.DefaultWorkspaceBytes
	}
	partial, err := os.MkdirTemp(parent, partialPrefix)
	if err != nil {
		return false, fmt.Errorf("%w: making workspace %s: %v", roche.ErrUnavailable, name, err)
	}
	err = os.Mkdir(filepath.Join(partial, workspaceData), 0o700)
	if err == nil {
		err = writeJSON(filepath.Join(partial, workspaceMeta), workspaceRecord{Name: name, CreatedAt: time.Now().UTC(), SizeBytes: want})
	}
	if err == nil {
		err = os.Rename(partial, dir)
	}
	if err != nil {
		_ = removeAll(partial)
		if errors.Is(err, fs.ErrExist) {
			return false, fmt.Errorf("%w: workspace %s at %s is damaged (it has no %s directory): remove that directory", roche.ErrUnavailable, name, dir, workspaceData)
		}
		return false, fmt.Errorf("%w: making workspace %s: %v", roche.ErrUnavailable, name, err)
	}
	return true, nil
}

// users maps each name that key picks out of a live sandbox's config (its workspace or
// its snapshot) to the sandboxes with that name, oldest first. The records on disk are
// read, so sandboxes of every process sharing the state directory count.
func (p *Provider) users(key func(roche.Config) string) (map[string][]string, error) {
	recs, err := p.records()
	if err != nil {
		return nil, err
	}
	users := map[string][]string{}
	for _, r := range recs {
		if k := key(r.Config.Config); k != "" {
			users[k] = append(users[k], r.ID)
		}
	}
	return users, nil
}

func workspaceOf(c roche.Config) string { return c.Workspace }

// Workspaces implements roche.WorkspaceManager.
func (p *Provider) Workspaces(_ context.Context) ([]roche.Workspace, error) {
	entries, err := os.ReadDir(filepath.Join(p.dataDir, workspacesDir))
	if errors.Is(err, fs.ErrNotExist) {
		return []roche.Workspace{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("%w: listing wasm workspaces: %v", roche.ErrUnavailable, err)
	}
	users, err := p.users(workspaceOf)
	if err != nil {
		return nil, err
	}
	out := []roche.Workspace{}
	for _, e := range entries {
		name := e.Name()
		if !e.IsDir() || !roche.ValidWorkspaceName(name) {
			continue
		}
		var meta workspaceRecord
		if err := readJSON(filepath.Join(p.workspaceDir(name), workspaceMeta), &meta); err != nil {
			p.log.Warn("wasm: skipping unreadable workspace", "name", name, "err", err)
			continue
		}
		out = append(out, roche.Workspace{Name: name, Provider: p.Name(), CreatedAt: meta.CreatedAt, InUseBy: users[name], SizeBytes: meta.size()})
	}
	// ReadDir sorts by name.
	return out, nil
}

// RemoveWorkspace implements roche.WorkspaceManager.
func (p *Provider) RemoveWorkspace(_ context.Context, name string) error {
	if !roche.ValidWorkspaceName(name) {
		return fmt.Errorf("%w: no workspace %q", roche.ErrNotFound, name)
	}
	unlock, err := p.lockData()
	if err != nil {
		return err
	}
	defer unlock()
	if err := p.workspaceFree(name, ""); err != nil {
		return err
	}
	if _, err := os.Lstat(p.workspaceDir(name)); errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("%w: no workspace %s (roche workspace list --provider wasm shows them)", roche.ErrNotFound, name)
	}
	return p.removeWorkspaceFiles(name)
}

// workspaceFree fails with ErrInUse, naming them, when sandboxes other than except have
// workspace name.
func (p *Provider) workspaceFree(name, except string) error {
	users, err := p.users(workspaceOf)
	if err != nil {
		return err
	}
	ids := slices.DeleteFunc(users[name], func(id string) bool { return id == except })
	if len(ids) > 0 {
		return fmt.Errorf("%w: workspace %s is mounted by sandbox %s: destroy it first (roche destroy %s)",
			roche.ErrInUse, name, strings.Join(ids, ", "), strings.Join(ids, " "))
	}
	return nil
}

// removeWorkspaceFiles takes workspace name away at once, then deletes its files.
func (p *Provider) removeWorkspaceFiles(name string) error {
	return removeDataEntry(p.workspaceDir(name), "workspace "+name)
}

// removeDataEntry renames dir aside, so that it is gone in one step however long
// deleting its files takes, then deletes them; what cannot be deleted now, GC retries.
func removeDataEntry(dir, what string) error {
	suffix, err := newID()
	if err != nil {
		return fmt.Errorf("removing %s: %w", what, err)
	}
	trash := filepath.Join(filepath.Dir(dir), trashPrefix+filepath.Base(dir)+"-"+strings.TrimPrefix(suffix, idPrefix))
	if err := os.Rename(dir, trash); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return fmt.Errorf("%w: removing %s: %v", roche.ErrUnavailable, what, err)
	}
	if err := removeAll(trash); err != nil {
		return fmt.Errorf("removing %s: deleting its files at %s: %w (roche gc retries)", what, trash, err)
	}
	return nil
}

// Reset implements roche.Resetter: the sandbox is destroyed and made again from the
// config in its record, with the lifetime it had left. Its root, /tmp and own /workspace
// start again empty (or as its snapshot had them); a named workspace is kept, or emptied
// when keepWorkspace is false.
func (p *Provider) Reset(ctx context.Context, id string, keepWorkspace bool) (roche.SandboxInfo, error) {
	rec, err := p.lookup(id)
	if err != nil {
		return roche.SandboxInfo{}, err
	}
	cfg := rec.Config
	left := time.Until(rec.ExpiresAt)
	if left < time.Second {
		return roche.SandboxInfo{}, fmt.Errorf("%w: wasm sandbox %s has reached the end of its lifetime", roche.ErrNotFound, id)
	}
	cfg.TimeoutSecs = int(left / time.Second)
	// Whatever would stop the new sandbox is found before the old one goes.
	if err := p.checkConfig(cfg); err != nil {
		return roche.SandboxInfo{}, fmt.Errorf("resetting wasm sandbox %s: %w", id, err)
	}
	wipe := !keepWorkspace && cfg.Workspace != ""
	if usesData(cfg) {
		unlock, err := p.lockData()
		if err != nil {
			return roche.SandboxInfo{}, err
		}
		defer unlock()
		if cfg.FromSnapshot != "" {
			if _, err := p.existingSnapshot(cfg.FromSnapshot); err != nil {
				return roche.SandboxInfo{}, fmt.Errorf("resetting wasm sandbox %s: %w", id, err)
			}
		}
		if wipe {
			if err := p.workspaceFree(cfg.Workspace, id); err != nil {
				return roche.SandboxInfo{}, fmt.Errorf("resetting wasm sandbox %s with its workspace emptied: %w", id, err)
			}
		}
	}
	if err := p.Destroy(ctx, id); err != nil {
		return roche.SandboxInfo{}, err
	}
	if wipe {
		// Emptied means made again, with the size it had.
		if size, err := p.workspaceSize(cfg.Workspace); err == nil {
			cfg.WorkspaceSize = fmt.Sprint(size)
		}
		if err := p.removeWorkspaceFiles(cfg.Workspace); err != nil {
			return roche.SandboxInfo{}, fmt.Errorf("resetting wasm sandbox %s (now destroyed): emptying its workspace: %w", id, err)
		}
	}
	info, err := p.create(ctx, cfg)
	if err != nil {
		return roche.SandboxInfo{}, fmt.Errorf("resetting wasm sandbox %s (now destroyed): %w", id, err)
	}
	p.log.Debug("wasm: sandbox reset", "old", id, "new", info.ID, "keep_workspace", keepWorkspace)
	return info, nil
}

// sweepData removes what crashed processes left in the data directory: entries being
// removed, and entries being made that are old enough not to be in progress.
func (p *Provider) sweepData(now time.Time) {
	for _, sub := range []string{workspacesDir, snapshotsDir} {
		dir := filepath.Join(p.dataDir, sub)
		entries, err := os.ReadDir(dir)
		if err != nil {
			continue
		}
		for _, e := range entries {
			name := e.Name()
			switch {
			case strings.HasPrefix(name, trashPrefix):
			case strings.HasPrefix(name, partialPrefix):
				if fi, err := e.Info(); err != nil || now.Sub(fi.ModTime()) < orphanAge {
					continue
				}
			default:
				continue
			}
			if err := removeAll(filepath.Join(dir, name)); err != nil {
				p.log.Warn("wasm: gc could not remove leftover files", "dir", filepath.Join(dir, name), "err", err)
			}
		}
	}
}

func writeJSON(file string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(file, append(b, '\n'), 0o600)
}

func readJSON(file string, v any) error {
	b, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("%s is corrupt: %v", file, err)
	}
	return nil
}
