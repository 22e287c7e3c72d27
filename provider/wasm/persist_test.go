package wasm

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/internal/testenv"
)

// Workspaces, reset and snapshots as every provider has them are checked by the
// conformance suite; these are the wasm provider's own parts: where things live on disk,
// what is left there, and what two processes sharing a state directory see.

// dataEntries lists what a data subdirectory holds, leftovers included.
func dataEntries(t *testing.T, p *Provider, sub string) []string {
	t.Helper()
	entries, err := os.ReadDir(filepath.Join(p.dataDir, sub))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}

func createInfo(t *testing.T, p *Provider, cfg roche.Config) roche.SandboxInfo {
	t.Helper()
	info, err := p.Create(ctxFor(t, time.Minute), cfg)
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	t.Cleanup(func() { p.Destroy(context.Background(), info.ID) })
	return info
}

func TestDataDirectory(t *testing.T) {
	testenv.Needs(t, testenv.PythonWasm)
	// With a state directory of its own, a provider keeps its data beside its sandboxes.
	if want := filepath.Join(tp.stateDir, dataSubdir); tp.dataDir != want {
		t.Fatalf("data directory %s, want %s", tp.dataDir, want)
	}
	data := filepath.Join(t.TempDir(), "data")
	p, err := New(WithStateDir(t.TempDir()), WithDataDir(data))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if p.dataDir != data {
		t.Fatalf("WithDataDir(%s) gave %s", data, p.dataDir)
	}
	// Nothing is made there until a workspace or snapshot needs it.
	if _, err := os.Stat(data); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the data directory was made before it was needed: %v", err)
	}
	if ws, err := p.Workspaces(ctxFor(t, time.Minute)); err != nil || len(ws) != 0 {
		t.Fatalf("Workspaces of an empty data directory: %v %v", ws, err)
	}
	if snaps, err := p.Snapshots(ctxFor(t, time.Minute)); err != nil || len(snaps) != 0 {
		t.Fatalf("Snapshots of an empty data directory: %v %v", snaps, err)
	}
}

// TestWorkspaceOnDisk: the workspace is a directory of the data directory that outlives
// the sandbox, and nothing of either is left once both are removed.
func TestWorkspaceOnDisk(t *testing.T) {
	testenv.Needs(t, testenv.PythonWasm)
	cfg := roche.DefaultConfig()
	cfg.Workspace = "disk-" + strings.TrimPrefix(mustID(t), idPrefix)
	info := createInfo(t, tp, cfg)
	pyOK(t, info.ID, "open('/workspace/f', 'w').write('persisted')")
	if b, err := os.ReadFile(filepath.Join(tp.workspaceFiles(cfg.Workspace), "f")); err != nil || string(b) != "persisted" {
		t.Fatalf("the workspace's file on the host: %q %v", b, err)
	}
	// The sandbox's own /workspace, hidden by the named one, stays empty.
	if entries, _ := os.ReadDir(filepath.Join(tp.sandboxDir(info.ID), rootDir, "workspace")); len(entries) != 0 {
		t.Fatalf("the sandbox's own /workspace holds %v", entries)
	}
	// Another provider sharing the state directory (another process, as the CLI is)
	// sees the sandbox using it.
	err := twp.RemoveWorkspace(ctxFor(t, time.Minute), cfg.Workspace)
	if !errors.Is(err, roche.ErrInUse) || !strings.Contains(err.Error(), info.ID) {
		t.Fatalf("removing a workspace in use through another provider: %v", err)
	}
	if err := tp.Destroy(ctxFor(t, time.Minute), info.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(tp.workspaceFiles(cfg.Workspace), "f")); err != nil {
		t.Fatalf("the workspace went with its sandbox: %v", err)
	}
	if err := twp.RemoveWorkspace(ctxFor(t, time.Minute), cfg.Workspace); err != nil {
		t.Fatal(err)
	}
	for _, e := range dataEntries(t, tp, workspacesDir) {
		if strings.Contains(e, cfg.Workspace) {
			t.Fatalf("removing the workspace left %s", e)
		}
	}
	if _, err := os.Stat(tp.sandboxDir(info.ID)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the sandbox's directory remains: %v", err)
	}
	if err := tp.RemoveWorkspace(ctxFor(t, time.Minute), "../"+dataSubdir); !errors.Is(err, roche.ErrNotFound) {
		t.Fatalf("removing a workspace with a path for a name: %v, want ErrNotFound", err)
	}
}

