package docker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/api/types/mount"
	"github.com/docker/docker/api/types/volume"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/internal/size"
	"github.com/roche-sandbox/roche/provider/internal/egresswire"
	"github.com/roche-sandbox/roche/provider/internal/sizedfs"
	"github.com/roche-sandbox/roche/provider/kit"
)

// LabelWorkspace marks the sandboxes that mount a workspace with its name (and the
// unsized volumes of workspaces made by an older Roche).
const LabelWorkspace = "roche.workspace"

var (
	_ roche.WorkspaceManager = (*Provider)(nil)
	_ roche.Resetter         = (*Provider)(nil)
)

// A workspace is a sized filesystem (see disk_linux.go) kept in the data directory:
//
//	workspaces/NAME.img      ext4 in a sparse file of the workspace's size
//	workspaces/NAME.json     its record (workspaceRecord); the workspace exists while it does
//	workspaces/NAME.lock     serialises making, mounting, using and removing it across
//	                         processes; removed with the workspace
//	workspaces/mnt/NAME/     where it is mounted, from its first use after a boot until it
//	                         is removed, and bind-mounted into the sandboxes that use it
//
// The mount points have a directory of their own because names may hold dots: the mount
// point of a workspace "a.lock" must not be the lock file of a workspace "a".
//
// Its size is fixed when it is made (Config.WorkspaceSize, else the default): a create
// asking for another size is refused rather than silently given the old one.
const (
	workspacesDir = "workspaces"
	mountsDir     = "mnt"
)

// workspaceRecord is a workspace's NAME.json.
type workspaceRecord struct {
	Name      string    `json:"name"`
	CreatedAt time.Time `json:"created_at"`
	SizeBytes int64     `json:"size_bytes"`
	// UID is the uid every sandbox that mounts the workspace runs as (see ensureWorkspace).
	UID int `json:"uid"`
}

func (p *Provider) workspacePath(name, suffix string) string {
	return filepath.Join(p.dataDir, workspacesDir, name+suffix)
}

// workspaceDir is where workspace name is mounted on the host.
func (p *Provider) workspaceDir(name string) string {
	return filepath.Join(p.dataDir, workspacesDir, mountsDir, name)
}

// Older Roche kept a workspace as a named Docker volume without a size; the prefix kept
// Roche's apart from others'. Such a workspace is listed and can be removed, not used.
func volumeName(workspace string) string { return "roche-ws-" + workspace }

// ensureWorkspace makes workspace name unless it exists (want bytes, or the default
// size), checks a size asked for against the one it has, and mounts it unless it is
// mounted. It returns the uid its sandboxes run as, and returns with the workspace
// locked, so that no removal can come between this and the sandbox that will mount it;
// the caller releases it once that sandbox exists, or failed: a workspace made for a
// sandbox that could not be made goes with it.
//
// A workspace has a uid of its own, drawn when it is made, rather than each sandbox
// having one: the files one sandbox leaves in it must stay writable by the next, and by
// another that mounts it at the same time, whatever modes they were made with. Sandboxes
// that share a workspace share a writable directory, where each can already leave what
// the other runs, so sharing a uid (and per-user kernel limits) does not join two
// sandboxes that were apart. Workspaces draw from their own half of the range, so a
// sandbox's drawn uid never meets one.
func (p *Provider) ensureWorkspace(ctx context.Context, name string, want int64) (uid int, release func(failed bool), err error) {
	if err := p.canSizeDisks(); err != nil {
		return -1, nil, workspaceRefusal(name, err)
	}
	unlock, err := p.lockWorkspace(name)
	if err != nil {
		return -1, nil, err
	}
	rec, made, err := p.openWorkspace(ctx, name, want)
	if err != nil {
		// A workspace that was not made leaves no lock file behind either.
		if _, serr := os.Lstat(p.workspacePath(name, ".json")); errors.Is(serr, fs.ErrNotExist) {
			os.Remove(p.workspacePath(name, ".lock"))
		}
		unlock()
		return -1, nil, err
	}
	return rec.UID, func(failed bool) {
		if failed && made {
			if err := p.deleteWorkspace(name); err != nil {
				p.log.Warn("removing a workspace made for a sandbox that could not be made", "workspace", name, "err", err)
			}
		}
		unlock()
	}, nil
}

