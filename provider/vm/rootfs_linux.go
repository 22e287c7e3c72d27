package vm

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/client"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/internal/flock"
	"github.com/roche-sandbox/roche/provider/internal/engine"
	"github.com/roche-sandbox/roche/provider/internal/imagefs"
)

// rootfsFormat names how root filesystems are built; changing the builder changes it, so
// cached images from an older builder are not used.
const rootfsFormat = "ext4-v2"

// imageRoot is a VM root filesystem built from a Docker image, with what the VM needs
// from the image's config.
type imageRoot struct {
	id      string // the image id, which names the cached file
	path    string // the ext4 image
	env     []string
	workdir string
}

// rootfs returns the root filesystem for ref, building and caching it (by image id) the
// first time: the image is exported through the Engine API (a container is created, never
// started, and removed) and written into an ext4 image with mkfs.ext4 -d.
func (p *Provider) rootfs(ctx context.Context, ref string) (imageRoot, error) {
	cli, err := p.dockerClient()
	if err != nil {
		return imageRoot{}, err
	}
	img, err := imagefs.Inspect(ctx, cli, p.dockerEngine(cli), ref,
		"the "+p.Name()+" provider builds each VM's root filesystem from a Docker image", "start it (sudo dockerd &)")
	if err != nil {
		return imageRoot{}, err
	}
	root := imageRoot{id: img.ID, env: img.Env, workdir: img.Workdir}
	dir := filepath.Join(p.cacheDir, "rootfs")
	root.path = filepath.Join(dir, rootfsFormat+"-"+root.id+".ext4")
	if _, err := os.Stat(root.path); err == nil {
		return root, nil
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return imageRoot{}, fmt.Errorf("%w: making the root filesystem cache: %v", roche.ErrUnavailable, err)
	}
	// One build at a time, across processes (the lock is on the directory, so no lock
	// file is left behind).
	unlock, err := flock.Lock(ctx, dir)
	if err != nil {
		return imageRoot{}, err
	}
	defer unlock()
	if _, err := os.Stat(root.path); err == nil {
		return root, nil
	}
	start := time.Now()
	if err := p.buildRootfs(ctx, cli, ref, root.path); err != nil {
		return imageRoot{}, fmt.Errorf("building the VM root filesystem from image %s: %w", ref, err)
	}
	p.log.Info("built VM root filesystem", "image", ref, "path", root.path, "took", time.Since(start).Round(time.Millisecond))
	return root, nil
}

// buildRootfs exports ref and writes it as an ext4 image at dst. Nothing is left behind
// on failure: not the container, not the extracted tree, not a partial image.
func (p *Provider) buildRootfs(ctx context.Context, cli *client.Client, ref, dst string) (err error) {
	mkfs := p.mkfs
	if mkfs == "" {
		if mkfs, err = exec.LookPath("mkfs.ext4"); err != nil {
			return fmt.Errorf("%w: mkfs.ext4 is not installed: apt-get install e2fsprogs", roche.ErrUnavailable)
		}
	}
	if os.Geteuid() != 0 {
		return fmt.Errorf("%w: building a VM root filesystem keeps the image's file owners, which needs root", roche.ErrUnavailable)
	}
	tmp, err := os.MkdirTemp(filepath.Dir(dst), ".build-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	tree := filepath.Join(tmp, "root")
	if err := os.Mkdir(tree, 0o755); err != nil {
		return err
	}

	dockerd := p.dockerEngine(cli)
	cctx, done := dockerd.Bound(ctx, "creating a container to export "+ref, engine.ControlTimeout)
	created, err := cli.ContainerCreate(cctx, &container.Config{
		Image: ref,
		// Never started: a command is only required to create it.
		Entrypoint: []string{"/.roche-rootfs-export"},
		// Which cache the build is for: a test (or a look at the engine) can tell its
		// own export containers from another process's.
		Labels: map[string]string{"roche.rootfs-export": filepath.Dir(dst)},
	}, &container.HostConfig{NetworkMode: "none"}, nil, nil, "")
	done(&err)
	if err != nil {
		return fmt.Errorf("creating a container to export: %w", err)
	}
	defer func() {
		rctx, done := dockerd.Bound(context.WithoutCancel(ctx), "removing the export container", engine.ControlTimeout)
		rerr := cli.ContainerRemove(rctx, created.ID, container.RemoveOptions{Force: true})
		done(&rerr)
		if rerr != nil && !cerrdefs.IsNotFound(rerr) {
			p.log.Warn("removing the export container", "id", created.ID, "err", rerr)
		}
	}()
	rc, err := cli.ContainerExport(ctx, created.ID)
	if err != nil {
		return fmt.Errorf("exporting: %w", err)
	}
	rep, err := imagefs.Unpack(rc, tree, true)
	rc.Close()
	if err != nil {
		return fmt.Errorf("unpacking the export: %w", err)
	}
	if err := prepareTree(tree); err != nil {
		return err
	}

	// The image is sparse: generous room costs no disk, and a full root is read-only
	// anyway. Every file's last block, directory and symlink counted as a whole block.
	files := int64(rep.Files + rep.Dirs + rep.Links)
	bytes, inodes := rep.Bytes+files*4096, files+int64(rep.Nodes)
	size := (bytes+inodes*4096)*5/4 + 64<<20
	size = (size + 1<<20 - 1) &^ (1<<20 - 1)
	inodes = inodes*5/4 + 4096
	part := filepath.Join(tmp, "image.ext4")
	cmd := exec.CommandContext(ctx, mkfs, "-q", "-F", "-t", "ext4", "-L", "roche-root",
		"-b", "4096", "-I", "256", "-N", strconv.FormatInt(inodes, 10), "-m", "0",
		"-O", "^has_journal", "-E", "lazy_itable_init=1,nodiscard",
		"-d", tree, part, strconv.FormatInt(size>>10, 10)+"k")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%s: %v: %s", filepath.Base(mkfs), err, strings.TrimSpace(lastLines(string(out), 5)))
	}
	if err := os.Chmod(part, 0o644); err != nil {
		return err
	}
	return os.Rename(part, dst)
}

