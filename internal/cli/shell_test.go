package cli

import (
	"bytes"
	"cmp"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/roche-sandbox/roche/internal/daemon"
	"github.com/roche-sandbox/roche/internal/daemon/daemontest"
	"github.com/roche-sandbox/roche/internal/testenv"
)

// tmuxTerm is a real terminal: a tmux server of the test's own (its own socket name, so
// no one else's is touched) running one window.
type tmuxTerm struct {
	t    *testing.T
	name string
}

func newTmux(t *testing.T, env []string, cols, rows int, command string) *tmuxTerm {
	t.Helper()
	testenv.Needs(t, testenv.Tmux) // a real terminal
	b := make([]byte, 6)
	rand.Read(b)
	tm := &tmuxTerm{t: t, name: "roche-shell-test-" + hex.EncodeToString(b)}
	cmd := exec.Command("tmux", "-L", tm.name, "-f", "/dev/null", "new-session", "-d",
		"-x", fmt.Sprint(cols), "-y", fmt.Sprint(rows), command)
	cmd.Env = env
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("starting tmux: %v: %s", err, out)
	}
	t.Cleanup(func() {
		_ = exec.Command("tmux", "-L", tm.name, "kill-server").Run()
		// The server leaves its socket behind: where tmux puts one named with -L.
		_ = os.Remove(filepath.Join(cmp.Or(os.Getenv("TMUX_TMPDIR"), "/tmp"), fmt.Sprintf("tmux-%d", os.Getuid()), tm.name))
	})
	return tm
}

func (tm *tmuxTerm) tmux(args ...string) string {
	tm.t.Helper()
	out, err := exec.Command("tmux", append([]string{"-L", tm.name}, args...)...).CombinedOutput()
	if err != nil {
		tm.t.Fatalf("tmux %q: %v: %s", args, err, out)
	}
	return string(out)
}

// keys types into the terminal (send-keys: "Enter" and "C-c" are keys, the rest literal).
func (tm *tmuxTerm) keys(keys ...string) {
	tm.t.Helper()
	tm.tmux(append([]string{"send-keys"}, keys...)...)
}

func (tm *tmuxTerm) screen() string { tm.t.Helper(); return tm.tmux("capture-pane", "-p") }

