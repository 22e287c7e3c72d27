package guestcmd_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/roche-sandbox/roche/internal/guest/guestcmd"
	"github.com/roche-sandbox/roche/internal/testenv"
)

func TestMain(m *testing.M) {
	guestcmd.RunIfAsked() // this test binary, started as roche-agent, is the agent
	os.Exit(m.Run())
}

// TestForkAsUserRefusedOffGVisor: the agent started for gVisor (--fork-as-user, which
// comes with CAP_SYS_RESOURCE) on the host's kernel, as under a runtime named for gVisor
// that is runc, refuses to start and says why, rather than running the sandbox with
// weaker isolation than was asked for.
func TestForkAsUserRefusedOffGVisor(t *testing.T) {
	testenv.Needs(t, testenv.Root)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	agent := filepath.Join(dir, "roche-agent")
	if err := os.Symlink(self, agent); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, agent, "--socket", filepath.Join(dir, "agent.sock"), "--user", "65534:65534", "--fork-as-user")
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		t.Fatalf("the agent started with --fork-as-user on the host's kernel and served until killed:\n%s", out)
	}
	if err == nil || !strings.Contains(string(out), "not gVisor") || strings.Count(strings.TrimSpace(string(out)), "\n") > 0 {
		t.Fatalf("the agent with --fork-as-user off gVisor: %v, %q; want it to refuse in one line saying the kernel is not gVisor's", err, out)
	}
	t.Logf("refused: %s", strings.TrimSpace(string(out)))
}
