// Package imagebuild makes Roche's Python sandbox image from Debian packages, with
// debootstrap and no container registry: roche image build python, which
// scripts/build-test-image.sh runs for the test suite (one recipe for both).
//
// The image is Debian's minbase with python3, numpy, pandas and matplotlib, imported
// into the local Docker engine. The oci and microVM providers read images from there;
// a Kubernetes node's containerd takes it from docker save (the test cluster's
// cluster.sh import-docker).
package imagebuild

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/api/types/image"
	dockerclient "github.com/docker/docker/client"

	"github.com/roche-sandbox/roche"
)

// Version is the recipe's: an image whose roche.image.version label differs is rebuilt.
// Bump it when the packages or steps below change.
const Version = "4"

// VersionLabel is the image label that records Version.
const VersionLabel = "roche.image.version"

// DefaultTag and DefaultSuite are what roche image build python makes, from what.
const (
	DefaultTag   = "roche/python:local"
	DefaultSuite = "bookworm"
)

// Packages are installed on top of debootstrap's minbase (which with python3 has the
// whole standard library, coreutils, tar and a POSIX sh). numpy, pandas and matplotlib
// make the code contexts' rich results real: a chart as a PNG, a DataFrame as HTML.
var Packages = []string{"python3", "python3-numpy", "python3-pandas", "python3-matplotlib"}

// unneeded are packages Debian's python3-fonttools (which matplotlib needs) drags in for
// features matplotlib never uses: scipy and sympy, and through scipy's pythran gcc, g++
// and boost, 700 MB. They are purged again with dpkg told to ignore the dependencies,
// and the imports are checked after.
var unneeded = strings.Fields(`libboost1.74-dev python3-scipy python3-sympy python3-mpmath python3-pythran
  python3-gast python3-beniget gcc-12 g++-12 cpp-12 gcc g++ cpp libstdc++-12-dev libgcc-12-dev
  libopenblas-pthread-dev libopenblas-dev liblapack-dev libblas-dev libpython3.11-dev
  libpython3-dev python3.11-dev python3-dev libexpat1-dev zlib1g-dev libc6-dev libc-dev-bin
  linux-libc-dev libcrypt-dev libnsl-dev libtirpc-dev rpcsvc-proto binutils binutils-common
  binutils-x86-64-linux-gnu libbinutils libgprofng0 libctf0 libctf-nobfd0 libasan8 libtsan2
  liblsan0 libubsan1 libitm1 libcc1-0 libisl23 libmpc3 unicode-data`)

// Options say what to build.
type Options struct {
	// Tag is the image's name (DefaultTag when empty).
	Tag string
	// Suite is the Debian release (DefaultSuite when empty); Mirror the Debian mirror
	// (when empty, the host's apt source, else debootstrap's default).
	Suite, Mirror string
	// CacheDir keeps the downloaded packages for the next build (debootstrap
	// --cache-dir); empty: the user's cache directory, roche/debootstrap.
	CacheDir string
	// Force rebuilds an image that carries Version already.
	Force bool
	// Log receives progress lines.
	Log io.Writer
}

