package docker_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/provider/docker"
)

func workspaceName(t *testing.T) string {
	return fmt.Sprintf("test-%s-%d", strings.ToLower(t.Name()), time.Now().UnixNano()%1e9)
}

// removeWorkspaceAtEnd removes the workspace after the sandboxes using it are gone.
func removeWorkspaceAtEnd(t *testing.T, p *docker.Provider, name string) {
	t.Cleanup(func() {
		deadline := time.Now().Add(30 * time.Second)
		for {
			err := p.RemoveWorkspace(context.Background(), name)
			if err == nil || errors.Is(err, roche.ErrNotFound) {
				return
			}
			if time.Now().After(deadline) {
				t.Errorf("removing workspace %s: %v", name, err)
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
	})
}

func TestWorkspacePersists(t *testing.T) {
	p := newProvider(t)
	ctx := context.Background()
	name := workspaceName(t)
	removeWorkspaceAtEnd(t, p, name)
	cfg := testConfig()
	cfg.Workspace = name

	first, err := p.Create(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	// Writable for the sandbox user on a read-only root, through commands and the files API.
	execOK(t, p, first.ID, "sh", "-c", "echo from the first sandbox > /workspace/notes.txt")
	if err := p.WriteFile(ctx, first.ID, "/workspace/data/api.txt", strings.NewReader("via the files API"), 0o644); err != nil {
		t.Fatal(err)
	}
	ws, err := p.Workspaces(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var listed *roche.Workspace
	for i := range ws {
		if ws[i].Name == name {
			listed = &ws[i]
		}
	}
	if listed == nil || len(listed.InUseBy) != 1 || listed.InUseBy[0] != first.ID {
		t.Fatalf("workspace list: %+v, want %s in use by %s", ws, name, first.ID)
	}
	// Removing it while mounted is refused, clearly.
	err = p.RemoveWorkspace(ctx, name)
	if !errors.Is(err, roche.ErrInUse) || !strings.Contains(err.Error(), first.ID) {
		t.Fatalf("removing a workspace in use: %v, want ErrInUse naming the sandbox", err)
	}
	if err := p.Destroy(ctx, first.ID); err != nil {
		t.Fatal(err)
	}

	second := sandbox(t, p, cfg)
	if got := execOK(t, p, second, "cat", "/workspace/notes.txt", "/workspace/data/api.txt"); got != "from the first sandbox\nvia the files API" {
		t.Fatalf("second sandbox sees %q", got)
	}
}

func TestReset(t *testing.T) {
	p := newProvider(t)
	ctx := context.Background()
	name := workspaceName(t)
	removeWorkspaceAtEnd(t, p, name)
	cfg := testConfig()
	cfg.Writable = true
	cfg.Workspace = name
	cfg.Env = map[string]string{"KEPT": "yes"}
	info, err := p.Create(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	execOK(t, p, info.ID, "sh", "-c", "echo changed > /var/tmp/root-change; echo kept > /workspace/kept; echo scratch > /tmp/scratch")

	reset, err := p.Reset(ctx, info.ID, true)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Destroy(context.Background(), reset.ID) })
	if reset.ID == info.ID {
		t.Fatal("reset kept the sandbox id; the old sandbox was not recreated")
	}
	if _, err := p.Inspect(ctx, info.ID); !errors.Is(err, roche.ErrNotFound) {
		t.Fatalf("the old sandbox survived its reset: %v", err)
	}
	if d := reset.ExpiresAt.Sub(info.ExpiresAt); d > 2*time.Second || d < -2*time.Second {
		t.Fatalf("reset moved the expiry from %v to %v", info.ExpiresAt, reset.ExpiresAt)
	}
	got := execOK(t, p, reset.ID, "sh", "-c", "cat /workspace/kept; ls /var/tmp/root-change /tmp/scratch 2>&1 | wc -l; echo $KEPT")
	if got != "kept\n2\nyes\n" {
		t.Fatalf("after reset keeping the workspace: %q, want the workspace kept, root and /tmp changes gone, config kept", got)
	}
	var buf bytes.Buffer
	if err := p.ReadFile(ctx, reset.ID, "/var/tmp/root-change", &buf); !errors.Is(err, roche.ErrNotFound) {
		t.Fatalf("root change after reset: %v", err)
	}

	wiped, err := p.Reset(ctx, reset.ID, false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Destroy(context.Background(), wiped.ID) })
	if got := execOK(t, p, wiped.ID, "ls", "-A", "/workspace"); got != "" {
		t.Fatalf("workspace after reset without keeping it: %q, want empty", got)
	}
	if _, err := p.Reset(ctx, "no-such-sandbox", true); !errors.Is(err, roche.ErrNotFound) {
		t.Fatalf("reset of an unknown sandbox: %v", err)
	}
}
