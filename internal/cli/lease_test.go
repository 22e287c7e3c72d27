package cli

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	dockerclient "github.com/docker/docker/client"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/internal/testenv"
	"github.com/roche-sandbox/roche/provider/docker"
)

// TestRunKilledLeavesNoSandbox: `roche run` killed outright (SIGKILL: no cleanup runs)
// leaves a sandbox that is gone within seconds, not one that lives out its lifetime,
// directly (the sandbox's lease was held by the killed process) and through roched (the
// killed process held it through roched, which destroys it).
func TestRunKilledLeavesNoSandbox(t *testing.T) {
	testenv.Needs(t, testenv.Docker)
	img := newImageSandboxes(t, "roche-lease")
	tag := img.tag
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
			if n := len(img.ids(t)); n != 1 {
				cmd.Process.Kill()
				t.Fatalf("%d sandboxes from the test's image, want roche run's", n)
			}
			cmd.Process.Kill()
			<-exited
			img.goneWithin(t, 10*time.Second, "roche run killed")
		})
	}
}

// TestCreateHoldKeepsItsSandboxWhileItRuns: roche create --hold prints the sandbox as
// one line and keeps it while it runs (past the lease's grace), resets it in place on a
// "reset" line (the new sandbox leased to it too) and answers an unknown line with one
// error line; killed outright, it leaves a sandbox that is gone within seconds, and when
// its standard input closes it destroys the sandbox and exits 0. Directly and through
// roched.
func TestCreateHoldKeepsItsSandboxWhileItRuns(t *testing.T) {
	testenv.Needs(t, testenv.Docker)
	img := newImageSandboxes(t, "roche-hold")
	tag := img.tag
	for name, r := range modes(t) {
		t.Run(name, func(t *testing.T) {
			h := startHold(t, r, "--image", tag, "--timeout", "600")
			first := h.sandbox(t)
			if got := img.ids(t); len(got) != 1 || got[0] != first.ID {
				t.Fatalf("sandboxes of the test's image: %v, want only %s", got, first.ID)
			}

			h.send(t, "reset")
			second := h.sandbox(t)
			if second.ID == first.ID {
				t.Fatalf("reset kept the id %s", first.ID)
			}
			// Past the lease's grace: the new sandbox is held by the roche that reset it.
			time.Sleep(docker.LeaseGrace + 3*time.Second)
			if got := img.ids(t); len(got) != 1 || got[0] != second.ID {
				t.Fatalf("after reset and %v: sandboxes %v, want only %s", docker.LeaseGrace+3*time.Second, got, second.ID)
			}

			h.send(t, "destroy everything")
			if line := h.line(t); !strings.HasPrefix(line, "roche: unknown request ") {
				t.Fatalf("an unknown request was answered with %q", line)
			}

			// Killed outright, it leaves the sandbox it reset to go within seconds: its
			// lease was this process's.
			h.cmd.Process.Kill()
			h.wait(t)
			img.goneWithin(t, 10*time.Second, "create --hold killed after a reset")

			h = startHold(t, r, "--image", tag, "--timeout", "600")
			h.sandbox(t)
			h.stdin.Close()
			if err := h.wait(t); err != nil {
				t.Fatalf("roche create --hold exited with %v after its stdin closed: %s", err, h.stderr.String())
			}
			// Directly it is removed before roche exits; roched marks it gone at once and
			// removes it in the background.
			img.goneWithin(t, 10*time.Second, "stdin closed")
		})
	}
}

// imageSandboxes are the sandboxes of an image private to one test, seen on the engine
// directly, so that what roche leaves behind is found whichever way it went (directly or
// through roched) and whatever else runs on the engine.
type imageSandboxes struct {
	tag string
	p   *docker.Provider
	// dirs are the agent directories of the sandboxes seen, by sandbox id. A sandbox
	// whose roche was killed ends by its lease with no one of ours watching, and its
	// directory waits for the next create's sweep (or roche gc): the test removes
	// those of its own sandboxes at its end.
	dirs map[string]string
}

