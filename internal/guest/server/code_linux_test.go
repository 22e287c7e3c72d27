package server_test

import (
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/roche-sandbox/roche/internal/guest"
	"github.com/roche-sandbox/roche/internal/testenv"
)

type cellOut struct {
	end     guest.CodeEnd
	stdout  string
	stderr  string
	results []guest.CodeResult
}

func (o cellOut) text() string {
	for _, r := range o.results {
		if r.Main {
			return r.Data["text/plain"]
		}
	}
	return ""
}

type lockedBuf struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func runCell(t *testing.T, req guest.Request) cellOut {
	t.Helper()
	var out cellOut
	var stdout, stderr lockedBuf
	end, err := client.RunCode(ctxT(t, time.Minute), req, guest.CodeOptions{
		Stdout: &stdout, Stderr: &stderr,
		Result: func(r guest.CodeResult) { out.results = append(out.results, r) },
	})
	if err != nil {
		t.Fatalf("run %q: %v", req.Code, err)
	}
	out.end, out.stdout, out.stderr = end, stdout.String(), stderr.String()
	return out
}

func newContext(t *testing.T) string {
	t.Helper()
	cc, err := client.CreateContext(ctxT(t, time.Minute), "python", dir, map[string]string{"ROCHE_CONTEXT_TEST": "yes"})
	if err != nil {
		t.Fatalf("create context: %v", err)
	}
	t.Cleanup(func() { _ = client.RemoveContext(ctxT(t, 10*time.Second), cc.ID) })
	return cc.ID
}

func TestCodeStatePersists(t *testing.T) {
	testenv.Needs(t, testenv.Root)
	id := newContext(t)
	first := runCell(t, guest.Request{Context: id, Code: "x = 41\nprint('hi')"})
	if first.end.Error != nil || first.stdout != "hi\n" || first.end.ExecutionCount != 1 || len(first.results) != 0 {
		t.Fatalf("first cell: %+v", first)
	}
	second := runCell(t, guest.Request{Context: id, Code: "x + 1"})
	if second.text() != "42" || second.end.ExecutionCount != 2 || second.end.Context != id {
		t.Fatalf("second cell: %+v", second)
	}
}