// openWorkspace makes workspace name as needed (reporting whether it did) and mounts it.
func (p *Provider) openWorkspace(ctx context.Context, name string, want int64) (rec workspaceRecord, made bool, err error) {
	rec, err = p.workspaceRecord(name)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		if _, verr := p.cli.VolumeInspect(ctx, volumeName(name)); verr == nil {
			return rec, false, fmt.Errorf("%w: workspace %s is a Docker volume (%s) made by an older Roche, without a size: save what you need from it (docker run --rm -v %s:/w IMAGE tar -C /w -c . > %s.tar), then remove it (roche workspace rm %s) and use the name again",
				roche.ErrUnsupported, name, volumeName(name), volumeName(name), name, name)
		}
		if rec, err = p.makeWorkspace(name, want); err != nil {
			return rec, false, err
		}
		made = true
	case err != nil:
		return rec, false, err
	case want != 0 && want != rec.SizeBytes:
		return rec, false, fmt.Errorf("%w: workspace %s has a size of %s, fixed when it was made, and %s was asked for: leave the size out to use it as it is, or remove it (roche workspace rm %s) and make it again with the new size",
			roche.ErrInvalidConfig, name, size.String(rec.SizeBytes), size.String(want), name)
	}
	dir := p.workspaceDir(name)
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return rec, made, fmt.Errorf("%w: making the mount point of workspace %s: %v", roche.ErrUnavailable, name, err)
	}
	mounted, err := isMountPoint(dir)
	if err != nil {
		return rec, made, fmt.Errorf("%w: workspace %s: %v", roche.ErrUnavailable, name, err)
	}
	if !mounted {
		if err := sizedfs.Mount(p.workspacePath(name, ".img"), dir); err != nil {
			return rec, made, fmt.Errorf("workspace %s: %w", name, err)
		}
	}
	return rec, made, nil
}

// makeWorkspace makes the filesystem of a new workspace, then its record, which is what
// makes it exist: a crash in between leaves an image that the next attempt replaces.
func (p *Provider) makeWorkspace(name string, size int64) (workspaceRecord, error) {
	if size == 0 {
		size = kit.DefaultWorkspaceBytes
	}
	img := p.workspacePath(name, ".img")
	if err := os.Remove(img); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return workspaceRecord{}, fmt.Errorf("%w: workspace %s: removing a half-made image: %v", roche.ErrUnavailable, name, err)
	}
	if err := sizedfs.Make(img, size, sizedfs.Workspace); err != nil {
		return workspaceRecord{}, fmt.Errorf("making workspace %s: %w", name, err)
	}
	// mkfs leaves a lost+found that sandboxes would see in /workspace; it is not needed
	// (fsck makes it again when it is).
	dir := p.workspaceDir(name)
	err := os.Mkdir(dir, 0o700)
	if errors.Is(err, fs.ErrExist) {
		// Left mounted by a crash: the new filesystem goes there instead.
		_, err = sizedfs.Unmount(dir)
	}
	if err == nil {
		err = sizedfs.Mount(img, dir)
	}
	if err == nil {
		err = os.Remove(filepath.Join(dir, "lost+found"))
		if _, uerr := sizedfs.Unmount(dir); err == nil {
			err = uerr
		}
	}
	rec := workspaceRecord{Name: name, CreatedAt: time.Now().UTC(), SizeBytes: size}
	if err == nil {
		err = p.recordWithUID(&rec)
	}
	if err != nil {
		os.Remove(img)
		return workspaceRecord{}, fmt.Errorf("making workspace %s: %w", name, err)
	}
	return rec, nil
}

