package wasm

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/roche-sandbox/roche/internal/testenv"

	"github.com/roche-sandbox/roche"
)

// tp is shared by every test, so that python.wasm is compiled once per test binary.
var tp *Provider

// twp has warm start on and shares tp's state directory, so that the same sandbox can be
// exec'd in on a warm interpreter (twp) and on a fresh one (tp). tp starts every
// interpreter from scratch (WithoutPreinit); twp and tpre start theirs from a
// pre-initialised copy (preinit.go), twp ahead of the exec, tpre for it (as a one-shot
// roche run does).
var twp, tpre *Provider

func TestMain(m *testing.M) {
	os.Exit(runTests(m))
}

func runTests(m *testing.M) int {
	stateDir, err := os.MkdirTemp("", "roche-wasm-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(stateDir)
	tp, err = New(WithStateDir(stateDir), WithoutPreinit())
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	// These tests run the real python.wasm: its absence is a failure with the fix, not a
	// skip. The fast tier has none (nor fetches it): the tests that run it skip.
	if !testenv.Fast() {
		start := time.Now()
		if err := tp.Prepare(context.Background()); err != nil {
			fmt.Fprintf(os.Stderr, "wasm provider tests need python.wasm: %v\n", err)
			return 1
		}
		fmt.Fprintf(os.Stderr, "python.wasm ready in %v\n", time.Since(start).Round(time.Millisecond))
	}
	twp, err = New(WithStateDir(stateDir), WithWarmStart())
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	tpre, err = New(WithStateDir(stateDir))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	code := m.Run()
	for _, p := range []*Provider{tp, twp, tpre} {
		if err := p.Close(); err != nil {
			fmt.Fprintln(os.Stderr, "closing the provider:", err)
			code = 1
		}
	}
	return testenv.NoLeaks(code)
}

func ctxFor(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// newSandbox creates a sandbox from the defaults, changed by edit, destroyed at the end.
func newSandbox(t *testing.T, edit func(*roche.Config)) string {
	t.Helper()
	cfg := roche.DefaultConfig()
	if edit != nil {
		edit(&cfg)
	}
	info, err := tp.Create(ctxFor(t, time.Minute), cfg)
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	t.Cleanup(func() {
		if err := tp.Destroy(context.Background(), info.ID); err != nil {
			t.Errorf("Destroy %s: %v", info.ID, err)
		}
	})
	return info.ID
}

func execIn(t *testing.T, id string, req roche.ExecRequest) roche.ExecResult {
	t.Helper()
	if req.Timeout == 0 {
		req.Timeout = time.Minute
	}
	res, err := tp.Exec(ctxFor(t, 2*time.Minute), id, req)
	if err != nil {
		t.Fatalf("Exec %q: %v", req.Cmd, err)
	}
	return res
}

func py(t *testing.T, id, code string, args ...string) roche.ExecResult {
	t.Helper()
	return execIn(t, id, roche.ExecRequest{Cmd: append([]string{"python3", "-c", code}, args...)})
}

// pyOK runs code, which must exit 0, and returns its stdout without the final newline.
func pyOK(t *testing.T, id, code string, args ...string) string {
	t.Helper()
	res := py(t, id, code, args...)
	if res.ExitCode != 0 || res.TimedOut {
		t.Fatalf("exit %d (timed out %v)\ncode: %s\nstdout: %s\nstderr: %s", res.ExitCode, res.TimedOut, code, res.Stdout, res.Stderr)
	}
	return strings.TrimSuffix(res.Stdout, "\n")
}

// putModule writes a .wasm module into the sandbox's /tmp through CopyTo.
func putModule(t *testing.T, id, name string, bin []byte) string {
	t.Helper()
	src := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(src, bin, 0o644); err != nil {
		t.Fatal(err)
	}
	dst := "/tmp/" + name
	if err := tp.CopyTo(ctxFor(t, time.Minute), id, src, dst); err != nil {
		t.Fatalf("CopyTo %s: %v", dst, err)
	}
	return dst
}

func TestHello(t *testing.T) {
	testenv.Needs(t, testenv.PythonWasm)
	id := newSandbox(t, nil)
	res := py(t, id, "print('hi')")
	if res.ExitCode != 0 || res.Stdout != "hi\n" || res.Stderr != "" || res.TimedOut || res.Truncated || res.OOMKilled {
		t.Fatalf("print('hi'): %+v", res)
	}
	if got := pyOK(t, id, "import json, sys; print(json.dumps({'v': sys.version_info[:2]}), sys.platform)"); got != `{"v": [3, 12]} wasi` {
		t.Fatalf("json and sys: %q", got)
	}
	// Every spelling of the interpreter maps onto python.wasm.
	for _, argv0 := range []string{"python", "python3.12", "/usr/bin/python3", "/usr/local/bin/python3"} {
		res := execIn(t, id, roche.ExecRequest{Cmd: []string{argv0, "-c", "print(2 + 2)"}})
		if res.ExitCode != 0 || res.Stdout != "4\n" {
			t.Errorf("%s: %+v", argv0, res)
		}
	}
}

func TestInstantiateTime(t *testing.T) {
	testenv.Needs(t, testenv.PythonWasm)
	id := newSandbox(t, nil)
	py(t, id, "pass") // warm the file system caches
	const n = 5
	var total time.Duration
	for range n {
		res := py(t, id, "print('hi')")
		if res.Stdout != "hi\n" {
			t.Fatalf("print('hi'): %+v", res)
		}
		total += res.Duration
	}
	avg := total / n
	t.Logf("print('hi') takes %v per exec (instantiate and run, python.wasm already compiled)", avg)
	if avg > 3*time.Second {
		t.Fatalf("print('hi') takes %v per exec: python.wasm is being recompiled", avg)
	}
}

func TestExitCodesAndStderr(t *testing.T) {
	testenv.Needs(t, testenv.PythonWasm)
	id := newSandbox(t, nil)
	res := py(t, id, "import sys; print('out'); print('oops', file=sys.stderr); sys.exit(3)")
	if res.ExitCode != 3 || res.Stdout != "out\n" || res.Stderr != "oops\n" {
		t.Fatalf("got %+v", res)
	}
	res = py(t, id, "raise ValueError('bad value')")
	if res.ExitCode != 1 || !strings.Contains(res.Stderr, "ValueError: bad value") {
		t.Fatalf("uncaught exception: %+v", res)
	}
	res = py(t, id, "import os; os._exit(42)")
	if res.ExitCode != 42 {
		t.Fatalf("os._exit(42): %+v", res)
	}
	res = py(t, id, "syntax error here")
	if res.ExitCode != 1 || !strings.Contains(res.Stderr, "SyntaxError") {
		t.Fatalf("syntax error: %+v", res)
	}
}

func TestEnvOnlyWhatIsGiven(t *testing.T) {
	testenv.Needs(t, testenv.PythonWasm)
	t.Setenv("ROCHE_HOST_SECRET", "leaked")
	id := newSandbox(t, func(c *roche.Config) {
		c.Env = map[string]string{"FROM_CONFIG": "c", "OVERRIDDEN": "config"}
	})
	res := execIn(t, id, roche.ExecRequest{
		Cmd: []string{"python3", "-c", "import os, json; print(json.dumps(dict(os.environ), sort_keys=True))"},
		Env: map[string]string{"FROM_EXEC": "e", "OVERRIDDEN": "exec"},
	})
	if want := `{"FROM_CONFIG": "c", "FROM_EXEC": "e", "OVERRIDDEN": "exec"}` + "\n"; res.Stdout != want {
		t.Fatalf("environment inside: %s, want exactly %s (stderr %q)", res.Stdout, want, res.Stderr)
	}
	// A PYTHONPATH of the caller's own survives the start-up hook, which leaves no trace.
	got := execIn(t, id, roche.ExecRequest{
		Cmd: []string{"python3", "-c", "import os, sys; print(os.environ['PYTHONPATH'], '/.roche' in sys.path, '/tmp/lib' in sys.path)"},
		Env: map[string]string{"PYTHONPATH": "/tmp/lib"},
	})
	if got.Stdout != "/tmp/lib False True\n" {
		t.Fatalf("PYTHONPATH given: %+v", got)
	}
	if _, err := tp.Exec(ctxFor(t, time.Minute), id, roche.ExecRequest{Cmd: []string{"python3"}, Env: map[string]string{"A=B": "x"}}); !errors.Is(err, roche.ErrInvalidConfig) {
		t.Fatalf("env name with '=': %v, want ErrInvalidConfig", err)
	}
}

func TestStdin(t *testing.T) {
	testenv.Needs(t, testenv.PythonWasm)
	id := newSandbox(t, nil)
	input := "line one\nline two\n\x00binary\xff\n"
	res := execIn(t, id, roche.ExecRequest{
		Cmd:   []string{"python3", "-c", "import sys, hashlib; d = sys.stdin.buffer.read(); print(len(d), hashlib.sha256(d).hexdigest())"},
		Stdin: strings.NewReader(input),
	})
	sum := sha256.Sum256([]byte(input))
	if want := fmt.Sprintf("%d %x\n", len(input), sum); res.Stdout != want || res.ExitCode != 0 {
		t.Fatalf("stdin: %+v, want %q", res, want)
	}
	// No stdin is an empty one.
	if got := pyOK(t, id, "import sys; print(repr(sys.stdin.read()))"); got != "''" {
		t.Fatalf("without stdin: %s", got)
	}
	// A reader that never delivers does not outlive the timeout.
	pr, pw := io.Pipe()
	defer pw.Close()
	start := time.Now()
	res = execIn(t, id, roche.ExecRequest{Cmd: []string{"python3", "-c", "import sys; sys.stdin.read()"}, Stdin: pr, Timeout: time.Second})
	if !res.TimedOut || time.Since(start) > 10*time.Second {
		t.Fatalf("blocked on stdin: %+v after %v, want timed out at 1 s", res, time.Since(start))
	}
}

// escapeProbe tries to read each path given and prints what happened.
const escapeProbe = `
import sys
for p in sys.argv[1:]:
    try:
        with open(p, 'rb') as f:
            print(p, 'READ', f.read(20))
    except OSError as e:
        print(p, 'refused', type(e).__name__)
`

func TestHostFilesUnreachable(t *testing.T) {
	testenv.Needs(t, testenv.PythonWasm)
	host := t.TempDir()
	secret := filepath.Join(host, "secret.txt")
	if err := os.WriteFile(secret, []byte("host secret"), 0o644); err != nil {
		t.Fatal(err)
	}
	mnt := t.TempDir()
	if err := os.Symlink(secret, filepath.Join(mnt, "abs-link")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("../"+filepath.Base(host)+"/secret.txt", filepath.Join(mnt, "rel-link")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(host, filepath.Join(mnt, "dir-link")); err != nil {
		t.Fatal(err)
	}
	id := newSandbox(t, func(c *roche.Config) {
		c.Mounts = []roche.Mount{{Source: mnt, Target: "/mnt/data", ReadWrite: true}}
	})
	out := pyOK(t, id, escapeProbe, "/etc/passwd", "/etc/hostname", "/proc/self/environ", secret,
		"/tmp/../etc/passwd", "/tmp/../../../../etc/passwd", "/workspace/../../etc/passwd",
		"/mnt/data/abs-link", "/mnt/data/rel-link", "/mnt/data/dir-link/secret.txt", "/mnt/data/../../etc/passwd")
	if strings.Contains(out, "READ") {
		t.Fatalf("a host file was read from inside:\n%s", out)
	}
	if n := strings.Count(out, "refused"); n != 11 {
		t.Fatalf("want 11 refusals:\n%s", out)
	}

	// The guest cannot make a link out, relative or absolute, nor a hard link to one.
	out = pyOK(t, id, `
import os
for target, link in (('/etc/passwd', '/tmp/l1'), ('../../../../../../etc/passwd', '/tmp/l2'), ('../../../..', '/workspace/l3'), ('secret.txt', '/mnt/data/l4')):
    try:
        os.symlink(target, link); print('LINKED', link)
    except OSError as e:
        print('refused', e.errno)
try:
    os.link('/mnt/data/abs-link', '/mnt/data/hard'); print('LINKED hard')
except OSError as e:
    print('refused', e.errno)
print(sorted(os.listdir('/')))
`)
	if strings.Contains(out, "LINKED") {
		t.Fatalf("a symbolic link was made inside:\n%s", out)
	}
	if !strings.HasSuffix(out, "['mnt', 'tmp', 'workspace']") {
		t.Fatalf("the root holds more than the sandbox's directories:\n%s", out)
	}
	entries, _ := os.ReadDir(mnt)
	if len(entries) != 3 {
		t.Fatalf("the rw mount gained entries: %v", entries)
	}
}

const writeProbe = `
import errno, sys
for p in sys.argv[1:]:
    try:
        open(p, 'w').write('x')
        print(p, 'written')
    except OSError as e:
        print(p, errno.errorcode.get(e.errno, e.errno))
`

func TestWritesOutsideTmpAndWorkspaceFail(t *testing.T) {
	testenv.Needs(t, testenv.PythonWasm)
	id := newSandbox(t, nil)
	out := pyOK(t, id, writeProbe, "/roche-probe", "/etc/x", "/usr/local/lib/python3.12/x.py", "/tmp/ok", "/workspace/ok", "/tmp/../escape")
	want := strings.Join([]string{
		"/roche-probe EROFS", "/etc/x EROFS", "/usr/local/lib/python3.12/x.py ENOENT",
		"/tmp/ok written", "/workspace/ok written", "/tmp/../escape EPERM",
	}, "\n")
	if out != want {
		t.Fatalf("writes:\n%s\nwant:\n%s", out, want)
	}
	if res := py(t, id, "import os; os.mkdir('/newdir')"); res.ExitCode == 0 || !strings.Contains(res.Stderr, "Read-only file system") {
		t.Fatalf("mkdir /newdir: %+v", res)
	}
}

func TestWritableRoot(t *testing.T) {
	testenv.Needs(t, testenv.PythonWasm)
	id := newSandbox(t, func(c *roche.Config) { c.Writable = true })
	out := pyOK(t, id, writeProbe, "/roche-probe", "/tmp/ok")
	if out != "/roche-probe written\n/tmp/ok written" {
		t.Fatalf("writable root: %s", out)
	}
	// It stays the sandbox's own: the file is in its directory, not on the host's /.
	if _, err := os.Stat("/roche-probe"); err == nil {
		t.Fatal("/roche-probe appeared on the host")
	}
	if got := pyOK(t, id, "print(open('/roche-probe').read())"); got != "x" {
		t.Fatalf("reading it back: %q", got)
	}
}

func TestScratchSpaceCapped(t *testing.T) {
	testenv.Needs(t, testenv.PythonWasm)
	id := newSandbox(t, nil)
	got := pyOK(t, id, `
import errno, os
n = 0
try:
    with open('/tmp/fill', 'wb') as f:
        while n < (100 << 20):
            f.write(b'\0' * (1 << 20)); f.flush(); n += 1 << 20
    print('unbounded', n)
except OSError as e:
    print(errno.errorcode.get(e.errno), n >> 20)
os.remove('/tmp/fill')
open('/tmp/after', 'wb').write(b'x' * (10 << 20))
print(os.path.getsize('/tmp/after'))
`)
	if got != "ENOSPC 64\n10485760" && got != "ENOSPC 63\n10485760" {
		t.Fatalf("filling /tmp: %q, want ENOSPC at 64 MiB, then room again once removed", got)
	}
}

func TestWorkdir(t *testing.T) {
	testenv.Needs(t, testenv.PythonWasm)
	id := newSandbox(t, nil)
	if got := pyOK(t, id, "import os; print(os.getcwd())"); got != DefaultWorkdir {
		t.Fatalf("default cwd %q, want %s", got, DefaultWorkdir)
	}
	// A relative script path and relative file names resolve against the workdir.
	script := filepath.Join(t.TempDir(), "script.py")
	if err := os.WriteFile(script, []byte("import sys\nopen('out.txt', 'w').write('from script')\nprint('args', sys.argv[1:])\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := tp.CopyTo(ctxFor(t, time.Minute), id, script, "/workspace/script.py"); err != nil {
		t.Fatal(err)
	}
	res := execIn(t, id, roche.ExecRequest{Cmd: []string{"python3", "script.py", "a", "b"}})
	if res.ExitCode != 0 || res.Stdout != "args ['a', 'b']\n" {
		t.Fatalf("python3 script.py: %+v", res)
	}
	if got := pyOK(t, id, "print(open('/workspace/out.txt').read())"); got != "from script" {
		t.Fatalf("relative write went elsewhere: %q", got)
	}
	res = execIn(t, id, roche.ExecRequest{Cmd: []string{"python3", "-c", "import os; print(os.getcwd())"}, Workdir: "/tmp"})
	if res.Stdout != "/tmp\n" {
		t.Fatalf("exec workdir /tmp: %+v", res)
	}
	cfgID := newSandbox(t, func(c *roche.Config) { c.Workdir = "/workspace/project" })
	if got := pyOK(t, cfgID, "import os; print(os.getcwd())"); got != "/workspace/project" {
		t.Fatalf("config workdir: %q", got)
	}
	_, err := tp.Exec(ctxFor(t, time.Minute), id, roche.ExecRequest{Cmd: []string{"python3", "-c", "1"}, Workdir: "/nowhere"})
	if !errors.Is(err, roche.ErrInvalidConfig) || !strings.Contains(err.Error(), "/nowhere") {
		t.Fatalf("missing workdir: %v", err)
	}
}

func TestMemoryLimit(t *testing.T) {
	testenv.Needs(t, testenv.PythonWasm)
	id := newSandbox(t, func(c *roche.Config) { c.Memory = "64m" })
	res := py(t, id, "b = bytearray(256 << 20); print(len(b))")
	if res.ExitCode == 0 || !res.OOMKilled || !strings.Contains(res.Stderr, "MemoryError") {
		t.Fatalf("256 MiB under a 64m limit: %+v", res)
	}
	// Under the limit is fine, and the sandbox survives its program's OOM.
	if got := pyOK(t, id, "b = bytearray(32 << 20); print(len(b))"); got != "33554432" {
		t.Fatalf("32 MiB under 64m: %q", got)
	}
	// A program that catches MemoryError and succeeds was not stopped by the limit.
	res = py(t, id, "try:\n    b = bytearray(256 << 20)\nexcept MemoryError:\n    print('handled')")
	if res.ExitCode != 0 || res.OOMKilled || res.Stdout != "handled\n" {
		t.Fatalf("handled MemoryError: %+v", res)
	}
	// A module that traps after being refused memory is reported as both.
	mod := putModule(t, id, "grow.wasm", growModule)
	res = execIn(t, id, roche.ExecRequest{Cmd: []string{mod}})
	if res.ExitCode != ExitCodeTrap || !res.OOMKilled || !strings.Contains(res.Stderr, "refused memory beyond the sandbox's 64m limit") {
		t.Fatalf("grow module under 64m: %+v", res)
	}
	// A limit below what python.wasm needs to start is an error, not a result.
	small := newSandbox(t, func(c *roche.Config) { c.Memory = "8m" })
	_, err := tp.Exec(ctxFor(t, time.Minute), small, roche.ExecRequest{Cmd: []string{"python3", "-c", "1"}})
	if !errors.Is(err, roche.ErrInvalidConfig) || !strings.Contains(err.Error(), "more memory") {
		t.Fatalf("8m for python.wasm: %v", err)
	}
}

func TestTimeout(t *testing.T) {
	testenv.Needs(t, testenv.PythonWasm)
	id := newSandbox(t, nil)
	for _, code := range []string{"while True: pass", "import time; time.sleep(1000)"} {
		start := time.Now()
		res := execIn(t, id, roche.ExecRequest{Cmd: []string{"python3", "-c", "print('started', flush=True)\n" + code}, Timeout: time.Second})
		el := time.Since(start)
		if !res.TimedOut || res.ExitCode != ExitCodeKilled || res.Stdout != "started\n" {
			t.Fatalf("%s with a 1 s timeout: %+v", code, res)
		}
		if el > 5*time.Second {
			t.Fatalf("%s with a 1 s timeout took %v to stop", code, el)
		}
	}
	mod := putModule(t, id, "loop.wasm", loopModule)
	start := time.Now()
	res := execIn(t, id, roche.ExecRequest{Cmd: []string{mod}, Timeout: 500 * time.Millisecond})
	if !res.TimedOut || time.Since(start) > 5*time.Second {
		t.Fatalf("looping module: %+v after %v", res, time.Since(start))
	}
	// Sleeps end on time: time.sleep works on an absolute deadline the provider converts.
	if got := pyOK(t, id, "import time; t = time.monotonic(); time.sleep(0.25); d = time.monotonic() - t; print(0.24 < d < 2)"); got != "True" {
		t.Fatalf("time.sleep(0.25): %s", got)
	}
	if got := pyOK(t, id, "print('alive')"); got != "alive" {
		t.Fatalf("after timeouts: %q", got)
	}
	// A caller that gives up gets an error, not a result.
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	_, err := tp.Exec(ctx, id, roche.ExecRequest{Cmd: []string{"python3", "-c", "while True: pass"}, Timeout: time.Minute})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("caller's context expired: %v", err)
	}
}

func TestModules(t *testing.T) {
	testenv.Needs(t, testenv.PythonWasm)
	id := newSandbox(t, nil)
	trap := putModule(t, id, "trap.wasm", trapModule)
	res := execIn(t, id, roche.ExecRequest{Cmd: []string{trap}})
	if res.ExitCode != ExitCodeTrap || !strings.Contains(res.Stderr, "trapped: wasm error: unreachable") || res.OOMKilled {
		t.Fatalf("trapping module: %+v", res)
	}
	exit := putModule(t, id, "exit.wasm", exitModule)
	// Relative paths resolve against / for a module; the leading / may be left off.
	res = execIn(t, id, roche.ExecRequest{Cmd: []string{strings.TrimPrefix(exit, "/"), "arg"}})
	if res.ExitCode != 7 || res.Stderr != "" {
		t.Fatalf("proc_exit(7) module: %+v", res)
	}

	cases := []struct {
		name    string
		bin     []byte
		sentry  error
		message string
	}{
		{"notwasm.wasm", []byte("#!/bin/sh\necho pwned\n"), roche.ErrInvalidConfig, "not a WebAssembly module"},
		{"corrupt.wasm", append(append([]byte{}, wasmHeader...), 0x01, 0xff, 0xff, 0xff), roche.ErrInvalidConfig, "not a valid WebAssembly module"},
		{"truncated.wasm", trapModule[:len(trapModule)-3], roche.ErrInvalidConfig, "not a valid WebAssembly module"},
		{"empty.wasm", nil, roche.ErrInvalidConfig, "not a WebAssembly module"},
		{"foreign.wasm", foreignImportModule, roche.ErrUnsupported, "env.launch_missiles"},
		{"reactor.wasm", reactorModule, roche.ErrUnsupported, "no _start"},
	}
	for _, c := range cases {
		p := putModule(t, id, c.name, c.bin)
		_, err := tp.Exec(ctxFor(t, time.Minute), id, roche.ExecRequest{Cmd: []string{p}})
		if !errors.Is(err, c.sentry) || !strings.Contains(err.Error(), c.message) {
			t.Errorf("%s: err %v, want %v mentioning %q", c.name, err, c.sentry, c.message)
		}
	}
	_, err := tp.Exec(ctxFor(t, time.Minute), id, roche.ExecRequest{Cmd: []string{"/tmp/missing.wasm"}})
	if !errors.Is(err, roche.ErrInvalidConfig) || !strings.Contains(err.Error(), "no module /tmp/missing.wasm") {
		t.Errorf("missing module: %v", err)
	}
	_, err = tp.Exec(ctxFor(t, time.Minute), id, roche.ExecRequest{Cmd: []string{exit}, Workdir: "/tmp"})
	if !errors.Is(err, roche.ErrUnsupported) {
		t.Errorf("module with a workdir: %v, want ErrUnsupported", err)
	}
}

func TestUnsupportedCommands(t *testing.T) {
	testenv.Needs(t, testenv.PythonWasm)
	id := newSandbox(t, nil)
	for _, cmd := range [][]string{{"ls", "-l"}, {"sh", "-c", "echo hi"}, {"/bin/true"}} {
		_, err := tp.Exec(ctxFor(t, time.Minute), id, roche.ExecRequest{Cmd: cmd})
		if !errors.Is(err, roche.ErrUnsupported) || !strings.Contains(err.Error(), "`"+cmd[0]+"` is not available") {
			t.Errorf("%q: %v", cmd, err)
		}
	}
	if _, err := tp.Exec(ctxFor(t, time.Minute), id, roche.ExecRequest{}); !errors.Is(err, roche.ErrInvalidConfig) {
		t.Errorf("empty command: %v", err)
	}
}

func TestOutputTruncation(t *testing.T) {
	testenv.Needs(t, testenv.PythonWasm)
	id := newSandbox(t, nil)
	var live strings.Builder
	res := execIn(t, id, roche.ExecRequest{
		Cmd:         []string{"python3", "-c", "import sys; sys.stdout.write('x' * 5000); sys.stderr.write('e' * 10)"},
		OutputLimit: 1000,
		Stdout:      &live,
	})
	if !res.Truncated || len(res.Stdout) != 1000 || res.Stderr != "eeeeeeeeee" || res.ExitCode != 0 {
		t.Fatalf("5000 bytes with a 1000 limit: truncated %v, kept %d, stderr %q, exit %d", res.Truncated, len(res.Stdout), res.Stderr, res.ExitCode)
	}
	if live.String() != res.Stdout {
		t.Fatalf("streamed %d bytes, kept %d", live.Len(), len(res.Stdout))
	}
	res = py(t, id, "print('short')")
	if res.Truncated {
		t.Fatalf("short output flagged truncated: %+v", res)
	}
}

func TestCopyFiles(t *testing.T) {
	testenv.Needs(t, testenv.PythonWasm)
	id := newSandbox(t, nil)
	ctx := ctxFor(t, time.Minute)
	dir := t.TempDir()
	tree := filepath.Join(dir, "tree")
	for name, body := range map[string]string{"a.txt": "alpha", "sub/b.bin": "\x00\x01beta\xff", "sub/deeper/c": ""} {
		p := filepath.Join(tree, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := tp.CopyTo(ctx, id, tree, "/workspace/in/tree"); err != nil {
		t.Fatalf("CopyTo dir: %v", err)
	}
	got := pyOK(t, id, `
import os
for root, dirs, files in sorted(os.walk('/workspace/in/tree')):
    for f in sorted(files):
        p = os.path.join(root, f)
        print(p, open(p, 'rb').read())`)
	want := "/workspace/in/tree/a.txt b'alpha'\n/workspace/in/tree/sub/b.bin b'\\x00\\x01beta\\xff'\n/workspace/in/tree/sub/deeper/c b''"
	if got != want {
		t.Fatalf("copied tree seen inside:\n%s\nwant:\n%s", got, want)
	}
	pyOK(t, id, "import os; os.makedirs('/tmp/out/d'); open('/tmp/out/d/r.txt', 'w').write('result'); open('/tmp/one.txt', 'w').write('one')")
	if err := tp.CopyFrom(ctx, id, "/tmp/out", filepath.Join(dir, "out")); err != nil {
		t.Fatalf("CopyFrom dir: %v", err)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "out", "d", "r.txt")); err != nil || string(b) != "result" {
		t.Fatalf("copied out %q %v", b, err)
	}
	if err := tp.CopyFrom(ctx, id, "/tmp/one.txt", filepath.Join(dir, "new", "one.txt")); err != nil {
		t.Fatalf("CopyFrom file: %v", err)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "new", "one.txt")); err != nil || string(b) != "one" {
		t.Fatalf("copied out %q %v", b, err)
	}

	// What cannot be done says so.
	link := filepath.Join(dir, "link")
	if err := os.Symlink("/etc/passwd", link); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		src, dst string
		want     error
	}{
		{filepath.Join(tree, "a.txt"), "/a.txt", roche.ErrUnsupported},
		{filepath.Join(tree, "a.txt"), "/usr/local/lib/python3.12/a.py", roche.ErrUnsupported},
		{filepath.Join(tree, "a.txt"), "tmp/relative", roche.ErrInvalidConfig},
		{filepath.Join(tree, "a.txt"), "/tmp", roche.ErrInvalidConfig},
		{link, "/tmp/link", roche.ErrUnsupported},
		{filepath.Join(dir, "missing"), "/tmp/x", roche.ErrNotFound},
	} {
		if err := tp.CopyTo(ctx, id, c.src, c.dst); !errors.Is(err, c.want) {
			t.Errorf("CopyTo %s %s: %v, want %v", c.src, c.dst, err, c.want)
		}
	}
	if err := tp.CopyFrom(ctx, id, "/tmp/no-such-file", filepath.Join(dir, "x")); !errors.Is(err, roche.ErrNotFound) {
		t.Errorf("CopyFrom missing: %v", err)
	}
	if err := tp.CopyTo(ctx, "wasm-000000000000", filepath.Join(tree, "a.txt"), "/tmp/a"); !errors.Is(err, roche.ErrNotFound) {
		t.Errorf("CopyTo unknown sandbox: %v", err)
	}
}

func TestMounts(t *testing.T) {
	testenv.Needs(t, testenv.PythonWasm)
	ro, rw := t.TempDir(), t.TempDir()
	if err := os.WriteFile(filepath.Join(ro, "in.txt"), []byte("from host"), 0o644); err != nil {
		t.Fatal(err)
	}
	id := newSandbox(t, func(c *roche.Config) {
		c.Mounts = []roche.Mount{{Source: ro, Target: "/mnt/ro"}, {Source: rw, Target: "/data/rw", ReadWrite: true}}
	})
	if got := pyOK(t, id, "print(open('/mnt/ro/in.txt').read())"); got != "from host" {
		t.Fatalf("read from ro mount: %q", got)
	}
	if got := pyOK(t, id, writeProbe, "/mnt/ro/new.txt", "/data/rw/new.txt"); got != "/mnt/ro/new.txt EROFS\n/data/rw/new.txt written" {
		t.Fatalf("writes into mounts: %s", got)
	}
	if b, err := os.ReadFile(filepath.Join(rw, "new.txt")); err != nil || string(b) != "x" {
		t.Fatalf("written in the rw mount, seen on host: %q %v", b, err)
	}
	if err := tp.CopyTo(ctxFor(t, time.Minute), id, filepath.Join(ro, "in.txt"), "/mnt/ro/copy.txt"); !errors.Is(err, roche.ErrUnsupported) {
		t.Fatalf("CopyTo into a ro mount: %v", err)
	}
}

func TestCreateRefuses(t *testing.T) {
	testenv.Needs(t, testenv.PythonWasm)
	before, err := tp.List(ctxFor(t, time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name    string
		edit    func(*roche.Config)
		want    error
		message string
	}{
		{"network", func(c *roche.Config) { c.Network = true }, roche.ErrUnsupported, "no network"},
		{"allowlist", func(c *roche.Config) { c.NetworkAllowlist = []string{"pypi.org"} }, roche.ErrUnsupported, "no sockets"},
		{"workspace name", func(c *roche.Config) { c.Workspace = "../ws" }, roche.ErrInvalidConfig, "workspace"},
		{"cpus", func(c *roche.Config) { c.CPUs = 0.5 }, roche.ErrUnsupported, "cpus=0.5"},
		{"image", func(c *roche.Config) { c.Image = "ubuntu:22.04" }, roche.ErrUnsupported, `image "ubuntu:22.04"`},
		{"old python", func(c *roche.Config) { c.Image = "python:3.8" }, roche.ErrUnsupported, "CPython 3.12"},
		{"invalid", func(c *roche.Config) { c.Memory = "lots"; c.TimeoutSecs = 0 }, roche.ErrInvalidConfig, "timeout_secs"},
		{"mount on tmp", func(c *roche.Config) { c.Mounts = []roche.Mount{{Source: t.TempDir(), Target: "/tmp"}} }, roche.ErrUnsupported, "own writable directory"},
		{"mount on stdlib", func(c *roche.Config) { c.Mounts = []roche.Mount{{Source: t.TempDir(), Target: "/usr/lib"}} }, roche.ErrUnsupported, "standard library"},
		{"mount a file", func(c *roche.Config) { c.Mounts = []roche.Mount{{Source: file, Target: "/mnt/f"}} }, roche.ErrUnsupported, "not a directory"},
		{"workdir in stdlib", func(c *roche.Config) { c.Workdir = "/usr/lib" }, roche.ErrUnsupported, "standard library"},
		{"mount missing", func(c *roche.Config) { c.Mounts = []roche.Mount{{Source: file + "-missing", Target: "/mnt/f"}} }, roche.ErrInvalidConfig, "does not exist"},
	}
	for _, c := range cases {
		cfg := roche.DefaultConfig()
		c.edit(&cfg)
		_, err := tp.Create(ctxFor(t, time.Minute), cfg)
		if !errors.Is(err, c.want) || !strings.Contains(err.Error(), c.message) {
			t.Errorf("%s: %v, want %v mentioning %q", c.name, err, c.want, c.message)
		}
	}
	for _, image := range []string{"python:3.12-slim", "python:3.12", "docker.io/library/python:3.12-bookworm", "python"} {
		id := newSandbox(t, func(c *roche.Config) { c.Image = image })
		if info, err := tp.Inspect(ctxFor(t, time.Minute), id); err != nil || info.Image != image {
			t.Errorf("image %s: %+v %v", image, info, err)
		}
	}
	after, err := tp.List(ctxFor(t, time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if len(after) != len(before)+4 {
		t.Fatalf("refused creates left sandboxes behind: %d before, %d after (4 made on purpose)", len(before), len(after))
	}
	entries, _ := os.ReadDir(tp.stateDir)
	for _, e := range entries {
		if _, err := os.Stat(filepath.Join(tp.stateDir, e.Name(), recordFile)); err != nil && validID(e.Name()) {
			t.Errorf("a refused create left %s behind", e.Name())
		}
	}
}

func TestPythonMissing(t *testing.T) {
	testenv.Needs(t, testenv.PythonWasm)
	p, err := New(WithStateDir(t.TempDir()), WithCacheDir(t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	t.Setenv(PythonEnv, "")
	_, err = p.Create(ctxFor(t, time.Minute), roche.DefaultConfig())
	if !errors.Is(err, roche.ErrUnavailable) || !strings.Contains(err.Error(), "make it on this host with roche image build python --provider wasm") ||
		strings.Contains(err.Error(), "scripts/") {
		t.Fatalf("Create without python.wasm: %v", err)
	}
	if list, err := p.List(ctxFor(t, time.Minute)); err != nil || len(list) != 0 {
		t.Fatalf("List without python.wasm: %v %v", list, err)
	}

	bad := filepath.Join(t.TempDir(), "python.wasm")
	if err := os.WriteFile(bad, []byte("not wasm"), 0o644); err != nil {
		t.Fatal(err)
	}
	p2, err := New(WithStateDir(t.TempDir()), WithPythonPath(bad))
	if err != nil {
		t.Fatal(err)
	}
	defer p2.Close()
	if err := p2.Prepare(ctxFor(t, time.Minute)); !errors.Is(err, roche.ErrUnavailable) || !strings.Contains(err.Error(), "compiling python.wasm") {
		t.Fatalf("corrupt python.wasm: %v", err)
	}
}

func TestListDestroyGC(t *testing.T) {
	testenv.Needs(t, testenv.PythonWasm)
	ctx := ctxFor(t, time.Minute)
	short, err := tp.Create(ctx, func() roche.Config { c := roche.DefaultConfig(); c.TimeoutSecs = 1; return c }())
	if err != nil {
		t.Fatal(err)
	}
	long := newSandbox(t, nil)
	ids := func() map[string]roche.SandboxInfo {
		list, err := tp.List(ctx)
		if err != nil {
			t.Fatal(err)
		}
		m := map[string]roche.SandboxInfo{}
		for _, s := range list {
			m[s.ID] = s
		}
		return m
	}
	listed := ids()
	if s, ok := listed[short.ID]; !ok || s.State != roche.StateRunning || s.Provider != "wasm" || s.ExpiresAt.Sub(s.CreatedAt) != time.Second {
		t.Fatalf("listed %+v (present %v)", s, ok)
	}
	if !strings.HasPrefix(short.ID, "wasm-") || len(short.ID) != 17 || !validID(short.ID) {
		t.Fatalf("id %q, want wasm- and 12 hex digits", short.ID)
	}
	time.Sleep(1100 * time.Millisecond)

	// Another process sees the same sandboxes: state lives on disk.
	other, err := New(WithStateDir(tp.stateDir))
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if info, err := other.Inspect(ctx, long); err != nil || info.ID != long {
		t.Fatalf("second provider Inspect: %+v %v", info, err)
	}

	removed, err := other.GC(ctx, roche.GCOptions{DryRun: true})
	if err != nil || len(removed) != 1 || removed[0].ID != short.ID {
		t.Fatalf("GC dry run: %+v %v, want only %s", removed, err, short.ID)
	}
	if _, ok := ids()[short.ID]; !ok {
		t.Fatal("a dry run removed the sandbox")
	}
	removed, err = other.GC(ctx, roche.GCOptions{})
	if err != nil || len(removed) != 1 || removed[0].ID != short.ID {
		t.Fatalf("GC: %+v %v", removed, err)
	}
	now := ids()
	if _, ok := now[short.ID]; ok {
		t.Fatal("expired sandbox still listed after GC")
	}
	if _, ok := now[long]; !ok {
		t.Fatal("GC removed a live sandbox")
	}
	if _, err := os.Stat(tp.sandboxDir(short.ID)); !os.IsNotExist(err) {
		t.Fatalf("expired sandbox's directory remains: %v", err)
	}

	// Destroy is idempotent; an id that never was a sandbox is simply gone.
	for _, id := range []string{short.ID, "wasm-000000000000", "roche-no-such-sandbox", "../../etc", ""} {
		if err := tp.Destroy(ctx, id); err != nil {
			t.Errorf("Destroy %q: %v", id, err)
		}
		if _, err := tp.Inspect(ctx, id); !errors.Is(err, roche.ErrNotFound) {
			t.Errorf("Inspect %q: %v, want ErrNotFound", id, err)
		}
		if _, err := tp.Exec(ctx, id, roche.ExecRequest{Cmd: []string{"python3", "-c", "1"}}); !errors.Is(err, roche.ErrNotFound) {
			t.Errorf("Exec in %q: %v, want ErrNotFound", id, err)
		}
	}

	// GC also clears a half-made sandbox left by a crash, once it is old.
	orphan := filepath.Join(tp.stateDir, "wasm-0123456789ab")
	if err := os.MkdirAll(filepath.Join(orphan, rootDir), 0o700); err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-time.Hour)
	if err := os.Chtimes(orphan, old, old); err != nil {
		t.Fatal(err)
	}
	if _, err := tp.GC(ctx, roche.GCOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(orphan); !os.IsNotExist(err) {
		t.Fatalf("orphan directory survived GC: %v", err)
	}
}

func TestDestroyStopsRunningExec(t *testing.T) {
	testenv.Needs(t, testenv.PythonWasm)
	info, err := tp.Create(ctxFor(t, time.Minute), roche.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() {
		_, err := tp.Exec(context.Background(), info.ID, roche.ExecRequest{
			Cmd: []string{"python3", "-c", "print('up', flush=True)\nwhile True: pass"}, Timeout: time.Minute,
			Stdout: writerFunc(func(b []byte) {
				if strings.Contains(string(b), "up") {
					_ = tp.Destroy(context.Background(), info.ID)
				}
			}),
		})
		errc <- err
	}()
	select {
	case err := <-errc:
		if !errors.Is(err, roche.ErrNotFound) || !strings.Contains(err.Error(), "destroyed") {
			t.Fatalf("exec whose sandbox was destroyed: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("destroying the sandbox did not stop its exec")
	}
}

type writerFunc func([]byte)

func (f writerFunc) Write(b []byte) (int, error) { f(b); return len(b), nil }

func TestConcurrentExecs(t *testing.T) {
	testenv.Needs(t, testenv.PythonWasm)
	id := newSandbox(t, nil)
	var wg sync.WaitGroup
	errs := make(chan string, 8)
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := tp.Exec(ctxFor(t, time.Minute), id, roche.ExecRequest{
				Cmd: []string{"python3", "-c", fmt.Sprintf("import time; time.sleep(0.1); print(%d * 2)", i)}, Timeout: time.Minute,
			})
			if err != nil || res.ExitCode != 0 || res.Stdout != fmt.Sprintf("%d\n", i*2) {
				errs <- fmt.Sprintf("exec %d: %+v %v", i, res, err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
}

func TestCapabilities(t *testing.T) {
	testenv.Needs(t, testenv.PythonWasm)
	c := tp.Capabilities()
	if c.Network || c.Processes || c.Pause || !c.Files || !c.Stdin || !c.Writable || !c.Mounts {
		t.Fatalf("capabilities %+v", c)
	}
	if tp.Name() != "wasm" {
		t.Fatalf("name %q", tp.Name())
	}
	// pids_limit and user are accepted and ignored.
	id := newSandbox(t, func(c *roche.Config) { c.PidsLimit = 1; c.User = "0:0" })
	if got := pyOK(t, id, "print('ok')"); got != "ok" {
		t.Fatal(got)
	}
}

func TestNoNetworkNoProcesses(t *testing.T) {
	testenv.Needs(t, testenv.PythonWasm)
	id := newSandbox(t, nil)
	got := pyOK(t, id, `
import socket, subprocess
for name, f in (('socket', lambda: socket.socket().connect(('1.1.1.1', 53))),
                ('dns', lambda: socket.getaddrinfo('example.com', 80)),
                ('subprocess', lambda: subprocess.run(['true']))):
    try:
        f(); print(name, 'WORKED')
    except (OSError, AttributeError):  # python.wasm's _socket has no getaddrinfo at all
        print(name, 'refused')
`)
	if got != "socket refused\ndns refused\nsubprocess refused" {
		t.Fatalf("network and processes from inside:\n%s", got)
	}
}
