package docker_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/docker/docker/api/types/volume"
	"github.com/docker/docker/client"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/internal/testenv"
	"github.com/roche-sandbox/roche/provider/docker"
)

// fillProbe writes up to 200 MiB, 1 MiB at a time, into the file it is given and
// prints the errno it stopped at (or "unbounded") and the MiB written. The file is
// kept, so that the host side can be measured.
const fillProbe = `
import errno, os, sys
n = 0
try:
    with open(sys.argv[1], 'wb') as f:
        while n < (200 << 20):
            f.write(b'\x5a' * (1 << 20)); f.flush(); os.fsync(f.fileno()); n += 1 << 20
    print('unbounded', n >> 20)
except OSError as e:
    print(errno.errorcode.get(e.errno), n >> 20)
`

// fill runs fillProbe on path and returns what it stopped at and the MiB written.
func fill(t *testing.T, p *docker.Provider, id, path string) (string, int) {
	t.Helper()
	fields := strings.Fields(execOK(t, p, id, "python3", "-c", fillProbe, path))
	if len(fields) != 2 {
		t.Fatalf("fill probe printed %q", fields)
	}
	mib, _ := strconv.Atoi(fields[1])
	return fields[0], mib
}

// hostClient is an Engine API client of the test's own, for looking at what the
// provider made from the host's side.
func hostClient(t *testing.T) *client.Client {
	t.Helper()
	c, err := client.NewClientWithOpts(client.FromEnv, client.WithAPIVersionNegotiation())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// TestWritableRootBoundedByDisk: a writable root of 100m gets ENOSPC from inside once
// about 100 MiB are written, and the engine's host holds no more than that for it; once
// the sandbox is gone, so is its filesystem.
func TestWritableRootBoundedByDisk(t *testing.T) {
	p := newProvider(t)
	cfg := testConfig()
	cfg.Writable = true
	cfg.Disk = "100m"
	id := sandbox(t, p, cfg)

	stopped, mib := fill(t, p, id, "/var/tmp/fill")
	if stopped != "ENOSPC" || mib > 100 || mib < 80 {
		t.Fatalf("writing 200 MiB to a 100m root: stopped at %s after %d MiB, want ENOSPC after 80 to 100", stopped, mib)
	}
	// The host's side: what the engine holds for the container's writable layer.
	ctx := context.Background()
	c, _, err := hostClient(t).ContainerInspectWithRaw(ctx, id, true)
	if err != nil {
		t.Fatal(err)
	}
	if c.SizeRw == nil || *c.SizeRw > 100<<20 || *c.SizeRw < int64(mib)<<20 {
		t.Fatalf("the engine holds %v bytes for the sandbox's writable layer, want %d MiB to 100 MiB", c.SizeRw, mib)
	}
	layer := filepath.Dir(c.GraphDriver.Data["UpperDir"])
	if _, err := os.Stat(layer); err != nil {
		t.Fatalf("the layer directory %s: %v", layer, err)
	}
	// Programs can go on once space is freed.
	execOK(t, p, id, "rm", "/var/tmp/fill")
	execOK(t, p, id, "sh", "-c", "echo again > /var/tmp/again")

	if err := p.Destroy(ctx, id); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := os.Stat(layer)
		if errors.Is(err, os.ErrNotExist) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the sandbox's layer %s (and its disk image) is still there after it was destroyed: %v", layer, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestWritableRootDefaultDisk: without --disk a writable root still has a bound, the
// 1g default; --disk 0 is the explicit way to have none.
func TestWritableRootDefaultDisk(t *testing.T) {
	p := newProvider(t)
	const statRoot = "import os; s = os.statvfs('/'); print(s.f_blocks * s.f_frsize >> 20)"
	cfg := testConfig()
	cfg.Writable = true
	id := sandbox(t, p, cfg)
	mib, _ := strconv.Atoi(strings.TrimSpace(execOK(t, p, id, "python3", "-c", statRoot)))
	if mib < 900 || mib > 1024 {
		t.Fatalf("a writable root by default is %d MiB, want the 1g default", mib)
	}

	cfg.Disk = "0"
	id = sandbox(t, p, cfg)
	mib, _ = strconv.Atoi(strings.TrimSpace(execOK(t, p, id, "python3", "-c", statRoot)))
	if mib <= 1024 {
		t.Fatalf("a writable root with disk 0 is %d MiB, want the engine's own disk, unbounded by Roche", mib)
	}
}

// TestDiskRefusedWhereUnenforceable: a provider that cannot mount where its engine keeps
// containers (here: an engine reached over TCP) refuses a writable root with a limit,
// saying how to proceed, and makes nothing; a read-only root needs no limit.
func TestDiskRefusedWhereUnenforceable(t *testing.T) {
	testenv.Needs(t, testenv.Root) // not root, the refusal is for the mount, before the engine's
	c, err := client.NewClientWithOpts(client.WithHost("tcp://127.0.0.1:1"), client.WithAPIVersionNegotiation())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	p, err := docker.New(docker.WithClient(c))
	if err != nil {
		t.Fatal(err)
	}
	cfg := testConfig()
	cfg.Writable = true
	_, err = p.Create(context.Background(), cfg)
	if !errors.Is(err, roche.ErrUnsupported) || !strings.Contains(err.Error(), "--disk 0") || !strings.Contains(err.Error(), "tcp://127.0.0.1:1") {
		t.Fatalf("a bounded writable root on a remote engine: %v, want ErrUnsupported naming the engine and --disk 0", err)
	}
	cfg.Workspace = "remote"
	cfg.Writable = false
	_, err = p.Create(context.Background(), cfg)
	if !errors.Is(err, roche.ErrUnsupported) || !strings.Contains(err.Error(), "workspace remote") {
		t.Fatalf("a workspace on a remote engine: %v, want ErrUnsupported", err)
	}
}

// TestWorkspaceSized: a workspace of 50m gets ENOSPC from inside, holds no more than its
// size on the host, keeps its size (another size is refused), and gives its space back
// when removed.
func TestWorkspaceSized(t *testing.T) {
	dataDir := t.TempDir()
	p := newProvider(t, docker.WithDataDir(dataDir))
	name := workspaceName(t)
	removeAtEnd(t, "workspace", p.RemoveWorkspace, name)
	cfg := testConfig()
	cfg.Workspace = name
	cfg.WorkspaceSize = "50m"
	id := sandbox(t, p, cfg)

	stopped, mib := fill(t, p, id, "/workspace/fill")
	if stopped != "ENOSPC" || mib > 50 || mib < 40 {
		t.Fatalf("writing 200 MiB to a 50m workspace: stopped at %s after %d MiB, want ENOSPC after 40 to 50", stopped, mib)
	}
	img := filepath.Join(dataDir, "workspaces", name+".img")
	if used := allocated(t, img); used > 50<<20 || used < int64(mib)<<20 {
		t.Fatalf("the workspace's image holds %d bytes of the host's disk, want %d MiB to 50 MiB", used, mib)
	}
	ws := listed(t, p, name)
	if ws == nil || ws.SizeBytes != 50<<20 {
		t.Fatalf("workspace list shows %+v, want %s with 50 MiB", ws, name)
	}
	if err := p.Destroy(context.Background(), id); err != nil {
		t.Fatal(err)
	}

	// Its size is fixed: another is refused, none means its own.
	cfg.WorkspaceSize = "60m"
	if _, err := p.Create(context.Background(), cfg); !errors.Is(err, roche.ErrInvalidConfig) || !strings.Contains(err.Error(), "50 MiB") {
		t.Fatalf("a create asking workspace %s (50m) for 60m: %v, want ErrInvalidConfig naming its size", name, err)
	}
	cfg.WorkspaceSize = ""
	id = sandbox(t, p, cfg)
	if got := execOK(t, p, id, "python3", "-c", "import os; s = os.statvfs('/workspace'); print(os.path.getsize('/workspace/fill') >> 20, s.f_blocks * s.f_frsize >> 20)"); got != strconv.Itoa(mib)+" 50\n" && !strings.HasPrefix(got, strconv.Itoa(mib)+" 4") {
		t.Fatalf("the workspace used again: %q, want its %d MiB file on a filesystem of about 50 MiB", got, mib)
	}
	if err := p.Destroy(context.Background(), id); err != nil {
		t.Fatal(err)
	}

	if err := eventuallyRemoved(p, name); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{img, filepath.Join(dataDir, "workspaces", "mnt", name), filepath.Join(dataDir, "workspaces", name+".json")} {
		if _, err := os.Lstat(f); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s is still there after the workspace was removed: %v", f, err)
		}
	}
}

// TestWorkspaceFromOlderRoche: a workspace kept as an unsized volume by an older Roche is
// listed and removable, and using it is refused with what to do.
func TestWorkspaceFromOlderRoche(t *testing.T) {
	p := newProvider(t, docker.WithDataDir(t.TempDir()))
	ctx := context.Background()
	name := workspaceName(t)
	_, err := hostClient(t).VolumeCreate(ctx, volume.CreateOptions{
		Name: "roche-ws-" + name, Labels: map[string]string{docker.LabelManaged: "true", docker.LabelWorkspace: name},
	})
	if err != nil {
		t.Fatal(err)
	}
	removeAtEnd(t, "workspace", p.RemoveWorkspace, name)
	if ws := listed(t, p, name); ws == nil || ws.SizeBytes != 0 {
		t.Fatalf("workspace list shows %+v, want the old volume %s without a size", ws, name)
	}
	before, err := p.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	cfg := testConfig()
	cfg.Workspace = name
	_, err = p.Create(ctx, cfg)
	if !errors.Is(err, roche.ErrUnsupported) || !strings.Contains(err.Error(), "roche workspace rm "+name) {
		t.Fatalf("using an unsized workspace: %v, want ErrUnsupported saying how to move on", err)
	}
	if after, _ := p.List(ctx); len(after) != len(before) {
		t.Fatalf("a refused create left a sandbox: %d before, %d after", len(before), len(after))
	}
	if err := p.RemoveWorkspace(ctx, name); err != nil {
		t.Fatalf("removing the old workspace: %v", err)
	}
	if _, err := hostClient(t).VolumeInspect(ctx, "roche-ws-"+name); err == nil {
		t.Fatal("the old workspace's volume survived its removal")
	}
}

// allocated is how much of the host's disk file holds (it is sparse).
func allocated(t *testing.T, file string) int64 {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(file, &st); err != nil {
		t.Fatal(err)
	}
	return st.Blocks * 512
}

func listed(t *testing.T, p *docker.Provider, name string) *roche.Workspace {
	t.Helper()
	ws, err := p.Workspaces(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for i := range ws {
		if ws[i].Name == name {
			return &ws[i]
		}
	}
	return nil
}

// eventuallyRemoved removes workspace name once the engine has let go of it.
func eventuallyRemoved(p *docker.Provider, name string) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := p.RemoveWorkspace(context.Background(), name)
		if err == nil || !errors.Is(err, roche.ErrInUse) || time.Now().After(deadline) {
			return err
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestWorkspaceRefusedLeavesNothing: a create that fails leaves no workspace it made for
// it, and one refused for an old volume workspace leaves no file either.
func TestWorkspaceRefusedLeavesNothing(t *testing.T) {
	dataDir := t.TempDir()
	p := newProvider(t, docker.WithDataDir(dataDir))
	cfg := testConfig()
	cfg.Workspace = workspaceName(t)
	cfg.Image = "roche/no-such-image:none"
	if _, err := p.Create(context.Background(), cfg); err == nil {
		t.Fatal("a create with a missing image succeeded")
	}
	if left := dataFiles(t, dataDir); len(left) != 0 {
		t.Fatalf("a failed create left its new workspace's files: %v", left)
	}
	name := workspaceName(t) + "-old"
	ctx := context.Background()
	if _, err := hostClient(t).VolumeCreate(ctx, volume.CreateOptions{
		Name: "roche-ws-" + name, Labels: map[string]string{docker.LabelManaged: "true", docker.LabelWorkspace: name},
	}); err != nil {
		t.Fatal(err)
	}
	removeAtEnd(t, "workspace", p.RemoveWorkspace, name)
	cfg = testConfig()
	cfg.Workspace = name
	if _, err := p.Create(ctx, cfg); !errors.Is(err, roche.ErrUnsupported) {
		t.Fatalf("using an old volume workspace: %v", err)
	}
	if left := dataFiles(t, dataDir); len(left) != 0 {
		t.Fatalf("files left in the workspaces directory: %v", left)
	}
}

// dataFiles lists what the workspaces directory of dataDir holds, its mount points
// included, but not the directories that hold them.
func dataFiles(t *testing.T, dataDir string) []string {
	t.Helper()
	var files []string
	for _, pattern := range []string{"*", "mnt/*"} {
		m, _ := filepath.Glob(filepath.Join(dataDir, "workspaces", pattern))
		for _, f := range m {
			if filepath.Base(f) != "mnt" {
				files = append(files, f)
			}
		}
	}
	return files
}

// TestWorkspaceNamesWithDots: names may hold dots, and one workspace's files are never
// another's ("w" and "w.lock", "w.img", "w.json").
func TestWorkspaceNamesWithDots(t *testing.T) {
	p := newProvider(t, docker.WithDataDir(t.TempDir()))
	base := workspaceName(t)
	for _, name := range []string{base, base + ".lock", base + ".img", base + ".json"} {
		removeAtEnd(t, "workspace", p.RemoveWorkspace, name)
		cfg := testConfig()
		cfg.Workspace = name
		cfg.WorkspaceSize = "16m"
		id := sandbox(t, p, cfg)
		execOK(t, p, id, "sh", "-c", "echo "+name+" > /workspace/name")
		if err := p.Destroy(context.Background(), id); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range []string{base, base + ".lock", base + ".img", base + ".json"} {
		cfg := testConfig()
		cfg.Workspace = name
		id := sandbox(t, p, cfg)
		if got := execOK(t, p, id, "cat", "/workspace/name"); got != name+"\n" {
			t.Fatalf("workspace %s holds %q", name, got)
		}
	}
}
