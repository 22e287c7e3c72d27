package faults

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// TestCLIAgainstSilentEngine: with an engine socket that never answers, roche list, gc,
// destroy and run each end at their bound with one line naming the engine.
func TestCLIAgainstSilentEngine(t *testing.T) {
	sock := silentSocket(t)
	env := append(noDaemon(t), "DOCKER_HOST=unix://"+sock)
	cases := []struct {
		args  []string
		bound time.Duration
		code  int
	}{
		{[]string{"list", "--provider", "docker"}, controlBound, 1},
		{[]string{"gc", "--provider", "docker"}, controlBound, 1},
		{[]string{"destroy", "0123456789ab"}, controlBound, 1},
		{[]string{"run", "--engine-timeout", "2s", "--image", "roche/python:local", "--", "true"}, 2 * time.Second, 125},
	}
	var wg sync.WaitGroup
	for _, c := range cases {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := runRoche(t, env, c.args...)
			if r.code != c.code || r.took > c.bound+margin || strLines(r.stderr) != 1 ||
				!strings.Contains(r.stderr, "the Docker engine at unix://"+sock+" is not answering") {
				t.Errorf("roche %v: exit %d after %v, stderr %q; want exit %d within %v, one line naming the engine",
					c.args, r.code, r.took, r.stderr, c.code, c.bound)
			}
		}()
	}
	wg.Wait()
}

// TestCLISignalDuringHungCreate: roche run waiting on an engine that never answers
// stops at once on SIGTERM (exit 143) or SIGINT (130), with one line saying so.
func TestCLISignalDuringHungCreate(t *testing.T) {
	sock := silentSocket(t)
	env := append(noDaemon(t), "DOCKER_HOST=unix://"+sock)
	for _, c := range []struct {
		sig  syscall.Signal
		code int
	}{{syscall.SIGTERM, 143}, {syscall.SIGINT, 130}} {
		t.Run(c.sig.String(), func(t *testing.T) {
			cmd := exec.Command(filepath.Join(binDir, "roche"), "run", "--image", "roche/python:local", "--", "true")
			cmd.Env = append(os.Environ(), env...)
			var stderr syncBuffer
			cmd.Stderr = &stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			defer cmd.Process.Kill()
			time.Sleep(time.Second) // well into the create, which waits for the engine
			start := time.Now()
			if err := cmd.Process.Signal(c.sig); err != nil {
				t.Fatal(err)
			}
			waitExit(t, cmd, 2*time.Second+time.Second)
			took := time.Since(start)
			msg := stderr.String()
			if code := cmd.ProcessState.ExitCode(); code != c.code || strLines(msg) != 1 || !strings.Contains(msg, "interrupted") {
				t.Fatalf("after %v: exit %d, stderr %q; want exit %d and one line saying it was interrupted", c.sig, code, msg, c.code)
			}
			t.Logf("exited %v after %v: %s", c.sig, took.Round(time.Millisecond), strings.TrimSpace(msg))
		})
	}
}

// waitExit waits for cmd, failing the test (and killing it) if it takes longer than d.
func waitExit(t *testing.T, cmd *exec.Cmd, d time.Duration) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		cmd.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(d):
		cmd.Process.Kill()
		<-done
		t.Fatalf("still running %v after the signal", d)
	}
}

// TestCLISecondSignalExitsAtOnce: roche run's cleanup after a signal is bounded, and a
// second signal does not even wait for that: here the engine never answers the removal.
func TestCLISecondSignalExitsAtOnce(t *testing.T) {
	real := realProvider(t)
	img := privateImage(t)
	proxy := newEngineProxy(t)
	env := append(noDaemon(t), "DOCKER_HOST=unix://"+proxy.socket)
	for _, second := range []bool{false, true} {
		name := "one signal"
		if second {
			name = "two signals"
		}
		t.Run(name, func(t *testing.T) {
			proxy.set(false, nil, nil)
			cmd := exec.Command(filepath.Join(binDir, "roche"), "run", "--image", img, "--", "sh", "-c", "echo started; sleep 60")
			cmd.Env = append(os.Environ(), env...)
			var stderr syncBuffer
			cmd.Stderr = &stderr
			stdout, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			defer cmd.Process.Kill()
			line, err := bufio.NewReader(stdout).ReadString('\n')
			if err != nil || line != "started\n" {
				t.Fatalf("waiting for the command: %q %v (stderr %q)", line, err, stderr.String())
			}
			// From now on the engine does not hear about removals.
			proxy.set(false, isRemove, nil)
			start := time.Now()
			cmd.Process.Signal(syscall.SIGTERM)
			if second {
				time.Sleep(time.Second)
				cmd.Process.Signal(syscall.SIGTERM)
				waitExit(t, cmd, 2*time.Second)
				if !strings.Contains(stderr.String(), "SIGTERM again") && !strings.Contains(stderr.String(), "terminated again") {
					t.Errorf("stderr %q does not say it exits on the second signal", stderr.String())
				}
			} else {
				// The destroy on the way out is bounded (5 s after a signal).
				waitExit(t, cmd, 5*time.Second+margin)
				if !strings.Contains(stderr.String(), "destroying sandbox") {
					t.Errorf("stderr %q does not say the sandbox could not be destroyed", stderr.String())
				}
			}
			if code := cmd.ProcessState.ExitCode(); code != 143 {
				t.Errorf("exit %d, want 143", code)
			}
			t.Logf("exited after %v: %q", time.Since(start).Round(time.Millisecond), stderr.String())
			proxy.set(false, nil, nil)
			// What roche could not remove, the test does.
			for _, sb := range sandboxesFrom(t, real, img) {
				real.Destroy(context.Background(), sb.ID)
			}
			noneLeft(t, real, img, 30*time.Second)
		})
	}
}

// TestCLIAgentThatDoesNotStart: an agent that cannot start is an error saying why and
// how to ask for Docker's exec API, never a sandbox that silently works another way;
// asked for, the exec API runs the command.
func TestCLIAgentThatDoesNotStart(t *testing.T) {
	real := realProvider(t)
	img := privateImage(t)
	env := append(noDaemon(t), "ROCHE_AGENT=/bin/false")
	r := runRoche(t, env, "run", "--image", img, "--", "echo", "hi")
	if r.code != 125 || strLines(r.stderr) != 1 || !strings.Contains(r.stderr, "roche-agent did not start") ||
		!strings.Contains(r.stderr, "--transport docker-exec") || r.stdout != "" {
		t.Errorf("run with an agent that cannot start: %+v", r)
	}
	noneLeft(t, real, img, 30*time.Second)
	r = runRoche(t, noDaemon(t), "run", "--transport", "docker-exec", "--image", img, "--", "echo", "hi")
	if r.code != 0 || r.stdout != "hi\n" {
		t.Errorf("run --transport docker-exec: %+v", r)
	}
	noneLeft(t, real, img, 30*time.Second)
}
