package escape

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/provider/providertest"
)

// Link races on every path where the host touches a sandbox's files: a sandbox swaps a
// file and a directory for symlinks (and a hard link) to a victim the test owns on the
// host, as fast as it can, while the host copies out, serves the files API, snapshots
// and removes a workspace. The victim must come through untouched. Each race is a
// subtest: its answer is "untouched" when it passed, or the attack's success.

// race records the outcome of one race run as a subtest.
func (h *harness) race(key string, obs map[string]string, fn func(t *testing.T) string) {
	answer := ""
	ok := h.t.Run(key, func(t *testing.T) { answer = fn(t) })
	switch {
	case !ok:
		obs[key] = "ok:the victim changed or the race failed: see " + h.t.Name() + "/" + key
	case answer == "":
		obs[key] = "untouched"
	default:
		obs[key] = answer
	}
}

func (h *harness) races(a string, obs map[string]string) {
	caps := h.p.Capabilities()
	tc, isTar := h.p.(roche.TarCopier)
	h.race("race.copyout", obs, func(t *testing.T) string {
		if !isTar {
			return "nosurface: no copies"
		}
		return h.copyOutRace(t, tc, a)
	})
	h.race("race.copyin", obs, func(t *testing.T) string {
		if !isTar || !caps.Mounts {
			return "nosurface: no host mounts to copy from"
		}
		linked := true
		t.Run("providertest", func(t *testing.T) {
			defer func() { linked = !t.Skipped() }() // a skip ends the function here
			providertest.CopyInRace(t, h.p, providertest.Options{Config: h.cfg})
		})
		if !linked {
			return "nolink"
		}
		return ""
	})
	fsys, isFS := h.p.(roche.FileSystem)
	h.race("race.files", obs, func(t *testing.T) string {
		if !isFS || !caps.Mounts {
			return "nosurface: the files API reaches only the sandbox's own files, no host mount"
		}
		return h.filesRace(t, fsys)
	})
	h.race("race.persist", obs, func(t *testing.T) string {
		wm, isWM := h.p.(roche.WorkspaceManager)
		if !isWM {
			return "nosurface: no workspaces or snapshots"
		}
		return h.persistRace(t, wm)
	})
}

// swapping starts the swap loop in dir of sandbox id, aimed at victim, and returns a
// stop function, or the errno that kept the sandbox from making a link.
func (h *harness) swapping(t *testing.T, id, dir, victim string) (stop func(), nolink string) {
	line, stop := h.hold(id, "swap", map[string]any{"dir": dir, "victim": victim})
	if errno, ok := strings.CutPrefix(line, "nolink "); ok {
		stop()
		return nil, errno
	}
	if line != "ready" {
		stop()
		t.Fatalf("the swap loop said %q", line)
	}
	return stop, ""
}

// copyOutRace: roche cp out of a directory whose entries keep turning into links to
// the victim; at least 30 copies, each to a fresh destination, with and without
// PreserveLinks, and more (up to 300, within a minute) until one has caught the plain
// file: on a loaded machine the swap loop can sit in one state for a whole burst.
func (h *harness) copyOutRace(t *testing.T, tc roche.TarCopier, id string) string {
	v := providertest.VictimDir(t)
	stop, nolink := h.swapping(t, id, "/tmp/race-out", v)
	if stop == nil {
		return "nolink " + nolink
	}
	base := t.TempDir()
	links, files, n := 0, 0, 0
	deadline := time.Now().Add(time.Minute)
	for i := 0; i < 30 || files == 0 && i < 300 && time.Now().Before(deadline); i++ {
		n++
		dst := filepath.Join(base, fmt.Sprint(i))
		_, err := roche.CopyOut(ctxFor(t, 2*time.Minute), tc, id, "/tmp/race-out", dst, roche.CopyOptions{PreserveLinks: i%2 == 1})
		if err != nil {
			t.Logf("copy %d: %v", i, err) // a refusal is fine; a leak is not
			continue
		}
		if fi, err := os.Lstat(filepath.Join(dst, "f")); err == nil {
			if fi.Mode()&os.ModeSymlink != 0 {
				links++
			} else {
				files++
			}
		}
	}
	stop()
	providertest.CheckVictim(t, v)
	// Nothing was written beside the destinations either.
	if entries, _ := os.ReadDir(base); len(entries) > n {
		t.Fatalf("the copies left %d entries beside their %d destinations", len(entries), n)
	}
	t.Logf("%d copies out while the sandbox swapped: f came out %d times as a link, %d as a file", n, links, files)
	if files == 0 {
		t.Fatal("the race was not live: no copy saw the plain file")
	}
	return ""
}