// waitLine waits until a line of the screen, trimmed, satisfies ok; it returns the line.
func (tm *tmuxTerm) waitLine(what string, within time.Duration, ok func(string) bool) string {
	tm.t.Helper()
	deadline := time.Now().Add(within)
	for {
		scr := tm.screen()
		for _, l := range strings.Split(scr, "\n") {
			if l = strings.TrimSpace(l); ok(l) {
				return l
			}
		}
		if time.Now().After(deadline) {
			tm.t.Fatalf("%s did not appear within %v; the screen:\n%s", what, within, scr)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (tm *tmuxTerm) waitExact(line string, within time.Duration) {
	tm.t.Helper()
	tm.waitLine(fmt.Sprintf("the line %q", line), within, func(l string) bool { return l == line })
}

// TestShellTmux runs roche shell on a real terminal against a real Docker sandbox, direct
// and through roched: a prompt, typing, the window's size and its changes, Ctrl-C, the
// sandbox user and limits, the exit status and the terminal restored.
func TestShellTmux(t *testing.T) {
	testenv.Needs(t, testenv.Docker, testenv.Tmux)
	t.Run("direct", func(t *testing.T) {
		r := run(t, "--direct", "create", "--image", testImage())
		id := strings.TrimSpace(r.stdout)
		if r.code != 0 || id == "" {
			t.Fatalf("create: %+v", r)
		}
		defer run(t, "--direct", "destroy", id)
		shellScenario(t, id, []string{"ROCHE_SOCKET=" + filepath.Join(t.TempDir(), "none.sock")}, "--direct")
	})
	t.Run("roched", func(t *testing.T) {
		s := daemontest.Serve(t, daemon.Config{})
		r := run(t, "--socket", s.Socket, "create", "--image", testImage())
		id := strings.TrimSpace(r.stdout)
		if r.code != 0 || id == "" {
			t.Fatalf("create through roched: %+v", r)
		}
		defer run(t, "--socket", s.Socket, "destroy", id)
		// A sandbox roched made is reached only through roched while it answers.
		shellScenario(t, id, []string{"ROCHE_SOCKET=" + s.Socket})
	})
}

func shellScenario(t *testing.T, id string, env []string, flags ...string) {
	dir := t.TempDir()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	// The test binary doubles as roche (TestMain). The shell around it records the
	// terminal's settings before and after, and roche's exit status.
	script := fmt.Sprintf(`stty -g > %[1]s/before; %[2]s %[3]s shell %[4]s; echo EXIT=$?; stty -g > %[1]s/after; sleep 600`,
		dir, self, strings.Join(flags, " "), id)
	tm := newTmux(t, append(append(os.Environ(), "ROCHE_TEST_AS_CLI=1"), env...), 100, 30, script)

	prompt := func(l string) bool { return strings.HasSuffix(l, "$") || strings.HasSuffix(l, "#") }
	tm.waitLine("a shell prompt", time.Minute, prompt)
	tm.keys(`echo h""i`, "Enter")
	tm.waitExact("hi", 30*time.Second)

	tm.keys("stty size", "Enter")
	tm.waitExact("30 100", 30*time.Second)
	tm.tmux("resize-window", "-x", "120", "-y", "40")
	// Nothing says when the new size has reached the sandbox's terminal: ask stty until
	// it says so, each answer numbered so that none is read twice.
	for i, deadline := 0, time.Now().Add(30*time.Second); ; i++ {
		tm.keys(fmt.Sprintf("clear; echo S%d=$(stty size)", i), "Enter")
		prefix := fmt.Sprintf("S%d=", i)
		if tm.waitLine("stty's answer", 30*time.Second, func(l string) bool { return strings.HasPrefix(l, prefix) }) == prefix+"40 120" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the sandbox's terminal is not 40x120 30 s after the window's resize")
		}
	}

	// Ctrl-C reaches sleep, the terminal's foreground job, and the shell lives on. The
	// job says it runs, then becomes sleep (the quotes keep the typed line from matching).
	tm.keys(`clear; sh -c 'echo sleep""ing; exec sleep 100'`, "Enter")
	tm.waitExact("sleeping", 30*time.Second)
	start := time.Now()
	tm.keys("C-c")
	tm.keys(`echo after-int''errupt`, "Enter")
	tm.waitExact("after-interrupt", 30*time.Second)
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("Ctrl-C took %v to interrupt sleep 100", d)
	}

	// The sandbox user, under the sandbox's limits: not root, no capabilities, and the
	// default 512 MiB of memory kills a program that takes 700.
	tm.keys("clear; echo U=$(id -u) B=$(grep CapBnd /proc/self/status | cut -f2)", "Enter")
	user := tm.waitLine("the user line", 30*time.Second, func(l string) bool { return strings.HasPrefix(l, "U=") })
	if user == "U=0 B=0000000000000000" || !strings.HasSuffix(user, "B=0000000000000000") || strings.HasPrefix(user, "U=0 ") {
		t.Errorf("the shell runs as %q, want a uid other than 0 and no capabilities", user)
	}
	tm.keys(`python3 -c "b = bytearray(700 << 20)"; echo MEM=$?`, "Enter")
	tm.waitExact("MEM=137", time.Minute)

	tm.keys("exit 3", "Enter")
	tm.waitExact("EXIT=3", 30*time.Second)
	testenv.AwaitFile(t, filepath.Join(dir, "after"), "the terminal's settings after roche shell", 30*time.Second, func(fi os.FileInfo) bool { return fi.Size() > 0 })
	before, err1 := os.ReadFile(filepath.Join(dir, "before"))
	after, err2 := os.ReadFile(filepath.Join(dir, "after"))
	if err1 != nil || err2 != nil {
		t.Fatalf("the terminal's settings: %v %v", err1, err2)
	}
	if !bytes.Equal(before, after) {
		t.Errorf("the terminal was not restored: stty -g %q before, %q after", before, after)
	}
}

// TestShellRefusedOnWasm: a provider without terminals says so in one line, exit 125.
func TestShellRefusedOnWasm(t *testing.T) {
	testenv.Needs(t, testenv.PythonWasm)
	r := run(t, "--direct", "create", "--provider", "wasm")
	id := strings.TrimSpace(r.stdout)
	if r.code != 0 || id == "" {
		t.Fatalf("create: %+v", r)
	}
	defer run(t, "--direct", "destroy", id)
	r = run(t, "--direct", "shell", id)
	if r.code != 125 || !strings.Contains(r.stderr, "no terminals") || strings.Count(r.stderr, "\n") != 1 {
		t.Fatalf("roche shell on wasm: %+v, want exit 125 and one line saying it has no terminals", r)
	}
	if r := run(t, "--direct", "shell", id, "python3"); r.code != 125 || !strings.Contains(r.stderr, "after --") {
		t.Fatalf("a command without --: %+v, want the usage", r)
	}
}

// TestShellPiped: without a terminal, piped input is typed in and its end is a Ctrl-D.
func TestShellPiped(t *testing.T) {
	testenv.Needs(t, testenv.Docker)
	r := run(t, "--direct", "create", "--image", testImage())
	id := strings.TrimSpace(r.stdout)
	if r.code != 0 || id == "" {
		t.Fatalf("create: %+v", r)
	}
	defer run(t, "--direct", "destroy", id)
	if r := rocheIn(t, "echo pi''ped; exit 4\n", "--direct", "shell", id, "--", "sh"); r.code != 4 || !strings.Contains(r.stdout, "piped\r\n") {
		t.Fatalf("piped commands ending in exit 4: %+v", r)
	}
	if r := rocheIn(t, "echo no-exit\n", "--direct", "shell", id, "--", "sh"); r.code != 0 || !strings.Contains(r.stdout, "no-exit\r\n") {
		t.Fatalf("piped commands without an exit: %+v, want the shell ended by the Ctrl-D at the end", r)
	}
}

// TestShellPipedTmux: input piped into roche shell from a real terminal's shell, as a
// user types `echo 'echo hi' | roche shell ID`, 50 times in a row, direct and through
// roched, into bash and into python3, with no exit typed: every run must end by itself
// within its deadline (the end of the input is a Ctrl-D the program reads whenever it
// waits for input, even one typed before its line editor set the terminal up) and have
// run what was piped.
func TestShellPipedTmux(t *testing.T) {
	testenv.Needs(t, testenv.Docker, testenv.Tmux)
	t.Run("direct", func(t *testing.T) {
		r := run(t, "--direct", "create", "--image", testImage())
		id := strings.TrimSpace(r.stdout)
		if r.code != 0 || id == "" {
			t.Fatalf("create: %+v", r)
		}
		defer run(t, "--direct", "destroy", id)
		pipedScenario(t, id, []string{"ROCHE_SOCKET=" + filepath.Join(t.TempDir(), "none.sock")}, "--direct")
	})
	t.Run("roched", func(t *testing.T) {
		s := daemontest.Serve(t, daemon.Config{})
		r := run(t, "--socket", s.Socket, "create", "--image", testImage())
		id := strings.TrimSpace(r.stdout)
		if r.code != 0 || id == "" {
			t.Fatalf("create through roched: %+v", r)
		}
		defer run(t, "--socket", s.Socket, "destroy", id)
		pipedScenario(t, id, []string{"ROCHE_SOCKET=" + s.Socket}, "--socket", s.Socket)
	})
}

func pipedScenario(t *testing.T, id string, env []string, flags ...string) {
	const runs = 50
	dir := t.TempDir()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	roche := self + " " + strings.Join(flags, " ")
	// Odd runs pipe a command into the image's shell (bash), even ones a statement into
	// python3; each leaves a file in the sandbox's /tmp, checked after. Each run has 60 s.
	script := fmt.Sprintf(`for i in $(seq %[1]d); do
  start=$(date +%%s%%N)
  if [ $((i %% 2)) = 1 ]; then
    echo "echo \$((6*7)) > /tmp/sh-$i" | timeout -k 5 60 %[2]s shell %[3]s
  else
    echo "open('/tmp/py-$i', 'w').write(str(6*7))" | timeout -k 5 60 %[2]s shell %[3]s -- python3
  fi
  echo "run $i exit $? ms $(( ($(date +%%s%%N) - start) / 1000000 ))" >> %[4]s/runs
done; echo done >> %[4]s/runs; sleep 600`, runs, roche, id, dir)
	newTmux(t, append(append(os.Environ(), "ROCHE_TEST_AS_CLI=1"), env...), 100, 30, script)

	var lines []string
	testenv.AwaitFile(t, filepath.Join(dir, "runs"), "the runs' last line, done", runs*70*time.Second, func(os.FileInfo) bool {
		b, _ := os.ReadFile(filepath.Join(dir, "runs"))
		lines = strings.Split(strings.TrimSpace(string(b)), "\n")
		return lines[len(lines)-1] == "done"
	})
	var slowest string
	var most int
	for _, l := range lines[:len(lines)-1] {
		var i, code, ms int
		if _, err := fmt.Sscanf(l, "run %d exit %d ms %d", &i, &code, &ms); err != nil {
			t.Fatalf("a run's line %q: %v", l, err)
		}
		if code != 0 {
			t.Errorf("run %d exited %d (124 or 137: it hung until its 60 s deadline)", i, code)
		}
		if ms > most {
			most, slowest = ms, l
		}
	}
	if len(lines) != runs+1 {
		t.Fatalf("%d runs recorded, want %d: %q", len(lines)-1, runs, lines)
	}
	t.Logf("%d piped runs; the slowest: %s", runs, slowest)
	r := run(t, append(flags, "exec", "--sandbox", id, "--", "sh", "-c", "cd /tmp && for f in sh-* py-*; do echo \"$f $(cat $f)\"; done")...)
	if r.code != 0 {
		t.Fatalf("reading the runs' files: %+v", r)
	}
	for i := 1; i <= runs; i++ {
		name := fmt.Sprintf("py-%d", i)
		if i%2 == 1 {
			name = fmt.Sprintf("sh-%d", i)
		}
		if !strings.Contains(r.stdout, name+" 42\n") {
			t.Errorf("run %d left no %s holding 42: what ran did not run; the files:\n%s", i, name, r.stdout)
		}
	}
}

// TestShellMessages: roche shell without a sandbox says what it takes, with its brackets
// whole; a command that is not in the sandbox says so and exits 127 (126 for one that
// cannot run), as a shell does, direct and through roched alike.
func TestShellMessages(t *testing.T) {
	testenv.Needs(t, testenv.Docker)
	r := run(t, "--direct", "shell")
	if r.code == 0 || r.stderr != "roche: roche shell takes ID [-- CMD [ARGS...]], got none (usage: roche shell ID [-- CMD [ARGS...]] [flags])\n" {
		t.Errorf("roche shell alone: %+v", r)
	}
	check := func(t *testing.T, flags ...string) {
		r := run(t, append(flags, "create", "--image", testImage())...)
		id := strings.TrimSpace(r.stdout)
		if r.code != 0 || id == "" {
			t.Fatalf("create: %+v", r)
		}
		defer run(t, append(flags, "destroy", id)...)
		r = run(t, append(flags, "shell", id, "--", "nosuchcmd")...)
		if r.code != 127 || !strings.Contains(r.stdout, "nosuchcmd: command not found") {
			t.Errorf("roche shell -- nosuchcmd: %+v, want exit 127 saying the command was not found", r)
		}
		r = run(t, append(flags, "shell", id, "--", "/etc/passwd")...)
		if r.code != 126 || !strings.Contains(r.stdout, "/etc/passwd: permission denied") {
			t.Errorf("roche shell -- /etc/passwd: %+v, want exit 126 saying it may not run", r)
		}
	}
	t.Run("direct", func(t *testing.T) { check(t, "--direct") })
	t.Run("roched", func(t *testing.T) {
		s := daemontest.Serve(t, daemon.Config{})
		check(t, "--socket", s.Socket)
	})
}