func (p *Provider) workspaceRecord(name string) (workspaceRecord, error) {
	var rec workspaceRecord
	b, err := os.ReadFile(p.workspacePath(name, ".json"))
	if err != nil {
		return rec, err
	}
	if err := json.Unmarshal(b, &rec); err != nil {
		return rec, fmt.Errorf("%w: workspace %s: its record %s is corrupt (%v): remove the workspace (roche workspace rm %s)",
			roche.ErrUnavailable, name, p.workspacePath(name, ".json"), err, name)
	}
	return rec, nil
}

// lockWorkspace takes workspace name's lock, making the workspaces directory as needed.
func (p *Provider) lockWorkspace(name string) (func(), error) {
	if err := os.MkdirAll(filepath.Join(p.dataDir, workspacesDir, mountsDir), 0o700); err != nil {
		return nil, fmt.Errorf("%w: making the workspaces directory: %v", roche.ErrUnavailable, err)
	}
	unlock, err := lockFile(p.workspacePath(name, ".lock"))
	if err != nil {
		return nil, fmt.Errorf("%w: locking workspace %s: %v", roche.ErrUnavailable, name, err)
	}
	return unlock, nil
}

// workspaceMount mounts the workspace read-write at /workspace.
func (p *Provider) workspaceMount(name string) mount.Mount {
	return mount.Mount{Type: mount.TypeBind, Source: p.workspaceDir(name), Target: roche.WorkspacePath}
}

