package wasm

import (
	"context"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/internal/testenv"
)

// hostFDs counts this process's open descriptors: a guest's open files are among them.
func hostFDs(t *testing.T) int {
	t.Helper()
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(fds)
}

// holdOpen runs, in sandbox id, a program that opens files until refused (at most
// upTo) and holds them, and returns its first line ("ERRNO COUNT") once it holds them,
// with the function that ends it.
func holdOpen(t *testing.T, id string, upTo int) (string, func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	lines := make(chan string, 1)
	done := make(chan error, 1)
	go func() {
		_, err := tp.Exec(ctx, id, roche.ExecRequest{Cmd: []string{"python3", "-c", `
import errno, os, sys, time
open('/tmp/held', 'w').close()
fds = []
try:
    while len(fds) < int(sys.argv[1]):
        fds.append(os.open('/tmp/held', os.O_RDONLY))
    print('cap', len(fds), flush=True)
except OSError as e:
    print(errno.errorcode.get(e.errno, e.errno), len(fds), flush=True)
time.sleep(120)
`, strconv.Itoa(upTo)}, Timeout: 3 * time.Minute, Stdout: writerFunc(func(b []byte) {
			select {
			case lines <- strings.TrimSpace(string(b)):
			default:
			}
		})})
		done <- err
	}()
	stop := sync.OnceFunc(func() {
		cancel()
		<-done
	})
	select {
	case line := <-lines:
		return line, stop
	case err := <-done:
		cancel()
		t.Fatalf("the program holding files ended first: %v", err)
	case <-time.After(2 * time.Minute):
		stop()
		t.Fatal("the program holding files printed nothing in 2 minutes")
	}
	return "", nil
}

// A sandbox's guests may hold at most roche.DefaultOpenFiles files open, together, and
// each is a descriptor of this process: past the cap an open fails with EMFILE in the
// guest, the host's descriptors stay bounded, and a neighbour still opens files.
func TestOpenFilesCapped(t *testing.T) {
	testenv.Needs(t, testenv.PythonWasm)
	id := newSandbox(t, nil)
	neighbour := newSandbox(t, nil)
	before := hostFDs(t)
	line, stop := holdOpen(t, id, 5000)
	defer stop()
	during := hostFDs(t)
	t.Logf("the guest: %s; this process's descriptors: %d before, %d while it holds them", line, before, during)
	f := strings.Fields(line)
	if len(f) != 2 || f[0] != "EMFILE" {
		t.Fatalf("opening files until refused: %q, want EMFILE near %d", line, roche.DefaultOpenFiles)
	}
	n, _ := strconv.Atoi(f[1])
	if n > roche.DefaultOpenFiles || n < roche.DefaultOpenFiles-16 {
		t.Errorf("the guest held %d files, want just under the cap of %d (what python.wasm keeps open counts too)", n, roche.DefaultOpenFiles)
	}
	if held := tp.openFilesOf(id).held(); held != roche.DefaultOpenFiles {
		t.Errorf("the sandbox's count says %d files open, want the cap, %d", held, roche.DefaultOpenFiles)
	}
	// Some slack for what the runtime opens meanwhile; without the cap the guest held 5000.
	if during-before > roche.DefaultOpenFiles+64 {
		t.Errorf("this process's descriptors grew by %d while the guest held its files, want at most %d", during-before, roche.DefaultOpenFiles+64)
	}
	// The cap is the sandbox's, not one instance's: a second exec gets no file either
	// (CPython's start-up opens files, so it stops there, with EMFILE's message).
	if res := py(t, id, `print('started')`); res.ExitCode == 0 || !strings.Contains(res.Stderr, "No file descriptors available") {
		t.Errorf("a second exec while the sandbox holds its cap: %+v, want CPython stopped by EMFILE", res)
	}
	// The neighbour is not starved.
	if got := pyOK(t, neighbour, `
import os
open('/tmp/f', 'w').close()
fds = [os.open('/tmp/f', os.O_RDONLY) for _ in range(200)]
print(len(fds))
`); got != "200" {
		t.Errorf("the neighbour opening 200 files: %q", got)
	}
	stop()
	if held := tp.openFilesOf(id).held(); held != 0 {
		t.Errorf("%d files still counted open after the exec ended", held)
	}
	if after := hostFDs(t); after > before+16 {
		t.Errorf("this process holds %d descriptors after the exec ended, %d before", after, before)
	}
	if got := pyOK(t, id, `open('/tmp/held').close(); print('ok')`); got != "ok" {
		t.Errorf("opening a file once the holder ended: %q", got)
	}
}

// /tmp holds at most entriesFor(64 MiB) entries: empty files, directories and hard
// links cost no bytes but a host inode each, and past the count a create fails with
// ENOSPC, as on a tmpfs out of inodes; removing entries gives room back. The count
// starts, in every exec, from what the directory holds.
func TestTmpEntriesCapped(t *testing.T) {
	testenv.Needs(t, testenv.PythonWasm)
	id := newSandbox(t, nil)
	limit := entriesFor(roche.DefaultTmpSize)
	got := pyOK(t, id, `
import errno, os
def name(e): return errno.errorcode.get(e.errno, str(e.errno))
os.mkdir('/tmp/i')
n = 0
try:
    while n < 200000:
        os.close(os.open('/tmp/i/%d' % n, os.O_CREAT | os.O_WRONLY, 0o600)); n += 1
    print('cap', n)
except OSError as e:
    print(name(e), n)
for what, f in (('mkdir', lambda: os.mkdir('/tmp/d')), ('link', lambda: os.link('/tmp/i/0', '/tmp/l')),
                ('open', lambda: open('/tmp/o', 'w'))):
    try:
        f(); print(what, 'ok')
    except OSError as e:
        print(what, name(e))
# An existing file opened for writing is no new entry; a removed one gives its place.
open('/tmp/i/0', 'w').close(); print('reopen ok')
os.remove('/tmp/i/1')
os.mkdir('/tmp/d'); print('after remove ok')
`)
	lines := strings.Split(got, "\n")
	f := strings.Fields(lines[0])
	if len(f) != 2 || f[0] != "ENOSPC" {
		t.Fatalf("making empty files in /tmp: %q, want ENOSPC near %d", got, limit)
	}
	// /tmp also holds the directory i and whatever Python left there.
	if n, _ := strconv.Atoi(f[1]); int64(n) > limit-1 || int64(n) < limit-16 {
		t.Errorf("%d empty files made, want just under the %d entries of /tmp", n, limit)
	}
	want := []string{"mkdir ENOSPC", "link ENOSPC", "open ENOSPC", "reopen ok", "after remove ok"}
	if strings.Join(lines[1:], "\n") != strings.Join(want, "\n") {
		t.Errorf("at the limit:\n%s\nwant\n%s", strings.Join(lines[1:], "\n"), strings.Join(want, "\n"))
	}
	// The next exec starts from the full directory, and has room once it is emptied.
	if got := pyOK(t, id, `
import errno, os, shutil
try:
    open('/tmp/one-more', 'w'); print('made')
except OSError as e:
    print(errno.errorcode.get(e.errno, e.errno))
shutil.rmtree('/tmp/i')
for i in range(1000): open('/tmp/again%d' % i, 'w').close()
print('after rmtree ok')`); got != "ENOSPC\nafter rmtree ok" {
		t.Errorf("an exec that starts with /tmp full: %q, want ENOSPC, then room once emptied", got)
	}
}
