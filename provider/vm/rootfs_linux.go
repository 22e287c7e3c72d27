package vm

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/client"
	"golang.org/x/sys/unix"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/internal/flock"
	"github.com/roche-sandbox/roche/provider/internal/engine"
)

// rootfsFormat names how root filesystems are built; changing the builder changes it, so
// cached images from an older builder are not used.
const rootfsFormat = "ext4-v1"

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
	dockerd := p.dockerEngine(cli)
	ictx, done := dockerd.Bound(ctx, "inspecting image "+ref, engine.ControlTimeout)
	ins, err := cli.ImageInspect(ictx, ref)
	done(&err)
	var notAnswering *engine.NotAnsweringError
	if errors.As(err, &notAnswering) {
		return imageRoot{}, notAnswering
	}
	if err != nil {
		switch {
		case cerrdefs.IsNotFound(err):
			return imageRoot{}, &roche.Remedy{Err: fmt.Errorf("%w: image %s is not in the local Docker engine (the %s provider builds the VM's root filesystem from a Docker image)",
				roche.ErrImageNotFound, ref, p.Name()), Run: "roche image build python", AsRoot: true, Image: "roche/python:local"}
		case client.IsErrConnectionFailed(err):
			return imageRoot{}, fmt.Errorf("%w: the %s provider builds each VM's root filesystem from a Docker image, and the Docker engine is not reachable: start it (sudo dockerd &)",
				roche.ErrUnavailable, p.Name())
		}
		return imageRoot{}, fmt.Errorf("inspecting image %s: %w", ref, err)
	}
	root := imageRoot{id: strings.TrimPrefix(ins.ID, "sha256:")}
	if ins.Config != nil {
		root.env, root.workdir = ins.Config.Env, ins.Config.WorkingDir
	}
	if strings.ContainsAny(root.id, "/.") || root.id == "" {
		return imageRoot{}, fmt.Errorf("image %s has an unexpected id %q", ref, ins.ID)
	}
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
		Labels:     map[string]string{"roche.rootfs-export": "true"},
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
	stats, err := extractRootfs(rc, tree)
	rc.Close()
	if err != nil {
		return fmt.Errorf("unpacking the export: %w", err)
	}
	if err := prepareTree(tree); err != nil {
		return err
	}

	// The image is sparse: generous room costs no disk, and a full root is read-only anyway.
	size := (stats.bytes+stats.inodes*4096)*5/4 + 64<<20
	size = (size + 1<<20 - 1) &^ (1<<20 - 1)
	inodes := stats.inodes*5/4 + 4096
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

type extractStats struct {
	bytes  int64 // file data, rounded up to blocks
	inodes int64
}