// Build makes the image unless it exists with this Version (built false then). It needs
// root (debootstrap, chroot) and debootstrap. A rebuilt image replaces the old name in
// one step (built under a temporary tag, then tagged), so that a sandbox starting
// meanwhile finds a whole image.
func Build(ctx context.Context, o Options) (built bool, err error) {
	if o.Tag == "" {
		o.Tag = DefaultTag
	}
	if o.Suite == "" {
		o.Suite = DefaultSuite
	}
	if o.Log == nil {
		o.Log = io.Discard
	}
	cli, err := dockerclient.NewClientWithOpts(dockerclient.FromEnv, dockerclient.WithAPIVersionNegotiation())
	if err != nil {
		return false, fmt.Errorf("%w: configuring the Docker client: %v", roche.ErrUnavailable, err)
	}
	defer cli.Close()
	ictx, cancel := context.WithTimeout(ctx, 30*time.Second)
	ins, err := cli.ImageInspect(ictx, o.Tag)
	cancel()
	switch {
	case err == nil:
		have := ""
		if ins.Config != nil {
			have = ins.Config.Labels[VersionLabel]
		}
		if have == Version && !o.Force {
			fmt.Fprintf(o.Log, "image %s already exists (version %s)\n", o.Tag, Version)
			return false, nil
		}
		fmt.Fprintf(o.Log, "image %s has version %q, want %s: rebuilding it\n", o.Tag, have, Version)
	case dockerclient.IsErrConnectionFailed(err):
		return false, fmt.Errorf("%w: the image goes into the local Docker engine, which is not reachable at %s: start it (dockerd)", roche.ErrUnavailable, cli.DaemonHost())
	case !cerrdefs.IsNotFound(err):
		return false, fmt.Errorf("inspecting image %s: %w", o.Tag, err)
	}
	if os.Geteuid() != 0 {
		return false, fmt.Errorf("%w: building an image runs debootstrap and chroot, which need root: run it as root (sudo roche image build python)", roche.ErrPermission)
	}
	if _, err := exec.LookPath("debootstrap"); err != nil {
		return false, fmt.Errorf("%w: debootstrap is not installed: apt-get install debootstrap", roche.ErrUnavailable)
	}
	if o.CacheDir == "" {
		if dir, err := os.UserCacheDir(); err == nil {
			o.CacheDir = filepath.Join(dir, "roche", "debootstrap")
		}
	}
	if o.Mirror == "" {
		o.Mirror = hostMirror()
	}
	root, err := os.MkdirTemp("", "roche-image-")
	if err != nil {
		return false, err
	}
	defer removeRoot(root, o.Log)
	if err := bootstrap(ctx, o, root); err != nil {
		return false, err
	}
	if err := trim(ctx, o, root); err != nil {
		return false, err
	}
	if err := importImage(ctx, cli, o, root); err != nil {
		return false, err
	}
	fmt.Fprintf(o.Log, "built %s (version %s)\n", o.Tag, Version)
	return true, nil
}

// hostMirror is the Debian mirror this host's apt uses (deb822 or one-line sources), so
// that an air-gapped host's own mirror serves the build; "" for debootstrap's default.
func hostMirror() string {
	return mirrorFrom("/etc/apt/sources.list.d/debian.sources", "/etc/apt/sources.list")
}

func mirrorFrom(deb822, oneLine string) string {
	if f, err := os.Open(deb822); err == nil {
		defer f.Close()
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if v, ok := strings.CutPrefix(sc.Text(), "URIs:"); ok {
				if fields := strings.Fields(v); len(fields) > 0 {
					return fields[0]
				}
			}
		}
	}
	if f, err := os.Open(oneLine); err == nil {
		defer f.Close()
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if fields := strings.Fields(sc.Text()); len(fields) >= 3 && fields[0] == "deb" && !strings.HasPrefix(fields[1], "[") {
				return fields[1]
			}
		}
	}
	return ""
}

// run runs a step's command, its output kept for the error that quotes its end.
func run(ctx context.Context, what string, name string, args ...string) error {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive", "LC_ALL=C")
	out, err := cmd.CombinedOutput()
	if err != nil {
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		tail := strings.Join(lines[max(0, len(lines)-5):], " | ")
		return fmt.Errorf("%s: %v: %s", what, err, tail)
	}
	return nil
}

func bootstrap(ctx context.Context, o Options, root string) error {
	args := []string{"--variant=minbase", "--include=" + strings.Join(Packages, ",")}
	if o.CacheDir != "" {
		if err := os.MkdirAll(o.CacheDir, 0o755); err != nil {
			return err
		}
		args = append(args, "--cache-dir="+o.CacheDir)
	}
	args = append(args, o.Suite, root)
	if o.Mirror != "" {
		args = append(args, o.Mirror)
	}
	fmt.Fprintf(o.Log, "debootstrapping %s with %s into %s (a few minutes)\n", o.Suite, strings.Join(Packages, ","), root)
	return run(ctx, "debootstrap", "debootstrap", args...)
}

