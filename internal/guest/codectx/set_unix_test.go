//go:build unix

package codectx

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/roche-sandbox/roche/internal/guest"
	"github.com/roche-sandbox/roche/internal/guest/kernel"
)

// These tests run the Set over the real kernel, in the host's python3 as a plain child
// process (pyProc: the agent's layout of pipes, without its users, cgroups and limits,
// which internal/guest/server's tests cover), so that they need no root and no sandbox.

// pyProc is a kernel in a child python3.
type pyProc struct {
	cmd *exec.Cmd
	in  *os.File // the cell pipe
	// noInterrupt, when set, is what Interrupt answers (a kernel without signals).
	noInterrupt error
	waited      chan struct{}
}

func (p *pyProc) Send(line []byte) error { _, err := p.in.Write(line); return err }

func (p *pyProc) Interrupt() error {
	if p.noInterrupt != nil {
		return p.noInterrupt
	}
	return p.cmd.Process.Signal(syscall.SIGINT)
}

func (p *pyProc) Kill() {
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	p.in.Close()
}

func (p *pyProc) Exit() Exit {
	select {
	case <-p.waited:
	case <-time.After(5 * time.Second):
		return Exit{How: "stopped answering"}
	}
	ws := p.cmd.ProcessState.Sys().(syscall.WaitStatus)
	if ws.Signaled() {
		return Exit{How: fmt.Sprintf("was killed by signal %d (%s)", int(ws.Signal()), ws.Signal())}
	}
	return Exit{How: fmt.Sprintf("exited with status %d", ws.ExitStatus())}
}

var python struct {
	once sync.Once
	path string
}

// hostPython is the host's python3 itself (not a wrapper such as pyenv's shim, which
// would be the process the tests signal).
func hostPython(t *testing.T) string {
	python.once.Do(func() {
		out, err := exec.Command("python3", "-c", "import sys; print(sys.executable)").Output()
		if err == nil {
			python.path = strings.TrimSpace(string(out))
		}
	})
	if python.path == "" {
		t.Fatal("python3 not found: these tests run the kernel in the host's Python 3")
	}
	return python.path
}

type starter struct {
	t           *testing.T
	argv        []string // default: the kernel
	noInterrupt error
	mu          sync.Mutex
	started     int
}

func (s *starter) start(_ context.Context, cwd string, env map[string]string) (*Kernel, error) {
	python := hostPython(s.t)
	argv := s.argv
	if argv == nil {
		argv = kernel.Argv(python)
	}
	var pipes []*os.File
	pipe := func() (*os.File, *os.File) {
		r, w, err := os.Pipe()
		if err != nil {
			s.t.Fatal(err)
		}
		pipes = append(pipes, r, w)
		return r, w
	}
	outR, outW := pipe()
	errR, errW := pipe()
	cmdR, cmdW := pipe()
	evR, evW := pipe()
	cmd := exec.Command(python, argv[1:]...)
	cmd.Stdin = strings.NewReader(kernel.Source)
	cmd.Stdout, cmd.Stderr = outW, errW
	cmd.ExtraFiles = []*os.File{cmdR, evW} // fd 3 and fd 4
	cmd.Dir = cwd
	cmd.Env = os.Environ()
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		for _, f := range pipes {
			f.Close()
		}
		return nil, err
	}
	outW.Close()
	errW.Close()
	cmdR.Close()
	evW.Close()
	p := &pyProc{cmd: cmd, in: cmdW, noInterrupt: s.noInterrupt, waited: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		close(p.waited)
	}()
	s.mu.Lock()
	s.started++
	s.mu.Unlock()
	k := NewKernel(p)
	k.PumpRaw(outR, Stdout)
	k.PumpRaw(errR, Stderr)
	k.PumpEvents(evR)
	return k, nil
}

