package cli

import (
	"context"
	"encoding/json"
	"os"
	"strings"
	"testing"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/internal/testenv"
	"github.com/roche-sandbox/roche/provider/docker"
	"github.com/roche-sandbox/roche/provider/kit"
)

// TestYourOwnOnly: on an engine holding another user's sandbox, list, gc --all and
// destroy --all in direct mode keep to this user's own; --any-owner shows (and would
// collect) every one, with its owner; through roched --any-owner is refused.
func TestYourOwnOnly(t *testing.T) {
	testenv.Needs(t, testenv.Docker)
	ctx := context.Background()
	dp, err := docker.New()
	if err != nil {
		t.Fatal(err)
	}
	defer dp.Close()
	cfg := roche.DefaultConfig()
	cfg.Image = testImage()
	other, err := dp.CreateFor(ctx, cfg, kit.CreateOptions{Owner: "cli:someone-else@elsewhere"})
	if err != nil {
		t.Fatal(err)
	}
	defer dp.Destroy(ctx, other.ID)
	r := run(t, "create", "--direct", "--image", testImage())
	mine := strings.TrimSpace(r.stdout)
	if r.code != 0 || mine == "" {
		t.Fatalf("create: %+v", r)
	}
	defer run(t, "destroy", "--direct", mine)
	me := os.Getenv("ROCHE_OWNER")

	r = run(t, "list", "--direct", "--json")
	var list []roche.SandboxInfo
	if err := json.Unmarshal([]byte(r.stdout), &list); err != nil {
		t.Fatalf("list --json: %+v %v", r, err)
	}
	if !containsID(list, mine) || containsID(list, other.ID) {
		t.Fatalf("list shows %v: want %s and not another user's %s", list, mine, other.ID)
	}
	for _, sb := range list {
		if sb.Owner != me {
			t.Errorf("list shows %s of %q, want only %q's", sb.ID, sb.Owner, me)
		}
	}
	r = run(t, "list", "--direct", "--any-owner")
	if !strings.Contains(r.stdout, mine) || !strings.Contains(r.stdout, other.ID) || !strings.Contains(r.stdout, "OWNER") ||
		!strings.Contains(r.stdout, "cli:someone-else@elsewhere") || !strings.Contains(r.stdout, me) {
		t.Fatalf("list --any-owner: %+v", r)
	}
	r = run(t, "gc", "--direct", "--all", "--dry-run")
	if !strings.Contains(r.stdout, "would remove "+mine) || strings.Contains(r.stdout, other.ID) {
		t.Fatalf("gc --all --dry-run: %+v", r)
	}
	r = run(t, "gc", "--direct", "--all", "--dry-run", "--any-owner")
	if !strings.Contains(r.stdout, "would remove "+mine) || !strings.Contains(r.stdout, "would remove "+other.ID) {
		t.Fatalf("gc --all --dry-run --any-owner: %+v", r)
	}
	r = run(t, "destroy", "--direct", "--all", "--provider", "docker")
	if r.code != 0 || !strings.Contains(r.stdout, mine) || strings.Contains(r.stdout, other.ID) {
		t.Fatalf("destroy --all: %+v", r)
	}
	if _, err := dp.Inspect(ctx, other.ID); err != nil {
		t.Fatalf("another user's sandbox after destroy --all: %v", err)
	}
	if _, err := dp.Inspect(ctx, mine); err == nil {
		t.Fatalf("own sandbox %s survived destroy --all", mine)
	}

	socket, _ := startInProcessDaemon(t)
	for _, args := range [][]string{{"list", "--any-owner"}, {"gc", "--any-owner"}, {"destroy", "--all", "--any-owner"}} {
		r := run(t, append([]string{"--socket", socket}, args...)...)
		if r.code != 1 || !strings.Contains(r.stderr, "--any-owner needs --direct") {
			t.Errorf("roche %v through roched: %+v", args, r)
		}
	}
}