func mustID(t *testing.T) string {
	id, err := newID()
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// TestFailedCreateTakesItsWorkspace: a workspace made by a Create that then fails goes
// with it; one that existed stays.
func TestFailedCreateTakesItsWorkspace(t *testing.T) {
	testenv.Needs(t, testenv.PythonWasm)
	host := t.TempDir()
	cfg := roche.DefaultConfig()
	cfg.Workspace = "failed-" + strings.TrimPrefix(mustID(t), idPrefix)
	cfg.Mounts = []roche.Mount{{Source: host, Target: "/mnt/host"}}
	cfg.Workdir = "/mnt/host/missing" // found missing only after the workspace is made
	if _, err := tp.Create(ctxFor(t, time.Minute), cfg); !errors.Is(err, roche.ErrInvalidConfig) {
		t.Fatalf("Create with a workdir missing from a host mount: %v", err)
	}
	for _, e := range dataEntries(t, tp, workspacesDir) {
		if strings.Contains(e, cfg.Workspace) {
			t.Fatalf("a failed Create left its new workspace behind: %s", e)
		}
	}
	ok := cfg
	ok.Workdir, ok.Mounts = "", nil
	info := createInfo(t, tp, ok)
	if err := tp.Destroy(ctxFor(t, time.Minute), info.ID); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tp.RemoveWorkspace(context.Background(), cfg.Workspace) })
	if _, err := tp.Create(ctxFor(t, time.Minute), cfg); !errors.Is(err, roche.ErrInvalidConfig) {
		t.Fatalf("Create with a workdir missing from a host mount: %v", err)
	}
	if _, err := os.Stat(tp.workspaceFiles(cfg.Workspace)); err != nil {
		t.Fatalf("a failed Create took a workspace that was there before it: %v", err)
	}
}

// TestResetWipeSharedWorkspace: emptying a workspace another sandbox has is refused
// before anything is destroyed.
func TestResetWipeSharedWorkspace(t *testing.T) {
	testenv.Needs(t, testenv.PythonWasm)
	cfg := roche.DefaultConfig()
	cfg.Workspace = "shared-" + strings.TrimPrefix(mustID(t), idPrefix)
	t.Cleanup(func() { tp.RemoveWorkspace(context.Background(), cfg.Workspace) })
	a := createInfo(t, tp, cfg)
	b := createInfo(t, tp, cfg)
	pyOK(t, a.ID, "open('/workspace/f', 'w').write('shared')")
	_, err := tp.Reset(ctxFor(t, time.Minute), a.ID, false)
	if !errors.Is(err, roche.ErrInUse) || !strings.Contains(err.Error(), b.ID) {
		t.Fatalf("Reset emptying a workspace another sandbox has: %v, want ErrInUse naming %s", err, b.ID)
	}
	if got := pyOK(t, a.ID, "print(open('/workspace/f').read())"); got != "shared" {
		t.Fatalf("after the refused reset: %q", got)
	}
	// Keeping it is fine.
	reset, err := tp.Reset(ctxFor(t, time.Minute), a.ID, true)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tp.Destroy(context.Background(), reset.ID) })
	if got := pyOK(t, b.ID, "print(open('/workspace/f').read())"); got != "shared" {
		t.Fatalf("the other sandbox after the reset: %q", got)
	}
}

