package wasm

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/internal/guest/codectx"
	"github.com/roche-sandbox/roche/internal/testenv"
)

// TestWarmCode: the instance WarmCode starts goes to the sandbox's default context at
// its first cell, which runs fresh in it (count 1, nothing defined); a context started
// with other env gets its own and leaves the spare; destroying the sandbox ends a spare
// nobody took. (The conformance suite checks the hand-over by pids, which python.wasm
// does not have; here it is checked by identity.)
func TestWarmCode(t *testing.T) {
	testenv.Needs(t, testenv.PythonWasm)
	id := newSandbox(t, nil)
	spare := warmed(t, id)

	other, err := tp.CreateContext(ctxFor(t, time.Minute), id, roche.ContextOptions{Env: map[string]string{"OTHER": "1"}})
	if err != nil {
		t.Fatal(err)
	}
	if k := codeSet(t, id).Kernel(other.ID); k == nil || k == spare {
		t.Fatal("a context started with other env took the spare")
	}

	ex, err := tp.RunCode(ctxFor(t, time.Minute), id, roche.CodeRequest{Code: "'x' in globals()"})
	if err != nil || ex.Error != nil || ex.Text() != "False" || ex.ExecutionCount != 1 {
		t.Fatalf("first cell: %+v %v", ex, err)
	}
	if k := codeSet(t, id).Kernel(ex.Context); k == nil || k != spare {
		t.Fatal("the default context did not take the spare")
	}

	// A spare nobody takes ends with its sandbox.
	id2 := newSandbox(t, nil)
	spare2 := warmed(t, id2)
	if err := tp.Destroy(context.Background(), id2); err != nil {
		t.Fatal(err)
	}
	select {
	case <-spare2.Ended():
	case <-time.After(10 * time.Second):
		t.Fatal("the spare instance outlived its sandbox")
	}
	tp.codeMu.Lock()
	_, kept := tp.codeSets[id2]
	tp.codeMu.Unlock()
	if kept {
		t.Fatal("the destroyed sandbox's spare is still listed")
	}
	if err := tp.WarmCode(ctxFor(t, time.Minute), id, "bash"); err == nil || !strings.Contains(err.Error(), "bash") {
		t.Fatalf("warming bash: %v", err)
	}
}

// warmed warms sandbox id's python and returns the spare instance it keeps.
func warmed(t *testing.T, id string) *codectx.Kernel {
	t.Helper()
	if err := tp.WarmCode(ctxFor(t, time.Minute), id, "python"); err != nil {
		t.Fatal(err)
	}
	spare := codeSet(t, id).Spare()
	if spare == nil {
		t.Fatal("no spare instance after WarmCode")
	}
	return spare
}

// codeSet returns sandbox id's code contexts.
func codeSet(t *testing.T, id string) *codectx.Set {
	t.Helper()
	tp.codeMu.Lock()
	defer tp.codeMu.Unlock()
	s := tp.codeSets[id]
	if s == nil {
		t.Fatalf("no code contexts for sandbox %s", id)
	}
	return s
}

// TestCodePreinit: a provider with pre-initialised interpreters (tpre) starts each code
// context's kernel from a copy made with the kernel's options, a new instance each time:
// two contexts share no variables and draw different random numbers, and what a cell
// can see of how the interpreter started (argv, its streams' buffering, __main__, the
// modules imported, of which the copy has the kernel's own) is what a kernel started
// from scratch (tp) shows. A context restarted after a timeout
// starts from the copy again.
func TestCodePreinit(t *testing.T) {
	testenv.Needs(t, testenv.PythonWasm)
	const probe = `import sys, os
(sys.argv, sys.orig_argv[:3], sys.orig_argv[-1], __name__, os.getcwd(),
 type(sys.__stdout__.buffer).__name__, sys.__stdout__.write_through, sys.__stderr__.line_buffering,
 sorted(k for k in globals() if not k.startswith('_')), os.environ.get('CTX'), 'PYTHONPATH' in os.environ,
 sorted(sys.modules))`
	fresh := runCell(t, tp, newSandbox(t, nil), roche.CodeRequest{Code: probe, Env: map[string]string{"CTX": "a"}})

	id := newPreSandbox(t, tpre, nil)
	before := tpre.preinitRuns.Load()
	var ctxs []string
	for _, env := range []string{"a", "b"} {
		cc, err := tpre.CreateContext(ctxFor(t, time.Minute), id, roche.ContextOptions{Env: map[string]string{"CTX": env}})
		if err != nil {
			t.Fatal(err)
		}
		ctxs = append(ctxs, cc.ID)
	}
	if got := tpre.preinitRuns.Load(); got != before+2 {
		t.Fatalf("two contexts started %d interpreters from the copy, want 2", got-before)
	}
	pre := runCell(t, tpre, id, roche.CodeRequest{Code: probe, Context: ctxs[0]})
	if fresh.Error != nil || pre.Error != nil {
		t.Fatalf("the probe failed: %+v %+v", fresh.Error, pre.Error)
	}
	if pre.Text() != fresh.Text() || !strings.Contains(pre.Text(), "(['-c', '--stdio'], ['python3', '-u', '-c'], '--stdio', '__main__'") {
		t.Fatalf("a kernel from the copy sees\n%s\nfrom scratch\n%s", pre.Text(), fresh.Text())
	}

	const draw = "import random\nrandom.random()"
	a := runCell(t, tpre, id, roche.CodeRequest{Code: "secret = 42\n" + draw, Context: ctxs[0]})
	b := runCell(t, tpre, id, roche.CodeRequest{Code: draw, Context: ctxs[1]})
	if a.Text() == "" || a.Text() == b.Text() {
		t.Fatalf("two contexts from the copy drew %q and %q", a.Text(), b.Text())
	}
	if seen := runCell(t, tpre, id, roche.CodeRequest{Code: "'secret' in globals(), os.environ.get('CTX')", Context: ctxs[1]}); seen.Error == nil ||
		seen.Error.Name != "NameError" {
		t.Fatalf("the second context sees the first's names or imports: %+v", seen)
	}
	if seen := runCell(t, tpre, id, roche.CodeRequest{Code: "'secret' in globals(), __import__('os').environ.get('CTX')", Context: ctxs[1]}); seen.Text() != "(False, 'b')" {
		t.Fatalf("the second context: %q, want (False, 'b')", seen.Text())
	}

	// A timeout stops the instance; the next cell runs in a new one, from the copy.
	ex := runCell(t, tpre, id, roche.CodeRequest{Code: "while True:\n    pass", Context: ctxs[0], Timeout: 2 * time.Second})
	if !ex.TimedOut {
		t.Fatalf("an endless loop at a 2 s timeout: %+v", ex)
	}
	mid := tpre.preinitRuns.Load()
	after := runCell(t, tpre, id, roche.CodeRequest{Code: "'secret' in globals(), __import__('os').environ.get('CTX')", Context: ctxs[0]})
	if !after.Restarted || after.Text() != "(False, 'a')" || tpre.preinitRuns.Load() != mid+1 {
		t.Fatalf("after the timeout: restarted %v, text %q, %d from the copy", after.Restarted, after.Text(), tpre.preinitRuns.Load()-mid)
	}
}

// runCell runs req in sandbox id through p.
func runCell(t *testing.T, p *Provider, id string, req roche.CodeRequest) roche.Execution {
	t.Helper()
	ex, err := p.RunCode(ctxFor(t, time.Minute), id, req)
	if err != nil {
		t.Fatalf("RunCode %q: %v", req.Code, err)
	}
	return ex
}
