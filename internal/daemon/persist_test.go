package daemon

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/pool"
)

// uniqueName is a workspace or snapshot name no other test run uses.
func uniqueName(prefix string) string {
	return fmt.Sprintf("%s-%d", prefix, time.Now().UnixNano())
}

// TestResetThroughDaemon: roched serves the sandbox a reset makes as it served the old
// one. A sandbox from the pool keeps the env and the workdir (made again under /tmp)
// its create asked for, and its expiry; the old id is gone; the workspace is kept.
func TestResetThroughDaemon(t *testing.T) {
	spec, _ := pool.ParseSpec("docker/" + testImage() + "?min=1")
	td := startDaemon(t, Config{Pools: []pool.Spec{spec}})
	ctx := ctxFor(t, 2*time.Minute)
	eventually(t, 30*time.Second, "the pool to fill", func() bool {
		s, err := td.c.PoolStatus(ctx)
		return err == nil && s[0].Idle == 1
	})

	cfg := pyConfig()
	cfg.Env = map[string]string{"GREETING": "hello"}
	cfg.Workdir = "/tmp/work"
	cfg.TimeoutSecs = 120
	sb, pooled, err := td.c.Create(ctx, "docker", cfg)
	if err != nil || !pooled {
		t.Fatalf("create from the pool: pooled %v, %v", pooled, err)
	}
	res, err := td.p.Exec(ctx, sb.ID, roche.ExecRequest{Cmd: []string{"sh", "-c", "echo dirty > /tmp/mark"}})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("writing a mark: %+v %v", res, err)
	}

	nsb, err := td.p.Reset(ctx, sb.ID, true)
	if err != nil {
		t.Fatal(err)
	}
	if nsb.ID == sb.ID {
		t.Fatalf("reset kept the id %s", sb.ID)
	}
	if _, err := td.p.Inspect(ctx, sb.ID); !errors.Is(err, roche.ErrNotFound) {
		t.Fatalf("the old id after a reset: %v, want not found", err)
	}
	if d := nsb.ExpiresAt.Sub(sb.ExpiresAt); d < -time.Second || d > time.Second {
		t.Fatalf("expiry after reset %v, before %v: the lifetime left must carry over", nsb.ExpiresAt, sb.ExpiresAt)
	}
	res, err = td.p.Exec(ctx, nsb.ID, roche.ExecRequest{Cmd: []string{"sh", "-c", `pwd; echo "$GREETING"; cat /tmp/mark 2>&1 || true`}})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("exec in the reset sandbox: %+v %v", res, err)
	}
	if lines := strings.Split(res.Stdout, "\n"); len(lines) < 3 || lines[0] != "/tmp/work" || lines[1] != "hello" || !strings.Contains(lines[2], "No such file") {
		t.Fatalf("reset sandbox: want workdir /tmp/work, GREETING=hello and /tmp/mark gone; got %q", res.Stdout)
	}
	list, err := td.p.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, s := range list {
		ids = append(ids, s.ID)
	}
	if !strings.Contains(strings.Join(ids, " "), nsb.ID) || strings.Contains(strings.Join(ids, " "), sb.ID) {
		t.Fatalf("list after a reset: %v, want %s and not %s", ids, nsb.ID, sb.ID)
	}
	if err := td.p.Destroy(ctx, nsb.ID); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "the reset sandbox to be removed", func() bool { return td.gone(nsb.ID) })

	if _, err := td.p.Reset(ctx, "0000deadbeef", true); !errors.Is(err, roche.ErrNotFound) || connectCode(err) != connect.CodeNotFound {
		t.Fatalf("reset of an unknown sandbox: %v", err)
	}
}

// TestWorkspacesAndSnapshotsThroughDaemon: the API lists and removes workspaces and
// snapshots, refuses removing one in use with IN_USE, and a sandbox made from a
// snapshot through the API has its files.
func TestWorkspacesAndSnapshotsThroughDaemon(t *testing.T) {
	td := startDaemon(t, Config{})
	ctx := ctxFor(t, 2*time.Minute)
	ws, snap := uniqueName("dws"), uniqueName("dsnap")

	cfg := pyConfig()
	cfg.Workspace = ws
	sb, err := td.p.Create(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { td.rec.Provider.RemoveWorkspace(ctx, ws) })
	res, err := td.p.Exec(ctx, sb.ID, roche.ExecRequest{Cmd: []string{"sh", "-c", "echo kept > /workspace/f && echo saved > /tmp/s"}})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("writing files: %+v %v", res, err)
	}

	list, err := td.p.Workspaces(ctx)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, w := range list {
		if w.Name == ws {
			found = len(w.InUseBy) == 1 && w.InUseBy[0] == sb.ID && w.Provider == "docker" && !w.CreatedAt.IsZero()
		}
	}
	if !found {
		t.Fatalf("workspace %s in use by %s missing from %+v", ws, sb.ID, list)
	}
	err = td.p.RemoveWorkspace(ctx, ws)
	if !errors.Is(err, roche.ErrInUse) || connectCode(err) != connect.CodeFailedPrecondition || !strings.Contains(err.Error(), sb.ID) {
		t.Fatalf("removing a workspace in use: %v, want IN_USE naming %s", err, sb.ID)
	}

	s, err := td.p.Snapshot(ctx, sb.ID, snap)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { td.rec.Provider.RemoveSnapshot(ctx, snap) })
	if s.Name != snap || s.Provider != "docker" || s.Image != testImage() {
		t.Fatalf("snapshot: %+v", s)
	}
	snaps, err := td.p.Snapshots(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(fmt.Sprint(snaps), snap) {
		t.Fatalf("snapshot %s missing from %+v", snap, snaps)
	}
	if err := td.p.Destroy(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}

	from := pyConfig()
	from.FromSnapshot = snap
	from.Workspace = ws
	sb2, err := td.p.Create(ctx, from)
	if err != nil {
		t.Fatal(err)
	}
	res, err = td.p.Exec(ctx, sb2.ID, roche.ExecRequest{Cmd: []string{"cat", "/tmp/s", "/workspace/f"}})
	if err != nil || res.Stdout != "saved\nkept\n" {
		t.Fatalf("a sandbox from the snapshot with the workspace: %+v %v", res, err)
	}
	if err := td.p.RemoveSnapshot(ctx, snap); !errors.Is(err, roche.ErrInUse) {
		t.Fatalf("removing a snapshot in use: %v", err)
	}
	if err := td.p.Destroy(ctx, sb2.ID); err != nil {
		t.Fatal(err)
	}

	if err := td.p.RemoveSnapshot(ctx, snap); err != nil {
		t.Fatal(err)
	}
	if err := td.p.RemoveWorkspace(ctx, ws); err != nil {
		t.Fatal(err)
	}
	if err := td.p.RemoveWorkspace(ctx, ws); !errors.Is(err, roche.ErrNotFound) {
		t.Fatalf("removing a removed workspace: %v", err)
	}
	// Without a provider, the daemon asks each one that has workspaces.
	if err := td.c.Provider("").RemoveSnapshot(ctx, snap); !errors.Is(err, roche.ErrNotFound) {
		t.Fatalf("removing a removed snapshot from any provider: %v", err)
	}
}
