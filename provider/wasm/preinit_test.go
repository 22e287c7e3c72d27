package wasm

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/internal/testenv"
)

// newPreSandbox creates a sandbox through p, destroyed at the end.
func newPreSandbox(t *testing.T, p *Provider, edit func(*roche.Config)) string {
	t.Helper()
	cfg := roche.DefaultConfig()
	if edit != nil {
		edit(&cfg)
	}
	info, err := p.Create(ctxFor(t, time.Minute), cfg)
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	t.Cleanup(func() {
		if err := p.Destroy(context.Background(), info.ID); err != nil {
			t.Errorf("Destroy %s: %v", info.ID, err)
		}
	})
	return info.ID
}

// execPre runs req through p and checks that it ran on a pre-initialised interpreter.
func execPre(t *testing.T, p *Provider, id string, req roche.ExecRequest) roche.ExecResult {
	t.Helper()
	if req.Timeout == 0 {
		req.Timeout = time.Minute
	}
	before := p.preinitRuns.Load()
	res, err := p.Exec(ctxFor(t, 2*time.Minute), id, req)
	if err != nil {
		t.Fatalf("exec %q: %v", req.Cmd, err)
	}
	if got := p.preinitRuns.Load(); got != before+1 {
		t.Fatalf("exec %q did not run on a pre-initialised interpreter (%d before, %d after)", req.Cmd, before, got)
	}
	return res
}

// TestPreinitMatchesFresh runs each program on an interpreter entered from a copy made
// after start-up (as a one-shot roche run does) and on one started from scratch, in
// sandboxes set up alike, and wants the same output, exit code and flags.
func TestPreinitMatchesFresh(t *testing.T) {
	testenv.Needs(t, testenv.PythonWasm)
	matchFresh(t, func(t *testing.T, cfg func(*roche.Config)) string { return newPreSandbox(t, tpre, cfg) },
		func(t *testing.T, id string, req roche.ExecRequest) roche.ExecResult {
			return execPre(t, tpre, id, req)
		})
}

// TestPreinitFreshState: every run from the copy is a new instance, so nothing one run
// changes in the interpreter (variables, modules, builtins, environment, working
// directory) or in another sandbox's files reaches the next; random is seeded anew. The
// string-hash secret is the copy's, the same in every run from it (documented).
func TestPreinitFreshState(t *testing.T) {
	testenv.Needs(t, testenv.PythonWasm)
	a := newPreSandbox(t, tpre, nil)
	b := newPreSandbox(t, tpre, nil)
	dirty := `
import builtins, os, sys, random, json
builtins.LEAK = 1
json.LEAK = 1
LEAK = 1
os.environ['LEAK'] = '1'
sys.path.append('/leak')
sys.modules['leak'] = sys
os.chdir('/tmp')
open('/tmp/leak', 'w').write('x')
print(random.random(), hash('x'), os.urandom(8).hex())
`
	check := `
import builtins, os, sys, random, json
print(hasattr(builtins, 'LEAK'), hasattr(json, 'LEAK'), 'LEAK' in globals(), 'LEAK' in os.environ, '/leak' in sys.path, 'leak' in sys.modules, os.getcwd())
print(random.random(), hash('x'), os.urandom(8).hex())
`
	first := execPre(t, tpre, a, roche.ExecRequest{Cmd: []string{"python3", "-c", dirty}})
	if first.ExitCode != 0 {
		t.Fatalf("dirty: %+v", first)
	}
	firstRand := strings.Fields(first.Stdout)
	for _, id := range []string{a, b} {
		res := execPre(t, tpre, id, roche.ExecRequest{Cmd: []string{"python3", "-c", check}})
		lines := strings.Split(res.Stdout, "\n")
		if res.ExitCode != 0 || lines[0] != "False False False False False False /workspace" {
			t.Fatalf("state leaked into the next run: %+v", res)
		}
		got := strings.Fields(lines[1])
		if len(got) != 3 || len(firstRand) != 3 {
			t.Fatalf("unexpected output: %q, %q", first.Stdout, lines[1])
		}
		if got[0] == firstRand[0] || got[2] == firstRand[2] {
			t.Fatalf("random state repeated from the earlier run: %q and %q", firstRand, got)
		}
		if got[1] != firstRand[1] {
			t.Fatalf("hash('x') differs between runs from one copy (%s, %s): the documentation says they share the secret", firstRand[1], got[1])
		}
	}
	// Files stay the sandbox's: there in a's /tmp, not in b's.
	if got := pyOK(t, b, "import os; print(os.path.exists('/tmp/leak'))"); got != "False" {
		t.Fatalf("another sandbox's file is visible: %s", got)
	}
	if got := pyOK(t, a, "print(open('/tmp/leak').read())"); got != "x" {
		t.Fatalf("the sandbox's own file: %q", got)
	}
	// And a fresh interpreter's secret is its own: the copy's is not everyone's.
	if got := pyOK(t, a, "print(hash('x'))"); got == firstRand[1] {
		t.Fatalf("a fresh interpreter has the copy's hash secret %s", got)
	}
}