// filesRace: the files API (write, mkdir, rename, remove) on paths that keep turning
// into links to a victim the sandbox user may not touch: a host directory mounted
// read-write whose file is root's, mode 0600. The agent serves the API with the
// sandbox user's filesystem identity and never follows a link; were it to follow one
// as root, the victim would change.
func (h *harness) filesRace(t *testing.T, fsys roche.FileSystem) string {
	v := providertest.VictimDir(t)
	if err := os.Chmod(v, 0o755); err != nil { // the sandbox user may look, not write
		t.Fatal(err)
	}
	cfg := h.cfg
	cfg.Mounts = []roche.Mount{{Source: v, Target: "/mnt/victim", ReadWrite: true}}
	id := h.create(cfg)
	defer h.p.Destroy(context.Background(), id)
	stop, nolink := h.swapping(t, id, "/tmp/race-files", "/mnt/victim")
	if stop == nil {
		return "nolink " + nolink
	}
	ctx := ctxFor(t, 5*time.Minute)
	refused := 0
	for i := range 40 {
		for _, err := range []error{
			fsys.WriteFile(ctx, id, "/tmp/race-files/f", bytes.NewReader([]byte("pwned")), 0o644),
			fsys.WriteFile(ctx, id, "/tmp/race-files/d/keep", bytes.NewReader([]byte("pwned")), 0o644),
			fsys.Mkdir(ctx, id, fmt.Sprintf("/tmp/race-files/d/new%d", i)),
			fsys.Rename(ctx, id, "/tmp/race-files/g", "/tmp/race-files/d/keep"),
			fsys.Remove(ctx, id, "/tmp/race-files/d/keep"),
		} {
			if err != nil {
				refused++
			}
		}
	}
	stop()
	providertest.CheckVictim(t, v)
	t.Logf("200 files API calls while the sandbox swapped: %d refused", refused)
	return ""
}

// persistRace: a sandbox with a workspace leaves links to the victim in it and keeps
// swapping them while the host snapshots it; then the workspace and the snapshot are
// removed. Neither the snapshot nor the removal may follow a link to the victim.
func (h *harness) persistRace(t *testing.T, wm roche.WorkspaceManager) string {
	v := providertest.VictimDir(t)
	name := fmt.Sprintf("escape-%x", time.Now().UnixNano())
	t.Cleanup(func() {
		if err := wm.RemoveWorkspace(context.Background(), name); err != nil && !errors.Is(err, roche.ErrNotFound) {
			t.Errorf("RemoveWorkspace %s: %v", name, err)
		}
	})
	cfg := h.cfg
	cfg.Workspace = name
	id := h.create(cfg)
	defer h.p.Destroy(context.Background(), id) // before the workspace's removal
	stop, nolink := h.swapping(t, id, "/workspace/race", v)
	if stop == nil {
		return "nolink " + nolink
	}
	if sn, ok := h.p.(roche.Snapshotter); ok {
		for i := range 3 {
			snap := fmt.Sprintf("%s-%d", name, i)
			if _, err := sn.Snapshot(ctxFor(t, 3*time.Minute), id, snap); err != nil {
				t.Logf("snapshot %d: %v", i, err)
				continue
			}
			t.Cleanup(func() {
				if err := sn.RemoveSnapshot(context.Background(), snap); err != nil && !errors.Is(err, roche.ErrNotFound) {
					t.Errorf("RemoveSnapshot %s: %v", snap, err)
				}
			})
		}
	}
	stop()
	if err := h.p.Destroy(ctxFor(t, 2*time.Minute), id); err != nil {
		t.Fatal(err)
	}
	if err := wm.RemoveWorkspace(ctxFor(t, 2*time.Minute), name); err != nil {
		t.Fatalf("RemoveWorkspace: %v", err)
	}
	providertest.CheckVictim(t, v)
	return ""
}