func TestCodeDefaultContext(t *testing.T) {
	testenv.Needs(t, testenv.Root)
	a := runCell(t, guest.Request{Code: "y = 'default'"})
	t.Cleanup(func() { _ = client.RemoveContext(ctxT(t, 10*time.Second), a.end.Context) })
	b := runCell(t, guest.Request{Language: "python", Code: "y"})
	if a.end.Context == "" || a.end.Context != b.end.Context || b.text() != "'default'" {
		t.Fatalf("default context: %+v then %+v", a, b)
	}
	list, err := client.Contexts(ctxT(t, 10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var found bool
	for _, cc := range list {
		found = found || (cc.ID == a.end.Context && cc.Default && cc.Language == "python")
	}
	if !found {
		t.Fatalf("default context %s not listed as default: %+v", a.end.Context, list)
	}
}

func TestCodeError(t *testing.T) {
	testenv.Needs(t, testenv.Root)
	id := newContext(t)
	out := runCell(t, guest.Request{Context: id, Code: "def f():\n    return 1/0\nf()"})
	e := out.end.Error
	if e == nil || e.Name != "ZeroDivisionError" || e.Value != "division by zero" ||
		!strings.Contains(e.Traceback, "return 1/0") || strings.Contains(e.Traceback, "kernel") {
		t.Fatalf("error: %+v", e)
	}
}

func TestCodeRawOutputAndDisplay(t *testing.T) {
	testenv.Needs(t, testenv.Root)
	id := newContext(t)
	code := "import os, sys\nprint('py')\nos.system('echo raw; echo rawerr >&2')\n" +
		"class S:\n    def _repr_svg_(self): return '<svg/>'\ndisplay(S())\nprint('late', file=sys.stderr)"
	out := runCell(t, guest.Request{Context: id, Code: code})
	if out.end.Error != nil || !strings.Contains(out.stdout, "py\n") || !strings.Contains(out.stdout, "raw\n") ||
		!strings.Contains(out.stderr, "rawerr\n") || !strings.Contains(out.stderr, "late\n") || strings.Contains(out.stdout, "sync") {
		t.Fatalf("output: %+v", out)
	}
	if len(out.results) != 1 || out.results[0].Data["image/svg+xml"] != "<svg/>" || out.results[0].Main {
		t.Fatalf("display results: %+v", out.results)
	}
}

func TestCodeTimeoutInterrupts(t *testing.T) {
	testenv.Needs(t, testenv.Root)
	id := newContext(t)
	runCell(t, guest.Request{Context: id, Code: "kept = 7"})
	start := time.Now()
	out := runCell(t, guest.Request{Context: id, Code: "while True:\n    pass", TimeoutMS: 300})
	if !out.end.TimedOut || out.end.Error == nil || out.end.Error.Name != "KeyboardInterrupt" || out.end.Died {
		t.Fatalf("interrupted cell: %+v", out.end)
	}
	// The interrupt is raised in the kernel's SIGINT handler, whose frame is not the
	// user's to see.
	if tb := out.end.Error.Traceback; !strings.Contains(tb, `File "<cell-`) || strings.Contains(tb, "roche-kernel") {
		t.Fatalf("the interrupted cell's traceback shows the kernel's frames, or not the cell's: %q", tb)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("interrupt took %s", d)
	}
	if got := runCell(t, guest.Request{Context: id, Code: "kept"}); got.text() != "7" || got.end.Restarted {
		t.Fatalf("after the interrupt: %+v", got)
	}
}

func TestCodeStuckKernelKilled(t *testing.T) {
	testenv.Needs(t, testenv.Root)
	id := newContext(t)
	// SIGINT ignored: the interrupt cannot stop it, so it is killed after the grace.
	out := runCell(t, guest.Request{Context: id, TimeoutMS: 200,
		Code: "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True: time.sleep(0.05)"})
	if !out.end.TimedOut || !out.end.Died || out.end.Error == nil || out.end.Error.Name != "TimeoutError" {
		t.Fatalf("stuck cell: %+v", out.end)
	}
	if got := runCell(t, guest.Request{Context: id, Code: "1"}); !got.end.Restarted || got.text() != "1" {
		t.Fatalf("after the kill: %+v", got)
	}
}

func TestCodeKernelDies(t *testing.T) {
	testenv.Needs(t, testenv.Root)
	id := newContext(t)
	runCell(t, guest.Request{Context: id, Code: "gone = 1"})
	out := runCell(t, guest.Request{Context: id, Code: "import os\nos._exit(3)"})
	if !out.end.Died || out.end.Error == nil || !strings.Contains(out.end.Error.Value, "exited with status 3") {
		t.Fatalf("dead cell: %+v", out.end)
	}
	next := runCell(t, guest.Request{Context: id, Code: "'gone' in globals()"})
	if !next.end.Restarted || next.text() != "False" || next.end.ExecutionCount != 1 {
		t.Fatalf("after the death: %+v", next)
	}
	again := runCell(t, guest.Request{Context: id, Code: "1"})
	if again.end.Restarted {
		t.Fatalf("Restarted said twice: %+v", again.end)
	}
}

func TestCodeRestartAndRemove(t *testing.T) {
	testenv.Needs(t, testenv.Root)
	id := newContext(t)
	runCell(t, guest.Request{Context: id, Code: "z = 1"})
	if err := client.RestartContext(ctxT(t, time.Minute), id); err != nil {
		t.Fatal(err)
	}
	if got := runCell(t, guest.Request{Context: id, Code: "'z' in globals()"}); got.text() != "False" || got.end.Restarted {
		t.Fatalf("after restart: %+v", got)
	}
	if err := client.RemoveContext(ctxT(t, 10*time.Second), id); err != nil {
		t.Fatal(err)
	}
	_, err := client.RunCode(ctxT(t, 10*time.Second), guest.Request{Context: id, Code: "1"}, guest.CodeOptions{})
	var ae *guest.Error
	if !errors.As(err, &ae) || ae.Code != guest.CodeNotFound {
		t.Fatalf("run in a removed context: %v", err)
	}
	list, _ := client.Contexts(ctxT(t, 10*time.Second))
	for _, cc := range list {
		if cc.ID == id {
			t.Fatalf("removed context still listed: %+v", list)
		}
	}
}

func TestCodeLanguages(t *testing.T) {
	testenv.Needs(t, testenv.Root)
	for lang, code := range map[string]string{"bash": guest.CodeUnsupported, "javascript": guest.CodeUnsupported, "cobol": guest.CodeInvalid} {
		_, err := client.RunCode(ctxT(t, 10*time.Second), guest.Request{Language: lang, Code: "1"}, guest.CodeOptions{})
		var ae *guest.Error
		if !errors.As(err, &ae) || ae.Code != code {
			t.Errorf("language %s: %v, want code %s", lang, err, code)
		}
	}
}

func TestCodeOutputLimit(t *testing.T) {
	testenv.Needs(t, testenv.Root)
	id := newContext(t)
	out := runCell(t, guest.Request{Context: id, OutputLimit: 1000, Code: "for i in range(1000): print('x' * 50)\n'end'"})
	if !out.end.Truncated || len(out.stdout) != 1000 || out.text() != "'end'" {
		t.Fatalf("truncated cell: truncated=%v stdout %d bytes, text %q", out.end.Truncated, len(out.stdout), out.text())
	}
}

func TestCodeKernelDiesBetweenCells(t *testing.T) {
	testenv.Needs(t, testenv.Root)
	id := newContext(t)
	pid, err := strconv.Atoi(runCell(t, guest.Request{Context: id, Code: "import os, threading, time\nthreading.Thread(target=lambda: (time.sleep(0.2), os._exit(1))).start()\nos.getpid()"}).text())
	if err != nil {
		t.Fatalf("the interpreter's pid: %v", err)
	}
	if left := testenv.AwaitExit(t, []int{pid}, 10*time.Second); len(left) > 0 {
		t.Fatal("the interpreter did not exit between the cells")
	}
	next := runCell(t, guest.Request{Context: id, Code: "'threading' in globals()"})
	if !next.end.Restarted || next.end.Error != nil || next.text() != "False" {
		t.Fatalf("after the interpreter died between cells: %+v", next)
	}
}

func TestCodeContextEnvAndCwd(t *testing.T) {
	testenv.Needs(t, testenv.Root)
	id := newContext(t)
	out := runCell(t, guest.Request{Context: id, Code: "import os\n(os.environ.get('ROCHE_CONTEXT_TEST'), os.getcwd())"})
	if want := "('yes', '" + dir + "')"; out.text() != want {
		t.Fatalf("env and cwd seen by the context: %s, want %s", out.text(), want)
	}
}

// startTicks is a cell that prints its interpreter's start time (clock ticks since boot).
const startTicks = "print(open('/proc/self/stat').read().rsplit(')', 1)[1].split()[19])"

// TestCodeWarmSpare: an interpreter started ahead (code_warm) goes to the first context
// started with its cwd and env, fresh (no cells run, its first cell is number 1), and not
// to one started otherwise, which gets an interpreter of its own.
func TestCodeWarmSpare(t *testing.T) {
	testenv.Needs(t, testenv.Root)
	env := map[string]string{"ROCHE_WARM_TEST": "warm"}
	before, err := client.Contexts(ctxT(t, 10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if err := client.WarmCode(ctxT(t, time.Minute), "python", dir, env); err != nil {
		t.Fatal(err)
	}
	// The spare is no context until one takes it.
	if after, err := client.Contexts(ctxT(t, 10*time.Second)); err != nil || len(after) != len(before) {
		t.Fatalf("contexts after the warm-up: %+v (%v), before: %+v", after, err, before)
	}
	other := newContext(t) // other env: its own interpreter, started after the spare
	o := runCell(t, guest.Request{Context: other, Code: startTicks})

	cc, err := client.CreateContext(ctxT(t, time.Minute), "python", dir, env)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.RemoveContext(ctxT(t, 10*time.Second), cc.ID) })
	w := runCell(t, guest.Request{Context: cc.ID, Code: "import os\nprint(os.environ['ROCHE_WARM_TEST'], os.getcwd())\n" + startTicks})
	lines := strings.Split(strings.TrimSpace(w.stdout), "\n")
	if w.end.Error != nil || len(lines) != 2 || lines[0] != "warm "+dir || w.end.ExecutionCount != 1 {
		t.Fatalf("the warmed context's first cell: %+v", w)
	}
	spareStart, _ := strconv.Atoi(lines[1])
	otherStart, _ := strconv.Atoi(strings.TrimSpace(o.stdout))
	if spareStart == 0 || otherStart == 0 || spareStart >= otherStart {
		t.Fatalf("the warmed context's interpreter started at tick %d, the other context's (started later) at %d: the spare was not taken", spareStart, otherStart)
	}
	if err := client.WarmCode(ctxT(t, time.Minute), "bash", dir, nil); err == nil || !strings.Contains(err.Error(), "not served") {
		t.Fatalf("warming bash: %v, want a refusal", err)
	}
}

// TestCodeForkContext: a context forked from A holds A's variables and goes on apart (B
// sets x = 2, A still sees 1) in a process of its own, the agent's child and outside A's
// tree: removing A leaves B running, and removing B ends its process.
func TestCodeForkContext(t *testing.T) {
	testenv.Needs(t, testenv.Root)
	a := newContext(t)
	apid := runCell(t, guest.Request{Context: a, Code: "import os, random\nx = 1\nos.getpid()"}).text()
	start := time.Now()
	cc, err := client.ForkContext(ctxT(t, time.Minute), a)
	if err != nil {
		t.Fatalf("fork: %v", err)
	}
	t.Logf("forked in %v", time.Since(start).Round(time.Microsecond))
	if cc.ID == a || cc.Language != "python" {
		t.Fatalf("forked context: %+v", cc)
	}
	b := cc.ID
	if got := runCell(t, guest.Request{Context: b, Code: "x"}); got.text() != "1" || got.end.Error != nil || got.end.Restarted {
		t.Fatalf("the fork's x: %+v", got)
	}
	runCell(t, guest.Request{Context: b, Code: "x = 2\nprint('from b')"})
	if got := runCell(t, guest.Request{Context: a, Code: "x"}); got.text() != "1" {
		t.Fatalf("A sees x = %s after B set it to 2", got.text())
	}
	bpid := runCell(t, guest.Request{Context: b, Code: "os.getpid()"}).text()
	if bpid == apid {
		t.Fatalf("the fork runs in A's process %s", apid)
	}
	if got := runCell(t, guest.Request{Context: b, Code: "x"}); got.text() != "2" {
		t.Fatalf("B's x: %s, want 2", got.text())
	}
	// A's end is not B's.
	if err := client.RemoveContext(ctxT(t, 10*time.Second), a); err != nil {
		t.Fatal(err)
	}
	if got := runCell(t, guest.Request{Context: b, Code: "x + 40"}); got.text() != "42" || got.end.Restarted {
		t.Fatalf("B after A was removed: %+v", got)
	}
	pid, _ := strconv.Atoi(bpid)
	if err := client.RemoveContext(ctxT(t, 10*time.Second), b); err != nil {
		t.Fatal(err)
	}
	if left := testenv.AwaitExit(t, []int{pid}, 10*time.Second); len(left) > 0 {
		t.Fatalf("the forked interpreter %d outlived its context", pid)
	}
	if _, err := client.ForkContext(ctxT(t, 10*time.Second), "nosuchcontext"); err == nil {
		t.Fatal("fork of no context succeeded")
	}
}