// TestSnapshotContents: a snapshot holds the sandbox's own directories, not a named
// workspace, and a sandbox made from one resets to it.
func TestSnapshotContents(t *testing.T) {
	testenv.Needs(t, testenv.PythonWasm)
	ctx := ctxFor(t, 2*time.Minute)
	name := "contents-" + strings.TrimPrefix(mustID(t), idPrefix)
	t.Cleanup(func() { tp.RemoveSnapshot(context.Background(), name) })
	src := newSandbox(t, func(c *roche.Config) { c.Writable = true })
	pyOK(t, src, `
import os
os.makedirs('/etc/app'); open('/etc/app/conf', 'w').write('root')
open('/workspace/own', 'w').write('own workspace')
open('/tmp/ro', 'w').write('read-only')
`)
	// WASI has no file modes; the host can still have set one.
	if err := os.Chmod(filepath.Join(tp.sandboxDir(src), rootDir, "tmp", "ro"), 0o4444); err != nil {
		t.Fatal(err)
	}
	if _, err := tp.Snapshot(ctx, src, name); err != nil {
		t.Fatal(err)
	}
	from := roche.DefaultConfig()
	from.FromSnapshot = name
	dst := createInfo(t, tp, from)
	check := "print(open('/etc/app/conf').read(), open('/workspace/own').read(), open('/tmp/ro').read())"
	want := "root own workspace read-only"
	if got := pyOK(t, dst.ID, check); got != want {
		t.Fatalf("sandbox from the snapshot: %q, want %q", got, want)
	}
	// Modes are kept, less setuid and plus the owner's read and write.
	if fi, err := os.Stat(filepath.Join(tp.sandboxDir(dst.ID), rootDir, "tmp", "ro")); err != nil || fi.Mode() != 0o644 {
		t.Fatalf("mode of a restored file the host made 04444: %v %v, want 0644", fi.Mode(), err)
	}
	pyOK(t, dst.ID, "open('/tmp/later', 'w').write('x')")
	reset, err := tp.Reset(ctx, dst.ID, true)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tp.Destroy(context.Background(), reset.ID) })
	if got := pyOK(t, reset.ID, "import os; "+check+"; print(os.path.exists('/tmp/later'))"); got != want+"\nFalse" {
		t.Fatalf("reset of a sandbox from a snapshot: %q, want the snapshot's files and nothing else", got)
	}

	// With a named workspace, the workspace is not in the snapshot and the own one
	// stays hidden.
	ws := roche.DefaultConfig()
	ws.Workspace = name
	t.Cleanup(func() { tp.RemoveWorkspace(context.Background(), name) })
	wsID := createInfo(t, tp, ws).ID
	pyOK(t, wsID, "open('/workspace/named', 'w').write('x')")
	second := name + "-ws"
	t.Cleanup(func() { tp.RemoveSnapshot(context.Background(), second) })
	if _, err := tp.Snapshot(ctx, wsID, second); err != nil {
		t.Fatal(err)
	}
	if entries, _ := os.ReadDir(filepath.Join(tp.snapshotDir(second), rootDir, "workspace")); len(entries) != 0 {
		t.Fatalf("the snapshot holds the named workspace's files: %v", entries)
	}
	fromBoth := roche.DefaultConfig()
	fromBoth.FromSnapshot, fromBoth.Workspace = name, name
	both := createInfo(t, tp, fromBoth)
	if got := pyOK(t, both.ID, "import os; print(sorted(os.listdir('/workspace')))"); got != "['named']" {
		t.Fatalf("a sandbox from a snapshot with a named workspace sees %s in /workspace", got)
	}
	if entries, _ := os.ReadDir(filepath.Join(tp.sandboxDir(both.ID), rootDir, "workspace")); len(entries) != 0 {
		t.Fatalf("the snapshot's own /workspace was copied under the named one: %v", entries)
	}
}

// TestSnapshotRefusesSymlinks: a symbolic link in a sandbox's directories (only the host
// can put one there) is not copied, and the failed snapshot leaves nothing.
func TestSnapshotRefusesSymlinks(t *testing.T) {
	testenv.Needs(t, testenv.PythonWasm)
	id := newSandbox(t, nil)
	if err := os.Symlink("/etc/passwd", filepath.Join(tp.sandboxDir(id), rootDir, "tmp", "link")); err != nil {
		t.Fatal(err)
	}
	name := "symlink-" + strings.TrimPrefix(mustID(t), idPrefix)
	t.Cleanup(func() { tp.RemoveSnapshot(context.Background(), name) })
	before := dataEntries(t, tp, snapshotsDir)
	_, err := tp.Snapshot(ctxFor(t, time.Minute), id, name)
	if !errors.Is(err, roche.ErrUnsupported) || !strings.Contains(err.Error(), "symbolic link") {
		t.Fatalf("snapshot of a sandbox holding a symlink: %v", err)
	}
	if after := dataEntries(t, tp, snapshotsDir); len(after) != len(before) {
		t.Fatalf("a failed snapshot left %v (before: %v)", after, before)
	}
	if _, err := tp.Snapshot(ctxFor(t, time.Minute), "wasm-000000000000", name); !errors.Is(err, roche.ErrNotFound) {
		t.Fatalf("snapshot of an unknown sandbox: %v", err)
	}
}

// TestDataLeftoversSwept: GC clears what a crash left in the data directory.
func TestDataLeftoversSwept(t *testing.T) {
	testenv.Needs(t, testenv.PythonWasm)
	p, err := New(WithStateDir(t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	dir, err := p.dataPath(workspacesDir)
	if err != nil {
		t.Fatal(err)
	}
	trash := filepath.Join(dir, trashPrefix+"ws-1")
	oldPartial := filepath.Join(dir, partialPrefix+"1")
	newPartial := filepath.Join(dir, partialPrefix+"2")
	for _, d := range []string{trash, oldPartial, newPartial} {
		if err := os.MkdirAll(filepath.Join(d, "files"), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	old := time.Now().Add(-time.Hour)
	if err := os.Chtimes(oldPartial, old, old); err != nil {
		t.Fatal(err)
	}
	if _, err := p.GC(ctxFor(t, time.Minute), roche.GCOptions{}); err != nil {
		t.Fatal(err)
	}
	if got := dataEntries(t, p, workspacesDir); len(got) != 1 || got[0] != filepath.Base(newPartial) {
		t.Fatalf("after GC the workspaces directory holds %v, want only the recent partial one", got)
	}
}