// newSet returns a Set over python3 children, stopped when the test ends.
func newSet(t *testing.T, opts Options, st *starter) *Set {
	t.Helper()
	if st == nil {
		st = &starter{}
	}
	st.t = t
	opts.Start = st.start
	s := New(opts)
	t.Cleanup(s.Stop)
	return s
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

type cell struct {
	end guest.CodeEnd
	out *streams
}

func (c cell) text() string {
	for _, r := range c.out.results {
		if r.Main {
			return r.Data["text/plain"]
		}
	}
	return ""
}

// lockedStreams is streams for a cell read while it runs.
type lockedStreams struct {
	mu sync.Mutex
	streams
}

func run(t *testing.T, s *Set, req guest.Request) cell {
	t.Helper()
	c, err := tryRun(t, s, req)
	if err != nil {
		t.Fatalf("run %q: %v", req.Code, err)
	}
	return c
}

func tryRun(t *testing.T, s *Set, req guest.Request) (cell, error) {
	t.Helper()
	out := &streams{}
	end, err := s.Run(ctxT(t, time.Minute), req, out)
	return cell{end, out}, err
}

func code(err error) string {
	var ae *guest.Error
	if errors.As(err, &ae) {
		return ae.Code
	}
	return ""
}

func TestStateOutputAndResults(t *testing.T) {
	t.Parallel()
	s := newSet(t, Options{}, nil)
	first := run(t, s, guest.Request{Code: "x = 41\nprint('hi')\nimport os\nos.system('echo raw; echo rawerr >&2')"})
	if first.end.Error != nil || first.end.ExecutionCount != 1 || first.end.Restarted || first.end.Died {
		t.Fatalf("first cell: %+v", first.end)
	}
	// The subprocess's raw output came before the cell's end (the sync marks). Its order
	// against print's is the kernel's and the subprocess's to decide, as in a script
	// whose stdout is a pipe: print's line may come first or second.
	if got := first.out.s[Stdout].String(); (got != "hi\nraw\n" && got != "raw\nhi\n") || first.out.s[Stderr].String() != "rawerr\n" {
		t.Fatalf("stdout %q, stderr %q", got, first.out.s[Stderr].String())
	}
	second := run(t, s, guest.Request{Code: "display(x)\nx + 1"})
	if second.text() != "42" || second.end.ExecutionCount != 2 || second.end.Context != first.end.Context || len(second.out.results) != 2 || second.out.results[0].Main {
		t.Fatalf("second cell: %q %+v %+v", second.text(), second.end, second.out.results)
	}
	if !strings.HasSuffix(string(second.out.results[1].Raw), "\n") || !strings.Contains(string(second.out.results[1].Raw), `"42"`) {
		t.Fatalf("a result is not passed on as its line: %q", second.out.results[1].Raw)
	}
	fail := run(t, s, guest.Request{Code: "def f():\n    return 1/0\nf()"})
	if e := fail.end.Error; e == nil || e.Name != "ZeroDivisionError" || !strings.Contains(e.Traceback, "return 1/0") || fail.end.Died {
		t.Fatalf("exception: %+v", fail.end)
	}
	capped := run(t, s, guest.Request{OutputLimit: 1000, Code: "for i in range(100): print('x' * 50)\nimport os\nos.system('head -c 5000 /dev/zero | tr \"\\\\0\" y >&2')\n'end'"})
	if !capped.end.Truncated || capped.out.s[Stdout].Len() != 1000 || capped.out.s[Stderr].Len() != 1000 || capped.text() != "'end'" {
		t.Fatalf("output limit 1000: truncated %v, kept %d and %d", capped.end.Truncated, capped.out.s[Stdout].Len(), capped.out.s[Stderr].Len())
	}
	if list := s.List(); len(list) != 1 || !list[0].Default || list[0].Language != "python" || list[0].ID != first.end.Context {
		t.Fatalf("List = %+v", list)
	}
}

func TestTimeoutInterrupts(t *testing.T) {
	t.Parallel()
	s := newSet(t, Options{}, nil)
	run(t, s, guest.Request{Code: "kept = 7"})
	out := run(t, s, guest.Request{Code: "while True:\n    pass", TimeoutMS: 300})
	if !out.end.TimedOut || out.end.Died || out.end.Error == nil || out.end.Error.Name != "KeyboardInterrupt" {
		t.Fatalf("timed-out cell: %+v", out.end)
	}
	if next := run(t, s, guest.Request{Code: "kept"}); next.text() != "7" || next.end.Restarted {
		t.Fatalf("after the interrupt: %q %+v", next.text(), next.end)
	}
}

func TestCallerGoneInterrupts(t *testing.T) {
	t.Parallel()
	s := newSet(t, Options{}, nil)
	run(t, s, guest.Request{Code: "kept = 8"})
	ctx, cancel := context.WithCancel(context.Background())
	out := &lockedStreams{}
	w := writeSignal{out, make(chan struct{}, 1)}
	go func() {
		<-w.wrote
		cancel()
	}()
	end, err := s.Run(ctx, guest.Request{Code: "import time\nprint('sleeping', flush=True)\ntime.sleep(60)"}, w)
	if err != nil || end.Error == nil || end.Error.Name != "KeyboardInterrupt" || end.TimedOut || end.Died {
		t.Fatalf("a cell whose caller went away: %+v %v", end, err)
	}
	if next := run(t, s, guest.Request{Code: "kept"}); next.text() != "8" || next.end.Restarted {
		t.Fatalf("after the interrupt: %q %+v", next.text(), next.end)
	}
}

// sleeping runs a cell that sleeps in context id, returns once it has started, and
// gives its end when it ends.
func sleeping(t *testing.T, s *Set, id string) <-chan guest.CodeEnd {
	w := writeSignal{&lockedStreams{}, make(chan struct{}, 1)}
	ended := make(chan guest.CodeEnd, 1)
	go func() {
		end, _ := s.Run(ctxT(t, time.Minute), guest.Request{Context: id, Code: "import time\nprint('go', flush=True)\ntime.sleep(60)"}, w)
		ended <- end
	}()
	<-w.wrote
	return ended
}

type writeSignal struct {
	*lockedStreams
	wrote chan struct{}
}

func (w writeSignal) Write(s Stream, p []byte) {
	w.mu.Lock()
	w.s[s].Write(p)
	w.mu.Unlock()
	select {
	case w.wrote <- struct{}{}:
	default:
	}
}

func (w writeSignal) Result(Event) {}

func TestUninterruptibleStoppedAtTimeout(t *testing.T) {
	t.Parallel()
	s := newSet(t, Options{}, &starter{noInterrupt: errors.New("this kernel has no signals")})
	run(t, s, guest.Request{Code: "kept = 1"})
	out := run(t, s, guest.Request{Code: "while True:\n    pass", TimeoutMS: 300})
	if e := out.end.Error; !out.end.TimedOut || !out.end.Died || e == nil || e.Name != "TimeoutError" ||
		!strings.Contains(e.Value, "at its timeout of 300ms: this kernel has no signals") {
		t.Fatalf("timed-out cell: %+v %+v", out.end, out.end.Error)
	}
	next := run(t, s, guest.Request{Code: "kept"})
	if !next.end.Restarted || next.end.Error == nil || next.end.Error.Name != "NameError" || next.end.ExecutionCount != 1 {
		t.Fatalf("after the stop: %+v", next.end)
	}
}

func TestKilledAfterInterruptGrace(t *testing.T) {
	t.Parallel()
	s := newSet(t, Options{}, nil)
	out := run(t, s, guest.Request{TimeoutMS: 300,
		Code: "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True: time.sleep(0.05)"})
	if e := out.end.Error; !out.end.TimedOut || !out.end.Died || e == nil || e.Name != "TimeoutError" || !strings.Contains(e.Value, "did not stop within 3s") {
		t.Fatalf("a cell ignoring SIGINT: %+v %+v", out.end, out.end.Error)
	}
	if next := run(t, s, guest.Request{Code: "1"}); !next.end.Restarted || next.text() != "1" {
		t.Fatalf("after the kill: %+v", next.end)
	}
}

func TestInterpreterDies(t *testing.T) {
	t.Parallel()
	s := newSet(t, Options{}, nil)
	run(t, s, guest.Request{Code: "gone = 1"})
	out := run(t, s, guest.Request{Code: "import os\nos._exit(3)"})
	if e := out.end.Error; !out.end.Died || e == nil || e.Name != "ContextDied" || !strings.Contains(e.Value, "exited with status 3") {
		t.Fatalf("os._exit(3): %+v %+v", out.end, out.end.Error)
	}
	if next := run(t, s, guest.Request{Code: "'gone' in globals()"}); !next.end.Restarted || next.text() != "False" || next.end.ExecutionCount != 1 {
		t.Fatalf("after the death: %q %+v", next.text(), next.end)
	}
	if again := run(t, s, guest.Request{Code: "1"}); again.end.Restarted {
		t.Fatalf("Restarted twice: %+v", again.end)
	}
	// Dying between cells: the next cell says so too.
	run(t, s, guest.Request{Code: "import os, threading, time\nthreading.Thread(target=lambda: (time.sleep(0.2), os._exit(1))).start()"})
	<-s.Kernel(out.end.Context).Ended()
	if next := run(t, s, guest.Request{Code: "'threading' in globals()"}); !next.end.Restarted || next.text() != "False" {
		t.Fatalf("after a death between cells: %q %+v", next.text(), next.end)
	}
}

func TestRestartAndRemove(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var records []string
	s := newSet(t, Options{
		Record: func(cc guest.CodeContext, removed bool) {
			mu.Lock()
			records = append(records, fmt.Sprintf("%s %v %v", cc.ID, cc.Default, removed))
			mu.Unlock()
		},
		Unknown: func(id string) error {
			if id == "elsewhere" {
				return errors.New("lived elsewhere")
			}
			return nil
		},
	}, nil)
	cc, err := s.Create(ctxT(t, time.Minute), "python", os.TempDir(), map[string]string{"ROCHE_CODECTX_TEST": "yes"})
	if err != nil || cc.Default || cc.Language != "python" {
		t.Fatalf("Create: %+v %v", cc, err)
	}
	got := run(t, s, guest.Request{Context: cc.ID, Code: "import os\nz = 1\n(os.environ['ROCHE_CODECTX_TEST'], os.getcwd() == " + fmt.Sprintf("%q", os.TempDir()) + ")"})
	if got.text() != "('yes', True)" {
		t.Fatalf("the context's env and cwd: %s", got.text())
	}
	// A restart while a cell runs ends the cell, saying so; the next cell is fresh, and
	// is not Restarted (that was asked for).
	ended := sleeping(t, s, cc.ID)
	if err := s.Restart(ctxT(t, time.Minute), cc.ID); err != nil {
		t.Fatal(err)
	}
	if end := <-ended; !end.Died || end.Error == nil || end.Error.Value != "the context was restarted while the cell ran" {
		t.Fatalf("the cell under the restart: %+v %+v", end, end.Error)
	}
	if next := run(t, s, guest.Request{Context: cc.ID, Code: "'z' in globals()"}); next.text() != "False" || next.end.Restarted {
		t.Fatalf("after the restart: %q %+v", next.text(), next.end)
	}
	if err := s.Remove(cc.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := tryRun(t, s, guest.Request{Context: cc.ID, Code: "1"}); code(err) != guest.CodeNotFound {
		t.Fatalf("a removed context ran: %v", err)
	}
	if err := s.Remove(cc.ID); code(err) != guest.CodeNotFound {
		t.Fatalf("removed twice: %v", err)
	}
	if _, err := tryRun(t, s, guest.Request{Context: "elsewhere", Code: "1"}); err == nil || err.Error() != "lived elsewhere" {
		t.Fatalf("Unknown's error not given: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	// Made, then removed: its cells added no record (Create did).
	if want := []string{cc.ID + " false false", cc.ID + " false true"}; strings.Join(records, ",") != strings.Join(want, ",") {
		t.Fatalf("records %q, want %q", records, want)
	}
}

func TestLanguagesAndDefault(t *testing.T) {
	t.Parallel()
	s := newSet(t, Options{Lost: func(lang string) bool { return lang == "python" }}, nil)
	for lang, want := range map[string]string{"bash": guest.CodeUnsupported, "javascript": guest.CodeUnsupported, "cobol": guest.CodeInvalid} {
		if _, err := tryRun(t, s, guest.Request{Language: lang, Code: "1"}); code(err) != want {
			t.Errorf("%s: %v, want %s", lang, err, want)
		}
		if _, err := s.Create(ctxT(t, time.Minute), lang, "", nil); code(err) != want {
			t.Errorf("create %s: %v, want %s", lang, err, want)
		}
		if err := s.Warm(ctxT(t, time.Minute), lang, "", nil); code(err) != want {
			t.Errorf("warm %s: %v, want %s", lang, err, want)
		}
	}
	// Two first calls make one default context; Lost makes its first cell Restarted.
	ids := make(chan cell, 2)
	for range 2 {
		go func() { ids <- run(t, s, guest.Request{Language: "python", Code: "1"}) }()
	}
	a, b := <-ids, <-ids
	if a.end.Context != b.end.Context || a.end.Restarted == b.end.Restarted || a.end.ExecutionCount+b.end.ExecutionCount != 3 {
		t.Fatalf("two first calls: %+v and %+v", a.end, b.end)
	}
	if _, err := tryRun(t, s, guest.Request{Context: a.end.Context, Language: "bash", Code: "1"}); code(err) != guest.CodeInvalid {
		t.Fatalf("a python context asked for bash: %v", err)
	}
	if got := run(t, s, guest.Request{Context: a.end.Context, Language: "python", Code: "2"}); got.text() != "2" {
		t.Fatalf("a python context asked for python: %+v", got.end)
	}
}

func TestWarmSpare(t *testing.T) {
	t.Parallel()
	st := &starter{}
	s := newSet(t, Options{}, st)
	dir, env := os.TempDir(), map[string]string{"ROCHE_WARM": "1"}
	if err := s.Warm(ctxT(t, time.Minute), "python", dir, env); err != nil {
		t.Fatal(err)
	}
	spare := s.Spare()
	if spare == nil || len(s.List()) != 0 {
		t.Fatalf("after Warm: spare %v, contexts %+v", spare, s.List())
	}
	other, err := s.Create(ctxT(t, time.Minute), "python", dir, nil)
	if err != nil || s.Kernel(other.ID) == spare || s.Spare() != spare {
		t.Fatalf("a context with other env took the spare (%v)", err)
	}
	cc, err := s.Create(ctxT(t, time.Minute), "python", dir, map[string]string{"ROCHE_WARM": "1"})
	if err != nil || s.Kernel(cc.ID) != spare || s.Spare() != nil {
		t.Fatalf("the context started as the spare was did not take it (%v)", err)
	}
	if got := run(t, s, guest.Request{Context: cc.ID, Code: "import os\nos.environ['ROCHE_WARM']"}); got.text() != "'1'" || got.end.ExecutionCount != 1 {
		t.Fatalf("in the warmed context: %q %+v", got.text(), got.end)
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.started != 2 {
		t.Fatalf("%d kernels started, want 2 (the spare and the other context's)", st.started)
	}
}

func TestStop(t *testing.T) {
	t.Parallel()
	s := newSet(t, Options{}, nil)
	if err := s.Warm(ctxT(t, time.Minute), "python", "", nil); err != nil {
		t.Fatal(err)
	}
	spare := s.Spare()
	cc, err := s.Create(ctxT(t, time.Minute), "python", "", map[string]string{"OTHER": "1"})
	if err != nil {
		t.Fatal(err)
	}
	ended := sleeping(t, s, cc.ID)
	s.Stop()
	if end := <-ended; !end.Died || end.Error == nil || end.Error.Value != "the context was stopped with the sandbox while the cell ran" {
		t.Fatalf("the cell under the stop: %+v %+v", end, end.Error)
	}
	<-spare.Ended()
	if _, err := s.Create(ctxT(t, time.Minute), "python", "", nil); code(err) != guest.CodeStopping {
		t.Fatalf("a context made after the stop: %v", err)
	}
	if err := s.Warm(ctxT(t, time.Minute), "python", "", nil); code(err) != guest.CodeStopping || s.Spare() != nil {
		t.Fatalf("a spare made after the stop: %v", err)
	}
	if _, err := tryRun(t, s, guest.Request{Context: cc.ID, Code: "1"}); code(err) != guest.CodeStopping {
		t.Fatalf("a cell run after the stop: %v", err)
	}
}

func TestStartFails(t *testing.T) {
	t.Parallel()
	s := newSet(t, Options{}, &starter{argv: []string{"python3", "-c", "import sys; sys.stderr.write('too old'); sys.exit(2)"}})
	_, err := tryRun(t, s, guest.Request{Code: "1"})
	if err == nil || err.Error() != "the python kernel exited with status 2 at start: too old" {
		t.Fatalf("a kernel failing at start: %v", err)
	}
}

// TestReseed: after Reseed, a context whose random module was seeded (as every copy of a
// memory snapshot's would be, alike) draws numbers other than the seed's next ones,
// while a generator the program made itself keeps its state.
func TestReseed(t *testing.T) {
	t.Parallel()
	s := newSet(t, Options{}, nil)
	run(t, s, guest.Request{Code: "import random\nrandom.seed(7)\nmine = random.Random(7)\nrandom.random(), mine.random()"})
	// What the seeded generators draw next, unless reseeded.
	next := run(t, s, guest.Request{Code: "r = random.Random(7)\nr.random()\nr.random()"}).text()
	s.Reseed()
	if got := run(t, s, guest.Request{Code: "random.random()"}).text(); got == next {
		t.Fatalf("after Reseed the random module drew %s, the seed's next number: it was not reseeded", got)
	}
	if got := run(t, s, guest.Request{Code: "mine.random()"}).text(); got != next {
		t.Fatalf("after Reseed a program's own generator drew %s, want its next number %s", got, next)
	}
}