// TestPreinitKnownDifference pins down what a program can tell: two frames sit below
// its module frame (warm.py's _serve and _entry), so recursion runs out two calls
// sooner; a fresh interpreter has none.
func TestPreinitKnownDifference(t *testing.T) {
	testenv.Needs(t, testenv.PythonWasm)
	id := newPreSandbox(t, tpre, nil)
	code := "import sys\nf, n = sys._getframe(), 0\nwhile f.f_back:\n    f, n = f.f_back, n + 1\nprint(n)"
	if got := execPre(t, tpre, id, roche.ExecRequest{Cmd: []string{"python3", "-c", code}}); got.Stdout != "2\n" {
		t.Fatalf("pre-initialised: %+v", got)
	}
	if got := pyOK(t, id, code); got != "0" {
		t.Fatalf("fresh: %q", got)
	}
}

// TestPreinitCollection: start-up's objects are frozen in the copy (warm.py), so that
// neither the program's collections nor finalisation's walk them. The program's own
// objects are still collected, and at exit finalised with their files flushed: those
// in __main__ and those it hung on start-up's modules (cleared at exit as every
// module is), though in another order than a fresh interpreter's. What is not
// finalised is an object hung only on one of start-up's classes or functions, which
// finalisation leaves uncollected; a fresh interpreter's last collection frees it.
func TestPreinitCollection(t *testing.T) {
	testenv.Needs(t, testenv.PythonWasm)
	id := newPreSandbox(t, tpre, nil)
	code := `import gc, os, sys, codecs
class C:
    def __init__(self, n):
        self.n, self.me = n, self
    def __del__(self, write=os.write):
        write(1, b'del %d\n' % self.n)
C(1)
print('collected', gc.collect() > 0, flush=True)
a = C(2)
os.kept = C(3)
sys.kept = C(4)
gc.kept = C(5)
codecs.kept = open('/tmp/held', 'w')
codecs.kept.write('data')
if len(sys.argv) > 1:
    codecs.StreamReader.kept = C(6)
print('end', flush=True)
`
	lines := func(res roche.ExecResult) []string {
		t.Helper()
		if res.ExitCode != 0 || res.Stderr != "" {
			t.Fatalf("%+v", res)
		}
		l := strings.Split(strings.TrimSpace(res.Stdout), "\n")
		slices.Sort(l)
		return l
	}
	held := func() string { return pyOK(t, id, "print(open('/tmp/held').read())") }
	pre := lines(execPre(t, tpre, id, roche.ExecRequest{Cmd: []string{"python3", "-c", code}}))
	if got := held(); got != "data" {
		t.Fatalf("a file hung on a start-up module was not flushed at exit: %q", got)
	}
	fresh := lines(py(t, id, code))
	want := []string{"collected True", "del 1", "del 2", "del 3", "del 4", "del 5", "end"}
	if !slices.Equal(pre, want) || !slices.Equal(fresh, want) {
		t.Fatalf("pre-initialised %q, fresh %q, want both %q (in any order)", pre, fresh, want)
	}
	// The known difference: C(6), hung on a start-up class.
	pre = lines(execPre(t, tpre, id, roche.ExecRequest{Cmd: []string{"python3", "-c", code, "class"}}))
	fresh = lines(py(t, id, code, "class"))
	if slices.Contains(pre, "del 6") || !slices.Contains(fresh, "del 6") {
		t.Fatalf("an object hung on a start-up class: pre-initialised %q, fresh %q", pre, fresh)
	}
}

