package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/internal/testenv"
)

func TestWorkspaceAndReset(t *testing.T) {
	testenv.Needs(t, testenv.Root, testenv.Docker)
	ws := fmt.Sprintf("cli-test-%d", time.Now().UnixNano()%1e9)
	t.Cleanup(func() { run(t, "workspace", "rm", ws) })
	img := testImage()
	if r := run(t, "run", "--image", img, "--workspace", ws, "--", "sh", "-c", "echo persisted > /workspace/f"); r.code != 0 {
		t.Fatalf("write to the workspace: %+v", r)
	}
	if r := run(t, "run", "--image", img, "--workspace", ws, "--", "cat", "/workspace/f"); r.code != 0 || r.stdout != "persisted\n" {
		t.Fatalf("a later sandbox reads: %+v", r)
	}

	r := run(t, "create", "--image", img, "--workspace", ws, "--writable")
	if r.code != 0 {
		t.Fatalf("create: %+v", r)
	}
	id := strings.TrimSpace(r.stdout)
	t.Cleanup(func() { run(t, "destroy", id) })
	if r := run(t, "workspace", "list"); !strings.Contains(r.stdout, ws) || !strings.Contains(r.stdout, id) {
		t.Fatalf("workspace list: %+v", r)
	}
	r = run(t, "workspace", "rm", ws)
	if r.code == 0 || strings.Count(r.stderr, "\n") != 1 || !strings.Contains(r.stderr, "destroy it first") {
		t.Fatalf("rm of a workspace in use: %+v, want one line saying to destroy the sandbox", r)
	}

	run(t, "exec", "--sandbox", id, "--", "sh", "-c", "echo x > /var/tmp/change")
	r = run(t, "reset", id)
	newID := strings.TrimSpace(r.stdout)
	if r.code != 0 || newID == "" || newID == id {
		t.Fatalf("reset: %+v", r)
	}
	t.Cleanup(func() { run(t, "destroy", newID) })
	if r := run(t, "exec", "--sandbox", newID, "--", "sh", "-c", "cat /workspace/f; test -e /var/tmp/change && echo root-change-survived; true"); r.stdout != "persisted\n" {
		t.Fatalf("after reset: %+v, want the workspace kept and the root change gone", r)
	}
	if r := run(t, "reset", "--wipe-workspace", newID); r.code != 0 {
		t.Fatalf("reset --wipe-workspace: %+v", r)
	} else {
		wiped := strings.TrimSpace(r.stdout)
		t.Cleanup(func() { run(t, "destroy", wiped) })
		if r := run(t, "exec", "--sandbox", wiped, "--", "ls", "-A", "/workspace"); r.code != 0 || r.stdout != "" {
			t.Fatalf("workspace after --wipe-workspace: %+v", r)
		}
		run(t, "destroy", wiped)
	}
	if r := run(t, "workspace", "rm", ws); r.code != 0 {
		t.Fatalf("rm after destroy: %+v", r)
	}
	if r := run(t, "workspace", "list"); strings.Contains(r.stdout, ws) {
		t.Fatalf("workspace still listed after rm: %+v", r)
	}
}

// TestDiskFlags: --disk sizes a writable root and --workspace-size a new workspace, whose
// size then stays; list shows it.
func TestDiskFlags(t *testing.T) {
	testenv.Needs(t, testenv.Root, testenv.Docker)
	img := testImage()
	statfs := "import os, sys; s = os.statvfs(sys.argv[1]); print(s.f_blocks * s.f_frsize >> 20)"
	r := run(t, "run", "--direct", "--image", img, "--writable", "--disk", "100m", "--", "python3", "-c", statfs, "/")
	if mib, _ := strconv.Atoi(strings.TrimSpace(r.stdout)); r.code != 0 || mib < 80 || mib > 100 {
		t.Fatalf("run --writable --disk 100m: %+v, want a root of about 100 MiB", r)
	}

	ws := fmt.Sprintf("cli-size-%d", time.Now().UnixNano()%1e9)
	t.Cleanup(func() { run(t, "workspace", "rm", ws) })
	r = run(t, "run", "--image", img, "--workspace", ws, "--workspace-size", "50m", "--", "python3", "-c", statfs, "/workspace")
	if mib, _ := strconv.Atoi(strings.TrimSpace(r.stdout)); r.code != 0 || mib < 40 || mib > 50 {
		t.Fatalf("run --workspace-size 50m: %+v, want a workspace of about 50 MiB", r)
	}
	if r := run(t, "workspace", "list"); !strings.Contains(r.stdout, "SIZE") || !strings.Contains(r.stdout, ws) || !strings.Contains(r.stdout, "50 MiB") {
		t.Fatalf("workspace list: %+v, want %s with its size 50 MiB", r, ws)
	}
	r = run(t, "run", "--image", img, "--workspace", ws, "--workspace-size", "60m", "--", "true")
	if r.code == 0 || strings.Count(r.stderr, "\n") != 1 || !strings.Contains(r.stderr, "fixed when it was made") {
		t.Fatalf("another size for an existing workspace: %+v, want one line saying its size is fixed", r)
	}
	if r := run(t, "workspace", "rm", ws); r.code != 0 {
		t.Fatalf("workspace rm: %+v", r)
	}
}