// extractRootfs unpacks an exported root filesystem into dir with owners, modes, times,
// hard links, device nodes and extended attributes kept. Every path is resolved beneath
// dir without following symlinks (openat2 RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS): an image
// is untrusted input, and a link planted by one entry must not carry a later entry onto
// the host.
func extractRootfs(r io.Reader, dir string) (extractStats, error) {
	var st extractStats
	rootFD, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return st, err
	}
	defer unix.Close(rootFD)
	type dirAttrs struct {
		name     string
		mode     uint32
		uid, gid int
		mtime    time.Time
	}
	var dirs []dirAttrs
	tr := tar.NewReader(r)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return st, fmt.Errorf("reading the image archive: %w", err)
		}
		name, err := cleanEntry(hdr.Name)
		if err != nil {
			return st, err
		}
		st.inodes++
		mode := uint32(hdr.Mode & 0o7777)
		if name == "." {
			if hdr.Typeflag == tar.TypeDir {
				dirs = append(dirs, dirAttrs{".", mode, hdr.Uid, hdr.Gid, hdr.ModTime})
			}
			continue
		}
		pfd, base, err := openParent(rootFD, name)
		if err != nil {
			return st, fmt.Errorf("%s: %w", name, err)
		}
		err = func() error {
			defer unix.Close(pfd)
			switch hdr.Typeflag {
			case tar.TypeDir:
				if err := unix.Mkdirat(pfd, base, 0o700); err != nil {
					if !errors.Is(err, unix.EEXIST) {
						return err
					}
					var s unix.Stat_t
					if err := unix.Fstatat(pfd, base, &s, unix.AT_SYMLINK_NOFOLLOW); err != nil {
						return err
					}
					if s.Mode&unix.S_IFMT != unix.S_IFDIR {
						if err := unix.Unlinkat(pfd, base, 0); err != nil {
							return err
						}
						if err := unix.Mkdirat(pfd, base, 0o700); err != nil {
							return err
						}
					}
				}
				dirs = append(dirs, dirAttrs{name, mode, hdr.Uid, hdr.Gid, hdr.ModTime})
				st.bytes += 4096
				return nil
			case tar.TypeReg: // the reader reports the old TypeRegA as TypeReg
				removeEntry(pfd, base)
				fd, err := unix.Openat(pfd, base, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
				if err != nil {
					return err
				}
				f := os.NewFile(uintptr(fd), name)
				defer f.Close()
				n, err := io.Copy(f, tr)
				if err != nil {
					return err
				}
				st.bytes += (n + 4095) &^ 4095
				if err := unix.Fchown(fd, hdr.Uid, hdr.Gid); err != nil {
					return err
				}
				// After chown, which clears set-id bits.
				if err := unix.Fchmod(fd, mode); err != nil {
					return err
				}
				for k, v := range hdr.PAXRecords {
					if attr, ok := strings.CutPrefix(k, "SCHILY.xattr."); ok {
						if err := unix.Fsetxattr(fd, attr, []byte(v), 0); err != nil && !errors.Is(err, unix.ENOTSUP) {
							return fmt.Errorf("extended attribute %s: %w", attr, err)
						}
					}
				}
				ts := []unix.Timespec{unix.NsecToTimespec(hdr.ModTime.UnixNano()), unix.NsecToTimespec(hdr.ModTime.UnixNano())}
				return unix.UtimesNanoAt(fd, "", ts, unix.AT_EMPTY_PATH)
			case tar.TypeSymlink:
				removeEntry(pfd, base)
				if err := unix.Symlinkat(hdr.Linkname, pfd, base); err != nil {
					return err
				}
				st.bytes += 4096
				return unix.Fchownat(pfd, base, hdr.Uid, hdr.Gid, unix.AT_SYMLINK_NOFOLLOW)
			case tar.TypeLink:
				target, err := cleanEntry(hdr.Linkname)
				if err != nil || target == "." {
					return fmt.Errorf("hard link to %q: %v", hdr.Linkname, err)
				}
				tfd, tbase, err := openParent(rootFD, target)
				if err != nil {
					return err
				}
				defer unix.Close(tfd)
				removeEntry(pfd, base)
				st.inodes-- // a link is not a new inode
				return unix.Linkat(tfd, tbase, pfd, base, 0)
			case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
				kind := map[byte]uint32{tar.TypeChar: unix.S_IFCHR, tar.TypeBlock: unix.S_IFBLK, tar.TypeFifo: unix.S_IFIFO}[hdr.Typeflag]
				removeEntry(pfd, base)
				dev := int(unix.Mkdev(uint32(hdr.Devmajor), uint32(hdr.Devminor)))
				if err := unix.Mknodat(pfd, base, kind|mode&0o777, dev); err != nil {
					return err
				}
				if err := unix.Fchownat(pfd, base, hdr.Uid, hdr.Gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
					return err
				}
				return unix.Fchmodat(pfd, base, mode, 0)
			}
			st.inodes--
			return nil // other entry types (sockets, pax globals) carry nothing to keep
		}()
		if err != nil {
			return st, fmt.Errorf("unpacking %s: %w", name, err)
		}
	}
	// Directories last, deepest first: writing their entries changed their times, and a
	// read-only directory must not stop its own entries being written.
	sort.Slice(dirs, func(i, j int) bool { return strings.Count(dirs[i].name, "/") > strings.Count(dirs[j].name, "/") })
	for _, d := range dirs {
		fd, err := unix.Openat2(rootFD, d.name, &unix.OpenHow{
			Flags:   unix.O_RDONLY | unix.O_DIRECTORY | unix.O_CLOEXEC,
			Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
		})
		if err != nil {
			return st, fmt.Errorf("directory %s: %w", d.name, err)
		}
		err = unix.Fchown(fd, d.uid, d.gid)
		if err == nil {
			err = unix.Fchmod(fd, d.mode)
		}
		if err == nil {
			ts := []unix.Timespec{unix.NsecToTimespec(d.mtime.UnixNano()), unix.NsecToTimespec(d.mtime.UnixNano())}
			err = unix.UtimesNanoAt(fd, "", ts, unix.AT_EMPTY_PATH)
		}
		unix.Close(fd)
		if err != nil {
			return st, fmt.Errorf("directory %s: %w", d.name, err)
		}
	}
	return st, nil
}

// cleanEntry turns an archive name into a clean relative path, refusing one that climbs out.
func cleanEntry(name string) (string, error) {
	p := path.Clean("/" + strings.TrimPrefix(name, "./"))
	if strings.Contains(name, "\x00") {
		return "", fmt.Errorf("archive entry %q has a NUL byte", name)
	}
	for _, part := range strings.Split(name, "/") {
		if part == ".." {
			return "", fmt.Errorf("archive entry %q climbs out with \"..\"", name)
		}
	}
	if p == "/" {
		return ".", nil
	}
	return p[1:], nil
}

// openParent opens the directory that will hold name, beneath root, never through a
// symlink, making missing directories on the way.
func openParent(rootFD int, name string) (int, string, error) {
	parent, base := path.Split(name)
	parent = strings.TrimSuffix(parent, "/")
	if parent == "" {
		parent = "."
	}
	how := &unix.OpenHow{
		Flags:   unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	}
	fd, err := unix.Openat2(rootFD, parent, how)
	if errors.Is(err, unix.ENOENT) {
		// Archives list directories before their entries, but need not.
		cur := "."
		for _, part := range strings.Split(parent, "/") {
			cur = path.Join(cur, part)
			pfd, pbase, perr := openParent(rootFD, cur)
			if perr != nil {
				return -1, "", perr
			}
			if merr := unix.Mkdirat(pfd, pbase, 0o755); merr != nil && !errors.Is(merr, unix.EEXIST) {
				unix.Close(pfd)
				return -1, "", merr
			}
			unix.Close(pfd)
		}
		fd, err = unix.Openat2(rootFD, parent, how)
	}
	if err != nil {
		if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.EXDEV) {
			return -1, "", fmt.Errorf("the path goes through a symlink, which the image builder does not follow: %w", err)
		}
		return -1, "", err
	}
	return fd, base, nil
}

// removeEntry removes whatever name is in a directory, so an entry replaces it.
func removeEntry(dirFD int, name string) {
	if err := unix.Unlinkat(dirFD, name, 0); errors.Is(err, unix.EISDIR) {
		_ = unix.Unlinkat(dirFD, name, unix.AT_REMOVEDIR)
	}
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