// prepareTree makes the exported tree bootable as a read-only root: the mount points the
// guest needs exist, and files a container engine would have bind-mounted are there to
// be covered at boot.
func prepareTree(tree string) error {
	_ = os.Remove(filepath.Join(tree, ".dockerenv"))
	for _, d := range []struct {
		name string
		mode os.FileMode
	}{{"proc", 0o555}, {"sys", 0o555}, {"dev", 0o755}, {"tmp", 0o1777}, {"run", 0o755}, {"etc", 0o755}} {
		p := filepath.Join(tree, d.name)
		fi, err := os.Lstat(p)
		if err == nil && fi.IsDir() {
			continue
		}
		if err == nil {
			if err := os.Remove(p); err != nil {
				return err
			}
		}
		if err := os.Mkdir(p, d.mode); err != nil {
			return err
		}
		if err := os.Chmod(p, d.mode); err != nil {
			return err
		}
	}
	// The egress CA's paths (trustPaths), made only where the image has nothing: an
	// image's own file stays as it is, and a link there is refused at boot, never
	// followed.
	for _, f := range trustPaths {
		p := filepath.Join(tree, f)
		if _, err := os.Lstat(p); err == nil {
			continue
		}
		if mkdirAllNoLinks(tree, filepath.Dir(f)) != nil {
			continue // a link or a file on the way: egress's boot says so, others boot
		}
		if err := os.WriteFile(p, nil, 0o644); err != nil {
			return err
		}
	}
	for _, f := range []string{"etc/hosts", "etc/hostname", "etc/resolv.conf"} {
		p := filepath.Join(tree, f)
		if fi, err := os.Lstat(p); err == nil && fi.Mode().IsRegular() {
			continue
		} else if err == nil {
			if err := os.Remove(p); err != nil {
				return err
			}
		}
		if err := os.WriteFile(p, nil, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// mkdirAllNoLinks makes dir (absolute, inside tree) and its parents, mode 0755, and
// fails where a component exists and is not a directory (a link included): the tree is
// an image's, and a link in it must not take the builder outside.
func mkdirAllNoLinks(tree, dir string) error {
	p := tree
	for _, c := range strings.Split(strings.Trim(dir, "/"), "/") {
		p = filepath.Join(p, c)
		fi, err := os.Lstat(p)
		if err == nil {
			if !fi.IsDir() {
				return fmt.Errorf("%s in the image is not a directory", strings.TrimPrefix(p, tree))
			}
			continue
		}
		if err := os.Mkdir(p, 0o755); err != nil {
			return err
		}
	}
	return nil
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// dockerEngine names the Docker engine for the errors of calls that build root
// filesystems.
func (p *Provider) dockerEngine(cli *client.Client) engine.Engine {
	return engine.Engine{
		Name: "the Docker engine (the " + p.Name() + " provider builds each VM's root filesystem from an image with it)",
		Addr: cli.DaemonHost(),
		Hint: "check that dockerd runs and is not stuck (sudo systemctl status docker)",
	}
}
