package cli

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/internal/daemon"
	"github.com/roche-sandbox/roche/internal/daemon/daemontest"
)

// thin runs the CLI as the thin roche binary does: no providers in this process. With
// no roched to be found (PATH empty, none beside the test binary), a handoff fails with
// errNoFullBinary instead of replacing the test process, which shows where it happens.
func thin(t *testing.T, args ...string) result {
	t.Helper()
	var out, errb bytes.Buffer
	code := Main(args, strings.NewReader(""), &out, &errb, nil)
	return result{code, out.String(), errb.String()}
}

// TestThinHandsOverBeforeActing: the thin CLI runs through roched what roched serves,
// and hands everything else to the full binary before it has done anything, also a
// command over several ids or providers of which roched serves only some.
func TestThinHandsOverBeforeActing(t *testing.T) {
	t.Setenv("PATH", filepath.Join(t.TempDir(), "empty"))
	s := daemontest.Serve(t, daemon.Config{}) // serves docker alone
	ctx := context.Background()
	cfg := roche.DefaultConfig()
	cfg.Image = testImage()
	sb, err := s.Client.Provider("docker").Create(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Client.Provider("docker").Destroy(ctx, sb.ID)
	sock := "--socket=" + s.Socket

	if r := thin(t, sock, "exec", "--sandbox", sb.ID, "--", "echo", "hi"); r.code != 0 || r.stdout != "hi\n" {
		t.Fatalf("exec on a sandbox roched serves: %+v", r)
	}
	if r := thin(t, sock, "list", "--provider", "docker"); r.code != 0 || !strings.Contains(r.stdout, sb.ID) {
		t.Fatalf("list --provider docker, which roched serves: %+v", r)
	}

	handedOver := func(r result) bool {
		return r.code != 0 && r.stdout == "" && strings.Count(r.stderr, "\n") == 1 && strings.Contains(r.stderr, errNoFullBinary.Error())
	}
	for _, args := range [][]string{
		{"destroy", sb.ID, "wasm-0123456789ab"}, // the first is roched's: not destroyed
		{"list"},                                // every provider, not only docker
		{"gc", "--all"},
		{"--direct", "exec", "--sandbox", sb.ID, "--", "true"},
		{"create", "--provider", "wasm"},
		{"mcp"},
		{"kubernetes", "seccomp-profile", "--output", filepath.Join(t.TempDir(), "profile.json")},
	} {
		if r := thin(t, append([]string{sock}, args...)...); !handedOver(r) {
			t.Errorf("thin roche %s: %+v, want the one line of a handoff that found no roched, and nothing done", strings.Join(args, " "), r)
		}
	}
	if _, err := s.Client.Provider("docker").Inspect(ctx, sb.ID); err != nil {
		t.Fatalf("the sandbox roched serves is gone after a destroy that had to be handed over: %v", err)
	}
	// No daemon at all: a command on any sandbox goes to the full binary.
	if r := thin(t, "--socket="+filepath.Join(t.TempDir(), "none.sock"), "exec", "--sandbox", sb.ID, "--", "true"); !handedOver(r) {
		t.Errorf("thin roche exec without roched: %+v", r)
	}
}