func TestSnapshotCommands(t *testing.T) {
	testenv.Needs(t, testenv.Docker)
	name := fmt.Sprintf("cli-snap-%d", time.Now().UnixNano()%1e9)
	t.Cleanup(func() { run(t, "snapshot", "rm", name) })
	r := run(t, "create", "--image", testImage())
	if r.code != 0 {
		t.Fatalf("create: %+v", r)
	}
	id := strings.TrimSpace(r.stdout)
	t.Cleanup(func() { run(t, "destroy", id) })
	run(t, "exec", "--sandbox", id, "--", "sh", "-c", "echo saved > /tmp/state.txt")
	if r := run(t, "snapshot", "create", id, name); r.code != 0 || strings.TrimSpace(r.stdout) != name {
		t.Fatalf("snapshot create: %+v", r)
	}
	if r := run(t, "snapshot", "list"); !strings.Contains(r.stdout, name) || !strings.Contains(r.stdout, testImage()) {
		t.Fatalf("snapshot list: %+v", r)
	}
	if r := run(t, "run", "--from-snapshot", name, "--", "cat", "/tmp/state.txt"); r.code != 0 || r.stdout != "saved\n" {
		t.Fatalf("run --from-snapshot: %+v", r)
	}
	r = run(t, "run", "--from-snapshot", "no-such-snapshot", "--", "true")
	if r.code == 0 || strings.Count(r.stderr, "\n") != 1 || !strings.Contains(r.stderr, "roche snapshot list") {
		t.Fatalf("run from a missing snapshot: %+v", r)
	}
	if r := run(t, "snapshot", "rm", name); r.code != 0 {
		t.Fatalf("snapshot rm: %+v", r)
	}
}

// TestPersistenceThroughDaemon: with roched running, reset, snapshot and workspace go
// through it: the daemon serves the reset sandbox (the env its pooled create asked for
// is kept, the old id is gone from its list), and in-use refusals come back as one line.
func TestPersistenceThroughDaemon(t *testing.T) {
	socket, c := startInProcessDaemon(t)
	t.Setenv("ROCHE_SOCKET", socket)
	hits := poolHits(t, c)
	r := run(t, "create", "--image", testImage(), "--env", "GREETING=kept")
	id := strings.TrimSpace(r.stdout)
	if r.code != 0 || poolHits(t, c) != hits+1 {
		t.Fatalf("create from roched's pool: %+v", r)
	}
	t.Cleanup(func() { run(t, "destroy", id) })
	run(t, "exec", "--sandbox", id, "--", "sh", "-c", "echo dirty > /tmp/mark")

	r = run(t, "reset", "--json", id)
	var reset roche.SandboxInfo
	if err := json.Unmarshal([]byte(r.stdout), &reset); r.code != 0 || err != nil || reset.ID == "" || reset.ID == id {
		t.Fatalf("reset --json: %+v (%v)", r, err)
	}
	t.Cleanup(func() { run(t, "destroy", reset.ID) })
	if r := run(t, "exec", "--sandbox", reset.ID, "--", "sh", "-c", `echo "$GREETING"; ls /tmp`); r.code != 0 || r.stdout != "kept\n" {
		t.Fatalf("after reset through roched: %+v, want the env kept and /tmp empty", r)
	}
	list, err := c.Provider("docker").List(context.Background())
	if err != nil || !containsID(list, reset.ID) || containsID(list, id) {
		t.Fatalf("roched's list after reset: %v %v, want %s and not %s", list, err, reset.ID, id)
	}

	name := fmt.Sprintf("cli-dsnap-%d", time.Now().UnixNano()%1e9)
	t.Cleanup(func() { run(t, "snapshot", "rm", name) })
	run(t, "exec", "--sandbox", reset.ID, "--", "sh", "-c", "echo saved > /tmp/s")
	r = run(t, "snapshot", "create", "--json", reset.ID, name)
	var snap roche.Snapshot
	if err := json.Unmarshal([]byte(r.stdout), &snap); r.code != 0 || err != nil || snap.Name != name || snap.Provider != "docker" {
		t.Fatalf("snapshot create --json through roched: %+v (%v)", r, err)
	}
	r = run(t, "snapshot", "list", "--json")
	var snaps []roche.Snapshot
	if err := json.Unmarshal([]byte(r.stdout), &snaps); err != nil || !strings.Contains(fmt.Sprint(snaps), name) {
		t.Fatalf("snapshot list --json: %+v (%v)", r, err)
	}
	r = run(t, "create", "--from-snapshot", name)
	from := strings.TrimSpace(r.stdout)
	if r.code != 0 {
		t.Fatalf("create --from-snapshot through roched: %+v", r)
	}
	t.Cleanup(func() { run(t, "destroy", from) })
	if r := run(t, "exec", "--sandbox", from, "--", "cat", "/tmp/s"); r.stdout != "saved\n" {
		t.Fatalf("a sandbox from the snapshot: %+v", r)
	}
	r = run(t, "snapshot", "rm", name)
	if r.code == 0 || strings.Count(r.stderr, "\n") != 1 || !strings.Contains(r.stderr, "in use") {
		t.Fatalf("snapshot rm in use through roched: %+v, want one line saying it is in use", r)
	}
	run(t, "destroy", from)
	if r := run(t, "snapshot", "rm", name); r.code != 0 {
		t.Fatalf("snapshot rm through roched: %+v", r)
	}
	if r := run(t, "snapshot", "rm", name); r.code == 0 || !strings.Contains(r.stderr, "no snapshot") {
		t.Fatalf("snapshot rm of a removed one: %+v", r)
	}
}
