package cli

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

func TestWorkspaceAndReset(t *testing.T) {
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

func TestSnapshotCommands(t *testing.T) {
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
