package oci_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/internal/testenv"
	"github.com/roche-sandbox/roche/provider/kit"
	"github.com/roche-sandbox/roche/provider/oci"
)

// posture prints what a sandbox's command runs as and under: its ids, capability sets,
// no-new-privileges and seccomp mode, its limits (processes, open files), the sandbox's
// cgroup limits of memory and pids, and whether it can write the root and /tmp.
const posture = `
import os, resource
st = dict(l.split(':\t', 1) for l in open('/proc/self/status').read().splitlines() if ':\t' in l)
def w(p):
    try:
        open(p, 'w').close(); os.remove(p); return 'w'
    except OSError as e:
        return 'ro' if e.errno == 30 else 'e%d' % e.errno
print('root' if os.getuid() == 0 else 'user', os.getuid() == os.getgid(), os.getgroups())
for k in ('CapInh', 'CapPrm', 'CapEff', 'CapBnd', 'CapAmb', 'NoNewPrivs', 'Seccomp'):
    print(k, st[k].strip())
print('nproc', resource.getrlimit(resource.RLIMIT_NPROC), 'nofile', resource.getrlimit(resource.RLIMIT_NOFILE))
print('root', w('/x'), 'tmp', w('/tmp/x'), 'cwd', os.getcwd(), 'hostname', len(os.uname().nodename))
print('net', sorted(os.listdir('/sys/class/net')))
`

// TestOneShot: a sandbox made for one command (kit.CreateOptions.OneShot, roche run's)
// runs it as a sandbox made to stay does, under the same posture (the probe's output is
// the same in both), with the command's stdin, output, exit status, timeout and output
// bound; it refuses a second command, and its destroy leaves nothing (the cleanup
// checks the runtime's state, mounts, cgroups and directories).
func TestOneShot(t *testing.T) {
	p, _ := newProvider(t)
	ctx := context.Background()
	oneShot := kit.CreateOptions{OneShot: true, Leased: true}
	run := func(req roche.ExecRequest) roche.ExecResult {
		t.Helper()
		info, err := p.CreateFor(ctx, testConfig(), oneShot)
		if err != nil {
			t.Fatal(err)
		}
		defer func() {
			if err := p.Destroy(ctx, info.ID); err != nil {
				t.Errorf("destroy: %v", err)
			}
			if _, err := p.Inspect(ctx, info.ID); !errors.Is(err, roche.ErrNotFound) {
				t.Errorf("inspect after the destroy: %v, want ErrNotFound", err)
			}
		}()
		if got, err := p.Inspect(ctx, info.ID); err != nil || got.State != roche.StateRunning {
			t.Errorf("the one-shot sandbox before its command: %+v %v, want running", got, err)
		}
		res, err := p.Exec(ctx, info.ID, req)
		if err != nil {
			t.Fatalf("%q: %v", req.Cmd, err)
		}
		if _, err := p.Exec(ctx, info.ID, roche.ExecRequest{Cmd: []string{"true"}}); !errors.Is(err, roche.ErrUnsupported) {
			t.Errorf("a second command in a one-shot sandbox: %v, want ErrUnsupported", err)
		}
		return res
	}

	kept, err := p.Create(ctx, testConfig())
	if err != nil {
		t.Fatal(err)
	}
	want, err := p.Exec(ctx, kept.ID, roche.ExecRequest{Cmd: []string{"python3", "-c", posture}})
	p.Destroy(ctx, kept.ID)
	if err != nil || want.ExitCode != 0 {
		t.Fatalf("the posture probe in a sandbox made to stay: %+v %v", want, err)
	}
	if got := run(roche.ExecRequest{Cmd: []string{"python3", "-c", posture}}); got.Stdout != want.Stdout || got.ExitCode != 0 {
		t.Errorf("a one-shot sandbox's posture:\n%s(exit %d, %q)\nthe kept sandbox's:\n%s", got.Stdout, got.ExitCode, got.Stderr, want.Stdout)
	} else {
		t.Logf("posture:\n%s", got.Stdout)
	}

	res := run(roche.ExecRequest{Cmd: []string{"sh", "-c", "cat; echo err >&2; exit 7"}, Stdin: strings.NewReader("typed\n")})
	if res.ExitCode != 7 || res.Stdout != "typed\n" || res.Stderr != "err\n" {
		t.Errorf("stdin, output, exit: %+v, want 7 %q %q", res, "typed\n", "err\n")
	}
	if res := run(roche.ExecRequest{Cmd: []string{"sh", "-c", "kill -9 $$"}}); res.ExitCode != 128+9 {
		t.Errorf("a command killed by SIGKILL: exit %d, want 137", res.ExitCode)
	}
	if res := run(roche.ExecRequest{Cmd: []string{"sleep", "60"}, Timeout: time.Second}); !res.TimedOut || res.Duration > 30*time.Second {
		t.Errorf("a command past its timeout: %+v, want timed out", res)
	}
	if res := run(roche.ExecRequest{Cmd: []string{"head", "-c", "100000", "/dev/zero"}, OutputLimit: 1000}); !res.Truncated || len(res.Stdout) != 1000 {
		t.Errorf("output past its bound: truncated %v, %d bytes, want 1000", res.Truncated, len(res.Stdout))
	}
}

// TestOneShotMakerGone: a one-shot sandbox whose maker went without destroying it (its
// connection closed, as when the process is killed) stops at once, and another process
// sees it exited (its runtime run deleted the container as it ended) and clears it away
// (its exit watch at once, or gc).
func TestOneShotMakerGone(t *testing.T) {
	p, state := newProvider(t)
	ctx := context.Background()
	info, err := p.CreateFor(ctx, testConfig(), kit.CreateOptions{OneShot: true})
	if err != nil {
		t.Fatal(err)
	}
	p.Close()
	other, err := oci.New(oci.WithStateDir(state), oci.WithDataDir("/var/lib/roche-test/oci"))
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	testenv.Eventually(t, 10*time.Second, "the sandbox to be seen exited, or gone", func() bool {
		got, err := other.Inspect(ctx, info.ID)
		return err == nil && got.State == roche.StateExited || errors.Is(err, roche.ErrNotFound)
	})
	if _, err := other.GC(ctx, roche.GCOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(state, info.ID)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the sandbox's directory after gc: %v", err)
	}
}