// TestPreinitPlanted: the copy of an interpreter is kept in the state directory so that
// the next process need not make it; it is memory that runs as the user's Python, so one
// written by a second local user (a file of theirs, a file of ours they could write, a
// link to a file elsewhere) must not be used: the provider makes a new copy, and the run
// is correct. The same altered copy written by this user, 0600, is used, which shows the
// test would see a planted one get through: its entry is made wrong, so a run on it
// traps instead of printing.
func TestPreinitPlanted(t *testing.T) {
	testenv.Needs(t, testenv.Root, testenv.PythonWasm)
	state := testenv.ReachableStateDir(t, "", "roche-wasm-plant-")
	p, err := New(WithStateDir(state))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	id := newPreSandbox(t, p, nil)
	hello := roche.ExecRequest{Cmd: []string{"python3", "-c", "print('hello')"}}
	if res := execPre(t, p, id, hello); res.ExitCode != 0 || res.Stdout != "hello\n" {
		t.Fatalf("first run: %+v", res)
	}
	files, _ := filepath.Glob(filepath.Join(state, "python-preinit-*.bin"))
	if len(files) != 1 {
		t.Fatalf("want one kept copy in %s, have %q", state, files)
	}
	file := files[0]
	if fi, err := os.Lstat(file); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("the kept copy: %v %v, want 0600", fi.Mode(), err)
	}
	good, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	bad := wrongEntry(t, good)
	// forget makes p read the file again, as a new process would.
	forget := func() {
		p.preinitMu.Lock()
		clear(p.preinits)
		p.preinitMu.Unlock()
	}

	for _, plant := range testenv.Plants(t, state, file, bad, "rochepre") {
		t.Run(plant.Name, func(t *testing.T) {
			plant.Do(t)
			forget()
			res := execPre(t, p, id, hello)
			if res.ExitCode != 0 || res.Stdout != "hello\n" {
				t.Fatalf("a run after the copy was planted: %+v", res)
			}
			// Replaced by a new copy of this user's, 0600 (the directory's mode is
			// set back when the case ends, so ReadPrivate would refuse it here).
			fi, err := os.Lstat(file)
			b, _ := os.ReadFile(file)
			if err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm() != 0o600 || fi.Sys().(*syscall.Stat_t).Uid != uint32(os.Geteuid()) || bytes.Equal(b, bad) {
				t.Fatalf("the planted copy was not replaced by a new, private one (%v)", err)
			}
		})
	}
	t.Run("ours, private: used", func(t *testing.T) {
		testenv.PlantOwn(t, file, bad)
		forget()
		res := execPre(t, p, id, hello)
		if res.ExitCode == 0 || res.Stdout == "hello\n" {
			t.Fatalf("the altered copy, private to this user, was not used, so the cases above prove nothing: %+v", res)
		}
	})
}

// wrongEntry returns the kept copy b with its entry's table index made one no
// Python callable has.
func wrongEntry(t *testing.T, b []byte) []byte {
	t.Helper()
	rest := b[len(preinitMagic):]
	n := binary.LittleEndian.Uint32(rest)
	var head map[string]any
	if err := json.Unmarshal(rest[4:4+n], &head); err != nil {
		t.Fatal(err)
	}
	head["tp_call"] = 0
	nh, _ := json.Marshal(head)
	out := append([]byte(preinitMagic), binary.LittleEndian.AppendUint32(nil, uint32(len(nh)))...)
	out = append(out, nh...)
	return append(out, rest[4+n:]...)
}

// TestPreinitTempSwept: the directories a process ending while it made a copy left in
// the state directory are removed once old, not while another may be using them.
func TestPreinitTempSwept(t *testing.T) {
	old := filepath.Join(tp.stateDir, preinitTempPrefix+"test-old")
	young := filepath.Join(tp.stateDir, preinitTempPrefix+"test-young")
	for _, d := range []string{old, young} {
		if err := os.MkdirAll(filepath.Join(d, "0"), 0o700); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(d) })
	}
	past := time.Now().Add(-2 * orphanAge)
	if err := os.Chtimes(old, past, past); err != nil {
		t.Fatal(err)
	}
	tp.sweepLeftovers(time.Now())
	if _, err := os.Stat(old); !os.IsNotExist(err) {
		t.Fatalf("old %s not swept: %v", old, err)
	}
	if _, err := os.Stat(young); err != nil {
		t.Fatalf("young %s swept: %v", young, err)
	}
}