// Workspaces implements roche.WorkspaceManager.
func (p *Provider) Workspaces(ctx context.Context) (_ []roche.Workspace, err error) {
	ctx, done := p.bound(ctx, "listing workspaces")
	defer done(&err)
	users, err := p.workspaceUsers(ctx, "")
	if err != nil {
		return nil, err
	}
	out := []roche.Workspace{}
	seen := map[string]bool{}
	records, _ := filepath.Glob(p.workspacePath("*", ".json"))
	for _, f := range records {
		name := strings.TrimSuffix(filepath.Base(f), ".json")
		if !roche.ValidWorkspaceName(name) {
			continue
		}
		rec, err := p.workspaceRecord(name)
		if err != nil {
			p.log.Warn("skipping an unreadable workspace", "name", name, "err", err)
			continue
		}
		seen[name] = true
		out = append(out, roche.Workspace{Name: name, Provider: p.Name(), CreatedAt: rec.CreatedAt, InUseBy: users[name], SizeBytes: rec.SizeBytes})
	}
	vols, err := p.cli.VolumeList(ctx, volume.ListOptions{Filters: filters.NewArgs(filters.Arg("label", LabelWorkspace))})
	if err != nil {
		return nil, p.engineErr("listing workspaces", err)
	}
	for _, v := range vols.Volumes {
		name := v.Labels[LabelWorkspace]
		if seen[name] || v.Name != volumeName(name) {
			continue
		}
		created, _ := time.Parse(time.RFC3339, v.CreatedAt)
		out = append(out, roche.Workspace{Name: name, Provider: p.Name(), CreatedAt: created, InUseBy: users[name]})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// workspaceUsers maps workspace names to the sandboxes that mount them (one name, or
// all). It reads mounts, not labels: a sandbox made from a snapshot inherits the labels
// of the sandbox the snapshot was taken of.
func (p *Provider) workspaceUsers(ctx context.Context, name string) (map[string][]string, error) {
	cs, err := p.containers(ctx, container.ListOptions{All: true, Filters: filters.NewArgs(
		filters.Arg("label", LabelManaged+"=true"))})
	if err != nil {
		return nil, p.engineErr("listing sandboxes", err)
	}
	parent := filepath.Join(p.dataDir, workspacesDir, mountsDir)
	users := map[string][]string{}
	for _, c := range cs {
		for _, m := range c.Mounts {
			var ws string
			switch {
			case m.Type == mount.TypeBind && filepath.Dir(m.Source) == parent:
				ws = filepath.Base(m.Source)
			case m.Type == mount.TypeVolume && strings.HasPrefix(m.Name, volumeName("")):
				ws = strings.TrimPrefix(m.Name, volumeName(""))
			default:
				continue
			}
			if name == "" || ws == name {
				users[ws] = append(users[ws], c.ID)
			}
		}
	}
	return users, nil
}

// RemoveWorkspace implements roche.WorkspaceManager.
func (p *Provider) RemoveWorkspace(ctx context.Context, name string) (err error) {
	ctx, done := p.bound(ctx, "removing workspace "+name)
	defer done(&err)
	if !roche.ValidWorkspaceName(name) {
		return fmt.Errorf("%w: no workspace %q", roche.ErrNotFound, name)
	}
	users, err := p.workspaceUsers(ctx, name)
	if err != nil {
		return err
	}
	if ids := users[name]; len(ids) > 0 {
		return fmt.Errorf("%w: workspace %s is mounted by sandbox %s: destroy it first (roche destroy %s)",
			roche.ErrInUse, name, strings.Join(ids, ", "), strings.Join(ids, " "))
	}
	found, err := p.removeLegacyVolume(ctx, name)
	if err != nil {
		return err
	}
	if _, err := os.Lstat(p.workspacePath(name, ".json")); errors.Is(err, fs.ErrNotExist) {
		if !found {
			return fmt.Errorf("%w: no workspace %s (roche workspace list shows them)", roche.ErrNotFound, name)
		}
		return nil
	}
	unlock, err := p.lockWorkspace(name)
	if err != nil {
		return err
	}
	defer unlock()
	// Looked at again under the lock: a create may have started using it meanwhile.
	if users, err = p.workspaceUsers(ctx, name); err != nil {
		return err
	}
	if ids := users[name]; len(ids) > 0 {
		return fmt.Errorf("%w: workspace %s is mounted by sandbox %s: destroy it first (roche destroy %s)",
			roche.ErrInUse, name, strings.Join(ids, ", "), strings.Join(ids, " "))
	}
	return p.deleteWorkspace(name)
}

// deleteWorkspace unmounts workspace name and deletes its files, its lock file last.
// The caller holds its lock and has made sure no sandbox uses it.
func (p *Provider) deleteWorkspace(name string) error {
	dir := p.workspaceDir(name)
	if busy, err := sizedfs.Unmount(dir); busy {
		return fmt.Errorf("%w: workspace %s is still mounted by a sandbox being removed: try again in a moment", roche.ErrInUse, name)
	} else if err != nil {
		return fmt.Errorf("%w: removing workspace %s: %v", roche.ErrUnavailable, name, err)
	}
	// The record goes first: from then on the workspace does not exist, whatever of its
	// files a crash leaves (a later make replaces them).
	for _, f := range []string{p.workspacePath(name, ".json"), p.workspacePath(name, ".img"), dir, p.workspacePath(name, ".lock")} {
		if err := os.Remove(f); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("%w: removing workspace %s: %v", roche.ErrUnavailable, name, err)
		}
	}
	return nil
}

// removeLegacyVolume removes the unsized volume an older Roche made for workspace name,
// and reports whether there was one.
func (p *Provider) removeLegacyVolume(ctx context.Context, name string) (bool, error) {
	err := p.cli.VolumeRemove(ctx, volumeName(name), false)
	switch {
	case err == nil:
		return true, nil
	case cerrdefs.IsNotFound(err):
		return false, nil
	case cerrdefs.IsConflict(err):
		return true, fmt.Errorf("%w: workspace %s is still mounted: destroy the sandboxes using it first", roche.ErrInUse, name)
	}
	return false, p.engineErr("removing workspace "+name, err)
}

// Reset implements roche.Resetter: the sandbox is destroyed and made again from the same
// config, which keeps its workspace unless asked to empty it.
func (p *Provider) Reset(ctx context.Context, id string, keepWorkspace bool) (roche.SandboxInfo, error) {
	c, s, err := p.inspect(ctx, id)
	if err != nil {
		return roche.SandboxInfo{}, err
	}
	cfg := s.cfg
	if cfg.Image == "" {
		return roche.SandboxInfo{}, fmt.Errorf("%w: sandbox %s carries no config to reset from", roche.ErrUnsupported, id)
	}
	// The new sandbox gets the lifetime the old one had left, not a fresh one.
	if left := int(time.Until(s.expires).Seconds()); left > 0 {
		cfg.TimeoutSecs = left
	} else {
		return roche.SandboxInfo{}, fmt.Errorf("%w: sandbox %s has reached the end of its lifetime", roche.ErrNotFound, id)
	}
	cfg.Secrets = slices.Clone(cfg.Secrets)
	if err := egresswire.CarryValues(c.ID, cfg.Secrets); err != nil {
		return roche.SandboxInfo{}, err
	}
	if err := p.Destroy(ctx, c.ID); err != nil {
		return roche.SandboxInfo{}, err
	}
	if !keepWorkspace && cfg.Workspace != "" {
		if err := p.waitGone(ctx, c.ID); err != nil {
			return roche.SandboxInfo{}, err
		}
		// Emptied means made again, with the size it had.
		if rec, err := p.workspaceRecord(cfg.Workspace); err == nil {
			cfg.WorkspaceSize = fmt.Sprint(rec.SizeBytes)
		}
		err := eventuallyFree(ctx, func() error { return p.RemoveWorkspace(ctx, cfg.Workspace) })
		if err != nil && !errors.Is(err, roche.ErrNotFound) {
			return roche.SandboxInfo{}, err
		}
	}
	return p.CreateFor(ctx, cfg.Config, cfg.CreateOptions)
}

// eventuallyFree retries rm while what it removes is still held by a sandbox whose
// removal the engine is finishing.
func eventuallyFree(ctx context.Context, rm func() error) error {
	for i := 0; ; i++ {
		err := rm()
		if !errors.Is(err, roche.ErrInUse) || i == 100 {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// waitGone waits until the engine has finished removing a container, so that its
// volumes are free.
func (p *Provider) waitGone(ctx context.Context, id string) (err error) {
	ctx, done := p.bound(ctx, "waiting for sandbox "+id+" to be removed")
	defer done(&err)
	for i := 0; i < 200; i++ {
		if _, err := p.cli.ContainerInspect(ctx, id); cerrdefs.IsNotFound(err) {
			return nil
		}
		time.Sleep(25 * time.Millisecond)
	}
	return fmt.Errorf("%w: sandbox %s is still being removed", roche.ErrTimeout, id)
}

// writeFileAtomic writes v as JSON to file through a temporary file and a rename.
func writeFileAtomic(file string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	tmp := file + ".partial"
	if err := os.WriteFile(tmp, append(b, '\n'), 0o600); err != nil {
		return err
	}
	if err := os.Rename(tmp, file); err != nil {
		os.Remove(tmp)
		return err
	}
	return nil
}

// recordWithUID draws the new workspace rec's uid and writes its record. Drawing and
// recording happen under one lock over every workspace of the data directory, so two
// workspaces made at once never draw the same uid; the records are the list of uids
// taken, and a uid is free again once its workspace is removed.
func (p *Provider) recordWithUID(rec *workspaceRecord) error {
	unlock, err := lockFile(filepath.Join(p.dataDir, "workspace-uids.lock"))
	if err != nil {
		return fmt.Errorf("%w: locking the workspaces' uids: %v", roche.ErrUnavailable, err)
	}
	defer unlock()
	taken := map[int]bool{}
	entries, err := os.ReadDir(filepath.Join(p.dataDir, workspacesDir))
	if err != nil {
		return err
	}
	for _, e := range entries {
		if other, ok := strings.CutSuffix(e.Name(), ".json"); ok && other != rec.Name {
			if r, err := p.workspaceRecord(other); err == nil {
				taken[r.UID] = true
			}
		}
	}
	for range maxUIDDraws {
		if uid := p.drawWorkspaceUID(); !taken[uid] {
			rec.UID = uid
			return writeFileAtomic(p.workspacePath(rec.Name, ".json"), *rec)
		}
	}
	return noFreeUID("workspace", p.uidFirst+p.uidCount/2, p.uidCount-p.uidCount/2)
}
