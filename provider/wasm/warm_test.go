package wasm

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/internal/testenv"
)

// newWarmSandbox creates a sandbox through twp and waits until its warm interpreter is
// ready, so that the next exec is served by it.
func newWarmSandbox(t *testing.T, edit func(*roche.Config)) string {
	t.Helper()
	cfg := roche.DefaultConfig()
	if edit != nil {
		edit(&cfg)
	}
	info, err := twp.Create(ctxFor(t, time.Minute), cfg)
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	t.Cleanup(func() {
		if err := twp.Destroy(context.Background(), info.ID); err != nil {
			t.Errorf("Destroy %s: %v", info.ID, err)
		}
	})
	waitWarm(t, info.ID)
	return info.ID
}

// waitWarm waits until sandbox id has a warm interpreter waiting for an exec.
func waitWarm(t *testing.T, id string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		if has, ready := twp.warmOf(id); has && ready {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("sandbox %s has no warm interpreter ready after a minute", id)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// execWarm runs req through twp and checks that a warm interpreter served it.
func execWarm(t *testing.T, id string, req roche.ExecRequest) roche.ExecResult {
	t.Helper()
	if req.Timeout == 0 {
		req.Timeout = time.Minute
	}
	before := twp.WarmStats().Served
	res, err := twp.Exec(ctxFor(t, 2*time.Minute), id, req)
	if err != nil {
		t.Fatalf("warm exec %q: %v", req.Cmd, err)
	}
	if got := twp.WarmStats().Served; got != before+1 {
		t.Fatalf("exec %q was not served by the warm interpreter (served %d before, %d after)", req.Cmd, before, got)
	}
	return res
}

// introspect prints what a program can see of how it was started.
const introspect = `
import sys, os, posix, site
print(sys.argv, sys.orig_argv, repr(sys.executable), sys.flags)
print(sys.path)
print(sorted(globals()), __name__, __doc__, __package__, __spec__, __loader__, __annotations__)
print(sorted(sys.modules))
print(posix.environ, os.environb, os.getenv('FOO'))
print(os.getcwd(), os.getpid(), site.USER_BASE, site.USER_SITE, site.ENABLE_USER_SITE)
print(sys.stdin.isatty(), sys.stdout.isatty(), sys.stdout.encoding, sys.stdout.line_buffering, sys.getrecursionlimit())
print(sys.path_importer_cache.keys())
`

const scriptIntrospect = `import sys, helper
print(__file__, __cached__, __name__, type(__loader__).__name__, __loader__.name, __loader__.path, __spec__)
print(sys.argv, sys.orig_argv, sys.path[0], sorted(globals()))
helper.boom()
`

// matchCases are programs run on a warm or pre-initialised interpreter and on a fresh
// one, whose output, exit code and flags must be the same.
var matchCases = []struct {
	name    string
	cmd     []string
	env     map[string]string
	workdir string
	stdin   *string
	files   map[string]string
	cfg     func(*roche.Config)
	limit   int64
}{
	{name: "hello", cmd: []string{"python3", "-c", "print('hi')"}},
	{name: "introspect", cmd: []string{"python3", "-c", introspect, "a", "é ü", "", "--x"}},
	{name: "env and workdir", cmd: []string{"python3", "-c", introspect},
		env: map[string]string{"FOO": "bar", "EMPTY": "", "UNI": "ü=x"}, workdir: "/tmp"},
	{name: "config env and workdir", cmd: []string{"python3", "-c", introspect},
		cfg: func(c *roche.Config) { c.Env = map[string]string{"CFG": "1"}; c.Workdir = "/workspace/proj" }},
	{name: "exit code", cmd: []string{"python3", "-c", "import sys; print('out'); print('err', file=sys.stderr); sys.exit(3)"}},
	{name: "exit message", cmd: []string{"python3", "-c", "import sys; sys.exit('bye')"}},
	{name: "exit none", cmd: []string{"python3", "-c", "raise SystemExit"}},
	{name: "exit from atexit", cmd: []string{"python3", "-c", "import atexit, sys; atexit.register(sys.exit, 5); print('x')"}},
	{name: "uncaught", cmd: []string{"python3", "-c", "def f(x):\n    return 1 / x\ndef g():\n    f(0)\ng()"}},
	{name: "chained", cmd: []string{"python3", "-c", "try:\n    {}['k']\nexcept KeyError:\n    raise ValueError('bad')"}},
	{name: "syntax error", cmd: []string{"python3", "-c", "print("}},
	{name: "keyboard interrupt", cmd: []string{"python3", "-c", "raise KeyboardInterrupt"}},
	{name: "keyboard interrupt subclass", cmd: []string{"python3", "-c", "class K(KeyboardInterrupt): pass\nraise K"}},
	{name: "excepthook", cmd: []string{"python3", "-c", "import sys\nsys.excepthook = lambda t, v, tb: print('hook', t.__name__, v, tb.tb_frame.f_code.co_filename, tb.tb_lineno, tb.tb_next)\n1/0"}},
	{name: "excepthook fails", cmd: []string{"python3", "-c", "import sys\ndef h(*a):\n    raise TypeError('in hook')\nsys.excepthook = h\n1/0"}},
	{name: "last exc in atexit", cmd: []string{"python3", "-c", "import atexit, sys\natexit.register(lambda: print('last', repr(sys.last_value), sys.last_traceback.tb_frame.f_code.co_filename))\nraise OSError(2, 'gone')"}},
	{name: "finalization", cmd: []string{"python3", "-c", "import atexit\natexit.register(print, 'atexit')\nclass D:\n    def __del__(self):\n        print('del')\nd = D()\nf = open('/tmp/unclosed', 'w')\nf.write('data')\nprint('end')"}},
	{name: "warning", cmd: []string{"python3", "-c", "import warnings\nwarnings.warn('careful')\nwarnings.warn('deprecated', DeprecationWarning)"}},
	{name: "stdin", cmd: []string{"python3", "-c", "import sys; d = sys.stdin.buffer.read(); print(len(d), d[-3:])"}, stdin: ptr("line\n\x00\xffend")},
	{name: "input", cmd: []string{"python3", "-c", "print(input('? ').upper()); print(input())"}, stdin: ptr("hello\n")},
	{name: "no stdin", cmd: []string{"python3", "-c", "import sys; print(repr(sys.stdin.read()))"}},
	{name: "truncated", cmd: []string{"python3", "-c", "print('x' * 5000)"}, limit: 1000},
	{name: "script", cmd: []string{"python3", "app/main.py", "x", "y"}, files: map[string]string{
		"/workspace/app/main.py":   scriptIntrospect,
		"/workspace/app/helper.py": "def boom():\n    raise RuntimeError('in helper')\n",
	}},
	{name: "script in tmp by absolute path", cmd: []string{"python3", "/tmp/s.py"}, files: map[string]string{
		"/tmp/s.py": "import sys, os\nprint(sys.path[0], os.getcwd(), __file__)\n",
	}},
	{name: "script at the root", cmd: []string{"python3", "/s.py"}, cfg: func(c *roche.Config) { c.Writable = true },
		files: map[string]string{"/s.py": "import sys\nprint(sys.path[0], sys.argv)\n"}},
	{name: "script syntax error", cmd: []string{"python3", "bad.py"}, files: map[string]string{"/workspace/bad.py": "x = 1\ny = (\n"}},
	{name: "script encoding", cmd: []string{"python3", "latin.py"}, files: map[string]string{
		"/workspace/latin.py": "# -*- coding: latin-1 -*-\nprint('caf\xe9', len('caf\xe9'))\n",
	}},
	{name: "script exit", cmd: []string{"python3", "e.py"}, files: map[string]string{"/workspace/e.py": "import sys\nsys.exit(7)\n"}},
	// How a run ends at CPython's teardown (boot/warm.py's _arm_teardown), and when it does not.
	{name: "exit code over 255", cmd: []string{"python3", "-c", "import sys; print('x'); sys.exit(300)"}},
	{name: "exit code negative", cmd: []string{"python3", "-c", "raise SystemExit(-2)"}},
	{name: "exit code bool", cmd: []string{"python3", "-c", "raise SystemExit(True)"}},
	{name: "exit subclass", cmd: []string{"python3", "-c", "class E(SystemExit):\n    @property\n    def code(self):\n        print('code read')\n        return 4\nraise E"}},
	{name: "flush fails at exit", cmd: []string{"python3", "-c", flushFails}},
	{name: "flush fails without unraisablehook", cmd: []string{"python3", "-c", "import sys\ndel sys.unraisablehook\n" + flushFails}},
	{name: "audit hook sees the teardown", cmd: []string{"python3", "-c", "import os, sys\nsys.addaudithook(lambda e, a, w=os.write: e.startswith('cpython.') and w(1, e.encode() + b'\\n'))\nprint('end')"}},
}

// flushFails makes the flush of sys.stdout at exit fail, which CPython reports as an
// unraisable exception and answers with exit status 120.
const flushFails = `import sys
class W:
    def __repr__(self):
        return 'W'
    def write(self, s):
        return len(s)
    def flush(self):
        raise OSError('no flush')
sys.stdout = W()
print('lost')`

// TestWarmMatchesFresh runs each program on a warm interpreter and on a fresh one, in
// sandboxes set up alike, and wants the same output, exit code and flags.
func TestWarmMatchesFresh(t *testing.T) {
	testenv.Needs(t, testenv.PythonWasm)
	matchFresh(t, func(t *testing.T, cfg func(*roche.Config)) string { return newWarmSandbox(t, cfg) },
		func(t *testing.T, id string, req roche.ExecRequest) roche.ExecResult { return execWarm(t, id, req) })
}

// matchFresh runs matchCases in a sandbox made by create, each through run, and in one
// of tp's, which starts every interpreter from scratch.
func matchFresh(t *testing.T, create func(*testing.T, func(*roche.Config)) string,
	run func(*testing.T, string, roche.ExecRequest) roche.ExecResult) {
	for _, c := range matchCases {
		t.Run(c.name, func(t *testing.T) {
			warmID := create(t, c.cfg)
			freshID := newSandbox(t, c.cfg)
			for guest, content := range c.files {
				src := filepath.Join(t.TempDir(), filepath.Base(guest))
				if err := os.WriteFile(src, []byte(content), 0o644); err != nil {
					t.Fatal(err)
				}
				for _, id := range []string{warmID, freshID} {
					if err := tp.CopyTo(ctxFor(t, time.Minute), id, src, guest); err != nil {
						t.Fatal(err)
					}
				}
			}
			req := func() roche.ExecRequest {
				r := roche.ExecRequest{Cmd: c.cmd, Env: c.env, Workdir: c.workdir, OutputLimit: c.limit}
				if c.stdin != nil {
					r.Stdin = strings.NewReader(*c.stdin)
				}
				return r
			}
			warm := run(t, warmID, req())
			fresh := execIn(t, freshID, req())
			warm.Duration, fresh.Duration = 0, 0
			if warm != fresh {
				t.Fatalf("this run and a fresh one differ:\nthis:  %+v\nfresh: %+v", warm, fresh)
			}
			if c.name == "finalization" {
				// The file left open was flushed as the interpreter finalised.
				if got := pyOK(t, warmID, "print(open('/tmp/unclosed').read())"); got != "data" {
					t.Fatalf("unclosed file after the exec: %q", got)
				}
			}
		})
	}
}

func ptr(s string) *string { return &s }

// TestWarmKnownDifference pins down the one thing a program can tell: Roche's frames
// sit below its module frame.
func TestWarmKnownDifference(t *testing.T) {
	testenv.Needs(t, testenv.PythonWasm)
	id := newWarmSandbox(t, nil)
	code := "import sys; f = sys._getframe(); print(f.f_back is None, f.f_back.f_back is None if f.f_back else '-')"
	if got := execWarm(t, id, roche.ExecRequest{Cmd: []string{"python3", "-c", code}}); got.Stdout != "False False\n" {
		t.Fatalf("warm: %+v", got)
	}
	if got := pyOK(t, id, code); got != "True -" {
		t.Fatalf("fresh: %q", got)
	}
}

// TestWarmTeardownDifference pins down what a program can tell of a run ending at
// CPython's teardown (boot/warm.py's _arm_teardown): a finaliser that only CPython's own
// state still runs once every module is cleared (here of an object held by a codec
// search function) runs in a fresh interpreter and not in a warm or pre-initialised
// one; and an audit hook of the program's sees the loader add its own as the program
// ends. Such a hook still sees the teardown begin, as in a fresh interpreter.
func TestWarmTeardownDifference(t *testing.T) {
	testenv.Needs(t, testenv.PythonWasm)
	held := "import codecs, os\nclass D:\n    def __del__(self, w=os.write):\n        w(1, b'del\\n')\n" +
		"d = D()\ncodecs.register(lambda name, d=d: None)\ndel d\nprint('end')"
	hook := "import os, sys\nsys.addaudithook(lambda e, a, w=os.write: e in ('sys.addaudithook', 'cpython.PyInterpreterState_Clear') and w(1, e.encode() + b'\\n'))\nprint('end')"
	warm := newWarmSandbox(t, nil)
	pre := newPreSandbox(t, tpre, nil)
	for _, c := range []struct{ code, this, fresh string }{
		{held, "end\n", "end\ndel\n"},
		// os.write is unbuffered; print flushes at exit, after the hook is added.
		{hook, "sys.addaudithook\nend\ncpython.PyInterpreterState_Clear\n", "end\ncpython.PyInterpreterState_Clear\n"},
	} {
		req := roche.ExecRequest{Cmd: []string{"python3", "-c", c.code}}
		w := execWarm(t, warm, req)
		waitWarm(t, warm)
		p := execPre(t, tpre, pre, req)
		f := execIn(t, pre, req)
		for _, res := range []struct {
			name string
			got  roche.ExecResult
			want string
		}{{"warm", w, c.this}, {"pre-initialised", p, c.this}, {"fresh", f, c.fresh}} {
			if res.got.ExitCode != 0 || res.got.Stdout != res.want || res.got.Stderr != "" {
				t.Errorf("%s run of %q: %+v, want stdout %q", res.name, c.code, res.got, res.want)
			}
		}
	}
}

// TestWarmNoLeaks checks that nothing of one exec, or of one sandbox, reaches another:
// each exec gets an interpreter of its own, started anew.
func TestWarmNoLeaks(t *testing.T) {
	testenv.Needs(t, testenv.PythonWasm)
	a := newWarmSandbox(t, nil)
	b := newWarmSandbox(t, nil)
	dirty := `
import builtins, os, sys, random
builtins.LEAK = 1
os.environ['LEAK'] = '1'
sys.path.append('/leak')
sys.modules['leak'] = sys
os.chdir('/tmp')
print(hash('x'), os.urandom(8).hex())
`
	check := `
import builtins, os, sys
print(hasattr(builtins, 'LEAK'), 'LEAK' in os.environ, '/leak' in sys.path, 'leak' in sys.modules, os.getcwd())
print(hash('x'), os.urandom(8).hex())
`
	first := execWarm(t, a, roche.ExecRequest{Cmd: []string{"python3", "-c", dirty}})
	waitWarm(t, a) // the interpreter started after the exec
	second := execWarm(t, a, roche.ExecRequest{Cmd: []string{"python3", "-c", check}})
	other := execWarm(t, b, roche.ExecRequest{Cmd: []string{"python3", "-c", check}})
	for _, res := range []roche.ExecResult{second, other} {
		lines := strings.Split(res.Stdout, "\n")
		if res.ExitCode != 0 || lines[0] != "False False False False /workspace" {
			t.Fatalf("state leaked: %+v", res)
		}
		// Hash seeds and random state are each interpreter's own.
		if lines[1] == strings.TrimSpace(first.Stdout) {
			t.Fatalf("same hash seed and random bytes as an earlier interpreter: %q", lines[1])
		}
	}
}

// TestWarmLimits checks timeouts, the memory cap, caller cancellation and destroy on
// warm interpreters.
func TestWarmLimits(t *testing.T) {
	testenv.Needs(t, testenv.PythonWasm)
	t.Run("timeout", func(t *testing.T) {
		pr, pw := io.Pipe() // a stdin that never delivers
		defer pw.Close()
		for _, code := range []string{"while True: pass", "import time; time.sleep(1000)", "import sys; sys.stdin.read()"} {
			id := newWarmSandbox(t, nil)
			start := time.Now()
			res := execWarm(t, id, roche.ExecRequest{Cmd: []string{"python3", "-c", "print('started', flush=True)\n" + code}, Timeout: time.Second, Stdin: pr})
			if !res.TimedOut || res.ExitCode != ExitCodeKilled || res.Stdout != "started\n" || time.Since(start) > 10*time.Second {
				t.Fatalf("%s with a 1 s timeout: %+v after %v", code, res, time.Since(start))
			}
		}
	})
	t.Run("memory", func(t *testing.T) {
		id := newWarmSandbox(t, func(c *roche.Config) { c.Memory = "64m" })
		res := execWarm(t, id, roche.ExecRequest{Cmd: []string{"python3", "-c", "b = bytearray(256 << 20); print(len(b))"}})
		if res.ExitCode == 0 || !res.OOMKilled || !strings.Contains(res.Stderr, "MemoryError") {
			t.Fatalf("256 MiB under a 64m limit: %+v", res)
		}
		waitWarm(t, id)
		res = execWarm(t, id, roche.ExecRequest{Cmd: []string{"python3", "-c", "b = bytearray(32 << 20); print(len(b))"}})
		if res.ExitCode != 0 || res.OOMKilled || res.Stdout != "33554432\n" {
			t.Fatalf("32 MiB under 64m: %+v", res)
		}
	})
	t.Run("scratch quota counts files added after the start", func(t *testing.T) {
		id := newWarmSandbox(t, nil)
		big := filepath.Join(t.TempDir(), "big")
		if err := os.WriteFile(big, make([]byte, 60<<20), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := tp.CopyTo(ctxFor(t, time.Minute), id, big, "/tmp/big"); err != nil {
			t.Fatal(err)
		}
		res := execWarm(t, id, roche.ExecRequest{Cmd: []string{"python3", "-c", `
try:
    open('/tmp/more', 'wb').write(bytes(8 << 20))
    print('wrote')
except OSError as e:
    print('refused', e.errno)
`}})
		if res.Stdout == "wrote\n" {
			t.Fatalf("8 MiB more on top of 60 MiB in /tmp was accepted: %+v", res)
		}
	})
	t.Run("caller gives up", func(t *testing.T) {
		id := newWarmSandbox(t, nil)
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		defer cancel()
		_, err := twp.Exec(ctx, id, roche.ExecRequest{Cmd: []string{"python3", "-c", "while True: pass"}, Timeout: time.Minute})
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("caller's context expired: %v", err)
		}
	})
	t.Run("destroy", func(t *testing.T) {
		info, err := twp.Create(ctxFor(t, time.Minute), roche.DefaultConfig())
		if err != nil {
			t.Fatal(err)
		}
		waitWarm(t, info.ID)
		_, err = twp.Exec(ctxFor(t, time.Minute), info.ID, roche.ExecRequest{
			Cmd: []string{"python3", "-c", "print('up', flush=True)\nwhile True: pass"}, Timeout: time.Minute,
			Stdout: writerFunc(func(b []byte) {
				if strings.Contains(string(b), "up") {
					_ = twp.Destroy(context.Background(), info.ID)
				}
			}),
		})
		if !errors.Is(err, roche.ErrNotFound) || !strings.Contains(err.Error(), "destroyed") {
			t.Fatalf("warm exec whose sandbox was destroyed: %v", err)
		}
		time.Sleep(2 * warmDelay)
		if has, _ := twp.warmOf(info.ID); has {
			t.Fatal("a destroyed sandbox got a new warm interpreter")
		}
	})
}

// TestWarmNotUsed checks that execs a warm interpreter could not serve exactly run fresh
// and leave it waiting.
func TestWarmNotUsed(t *testing.T) {
	testenv.Needs(t, testenv.PythonWasm)
	id := newWarmSandbox(t, nil)
	for name, content := range map[string]string{
		"s.pyc":    "print('compiled')\x00",
		"z.py":     "print('zip?')\nPK\x05\x06",
		"plain.py": "import sys; print(sys.path[0])",
	} {
		src := filepath.Join(t.TempDir(), name)
		if err := os.WriteFile(src, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := tp.CopyTo(ctxFor(t, time.Minute), id, src, "/workspace/"+name); err != nil {
			t.Fatal(err)
		}
	}
	for _, req := range []roche.ExecRequest{
		{Cmd: []string{"python", "-c", "import sys; print(sys.orig_argv[0])"}},
		{Cmd: []string{"/usr/bin/python3", "-c", "import sys; print(sys.executable)"}},
		{Cmd: []string{"python3", "-u", "-c", "print(1)"}},
		{Cmd: []string{"python3", "-c", "import sys; print(sys.path[1])"}, Env: map[string]string{"PYTHONPATH": "/tmp"}},
		{Cmd: []string{"python3", "-c", "import site; print(site.USER_BASE)"}, Env: map[string]string{"HOME": "/workspace"}},
		{Cmd: []string{"python3", "-c", "print('\xff')"}},
		{Cmd: []string{"python3", "s.pyc"}},
		{Cmd: []string{"python3", "z.py"}},
		{Cmd: []string{"python3", "missing.py"}},
		{Cmd: []string{"python3", "/workspace//plain.py"}},
		{Cmd: []string{"python3", "-c"}},
	} {
		before := twp.WarmStats().Served
		if _, err := twp.Exec(ctxFor(t, time.Minute), id, req); err != nil {
			t.Fatalf("%q: %v", req.Cmd, err)
		}
		if twp.WarmStats().Served != before {
			t.Fatalf("%q was served warm", req.Cmd)
		}
		if has, _ := twp.warmOf(id); !has {
			t.Fatalf("%q took the warm interpreter", req.Cmd)
		}
	}
}

// TestWarmMountRetargeted: a warm interpreter resolved the mounts when it started; if a
// mount's host path now leads elsewhere, the exec runs fresh on what it leads to now.
func TestWarmMountRetargeted(t *testing.T) {
	testenv.Needs(t, testenv.PythonWasm)
	base := t.TempDir()
	for _, d := range []string{"one", "two"} {
		if err := os.MkdirAll(filepath.Join(base, d), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(base, d, "name"), []byte(d), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	link := filepath.Join(base, "current")
	if err := os.Symlink("one", link); err != nil {
		t.Fatal(err)
	}
	id := newWarmSandbox(t, func(c *roche.Config) { c.Mounts = []roche.Mount{{Source: link, Target: "/mnt/data"}} })
	if err := os.Remove(link); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("two", link); err != nil {
		t.Fatal(err)
	}
	before := twp.WarmStats().Served
	res, err := twp.Exec(ctxFor(t, time.Minute), id, roche.ExecRequest{Cmd: []string{"python3", "-c", "print(open('/mnt/data/name').read())"}})
	if err != nil || res.Stdout != "two\n" {
		t.Fatalf("after retargeting the mount: %+v %v", res, err)
	}
	if twp.WarmStats().Served != before {
		t.Fatal("served by an interpreter holding the old mount")
	}
}

// TestWarmLifecycle: an interpreter is started at create and again after each exec, is
// stopped at the sandbox's expiry and at destroy, and Close stops them all.
func TestWarmLifecycle(t *testing.T) {
	testenv.Needs(t, testenv.PythonWasm)
	p, err := New(WithStateDir(t.TempDir()), WithWarmStart())
	if err != nil {
		t.Fatal(err)
	}
	cfg := roche.DefaultConfig()
	cfg.TimeoutSecs = 2
	short, err := p.Create(ctxFor(t, time.Minute), cfg)
	if err != nil {
		t.Fatal(err)
	}
	long, err := p.Create(ctxFor(t, time.Minute), roche.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	gone, err := p.Create(ctxFor(t, time.Minute), roche.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	if st := p.WarmStats(); st.Ready+st.Starting != 3 {
		t.Fatalf("after three creates: %+v", st)
	}
	if err := p.Destroy(ctxFor(t, time.Minute), gone.ID); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		st := p.WarmStats()
		if st.Ready+st.Starting == 1 {
			break // the short-lived sandbox's interpreter stopped at its expiry
		}
		if time.Now().After(deadline) {
			t.Fatalf("warm interpreters after an expiry and a destroy: %+v", st)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if _, err := p.Exec(ctxFor(t, time.Minute), long.ID, roche.ExecRequest{Cmd: []string{"python3", "-c", "pass"}}); err != nil {
		t.Fatal(err)
	}
	deadline = time.Now().Add(30 * time.Second)
	for p.WarmStats().Ready != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("no interpreter started after the exec: %+v", p.WarmStats())
		}
		time.Sleep(10 * time.Millisecond)
	}
	// Close stops the waiting interpreter; goleak in TestMain finds any goroutine left.
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if st := p.WarmStats(); st.Ready+st.Starting != 0 {
		t.Fatalf("after Close: %+v", st)
	}
	_ = short
}

func TestWarmRequestEncoding(t *testing.T) {
	prog := program{argv: []string{"python3", "-c", "print(1)", "a"}, workdir: "/tmp", userEnv: map[string]string{"B": "2", "A": "1=x"}}
	got := string(warmRequest(prog))
	payload := "c\x00/tmp\x004\x00python3\x00-c\x00print(1)\x00a\x00A=1=x\x00B=2"
	if want := fmt.Sprintf("%010d", len(payload)) + payload; got != want {
		t.Fatalf("request %q, want %q", got, want)
	}
}
