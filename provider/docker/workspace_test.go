package docker_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/provider/docker"
)

// Workspaces and reset as every provider has them are checked by the conformance suite
// (providertest); these are the Docker-specific parts.

func workspaceName(t *testing.T) string {
	return fmt.Sprintf("test-%s-%d", strings.ToLower(t.Name()), time.Now().UnixNano()%1e9)
}

// removeAtEnd removes a workspace or snapshot with rm once the sandboxes using it are
// gone (their removal may still be under way when the test ends).
func removeAtEnd(t *testing.T, what string, rm func(context.Context, string) error, name string) {
	t.Cleanup(func() {
		deadline := time.Now().Add(30 * time.Second)
		for {
			err := rm(context.Background(), name)
			if err == nil || errors.Is(err, roche.ErrNotFound) {
				return
			}
			if time.Now().After(deadline) {
				t.Errorf("removing %s %s: %v", what, name, err)
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
	})
}

// TestWorkspaceBelongsToSandboxUser: a new volume belongs to root; the agent hands it to
// the sandbox user, so that it is writable on a read-only root.
func TestWorkspaceBelongsToSandboxUser(t *testing.T) {
	p := newProvider(t)
	name := workspaceName(t)
	removeAtEnd(t, "workspace", p.RemoveWorkspace, name)
	cfg := testConfig()
	cfg.Workspace = name
	id := sandbox(t, p, cfg)
	got := execOK(t, p, id, "sh", "-c", "id -u; stat -c %u /workspace; echo x > /workspace/f && stat -c %u /workspace/f")
	if f := strings.Fields(got); len(f) != 3 || f[1] != f[0] || f[2] != f[0] {
		t.Fatalf("sandbox user, owners of /workspace and a file made in it: %q, want the sandbox user's uid thrice", got)
	}
}

// TestWorkspaceNeedsAgent: without roche-agent nothing would make the volume writable
// for the sandbox user, so a workspace is refused rather than mounted unusable.
func TestWorkspaceNeedsAgent(t *testing.T) {
	p := newProvider(t, docker.WithTransport(docker.TransportDockerExec))
	ctx := context.Background()
	name := workspaceName(t)
	removeAtEnd(t, "workspace", p.RemoveWorkspace, name)
	before, err := p.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	cfg := testConfig()
	cfg.Workspace = name
	_, err = p.Create(ctx, cfg)
	if !errors.Is(err, roche.ErrUnsupported) || !strings.Contains(err.Error(), "roche-agent") {
		t.Fatalf("a workspace without roche-agent: %v, want ErrUnsupported naming roche-agent", err)
	}
	after, err := p.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(after) > len(before) {
		t.Fatalf("a refused create left a sandbox behind: %d before, %d after", len(before), len(after))
	}
}
