package docker

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/api/types/mount"
	"github.com/docker/docker/api/types/volume"

	"github.com/roche-sandbox/roche"
)

// LabelWorkspace marks workspace volumes, and the sandboxes that mount one, with its name.
const LabelWorkspace = "roche.workspace"

var (
	_ roche.WorkspaceManager = (*Provider)(nil)
	_ roche.Resetter         = (*Provider)(nil)
)

// A workspace is a named Docker volume; the prefix keeps Roche's apart from others'.
func volumeName(workspace string) string { return "roche-ws-" + workspace }

// ensureWorkspace creates the workspace's volume unless it exists.
func (p *Provider) ensureWorkspace(ctx context.Context, name string) error {
	_, err := p.cli.VolumeCreate(ctx, volume.CreateOptions{
		Name:   volumeName(name),
		Labels: map[string]string{LabelManaged: "true", LabelWorkspace: name},
	})
	return p.engineErr("creating workspace "+name, err)
}

// workspaceMount mounts the workspace read-write at /workspace.
func workspaceMount(name string) mount.Mount {
	return mount.Mount{Type: mount.TypeVolume, Source: volumeName(name), Target: roche.WorkspacePath}
}

// Workspaces implements roche.WorkspaceManager.
func (p *Provider) Workspaces(ctx context.Context) (_ []roche.Workspace, err error) {
	ctx, done := p.bound(ctx, "listing workspaces")
	defer done(&err)
	vols, err := p.cli.VolumeList(ctx, volume.ListOptions{Filters: filters.NewArgs(filters.Arg("label", LabelWorkspace))})
	if err != nil {
		return nil, p.engineErr("listing workspaces", err)
	}
	users, err := p.workspaceUsers(ctx, "")
	if err != nil {
		return nil, err
	}
	out := make([]roche.Workspace, 0, len(vols.Volumes))
	for _, v := range vols.Volumes {
		name := v.Labels[LabelWorkspace]
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
	cs, err := p.cli.ContainerList(ctx, container.ListOptions{All: true, Filters: filters.NewArgs(
		filters.Arg("label", LabelManaged+"=true"))})
	if err != nil {
		return nil, p.engineErr("listing sandboxes", err)
	}
	users := map[string][]string{}
	for _, c := range cs {
		for _, m := range c.Mounts {
			ws, ok := strings.CutPrefix(m.Name, volumeName(""))
			if ok && m.Type == mount.TypeVolume && (name == "" || ws == name) {
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
	err = p.cli.VolumeRemove(ctx, volumeName(name), false)
	switch {
	case cerrdefs.IsNotFound(err):
		return fmt.Errorf("%w: no workspace %s (roche workspace list shows them)", roche.ErrNotFound, name)
	case cerrdefs.IsConflict(err):
		return fmt.Errorf("%w: workspace %s is still mounted: destroy the sandboxes using it first", roche.ErrInUse, name)
	}
	return p.engineErr("removing workspace "+name, err)
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
	if err := p.Destroy(ctx, c.ID); err != nil {
		return roche.SandboxInfo{}, err
	}
	if !keepWorkspace && cfg.Workspace != "" {
		if err := p.waitGone(ctx, c.ID); err != nil {
			return roche.SandboxInfo{}, err
		}
		if err := p.RemoveWorkspace(ctx, cfg.Workspace); err != nil && !errors.Is(err, roche.ErrNotFound) {
			return roche.SandboxInfo{}, err
		}
	}
	return p.Create(ctx, cfg)
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
