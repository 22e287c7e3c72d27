package cli

import (
	"bufio"
	"context"
	"os/exec"
	"testing"
	"time"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/internal/testenv"
	"github.com/roche-sandbox/roche/provider/docker"
)

// TestRunKilledLeavesNoSandbox: `roche run` killed outright (SIGKILL: no cleanup runs)
// leaves a sandbox that is gone within seconds, not one that lives out its lifetime,
// directly (the sandbox's lease was held by the killed process) and through roched (the
// killed process held it through roched, which destroys it).
func TestRunKilledLeavesNoSandbox(t *testing.T) {
	ctx := context.Background()
	tag, untag, err := testenv.PrivateImage(ctx, "roche-lease")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(untag)
	p, err := docker.New()
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	mine := func() []roche.SandboxInfo {
		list, err := p.List(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var out []roche.SandboxInfo
		for _, sb := range list {
			if sb.Image == tag {
				out = append(out, sb)
			}
		}
		return out
	}
	t.Cleanup(func() {
		for _, sb := range mine() {
			p.Destroy(ctx, sb.ID)
		}
	})
	for name, r := range modes(t) {
		t.Run(name, func(t *testing.T) {
			cmd := exec.Command(r.path, append(append([]string{}, r.global...),
				"run", "--image", tag, "--timeout", "600", "--", "sh", "-c", "echo started; exec sleep 600")...)
			out, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			exited := make(chan struct{})
			go func() { cmd.Wait(); close(exited) }()
			// Its command runs: the create has returned and its lease is held.
			started := make(chan bool, 1)
			go func() {
				line, _ := bufio.NewReader(out).ReadString('\n')
				started <- line == "started\n"
			}()
			select {
			case ok := <-started:
				if !ok {
					cmd.Process.Kill()
					t.Fatal("roche run ended before its command started")
				}
			case <-time.After(2 * time.Minute):
				cmd.Process.Kill()
				t.Fatal("roche run's command did not start within 2 minutes")
			}
			if n := len(mine()); n != 1 {
				cmd.Process.Kill()
				t.Fatalf("%d sandboxes from the test's image, want roche run's", n)
			}
			cmd.Process.Kill()
			<-exited
			killed := time.Now()
			for len(mine()) > 0 {
				if time.Since(killed) > 10*time.Second {
					t.Fatalf("the sandbox of a killed roche run still exists %v later: %v", time.Since(killed).Round(time.Second), mine())
				}
				time.Sleep(200 * time.Millisecond)
			}
			t.Logf("gone %v after roche run was killed", time.Since(killed).Round(100*time.Millisecond))
		})
	}
}