// trim purges what a sandbox never needs, checks the imports, and compiles Python's
// bytecode caches (a read-only sandbox cannot write them, and would otherwise compile
// pandas and matplotlib from source on every import).
func trim(ctx context.Context, o Options, root string) error {
	fmt.Fprintln(o.Log, "purging what matplotlib's dependencies dragged in, checking the imports")
	out, _ := exec.CommandContext(ctx, "chroot", append([]string{root, "dpkg-query", "-W", "-f", "${Package}\n"}, unneeded...)...).Output()
	if installed := strings.Fields(string(out)); len(installed) > 0 {
		if err := run(ctx, "purging packages", "chroot", append([]string{root, "dpkg", "--purge", "--force-depends"}, installed...)...); err != nil {
			return err
		}
	}
	// Debian's matplotlib ships a setuptools namespace-package .pth, which site runs at
	// every Python start: 6-8 ms of every python3 -c in a sandbox. Python 3 finds
	// mpl_toolkits as a namespace package without it.
	pths, _ := filepath.Glob(filepath.Join(root, "usr/lib/python3/dist-packages/*-nspkg.pth"))
	for _, p := range pths {
		if err := os.Remove(p); err != nil {
			return err
		}
	}
	if err := run(ctx, "numpy, pandas or matplotlib does not import in the image", "chroot", root, "python3", "-c",
		"import matplotlib.pyplot, numpy, pandas, mpl_toolkits.mplot3d"); err != nil {
		return err
	}
	for _, glob := range []string{"var/cache/apt/archives/*.deb", "var/lib/apt/lists/*", "usr/share/doc", "usr/share/man"} {
		matches, _ := filepath.Glob(filepath.Join(root, glob))
		for _, m := range matches {
			if err := os.RemoveAll(m); err != nil {
				return err
			}
		}
	}
	fmt.Fprintln(o.Log, "compiling Python's bytecode caches")
	_ = run(ctx, "compileall", "chroot", root, "python3", "-m", "compileall", "-q", "-j", "0", "/usr/lib/python3")
	return nil
}

// importImage streams root as a tar into the engine under a temporary tag, then moves
// the name in one step.
func importImage(ctx context.Context, cli *dockerclient.Client, o Options, root string) error {
	tmp := fmt.Sprintf("%s-build-%d", o.Tag, os.Getpid())
	if !strings.Contains(o.Tag[strings.LastIndex(o.Tag, "/")+1:], ":") {
		tmp = fmt.Sprintf("%s:build-%d", o.Tag, os.Getpid())
	}
	fmt.Fprintf(o.Log, "importing %s as %s\n", root, tmp)
	tar := exec.CommandContext(ctx, "tar", "-C", root, "--numeric-owner", "-c", ".")
	stdout, err := tar.StdoutPipe()
	if err != nil {
		return err
	}
	var tarErr strings.Builder
	tar.Stderr = &tarErr
	if err := tar.Start(); err != nil {
		return fmt.Errorf("packing the image's files: %w", err)
	}
	rc, err := cli.ImageImport(ctx, image.ImportSource{Source: stdout, SourceName: "-"}, tmp, image.ImportOptions{Changes: []string{
		"ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"LABEL " + VersionLabel + "=" + Version,
		`CMD ["python3"]`,
	}})
	if err == nil {
		_, err = io.Copy(io.Discard, rc)
		rc.Close()
	}
	if werr := tar.Wait(); werr != nil && err == nil {
		err = fmt.Errorf("packing the image's files: %v: %s", werr, strings.TrimSpace(tarErr.String()))
	}
	if err != nil {
		return fmt.Errorf("importing the image into the Docker engine: %w", err)
	}
	if err := cli.ImageTag(ctx, tmp, o.Tag); err != nil {
		return fmt.Errorf("tagging %s: %w", o.Tag, err)
	}
	if _, err := cli.ImageRemove(ctx, tmp, image.RemoveOptions{}); err != nil {
		fmt.Fprintf(o.Log, "removing the temporary tag %s: %v\n", tmp, err)
	}
	return nil
}

// removeRoot removes the build's root, after making sure nothing is still mounted below
// it (debootstrap mounts /proc and /sys in the target while it installs, and a failed
// run may leave them): a removal would otherwise descend into the host's /proc.
func removeRoot(root string, log io.Writer) {
	mounted, err := mountsBelow(root)
	for i := len(mounted) - 1; err == nil && i >= 0; i-- {
		_ = exec.Command("umount", "-l", mounted[i]).Run()
	}
	if mounted, err = mountsBelow(root); err != nil || len(mounted) > 0 {
		fmt.Fprintf(log, "leaving %s: %v is still mounted below it (%v)\n", root, mounted, err)
		return
	}
	if err := os.RemoveAll(root); err != nil && !errors.Is(err, os.ErrNotExist) {
		fmt.Fprintf(log, "removing %s: %v\n", root, err)
	}
}

// mountsBelow lists the mount points at or below dir, outermost first.
func mountsBelow(dir string) ([]string, error) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 5 {
			continue
		}
		mp := strings.ReplaceAll(f[4], `\040`, " ")
		if mp == dir || strings.HasPrefix(mp, dir+"/") {
			out = append(out, mp)
		}
	}
	return out, nil
}
