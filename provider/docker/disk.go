package docker

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"strings"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/provider/internal/sizedfs"
)

// Disk limits. A writable root holds at most Config.Disk: Roche puts a sized filesystem
// (provider/internal/sizedfs) under the container's overlay2 layer directory
// (disk_linux.go) after the engine creates the container and before it starts it, so
// that every change the sandbox makes to its root lands there and a write past the size
// fails with ENOSPC. The engine removes it with the container. A workspace is a sized
// filesystem of its own (workspace.go).
//
// Both need this process to mount filesystems where the engine sees them: root, on the
// engine's host. Where that does not hold, a writable root with a limit is refused with
// how to fix it, and Disk "0" is the explicit way to accept a root without one.

// layerImage is the name of a sized layer's image file inside its layer directory.
const layerImage = "roche-disk.img"

// canSizeDisks reports why this provider cannot make sized filesystems for its engine, or
// nil.
func (p *Provider) canSizeDisks() error {
	if err := sizedfs.CanMount(); err != nil {
		return err
	}
	if host := p.cli.DaemonHost(); !strings.HasPrefix(host, "unix://") {
		return fmt.Errorf("the engine at %s is not reached through a local socket, so its storage is not on this host", host)
	}
	return nil
}

// diskRefusal is the error for a writable root whose limit cannot be enforced.
func diskRefusal(why error) error {
	return fmt.Errorf("%w: a writable root is bounded by --disk (%s by default) with a filesystem Roche mounts under the engine's storage, and here it cannot: %v; run roche as root on the engine's host (or through roched), or pass --disk 0 to accept a writable root without a limit",
		roche.ErrUnsupported, roche.DefaultDisk, why)
}

// checkDisk refuses, before anything is made or the engine is asked anything, a writable
// root with a limit or a workspace that this provider cannot enforce.
func (p *Provider) checkDisk(cfg roche.Config) error {
	bounded := cfg.Writable && cfg.DiskBytes() != 0
	if !bounded && cfg.Workspace == "" {
		return nil
	}
	err := p.canSizeDisks()
	switch {
	case err == nil:
		return nil
	case bounded:
		return diskRefusal(err)
	default:
		return workspaceRefusal(cfg.Workspace, err)
	}
}

// workspaceRefusal is the error for a workspace this provider cannot make.
func workspaceRefusal(name string, why error) error {
	return fmt.Errorf("%w: workspace %s: workspaces are sized filesystems that Roche mounts on the engine's host, and here it cannot: %v; run roche as root on that host (or through roched)",
		roche.ErrUnsupported, name, why)
}

// sizeRoot bounds the writable root of container id, created and not yet started, to
// cfg's disk limit, and returns its layer directory ("" when cfg asks for no bound).
func (p *Provider) sizeRoot(ctx context.Context, id string, cfg roche.Config) (string, error) {
	size := cfg.DiskBytes()
	if !cfg.Writable || size == 0 {
		return "", nil
	}
	c, err := p.cli.ContainerInspect(ctx, id)
	if err != nil {
		return "", p.engineErr("inspecting sandbox "+id, err)
	}
	gd := c.GraphDriver
	if gd.Name != "overlay2" {
		return "", diskRefusal(fmt.Errorf("the engine's storage driver is %q, and Roche sizes overlay2 layers only", gd.Name))
	}
	upper, work := gd.Data["UpperDir"], gd.Data["WorkDir"]
	layer := filepath.Dir(upper)
	if upper == "" || filepath.Base(upper) != "diff" || filepath.Dir(work) != layer {
		return "", diskRefusal(fmt.Errorf("the engine's overlay2 layer (upper %q, work %q) is not laid out as Roche expects", upper, work))
	}
	if err := sizeLayerDir(layer, size); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return "", diskRefusal(fmt.Errorf("the engine's storage (%s) is not visible from here: %v", layer, err))
		}
		return "", fmt.Errorf("bounding the writable root of sandbox %s to %s: %w", id, cfg.Disk, err)
	}
	return layer, nil
}

// checkRootSized makes sure the running container's root is the sized filesystem under
// layer: were the engine in another mount namespace that does not see Roche's mounts,
// the sandbox would write to the engine's disk without a bound.
func (p *Provider) checkRootSized(ctx context.Context, id, layer string) error {
	if layer == "" {
		return nil
	}
	c, err := p.cli.ContainerInspect(ctx, id)
	if err != nil {
		return p.engineErr("inspecting sandbox "+id, err)
	}
	if c.State == nil || !c.State.Running || c.State.Pid == 0 {
		return nil // it ended already; nothing runs to write
	}
	pid := c.State.Pid
	if p.gvisor() {
		// The engine's pid is gVisor's kernel, whose root is an empty directory; its
		// gofer, which serves the sandbox its files, has the container's root as its own.
		if pid, err = goferPid(pid, id); err != nil {
			return fmt.Errorf("%w: checking the disk limit of sandbox %s: %v", roche.ErrUnavailable, id, err)
		}
	}
	same, err := sameFilesystem(fmt.Sprintf("/proc/%d/root", pid), layer)
	if errors.Is(err, fs.ErrNotExist) {
		// The process may have ended meanwhile; if it still runs, this process cannot
		// see it (another PID namespace) and so cannot vouch for the limit.
		if again, ierr := p.cli.ContainerInspect(ctx, id); ierr != nil || again.State == nil || !again.State.Running || again.State.Pid != c.State.Pid {
			return nil
		}
	}
	if err != nil {
		return fmt.Errorf("%w: checking the disk limit of sandbox %s: %v", roche.ErrUnavailable, id, err)
	}
	if !same {
		return diskRefusal(errors.New("the engine does not see the filesystem Roche mounted under its storage (does it run in another mount namespace?)"))
	}
	return nil
}
