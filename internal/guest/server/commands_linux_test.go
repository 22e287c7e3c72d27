package server_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/roche-sandbox/roche/internal/guest"
	"github.com/roche-sandbox/roche/internal/guest/server"
	"github.com/roche-sandbox/roche/internal/testenv"
)

// followed is what one Connect saw: where it started, each stream, and the order of
// the frames across streams.
type followed struct {
	mu       sync.Mutex
	from     *guest.Offsets
	existing bool
	stdout   bytes.Buffer
	stderr   bytes.Buffer
	order    strings.Builder // "o" or "e" per frame
}

func (f *followed) opts() guest.ExecOptions {
	return guest.ExecOptions{
		Started: func(st guest.Started) { f.mu.Lock(); f.from, f.existing = st.From, st.Existing; f.mu.Unlock() },
		Stdout:  writerFunc(func(p []byte) { f.mu.Lock(); f.stdout.Write(p); f.order.WriteString("o"); f.mu.Unlock() }),
		Stderr:  writerFunc(func(p []byte) { f.mu.Lock(); f.stderr.Write(p); f.order.WriteString("e"); f.mu.Unlock() }),
	}
}

func connect(t *testing.T, c *guest.Client, req guest.Request) (*followed, guest.Result, error) {
	t.Helper()
	f := &followed{}
	res, err := c.Connect(ctxT(t, 30*time.Second), req, f.opts())
	return f, res, err
}

func start(t *testing.T, c *guest.Client, req guest.Request) int {
	t.Helper()
	st, err := c.Start(ctxT(t, 10*time.Second), req)
	if err != nil {
		t.Fatalf("start %q: %v", req.Cmd, err)
	}
	t.Cleanup(func() { _ = c.Signal(context.Background(), st.PID, int(syscall.SIGKILL)) })
	return st.PID
}

// TestDurableOffsets: a background command's output is replayed from any offsets still
// kept, each stream exactly from there on, interleaved as it was written.
func TestDurableOffsets(t *testing.T) {
	testenv.Needs(t, testenv.Root)
	pid := start(t, client, guest.Request{Cmd: []string{"sh", "-c",
		`for i in $(seq 1 40); do echo out$i; echo err$i >&2; done; exit 3`}})
	all, res, err := connect(t, client, guest.Request{PID: pid, From: &guest.Offsets{}})
	if err != nil {
		t.Fatal(err)
	}
	var wantOut, wantErr strings.Builder
	for i := 1; i <= 40; i++ {
		fmt.Fprintf(&wantOut, "out%d\n", i)
		fmt.Fprintf(&wantErr, "err%d\n", i)
	}
	if res.ExitCode != 3 || all.stdout.String() != wantOut.String() || all.stderr.String() != wantErr.String() {
		t.Fatalf("from 0: exit %d stdout %q stderr %q", res.ExitCode, all.stdout.String(), all.stderr.String())
	}
	if *all.from != (guest.Offsets{}) {
		t.Errorf("from 0 started at %+v", *all.from)
	}

	// From the middle of each stream: exactly the rest of each.
	from := guest.Offsets{Stdout: int64(len("out1\nout2\n")), Stderr: int64(len("err1\n"))}
	mid, res, err := connect(t, client, guest.Request{PID: pid, From: &from})
	if err != nil || res.ExitCode != 3 {
		t.Fatalf("from %+v: %v exit %d", from, err, res.ExitCode)
	}
	if mid.stdout.String() != wantOut.String()[from.Stdout:] || mid.stderr.String() != wantErr.String()[from.Stderr:] {
		t.Errorf("from %+v: stdout %q stderr %q", from, mid.stdout.String(), mid.stderr.String())
	}
	// From the current end (a negative offset): nothing, then the result.
	end, res, err := connect(t, client, guest.Request{PID: pid, From: &guest.Offsets{Stdout: -1, Stderr: -1}})
	if err != nil || res.ExitCode != 3 || end.stdout.Len()+end.stderr.Len() != 0 {
		t.Errorf("from the end: %v exit %d output %q %q", err, res.ExitCode, end.stdout.String(), end.stderr.String())
	}
	if end.from.Stdout != int64(wantOut.Len()) || end.from.Stderr != int64(wantErr.Len()) {
		t.Errorf("from the end started at %+v, want the streams' lengths", *end.from)
	}
	// Past the end: refused, not an empty replay.
	if _, _, err := connect(t, client, guest.Request{PID: pid, From: &guest.Offsets{Stdout: 1 << 20}}); codeOf(err) != guest.CodeInvalid {
		t.Errorf("from past the end: %v, want invalid", err)
	}
}

