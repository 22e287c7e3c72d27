package main

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/roche-sandbox/roche/internal/guest/guestbin"
	"github.com/roche-sandbox/roche/internal/testenv"
)

// TestOneBinary: roche and roched alone, with no roche-agent beside them, no
// ROCHE_AGENT and no daemon, run Docker sandboxes: roche hands each command to roched,
// whose providers run the agent roched carries (files, the sandbox user, exit codes),
// not the slower docker-exec path that has none of those.
func TestOneBinary(t *testing.T) {
	testenv.Needs(t, testenv.Docker)
	dir := t.TempDir()
	roche, roched, err := testenv.BuildCLI(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, bin := range []string{roche, roched} {
		if !guestbin.Static(bin) {
			t.Fatalf("%s is not static: a sandbox's image may have no C library to run it", bin)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, guestbin.Name)); !os.IsNotExist(err) {
		t.Fatalf("a roche-agent is beside roche (%v): the test would not prove anything", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	tag, untag, err := testenv.PrivateImage(ctx, "onebinary")
	if err != nil {
		t.Fatal(err)
	}
	defer untag()
	env := slices.DeleteFunc(os.Environ(), func(kv string) bool {
		return strings.HasPrefix(kv, guestbin.Env+"=") || strings.HasPrefix(kv, "ROCHE_SOCKET=")
	})
	// No daemon: roched, run as roche in this command's process, serves the sandbox.
	env = append(env, "ROCHE_SOCKET="+filepath.Join(dir, "nobody.sock"))
	run := func(stdin string, args ...string) (string, error) {
		t.Helper()
		cmd := exec.CommandContext(ctx, roche, args...)
		cmd.Env = env
		cmd.Stdin = strings.NewReader(stdin)
		var stderr strings.Builder
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			t.Logf("roche %s: %v: %s", strings.Join(args, " "), err, stderr.String())
		}
		return string(out), err
	}

	out, err := run("", "create", "--json", "--image", tag)
	if err != nil {
		t.Fatal(err)
	}
	var sb struct {
		ID        string `json:"id"`
		Transport string `json:"transport"`
	}
	if err := json.Unmarshal([]byte(out), &sb); err != nil || sb.ID == "" {
		t.Fatalf("roche create --json: %q: %v", out, err)
	}
	destroyed := false
	defer func() {
		if !destroyed {
			run("", "destroy", sb.ID)
		}
	}()
	if sb.Transport != "agent" {
		t.Fatalf("the sandbox runs commands through %q, want the agent roched carries", sb.Transport)
	}
	host := filepath.Join(dir, "in.txt")
	if err := os.WriteFile(host, []byte("carried\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := run("", "cp", host, sb.ID+":/tmp/in.txt"); err != nil {
		t.Fatal(err)
	}
	out, err = run("", "exec", "--sandbox", sb.ID, "--", "sh", "-c", "cat /tmp/in.txt; id -u; grep ^CapEff /proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 3 || lines[0] != "carried" || lines[1] == "0" || !strings.HasSuffix(lines[2], "0000000000000000") {
		t.Fatalf("in the sandbox: %q, want the copied file, a non-root uid and no capabilities", out)
	}
	if _, err := run("", "destroy", sb.ID); err != nil {
		t.Fatal(err)
	}
	destroyed = true
}

// TestHandsOneShotToRocheRun: with no roched, roche hands a command whose providers are
// all roche-run's (docker, oci, wasm) to roche-run, beside it, and any other to roched;
// roche-run hands on to roched what it lacks; with roche-run gone, or not starting,
// roched runs the command; and either way the command prints the same, byte for byte, and exits the same.
func TestHandsOneShotToRocheRun(t *testing.T) {
	dir := t.TempDir()
	roche, roched, err := testenv.BuildCLI(dir)
	if err != nil {
		t.Fatal(err)
	}
	rocheRun := filepath.Join(dir, "roche-run")
	env := slices.DeleteFunc(os.Environ(), func(kv string) bool {
		return strings.HasPrefix(kv, "ROCHE_SOCKET=") || strings.HasPrefix(kv, "ROCHE_DEBUG=") || strings.HasPrefix(kv, "PATH=")
	})
	env = append(env, "ROCHE_SOCKET="+filepath.Join(dir, "nobody.sock"), "PATH="+filepath.Join(dir, "empty"),
		"XDG_RUNTIME_DIR="+t.TempDir()) // the wasm provider's state: this test's own, empty
	type result struct {
		code           int
		stdout, stderr string
	}
	run := func(bin string, debug bool, args ...string) result {
		t.Helper()
		cmd := exec.Command(bin, args...)
		cmd.Env = env
		if debug {
			cmd.Env = append(cmd.Env, "ROCHE_DEBUG=1")
		}
		var out, errb strings.Builder
		cmd.Stdout, cmd.Stderr = &out, &errb
		err := cmd.Run()
		var exit *exec.ExitError
		if err != nil && !errors.As(err, &exit) {
			t.Fatalf("%s %v: %v", bin, args, err)
		}
		return result{cmd.ProcessState.ExitCode(), out.String(), errb.String()}
	}
	handedTo := func(r result) string {
		switch {
		case strings.Contains(r.stderr, `msg="handing the command to roche-run" roche-run=`+rocheRun+"\n"):
			return "roche-run"
		case strings.Contains(r.stderr, `msg="handing the command to the full binary" roched=`+roched+"\n"):
			return "roched"
		}
		return "neither"
	}

	direct := []string{"list", "--provider", "wasm"}
	other := []string{"list", "--provider", "kubernetes", "--kubeconfig", filepath.Join(dir, "none")}
	missing := []string{"exec", "--sandbox", "wasm-0123456789ab", "--", "true"} // an error from the provider

	viaRun := run(roche, true, direct...)
	if viaRun.code != 0 || !strings.HasPrefix(viaRun.stdout, "ID ") || handedTo(viaRun) != "roche-run" {
		t.Fatalf("roche %v: handed to %s: %+v", direct, handedTo(viaRun), viaRun)
	}
	if r := run(roche, true, other...); handedTo(r) != "roched" || strings.Contains(r.stderr, "roche-run") || r.code == 0 {
		t.Fatalf("roche %v: handed to %s, want roched alone: %+v", other, handedTo(r), r)
	}
	// roche-run run by hand (or by an older roche) hands on what it lacks.
	if r := run(rocheRun, true, other...); handedTo(r) != "roched" || r.code == 0 {
		t.Fatalf("roche-run %v: handed to %s, want roched: %+v", other, handedTo(r), r)
	}
	quietRun, errRun, otherRun := run(roche, false, direct...), run(roche, false, missing...), run(roche, false, other...)
	if errRun.code == 0 || !strings.HasPrefix(errRun.stderr, "roche: ") {
		t.Fatalf("roche %v through roche-run: %+v, want the provider's error", missing, errRun)
	}

	// A roche-run that does not start (not executable) is passed over for roched.
	if err := os.Chmod(rocheRun, 0o644); err != nil {
		t.Fatal(err)
	}
	if r := run(roche, true, direct...); !strings.Contains(r.stderr, "roche-run did not start: handing the command to roched") ||
		!strings.Contains(r.stderr, `msg="handing the command to the full binary" roched=`+roched+"\n") || r.stdout != viaRun.stdout || r.code != 0 {
		t.Fatalf("roche %v with a roche-run that does not start: %+v, want roched to run it", direct, r)
	}
	if err := os.Remove(rocheRun); err != nil {
		t.Fatal(err)
	}
	viaRoched := run(roche, true, direct...)
	if handedTo(viaRoched) != "roched" || !strings.Contains(viaRoched.stderr, "roche-run is not beside roche or on PATH: handing the command to roched") {
		t.Fatalf("roche %v without roche-run: handed to %s, not saying why: %+v", direct, handedTo(viaRoched), viaRoched)
	}
	for _, c := range []struct {
		args []string
		with result
	}{{direct, quietRun}, {missing, errRun}, {other, otherRun}} {
		if without := run(roche, false, c.args...); without != c.with {
			t.Errorf("roche %v: through roche-run %+v, through roched %+v", c.args, c.with, without)
		}
	}
}
