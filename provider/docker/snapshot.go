package docker

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/api/types/image"

	"github.com/roche-sandbox/roche"
)

// Snapshot images carry these labels.
const (
	LabelSnapshot     = "roche.snapshot"
	LabelSnapshotBase = "roche.snapshot.base"
)

var _ roche.Snapshotter = (*Provider)(nil)

func snapshotRef(name string) string { return "roche-snapshot:" + name }

// snapshotTmp is where a snapshot's /tmp is kept: /tmp is a tmpfs, which a commit of the
// container's filesystem does not see.
func (p *Provider) snapshotTmp(name string) string {
	return filepath.Join(p.dataDir, "snapshots", name+".tmp.tar")
}

// Snapshot implements roche.Snapshotter: the container's filesystem is committed as an
// image, and its /tmp saved beside it through the agent.
func (p *Provider) Snapshot(ctx context.Context, id, name string) (_ roche.Snapshot, err error) {
	ctx, done := p.engine.Bound(ctx, "snapshotting sandbox "+id, p.engineTimeout)
	defer done(&err)
	if !roche.ValidWorkspaceName(name) {
		return roche.Snapshot{}, fmt.Errorf("%w: snapshot name %q: use letters, digits, '_', '.' and '-', starting with a letter or digit", roche.ErrInvalidConfig, name)
	}
	c, s, err := p.inspect(ctx, id)
	if err != nil {
		return roche.Snapshot{}, err
	}
	if c.State == nil || !c.State.Running {
		return roche.Snapshot{}, fmt.Errorf("%w: sandbox %s is not running", roche.ErrNotFound, id)
	}
	if _, err := p.cli.ImageInspect(ctx, snapshotRef(name)); err == nil {
		return roche.Snapshot{}, fmt.Errorf("%w: snapshot %s exists: remove it first (roche snapshot rm %s)", roche.ErrInvalidConfig, name, name)
	}
	base := s.cfg.Image
	if s.cfg.FromSnapshot != "" {
		base = s.cfg.FromSnapshot + " (snapshot)"
	}
	// /tmp is a tmpfs, which only the agent can save; a snapshot without it would lose
	// those files silently.
	if s.agent == nil {
		return roche.Snapshot{}, fmt.Errorf("%w: sandbox %s runs without roche-agent (transport %s), which a snapshot needs to save /tmp",
			roche.ErrUnsupported, id, TransportDockerExec)
	}
	tmpFile := p.snapshotTmp(name)
	if err := p.saveTmp(ctx, s, tmpFile); err != nil {
		return roche.Snapshot{}, err
	}
	_, err = p.cli.ContainerCommit(ctx, s.id, container.CommitOptions{
		Reference: snapshotRef(name),
		Comment:   "roche snapshot of sandbox " + s.id,
		Pause:     true,
		// Quoted: the base of a snapshot's sandbox, "NAME (snapshot)", has a space.
		Changes: []string{fmt.Sprintf("LABEL %s=%q", LabelSnapshot, name), fmt.Sprintf("LABEL %s=%q", LabelSnapshotBase, base)},
	})
	if err != nil {
		os.Remove(tmpFile)
		return roche.Snapshot{}, p.engineErr("committing sandbox "+id, err)
	}
	return roche.Snapshot{Name: name, Provider: p.Name(), Image: base, CreatedAt: time.Now()}, nil
}

func (p *Provider) saveTmp(ctx context.Context, s sandbox, file string) error {
	if err := os.MkdirAll(filepath.Dir(file), 0o700); err != nil {
		return fmt.Errorf("making the snapshot directory: %w", err)
	}
	partial := file + ".partial"
	f, err := os.OpenFile(partial, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	err = p.target(s).CopyTarFrom(ctx, "/tmp", f)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(partial)
		return fmt.Errorf("saving /tmp for the snapshot: %w", err)
	}
	return os.Rename(partial, file)
}

// restoreTmp puts a snapshot's /tmp into a sandbox made from it.
func (p *Provider) restoreTmp(ctx context.Context, id, name string) error {
	f, err := os.Open(p.snapshotTmp(name))
	if errors.Is(err, fs.ErrNotExist) {
		return nil // nothing of /tmp was kept for it (taken by an older Roche, or with another data directory)
	}
	if err != nil {
		return err
	}
	defer f.Close()
	t, err := p.reach(ctx, id)
	if err != nil {
		return err
	}
	return t.CopyTarTo(ctx, "/tmp", f)
}

// Snapshots implements roche.Snapshotter.
func (p *Provider) Snapshots(ctx context.Context) (_ []roche.Snapshot, err error) {
	ctx, done := p.bound(ctx, "listing snapshots")
	defer done(&err)
	imgs, err := p.cli.ImageList(ctx, image.ListOptions{Filters: filters.NewArgs(filters.Arg("label", LabelSnapshot))})
	if err != nil {
		return nil, p.engineErr("listing snapshots", err)
	}
	out := make([]roche.Snapshot, 0, len(imgs))
	for _, im := range imgs {
		out = append(out, roche.Snapshot{
			Name: im.Labels[LabelSnapshot], Provider: p.Name(), Image: im.Labels[LabelSnapshotBase],
			CreatedAt: time.Unix(im.Created, 0),
		})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// RemoveSnapshot implements roche.Snapshotter.
func (p *Provider) RemoveSnapshot(ctx context.Context, name string) (err error) {
	ctx, done := p.bound(ctx, "removing snapshot "+name)
	defer done(&err)
	if !roche.ValidWorkspaceName(name) {
		return fmt.Errorf("%w: no snapshot %q", roche.ErrNotFound, name)
	}
	_, err = p.cli.ImageRemove(ctx, snapshotRef(name), image.RemoveOptions{PruneChildren: true})
	switch {
	case cerrdefs.IsNotFound(err):
		return fmt.Errorf("%w: no snapshot %s (roche snapshot list shows them)", roche.ErrNotFound, name)
	case cerrdefs.IsConflict(err):
		return fmt.Errorf("%w: snapshot %s is the image of a live sandbox: destroy it first", roche.ErrInUse, name)
	case err != nil:
		return p.engineErr("removing snapshot "+name, err)
	}
	os.Remove(p.snapshotTmp(name))
	return nil
}

// defaultDataDir keeps what must survive a reboot (snapshots' /tmp archives).
func defaultDataDir() string {
	if os.Geteuid() == 0 {
		return "/var/lib/roche/docker"
	}
	if d := os.Getenv("XDG_DATA_HOME"); d != "" {
		return filepath.Join(d, "roche", "docker")
	}
	home, _ := os.UserHomeDir()
	return filepath.Join(home, ".local", "share", "roche", "docker")
}