// TestDurableInterleaved: a replay interleaves the streams as the agent read them.
func TestDurableInterleaved(t *testing.T) {
	testenv.Needs(t, testenv.Root)
	pid := start(t, client, guest.Request{Cmd: []string{"sh", "-c",
		`for i in 1 2 3; do echo out$i; sleep 0.05; echo err$i >&2; sleep 0.05; done`}})
	waitEnded(t, client, pid)
	f, _, err := connect(t, client, guest.Request{PID: pid, From: &guest.Offsets{}})
	if err != nil {
		t.Fatal(err)
	}
	if o := f.order.String(); o != "oeoeoe" {
		t.Errorf("frames %q, want oeoeoe: the streams were not interleaved as written", o)
	}
}

// waitEnded waits until the command pid is listed as ended.
func waitEnded(t *testing.T, c *guest.Client, pid int) guest.Process {
	t.Helper()
	return waitListed(t, c, pid, func(p guest.Process) bool { return !p.Running })
}

// waitListed waits until the command pid is listed as cond wants it.
func waitListed(t *testing.T, c *guest.Client, pid int, cond func(guest.Process) bool) guest.Process {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		list, err := c.Processes(ctxT(t, 10*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range list {
			if p.PID == pid && cond(p) {
				return p
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("command %d never listed as wanted: %+v", pid, list)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestDurableLive: followers that connect while the command runs get what was written
// before and what follows, each once, in order.
func TestDurableLive(t *testing.T) {
	testenv.Needs(t, testenv.Root)
	dir := scratch(t)
	gate := filepath.Join(dir, "go")
	pid := start(t, client, guest.Request{Cmd: []string{"sh", "-c",
		`echo before; while [ ! -e ` + gate + ` ]; do sleep 0.05; done; for i in 1 2 3; do echo after$i; sleep 0.05; done`}})
	var wg sync.WaitGroup
	got := make([]*followed, 3)
	for i := range got {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f, res, err := connect(t, client, guest.Request{PID: pid, From: &guest.Offsets{}})
			if err != nil || res.ExitCode != 0 {
				t.Errorf("follower %d: %v exit %d", i, err, res.ExitCode)
			}
			got[i] = f
		}()
	}
	time.Sleep(200 * time.Millisecond) // the followers wait on the gate, not on this
	if err := os.WriteFile(gate, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	for i, f := range got {
		if f != nil && f.stdout.String() != "before\nafter1\nafter2\nafter3\n" {
			t.Errorf("follower %d saw %q", i, f.stdout.String())
		}
	}
}

// TestDurableWindow: past its window, a command's oldest output is gone, and asking
// for it is a clear error naming the first offset still kept, never a silent skip.
func TestDurableWindow(t *testing.T) {
	testenv.Needs(t, testenv.Root)
	const window = 4096
	pid := start(t, client, guest.Request{Window: window, Cmd: []string{"sh", "-c",
		`i=0; while [ $i -lt 2000 ]; do printf '%05d\n' $i; i=$((i+1)); done`}})
	waitEnded(t, client, pid)
	const total = 2000 * 6
	_, _, err := connect(t, client, guest.Request{PID: pid, From: &guest.Offsets{}})
	var ge *guest.Error
	if !errors.As(err, &ge) || ge.Code != guest.CodeGone || ge.Kept == nil || ge.Kept.Stdout != total-window {
		t.Fatalf("from 0 past the window: %v (%+v), want gone with the first kept at %d", err, ge, total-window)
	}
	if !strings.Contains(ge.Message, fmt.Sprint(total-window)) || !strings.Contains(ge.Message, "stdout") {
		t.Errorf("the error does not name the stream and the first offset kept: %q", ge.Message)
	}
	f, _, err := connect(t, client, guest.Request{PID: pid, From: ge.Kept})
	if err != nil {
		t.Fatal(err)
	}
	var want strings.Builder
	for i := 0; i < 2000; i++ {
		fmt.Fprintf(&want, "%05d\n", i)
	}
	if f.stdout.String() != want.String()[total-window:] {
		t.Errorf("from the first kept: %d bytes, want the last %d exactly", f.stdout.Len(), window)
	}
	list, err := client.Processes(ctxT(t, 10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range list {
		if p.PID == pid && (p.First.Stdout != total-window || p.End.Stdout != total || p.Window != window) {
			t.Errorf("listed %+v, want first %d end %d window %d", p, total-window, total, window)
		}
	}
	if _, err := client.Start(ctxT(t, 10*time.Second), guest.Request{Window: guest.MaxWindow + 1, Cmd: []string{"true"}}); codeOf(err) != guest.CodeInvalid {
		t.Errorf("a window over the maximum: %v, want invalid", err)
	}
}

// TestDurableStdin: a command started with stdin open reads what is sent until it is
// closed; one started without refuses input.
func TestDurableStdin(t *testing.T) {
	testenv.Needs(t, testenv.Root)
	ctx := ctxT(t, 30*time.Second)
	pid := start(t, client, guest.Request{Stdin: true, Cmd: []string{"sh", "-c",
		`while read l; do echo got:$l; done; echo eof; exit 4`}})
	sel := guest.Selector{PID: pid}
	for _, line := range []string{"a\n", "b\n"} {
		if err := client.SendInput(ctx, sel, []byte(line), false); err != nil {
			t.Fatal(err)
		}
	}
	if err := client.SendInput(ctx, sel, nil, true); err != nil {
		t.Fatal(err)
	}
	f, res, err := connect(t, client, guest.Request{PID: pid})
	if err != nil || res.ExitCode != 4 || f.stdout.String() != "got:a\ngot:b\neof\n" {
		t.Fatalf("%v exit %d output %q", err, res.ExitCode, f.stdout.String())
	}
	if err := client.SendInput(ctx, sel, []byte("late"), false); codeOf(err) != guest.CodeNotFound {
		t.Errorf("input to an ended command: %v, want not found", err)
	}
	other := start(t, client, guest.Request{Cmd: []string{"sleep", "30"}})
	if err := client.SendInput(ctx, guest.Selector{PID: other}, []byte("x"), false); codeOf(err) != guest.CodeInvalid {
		t.Errorf("input to a command without stdin: %v, want invalid", err)
	}
	if err := client.SendInput(ctx, guest.Selector{PID: other}, nil, true); codeOf(err) != guest.CodeInvalid {
		t.Errorf("closing the stdin of a command without: %v, want invalid", err)
	}
}

// TestDurableTagsAndSignals: commands found by tag, listed with what they were started
// with; a signal reaches the process group; a death by signal says which.
func TestDurableTagsAndSignals(t *testing.T) {
	testenv.Needs(t, testenv.Root)
	ctx := ctxT(t, 30*time.Second)
	dir := scratch(t)
	pid := start(t, client, guest.Request{Tag: "server", Cwd: dir, Env: map[string]string{"GREETING": "hi"}, Cmd: []string{"sh", "-c",
		`trap 'echo term; exit 9' TERM; echo $GREETING; pwd; while :; do sleep 0.05; done`}})
	// Once it printed, its trap is set.
	p := waitListed(t, client, pid, func(p guest.Process) bool { return p.End.Stdout > 0 })
	if p.Tag != "server" || p.Cwd != dir || p.Env["GREETING"] != "hi" || !p.Running || p.StartedNS == 0 || p.Stdin {
		t.Errorf("listed %+v", p)
	}
	if err := client.SignalCommand(ctx, guest.Selector{Tag: "server"}, int(syscall.SIGTERM)); err != nil {
		t.Fatal(err)
	}
	f, res, err := connect(t, client, guest.Request{Tag: "server"})
	if err != nil || res.ExitCode != 9 || res.Signal != 0 || f.stdout.String() != "hi\n"+dir+"\nterm\n" {
		t.Fatalf("by tag: %v %+v output %q", err, res, f.stdout.String())
	}
	killed := start(t, client, guest.Request{Cmd: []string{"sleep", "30"}})
	if err := client.SignalCommand(ctx, guest.Selector{PID: killed}, int(syscall.SIGKILL)); err != nil {
		t.Fatal(err)
	}
	if _, res, err := connect(t, client, guest.Request{PID: killed}); err != nil || res.Signal != 9 || res.ExitCode != 137 {
		t.Errorf("killed: %v %+v, want signal 9 and exit 137", err, res)
	}
	if _, _, err := connect(t, client, guest.Request{Tag: "no-such-tag"}); codeOf(err) != guest.CodeNotFound {
		t.Errorf("an unknown tag: %v, want not found", err)
	}
}

// TestIdempotencyKey: a keyed exec whose connection dropped keeps running, and its
// retry joins it (output from the start, the real result) instead of starting it twice.
func TestIdempotencyKey(t *testing.T) {
	testenv.Needs(t, testenv.Root)
	dir := scratch(t)
	count := filepath.Join(dir, "count")
	req := guest.Request{Key: "run-" + t.Name(), Cmd: []string{"sh", "-c",
		`echo x >> ` + count + `; echo started; sleep 0.5; echo done; exit 6`}}
	ctx, drop := context.WithCancel(context.Background())
	seen := make(chan struct{})
	var once sync.Once
	go func() {
		_, _ = client.Exec(ctx, req, guest.ExecOptions{Stdout: writerFunc(func([]byte) { once.Do(func() { close(seen) }) })})
	}()
	<-seen
	drop()
	var out bytes.Buffer
	var joined bool
	res, err := client.Exec(ctxT(t, 30*time.Second), req, guest.ExecOptions{
		Stdout: &out, Started: func(st guest.Started) { joined = st.Existing },
	})
	if err != nil || res.ExitCode != 6 || out.String() != "started\ndone\n" || !joined {
		t.Fatalf("retry: %v exit %d output %q joined %v", err, res.ExitCode, out.String(), joined)
	}
	if b, _ := os.ReadFile(count); string(b) != "x\n" {
		t.Errorf("the command ran %d times, want once", strings.Count(string(b), "x"))
	}
	// Background starts with one key: one command.
	key := guest.Request{Key: "bg-" + t.Name(), Cmd: []string{"sleep", "30"}}
	first := start(t, client, key)
	again, err := client.Start(ctxT(t, 10*time.Second), key)
	if err != nil || again.PID != first || !again.Existing {
		t.Errorf("a second start with the key: %v %+v, want pid %d existing", err, again, first)
	}
}

// TestIdempotencyKeyWhileRunning: the retry of a keyed exec that is still running joins it.
func TestIdempotencyKeyWhileRunning(t *testing.T) {
	testenv.Needs(t, testenv.Root)
	req := guest.Request{Key: "running-" + t.Name(), Cmd: []string{"sh", "-c", `echo one; sleep 0.5; echo two`}}
	ctx, drop := context.WithCancel(context.Background())
	first := make(chan struct{})
	var once sync.Once
	go func() {
		_, _ = client.Exec(ctx, req, guest.ExecOptions{Stdout: writerFunc(func([]byte) { once.Do(func() { close(first) }) })})
	}()
	<-first
	drop()
	var out bytes.Buffer
	res, err := client.Exec(ctxT(t, 30*time.Second), req, guest.ExecOptions{Stdout: &out})
	if err != nil || res.ExitCode != 0 || out.String() != "one\ntwo\n" {
		t.Fatalf("retry: %v exit %d output %q", err, res.ExitCode, out.String())
	}
}

// TestDurableBounds: at most guest.MaxDurable durable commands run at once.
func TestDurableBounds(t *testing.T) {
	testenv.Needs(t, testenv.Root)
	for range guest.MaxDurable - runningDurable(t) {
		start(t, client, guest.Request{Cmd: []string{"sleep", "60"}})
	}
	_, err := client.Start(ctxT(t, 10*time.Second), guest.Request{Cmd: []string{"sleep", "60"}})
	if codeOf(err) != guest.CodeExhausted {
		t.Errorf("one more background command: %v, want exhausted", err)
	}
}

func runningDurable(t *testing.T) int {
	list, err := client.Processes(ctxT(t, 10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, p := range list {
		if p.Running {
			n++
		}
	}
	return n
}

// TestDurableBudgetAndStop: on an agent that keeps little output in all, the finished
// commands' output goes first (asking for it says so); when the sandbox stops, a
// follower hears that the exit status is not the command's own.
func TestDurableBudgetAndStop(t *testing.T) {
	testenv.Needs(t, testenv.Root)
	sock := filepath.Join(t.TempDir(), "agent.sock")
	srv, err := server.New(server.Config{Socket: sock, User: fmt.Sprintf("%d:%d", sandboxUser, sandboxUser), KeptOutput: 64 << 10})
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Run(ctx); err != nil {
			t.Errorf("agent: %v", err)
		}
	}()
	defer func() { stop(); <-done }()
	c := guest.NewClient(sock)
	if err := c.WaitReady(ctxT(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	old := start(t, c, guest.Request{Cmd: []string{"head", "-c", "40000", "/dev/zero"}})
	if _, _, err := connect(t, c, guest.Request{PID: old}); err != nil {
		t.Fatal(err)
	}
	newer := start(t, c, guest.Request{Cmd: []string{"sh", "-c", "head -c 40000 /dev/zero; echo; sleep 60"}})
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, _, err := connect(t, c, guest.Request{PID: old, From: &guest.Offsets{}})
		var ge *guest.Error
		if errors.As(err, &ge) && ge.Code == guest.CodeGone && ge.Kept.Stdout == 40000 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the finished command's output was not dropped for the newer one's: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	f := &followed{}
	ended := make(chan error, 1)
	go func() {
		_, err := c.Connect(context.Background(), guest.Request{PID: newer, From: &guest.Offsets{Stdout: -1}}, f.opts())
		ended <- err
	}()
	time.Sleep(100 * time.Millisecond) // the follower waits for output, not for this
	stop()
	select {
	case err := <-ended:
		if codeOf(err) != guest.CodeStopping {
			t.Errorf("a follower of a command its sandbox's stop ended: %v, want stopping", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the follower did not hear the stop")
	}
}