// newImageSandboxes tags a private image for the test and, at its end, destroys what is
// left of its sandboxes and removes the tag.
func newImageSandboxes(t *testing.T, prefix string) *imageSandboxes {
	t.Helper()
	ctx := context.Background()
	tag, untag, err := testenv.PrivateImage(ctx, prefix)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(untag)
	p, err := docker.New()
	if err != nil {
		t.Fatal(err)
	}
	img := &imageSandboxes{tag: tag, p: p, dirs: map[string]string{}}
	t.Cleanup(func() {
		for _, id := range img.ids(t) {
			p.Destroy(ctx, id)
		}
		p.Close()
		for _, dir := range img.dirs {
			os.RemoveAll(dir)
		}
	})
	return img
}

// ids lists the sandboxes of the image.
func (img *imageSandboxes) ids(t *testing.T) []string {
	t.Helper()
	list, err := img.p.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, sb := range list {
		if sb.Image == img.tag {
			ids = append(ids, sb.ID)
			if _, seen := img.dirs[sb.ID]; !seen {
				img.dirs[sb.ID] = agentDir(t, sb.ID)
			}
		}
	}
	return ids
}

// goneWithin waits for every sandbox of the image to go.
func (img *imageSandboxes) goneWithin(t *testing.T, limit time.Duration, what string) {
	t.Helper()
	since := time.Now()
	for len(img.ids(t)) > 0 {
		if time.Since(since) > limit {
			t.Fatalf("%s: sandboxes still exist %v later: %v", what, limit, img.ids(t))
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Logf("%s: gone %v later", what, time.Since(since).Round(100*time.Millisecond))
}

// holder is a running roche create --hold --json.
type holder struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	out    *bufio.Reader
	stderr *bytes.Buffer
	exited chan error
}

func startHold(t *testing.T, r rocheBin, flags ...string) *holder {
	t.Helper()
	cmd := exec.Command(r.path, append(append(append([]string{}, r.global...), "create", "--hold", "--json"), flags...)...)
	h := &holder{cmd: cmd, stderr: &bytes.Buffer{}, exited: make(chan error, 1)}
	cmd.Stderr = h.stderr
	var err error
	if h.stdin, err = cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	h.out = bufio.NewReader(out)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { h.exited <- cmd.Wait() }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-h.exited
		h.exited <- nil
	})
	return h
}

// line is the next line it prints, within 2 minutes (a create may pull nothing, but
// the engine is shared).
func (h *holder) line(t *testing.T) string {
	t.Helper()
	got := make(chan string, 1)
	go func() {
		s, _ := h.out.ReadString('\n')
		got <- s
	}()
	select {
	case s := <-got:
		if !strings.HasSuffix(s, "\n") {
			t.Fatalf("roche create --hold ended its output with %q: %s", s, h.stderr.String())
		}
		return strings.TrimSuffix(s, "\n")
	case <-time.After(2 * time.Minute):
		t.Fatalf("roche create --hold printed no line within 2 minutes: %s", h.stderr.String())
	}
	return ""
}

// sandbox is the next line, a sandbox as --json prints it on one line.
func (h *holder) sandbox(t *testing.T) roche.SandboxInfo {
	t.Helper()
	line := h.line(t)
	var info roche.SandboxInfo
	if err := json.Unmarshal([]byte(line), &info); err != nil || info.ID == "" {
		t.Fatalf("roche create --hold printed %q, want a sandbox as JSON on one line: %v", line, err)
	}
	return info
}

func (h *holder) send(t *testing.T, line string) {
	t.Helper()
	if _, err := io.WriteString(h.stdin, line+"\n"); err != nil {
		t.Fatalf("writing to roche create --hold: %v", err)
	}
}

// wait waits for it to exit, within 30 s.
func (h *holder) wait(t *testing.T) error {
	t.Helper()
	select {
	case err := <-h.exited:
		h.exited <- err
		return err
	case <-time.After(30 * time.Second):
		t.Fatalf("roche create --hold did not exit within 30 s: %s", h.stderr.String())
	}
	return nil
}

// agentDir is the agent directory of a sandbox on the engine ("" when it has none or is
// gone).
func agentDir(t *testing.T, id string) string {
	t.Helper()
	c, err := dockerclient.NewClientWithOpts(dockerclient.FromEnv, dockerclient.WithAPIVersionNegotiation())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	info, err := c.ContainerInspect(context.Background(), id)
	if err != nil || info.Config == nil {
		return ""
	}
	return info.Config.Labels[docker.LabelAgentDir]
}
