package providertest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/roche-sandbox/roche"
)

// The checks of what outlives a sandbox: persistent workspaces, reset and snapshots. Each
// runs when the provider implements the interface; a provider that implements it but
// refuses it in its present configuration (with ErrUnsupported, e.g. Docker without
// roche-agent) is skipped with its reason.

// uniqueName makes a workspace or snapshot name no other run uses.
func uniqueName(kind string) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return "roche-suite-" + kind + "-" + hex.EncodeToString(b[:])
}

// track registers a sandbox the check did not make with create (a reset's), so that it
// is destroyed at the end and counted by checkNothingLeaked.
func (s *suite) track(t *testing.T, id string) {
	s.mu.Lock()
	s.created = append(s.created, id)
	s.mu.Unlock()
	t.Cleanup(func() {
		if err := s.p.Destroy(context.Background(), id); err != nil {
			t.Errorf("Destroy %s: %v", id, err)
		}
	})
}

// eventually retries f for a while: an engine may take a moment to let go of a
// workspace or snapshot after the sandbox using it is destroyed.
func eventually(f func() error) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := f()
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// removeWorkspaceAtEnd removes the workspace after the sandboxes using it are gone
// (cleanups run last-registered first, so register this before creating them).
func (s *suite) removeWorkspaceAtEnd(t *testing.T, wm roche.WorkspaceManager, name string) {
	s.mu.Lock()
	s.workspaces = append(s.workspaces, name)
	s.mu.Unlock()
	t.Cleanup(func() {
		err := eventually(func() error {
			err := wm.RemoveWorkspace(context.Background(), name)
			if errors.Is(err, roche.ErrNotFound) {
				return nil
			}
			return err
		})
		if err != nil {
			t.Errorf("removing workspace %s: %v", name, err)
		}
	})
}

func (s *suite) removeSnapshotAtEnd(t *testing.T, sn roche.Snapshotter, name string) {
	s.mu.Lock()
	s.snapshots = append(s.snapshots, name)
	s.mu.Unlock()
	t.Cleanup(func() {
		err := eventually(func() error {
			err := sn.RemoveSnapshot(context.Background(), name)
			if errors.Is(err, roche.ErrNotFound) {
				return nil
			}
			return err
		})
		if err != nil {
			t.Errorf("removing snapshot %s: %v", name, err)
		}
	})
}

func findWorkspace(t *testing.T, wm roche.WorkspaceManager, name string) *roche.Workspace {
	t.Helper()
	ws, err := wm.Workspaces(ctxFor(t, time.Minute))
	if err != nil {
		t.Fatalf("Workspaces: %v", err)
	}
	for i := range ws {
		if ws[i].Name == name {
			return &ws[i]
		}
	}
	return nil
}

func (s *suite) testWorkspace(t *testing.T) {
	wm := s.p.(roche.WorkspaceManager)
	name := uniqueName("ws")
	s.removeWorkspaceAtEnd(t, wm, name)
	cfg := s.opts.Config
	cfg.Workspace = name
	ctx := ctxFor(t, 3*time.Minute)

	info, err := s.p.Create(ctx, cfg)
	if errors.Is(err, roche.ErrUnsupported) {
		t.Skipf("the provider refuses workspaces here: %v", err)
	}
	if err != nil {
		t.Fatalf("Create with a workspace: %v", err)
	}
	s.track(t, info.ID)
	first := info.ID
	// Writable by the sandbox's code even on a read-only root, and through the files API.
	if got := s.probeWrite(t, first, roche.WorkspacePath+"/notes.txt"); got != "written" {
		t.Fatalf("writing into the workspace: %s", got)
	}
	s.pyOK(t, first, "open('/workspace/notes.txt', 'w').write('from the first sandbox')")
	fsys, hasFiles := s.p.(roche.FileSystem)
	if hasFiles {
		if err := fsys.WriteFile(ctx, first, "/workspace/data/api.txt", strings.NewReader("via the files API"), 0o644); err != nil {
			t.Fatalf("WriteFile into the workspace: %v", err)
		}
	}

	listed := findWorkspace(t, wm, name)
	if listed == nil || listed.Provider != s.p.Name() || !slices.Equal(listed.InUseBy, []string{first}) {
		t.Fatalf("workspace list shows %+v, want %s of provider %s in use by %s", listed, name, s.p.Name(), first)
	}
	err = wm.RemoveWorkspace(ctx, name)
	if !errors.Is(err, roche.ErrInUse) || !strings.Contains(err.Error(), first) {
		t.Fatalf("removing a workspace in use: %v, want ErrInUse naming sandbox %s", err, first)
	}
	if err := s.p.Destroy(ctx, first); err != nil {
		t.Fatalf("Destroy: %v", err)
	}

	second := s.create(t, cfg)
	want := "from the first sandbox"
	code := "print(open('/workspace/notes.txt').read())"
	if hasFiles {
		want += "\nvia the files API"
		code += "; print(open('/workspace/data/api.txt').read())"
	}
	if got := s.pyOK(t, second, code); got != want {
		t.Fatalf("the next sandbox with the workspace sees %q, want %q", got, want)
	}
	err = eventually(func() error {
		if listed := findWorkspace(t, wm, name); listed == nil || !slices.Equal(listed.InUseBy, []string{second}) {
			return fmt.Errorf("workspace list shows %+v, want it in use by %s only", listed, second)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.p.Destroy(ctx, second); err != nil {
		t.Fatalf("Destroy: %v", err)
	}
	if err := eventually(func() error { return wm.RemoveWorkspace(ctx, name) }); err != nil {
		t.Fatalf("removing the workspace once no sandbox has it: %v", err)
	}
	if listed := findWorkspace(t, wm, name); listed != nil {
		t.Fatalf("removed workspace still listed: %+v", listed)
	}
	if err := wm.RemoveWorkspace(ctx, name); !errors.Is(err, roche.ErrNotFound) {
		t.Fatalf("removing it again: %v, want ErrNotFound", err)
	}
	// It starts empty when made again.
	third := s.create(t, cfg)
	if got := s.pyOK(t, third, "import os; print(sorted(os.listdir('/workspace')))"); got != "[]" {
		t.Fatalf("a workspace made again after removal holds %s", got)
	}
}

// resetProbe, given write, changes /tmp, the root when writable ("root") and the
// workspace when there is one ("ws"); given read, it reports which changes it finds, and
// ROCHE_KEPT from the config.
const resetProbe = `
import os, sys
op, root, ws = sys.argv[1:4]
places = ['/tmp/roche-reset'] + (['/var/tmp/roche-reset'] if root == 'root' else [])
if op == 'write':
    if root == 'root':
        os.makedirs('/var/tmp', exist_ok=True)
    for p in places:
        open(p, 'w').write('changed')
    if ws == 'ws':
        open('/workspace/kept', 'w').write('kept')
else:
    kept = open('/workspace/kept').read() if ws == 'ws' else '-'
    print([p for p in places if os.path.exists(p)], kept, os.environ.get('ROCHE_KEPT'))
`

func (s *suite) testReset(t *testing.T) {
	r := s.p.(roche.Resetter)
	ctx := ctxFor(t, 3*time.Minute)
	cfg := s.opts.Config
	cfg.Writable = s.caps.Writable
	cfg.Env = map[string]string{"ROCHE_KEPT": "yes"}
	wm, withWorkspace := s.p.(roche.WorkspaceManager)
	if withWorkspace {
		cfg.Workspace = uniqueName("reset")
		s.removeWorkspaceAtEnd(t, wm, cfg.Workspace)
	}
	info, err := s.p.Create(ctx, cfg)
	if withWorkspace && errors.Is(err, roche.ErrUnsupported) {
		t.Logf("resetting without a workspace, which the provider refuses here: %v", err)
		withWorkspace, cfg.Workspace = false, ""
		info, err = s.p.Create(ctx, cfg)
	}
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	s.track(t, info.ID)
	args := func(op string) func(*roche.ExecRequest) {
		root, ws := "-", "-"
		if cfg.Writable {
			root = "root"
		}
		if withWorkspace {
			ws = "ws"
		}
		return func(r *roche.ExecRequest) { r.Cmd = append(r.Cmd, op, root, ws) }
	}
	s.pyOK(t, info.ID, resetProbe, args("write"))

	reset, err := r.Reset(ctx, info.ID, true)
	if err != nil {
		t.Fatalf("Reset: %v", err)
	}
	s.track(t, reset.ID)
	if reset.ID == info.ID {
		t.Fatal("Reset kept the sandbox id; the sandbox was not made again")
	}
	if _, err := s.p.Inspect(ctx, info.ID); !errors.Is(err, roche.ErrNotFound) {
		t.Fatalf("Inspect of the sandbox that was reset: %v, want ErrNotFound", err)
	}
	if s.ids(t)[info.ID] {
		t.Fatalf("the sandbox that was reset, %s, is still listed", info.ID)
	}
	if d := reset.ExpiresAt.Sub(info.ExpiresAt); d > 2*time.Second || d < -2*time.Second {
		t.Fatalf("Reset moved the expiry from %v to %v, want the lifetime that was left", info.ExpiresAt, reset.ExpiresAt)
	}
	want := "[] - yes"
	if withWorkspace {
		want = "[] kept yes"
	}
	if got := s.pyOK(t, reset.ID, resetProbe, args("read")); got != want {
		t.Fatalf("after Reset keeping the workspace: %q, want %q (changes to /tmp and the root gone, workspace and config kept)", got, want)
	}

	if withWorkspace {
		wiped, err := r.Reset(ctx, reset.ID, false)
		if err != nil {
			t.Fatalf("Reset emptying the workspace: %v", err)
		}
		s.track(t, wiped.ID)
		if got := s.pyOK(t, wiped.ID, "import os; print(sorted(os.listdir('/workspace')))"); got != "[]" {
			t.Fatalf("workspace after Reset emptying it: %s, want it empty", got)
		}
	}
	if _, err := r.Reset(ctx, "roche-no-such-sandbox", true); !errors.Is(err, roche.ErrNotFound) {
		t.Fatalf("Reset of an unknown sandbox: %v, want ErrNotFound", err)
	}
}

func findSnapshot(t *testing.T, sn roche.Snapshotter, name string) *roche.Snapshot {
	t.Helper()
	list, err := sn.Snapshots(ctxFor(t, time.Minute))
	if err != nil {
		t.Fatalf("Snapshots: %v", err)
	}
	for i := range list {
		if list[i].Name == name {
			return &list[i]
		}
	}
	return nil
}

func (s *suite) testSnapshot(t *testing.T) {
	sn := s.p.(roche.Snapshotter)
	ctx := ctxFor(t, 3*time.Minute)
	name := uniqueName("snap")
	s.removeSnapshotAtEnd(t, sn, name)

	cfg := s.opts.Config
	cfg.Writable = s.caps.Writable
	src := s.create(t, cfg)
	write := "import os; os.makedirs('/tmp/d'); open('/tmp/d/tmp.txt', 'w').write('in tmp')"
	read := "print(open('/tmp/d/tmp.txt').read())"
	want := "in tmp"
	if cfg.Writable {
		write += "; os.makedirs('/var/tmp', exist_ok=True); open('/var/tmp/root.txt', 'w').write('on the root')"
		read += "; print(open('/var/tmp/root.txt').read())"
		want += "\non the root"
	}
	s.pyOK(t, src, write)

	if _, err := sn.Snapshot(ctx, src, "../"+name); !errors.Is(err, roche.ErrInvalidConfig) {
		t.Fatalf("Snapshot named ../%s: %v, want ErrInvalidConfig", name, err)
	}
	snap, err := sn.Snapshot(ctx, src, name)
	if errors.Is(err, roche.ErrUnsupported) {
		t.Skipf("the provider refuses snapshots here: %v", err)
	}
	if err != nil {
		t.Fatalf("Snapshot: %v", err)
	}
	if snap.Name != name || snap.Provider != s.p.Name() || snap.Image != cfg.Image {
		t.Fatalf("Snapshot returned %+v, want name %s, provider %s, image %s", snap, name, s.p.Name(), cfg.Image)
	}
	if _, err := sn.Snapshot(ctx, src, name); !errors.Is(err, roche.ErrInvalidConfig) {
		t.Fatalf("a second snapshot of the same name: %v, want ErrInvalidConfig", err)
	}
	if listed := findSnapshot(t, sn, name); listed == nil || listed.Provider != s.p.Name() || listed.Image != cfg.Image {
		t.Fatalf("snapshot list shows %+v for %s", listed, name)
	}
	// Changes after the snapshot are not in it.
	s.pyOK(t, src, "open('/tmp/d/tmp.txt', 'w').write('changed later')")

	// A new sandbox from it, read-only this time, has the files.
	from := s.opts.Config
	from.FromSnapshot = name
	dst, err := s.p.Create(ctx, from)
	if err != nil {
		t.Fatalf("Create from the snapshot: %v", err)
	}
	s.track(t, dst.ID)
	if got := s.pyOK(t, dst.ID, read); got != want {
		t.Fatalf("sandbox from the snapshot sees %q, want %q", got, want)
	}
	if got := s.probeWrite(t, dst.ID, "/tmp/d/more.txt"); got != "written" {
		t.Fatalf("writing into the restored /tmp: %s", got)
	}

	if err := sn.RemoveSnapshot(ctx, name); !errors.Is(err, roche.ErrInUse) {
		t.Fatalf("removing a snapshot a live sandbox was made from: %v, want ErrInUse", err)
	}
	if err := s.p.Destroy(ctx, dst.ID); err != nil {
		t.Fatalf("Destroy: %v", err)
	}
	if err := eventually(func() error { return sn.RemoveSnapshot(ctx, name) }); err != nil {
		t.Fatalf("removing the snapshot after its sandbox: %v", err)
	}
	if listed := findSnapshot(t, sn, name); listed != nil {
		t.Fatalf("removed snapshot still listed: %+v", listed)
	}
	if err := sn.RemoveSnapshot(ctx, name); !errors.Is(err, roche.ErrNotFound) {
		t.Fatalf("removing it again: %v, want ErrNotFound", err)
	}
	before := s.ids(t)
	if _, err := s.p.Create(ctx, from); !errors.Is(err, roche.ErrNotFound) || !strings.Contains(err.Error(), "snapshot") {
		t.Fatalf("Create from a removed snapshot: %v, want ErrNotFound naming the snapshot", err)
	}
	s.noneMadeSince(t, before, "a refused Create")
}

// checkNothingKept: no workspace or snapshot the suite made may remain.
func (s *suite) checkNothingKept(t *testing.T) {
	s.mu.Lock()
	workspaces, snapshots := s.workspaces, s.snapshots
	s.mu.Unlock()
	if wm, ok := s.p.(roche.WorkspaceManager); ok && len(workspaces) > 0 {
		ws, err := wm.Workspaces(context.Background())
		if err != nil {
			t.Errorf("Workspaces after the suite: %v", err)
		}
		for _, w := range ws {
			if slices.Contains(workspaces, w.Name) {
				t.Errorf("workspace %s survived the suite", w.Name)
			}
		}
	}
	if sn, ok := s.p.(roche.Snapshotter); ok && len(snapshots) > 0 {
		list, err := sn.Snapshots(context.Background())
		if err != nil {
			t.Errorf("Snapshots after the suite: %v", err)
		}
		for _, x := range list {
			if slices.Contains(snapshots, x.Name) {
				t.Errorf("snapshot %s survived the suite", x.Name)
			}
		}
	}
}
