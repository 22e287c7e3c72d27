package server_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/roche-sandbox/roche/internal/guest"
	"github.com/roche-sandbox/roche/internal/guest/server"
	"github.com/roche-sandbox/roche/internal/testenv"
)

// scratch makes a directory for one test below the sandbox user's tree.
func scratch(t *testing.T) string {
	t.Helper()
	d := filepath.Join(dir, strings.ReplaceAll(t.Name(), "/", "_"))
	if err := os.Mkdir(d, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(d, sandboxUser, sandboxUser); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

// asSandboxUser makes p (made by the test as root) the sandbox user's.
func asSandboxUser(t *testing.T, p string) {
	t.Helper()
	if err := os.Lchown(p, sandboxUser, sandboxUser); err != nil {
		t.Fatal(err)
	}
}

func walkAll(t *testing.T, p string, depth, max int) ([]guest.FileInfo, error) {
	t.Helper()
	var out []guest.FileInfo
	err := client.Walk(ctxT(t, 30*time.Second), p, depth, max, func(b []guest.FileInfo) error {
		out = append(out, b...)
		return nil
	})
	return out, err
}

func TestWalkDepthAndEntries(t *testing.T) {
	testenv.Needs(t, testenv.Root)
	base := scratch(t)
	ctx := ctxT(t, 30*time.Second)
	for _, f := range []string{"a/b/c/deep.txt", "a/one.txt", "z.txt"} {
		if err := client.WriteFile(ctx, filepath.Join(base, f), strings.NewReader("x"), 0o600, true); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("/etc", filepath.Join(base, "a", "etc-link")); err != nil {
		t.Fatal(err)
	}
	asSandboxUser(t, filepath.Join(base, "a", "etc-link"))
	if err := os.WriteFile(filepath.Join(base, "rootfile"), []byte("r"), 0o644); err != nil {
		t.Fatal(err)
	}
	names := func(list []guest.FileInfo) string {
		var out []string
		for _, fi := range list {
			out = append(out, strings.TrimPrefix(fi.Path, base+"/"))
		}
		return strings.Join(out, " ")
	}
	for depth, want := range map[int]string{
		1: "a rootfile z.txt",
		2: "a rootfile z.txt a/b a/etc-link a/one.txt",
		4: "a rootfile z.txt a/b a/etc-link a/one.txt a/b/c a/b/c/deep.txt",
	} {
		list, err := walkAll(t, base, depth, 0)
		if err != nil {
			t.Fatal(err)
		}
		if got := names(list); got != want {
			t.Errorf("depth %d: %q, want %q (the symlink listed, not entered)", depth, got, want)
		}
	}
	list, err := walkAll(t, base, 2, 0)
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]guest.FileInfo{}
	for _, fi := range list {
		byName[strings.TrimPrefix(fi.Path, base+"/")] = fi
	}
	if fi := byName["a/etc-link"]; fi.Type != guest.TypeSymlink || fi.Symlink != "/etc" {
		t.Errorf("symlink entry %+v, want type symlink to /etc", fi)
	}
	if fi := byName["a"]; fi.Type != guest.TypeDir || !fi.IsDir || fi.UID != sandboxUser {
		t.Errorf("directory entry %+v", fi)
	}
	if fi := byName["z.txt"]; fi.Type != guest.TypeFile || fi.Mode != 0o600 || fi.Size != 1 || fi.ModTimeNS == 0 {
		t.Errorf("file entry %+v", fi)
	}
	if fi := byName["rootfile"]; fi.Owner != "root" || fi.Group != "root" || fi.UID != 0 {
		t.Errorf("a root-owned file's owner %q group %q uid %d, want root's names from /etc/passwd", fi.Owner, fi.Group, fi.UID)
	}
	if _, err := walkAll(t, base, 4, 3); codeOf(err) != guest.CodeTooLarge {
		t.Errorf("a walk past its entry cap: %v, want %s", err, guest.CodeTooLarge)
	}
	if _, err := walkAll(t, filepath.Join(base, "a", "etc-link"), 1, 0); codeOf(err) != guest.CodePermission {
		t.Errorf("walking a symlink: %v, want permission (not followed)", err)
	}
	if _, err := walkAll(t, filepath.Join(base, "z.txt"), 1, 0); codeOf(err) != guest.CodeInvalid {
		t.Errorf("walking a file: %v, want invalid", err)
	}
}

// TestReadRefusesWhatIsNotAFile: a FIFO (a read would wait for a writer forever), a
// device node (it could stream forever) and /proc (the agent's own entries) are refused
// at once with a clear error, and a file that grows while it is read is read to the size
// it had when the read began.
func TestReadRefusesWhatIsNotAFile(t *testing.T) {
	testenv.Needs(t, testenv.Root)
	base := scratch(t)
	fifo := filepath.Join(base, "fifo")
	if err := syscall.Mkfifo(fifo, 0o666); err != nil {
		t.Fatal(err)
	}
	asSandboxUser(t, fifo)
	for _, c := range []struct{ path, code, says string }{
		{fifo, guest.CodeInvalid, "is a fifo, not a regular file"},
		{"/dev/zero", guest.CodeInvalid, "is a device, not a regular file"},
		{"/proc/self/environ", guest.CodePermission, "/proc/self is a symlink"},
		{fmt.Sprintf("/proc/%d/environ", os.Getpid()), guest.CodePermission, "is in /proc"},
		{fmt.Sprintf("/proc/%d/mem", os.Getpid()), guest.CodePermission, "is in /proc"},
		// World-readable: only the refusal of /proc keeps it unread.
		{fmt.Sprintf("/proc/%d/status", os.Getpid()), guest.CodePermission, "is in /proc"},
		{fmt.Sprintf("/proc/%d/cmdline", os.Getpid()), guest.CodePermission, "is in /proc"},
		{base, guest.CodeInvalid, "is a directory"},
	} {
		var sink bytes.Buffer
		err := client.ReadFile(ctxT(t, 10*time.Second), c.path, &sink)
		if codeOf(err) != c.code || !strings.Contains(fmt.Sprint(err), c.says) {
			t.Errorf("read %s: %v, want code %s saying %q", c.path, err, c.code, c.says)
		}
		if sink.Len() != 0 {
			t.Errorf("read %s sent %d bytes", c.path, sink.Len())
		}
	}
	// Writes are refused the same way, and leave the FIFO as it was.
	err := client.WriteFile(ctxT(t, 10*time.Second), fifo, strings.NewReader("x"), 0o644, false)
	if codeOf(err) != guest.CodeInvalid || !strings.Contains(err.Error(), "fifo") {
		t.Errorf("write to a FIFO: %v, want it refused as not a regular file", err)
	}
	if fi, err := os.Lstat(fifo); err != nil || fi.Mode()&os.ModeNamedPipe == 0 {
		t.Errorf("the FIFO after a refused write: %v %v", fi, err)
	}

	// A file growing as fast as it can while read.
	growing := filepath.Join(base, "growing")
	if err := os.WriteFile(growing, bytes.Repeat([]byte("a"), 8<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	asSandboxUser(t, growing)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		f, err := os.OpenFile(growing, os.O_APPEND|os.O_WRONLY, 0)
		if err != nil {
			return
		}
		defer f.Close()
		chunk := bytes.Repeat([]byte("b"), 1<<20)
		for {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := f.Write(chunk); err != nil {
				return
			}
		}
	}()
	defer func() { close(stop); wg.Wait() }()
	time.Sleep(20 * time.Millisecond) // let it start growing
	var got countWriter
	if err := client.ReadFile(ctxT(t, 60*time.Second), growing, &got); err != nil {
		t.Fatalf("reading a growing file: %v", err)
	}
	if got.n < 8<<20 {
		t.Errorf("read %d bytes of a growing file, want at least the 8 MiB it started with", got.n)
	}
	t.Logf("read %d bytes of a file growing while read", got.n)

	// The caller's cap refuses a larger file before any of it is sent.
	var sink countWriter
	err = client.ReadFileLimit(ctxT(t, 10*time.Second), growing, &sink, 1<<20)
	if codeOf(err) != guest.CodeTooLarge || sink.n != 0 {
		t.Errorf("read over the cap: %v after %d bytes, want %s before any", err, sink.n, guest.CodeTooLarge)
	}
}

type countWriter struct{ n int64 }

func (c *countWriter) Write(p []byte) (int, error) { c.n += int64(len(p)); return len(p), nil }

// TestSymlinkSwapRace: the sandboxed code swaps a directory for a symlink to a victim
// directory, as fast as it can, while files are written into, read from and listed in
// it; nothing reaches the victim, with openat2 and with the component walk of kernels
// without it.
func TestSymlinkSwapRace(t *testing.T) {
	testenv.Needs(t, testenv.Root)
	for _, noOpenat2 := range []bool{false, true} {
		t.Run(fmt.Sprintf("openat2=%v", !noOpenat2), func(t *testing.T) {
			prev := server.SetOpenat2Missing(noOpenat2)
			defer server.SetOpenat2Missing(prev)
			base := scratch(t)
			// The victim is the sandbox user's own, so only the no-follow rule keeps the
			// writes out of it (permissions would not).
			victim := filepath.Join(base, "victim")
			if err := os.Mkdir(victim, 0o755); err != nil {
				t.Fatal(err)
			}
			asSandboxUser(t, victim)
			if err := os.WriteFile(filepath.Join(victim, "secret"), []byte("victim"), 0o644); err != nil {
				t.Fatal(err)
			}
			asSandboxUser(t, filepath.Join(victim, "secret"))
			// "d" is a real directory and "spare" a link to the victim; they are exchanged
			// atomically (renameat2 RENAME_EXCHANGE), over and over.
			swapped, spare := filepath.Join(base, "d"), filepath.Join(base, "spare")
			if err := os.Mkdir(swapped, 0o755); err != nil {
				t.Fatal(err)
			}
			asSandboxUser(t, swapped)
			if err := os.Symlink(victim, spare); err != nil {
				t.Fatal(err)
			}
			asSandboxUser(t, spare)
			stop := make(chan struct{})
			var swaps atomic.Int64
			var wg sync.WaitGroup
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					select {
					case <-stop:
						return
					default:
					}
					if unix.Renameat2(unix.AT_FDCWD, swapped, unix.AT_FDCWD, spare, unix.RENAME_EXCHANGE) == nil {
						swaps.Add(1)
					}
				}
			}()
			ctx := ctxT(t, 60*time.Second)
			var refusedByLink, wrote int
			for i := 0; i < 300; i++ {
				err := client.WriteFile(ctx, filepath.Join(swapped, "secret"), strings.NewReader("overwritten"), 0o644, false)
				switch {
				case err == nil:
					wrote++
				case codeOf(err) == guest.CodePermission:
					refusedByLink++
				}
				var sink bytes.Buffer
				_ = client.ReadFile(ctx, filepath.Join(swapped, "secret"), &sink)
				if strings.Contains(sink.String(), "victim") {
					t.Fatalf("read the victim's file through the swapped-in symlink (round %d)", i)
				}
				list, _ := client.List(ctx, swapped)
				for _, fi := range list {
					if fi.Name == "secret" && fi.Size == int64(len("victim")) {
						t.Fatalf("listed the victim's directory through the swapped-in symlink (round %d)", i)
					}
				}
			}
			close(stop)
			wg.Wait()
			if b, _ := os.ReadFile(filepath.Join(victim, "secret")); string(b) != "victim" {
				t.Fatalf("the victim's file was overwritten through the symlink: %q", b)
			}
			if refusedByLink == 0 || wrote == 0 {
				t.Fatalf("the race was not mounted both ways (%d writes, %d refused for the link, %d swaps)", wrote, refusedByLink, swaps.Load())
			}
			t.Logf("%d swaps; %d writes landed in the real directory, %d refused as through a symlink", swaps.Load(), wrote, refusedByLink)
		})
	}
}

// TestWriteFailsCleanly: a write past the filesystem's space fails with no_space and
// leaves no file; one cut short by its client leaves none either.
func TestWriteFailsCleanly(t *testing.T) {
	testenv.Needs(t, testenv.Root)
	base := scratch(t)
	small := filepath.Join(base, "small")
	if err := os.Mkdir(small, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("tmpfs", small, "tmpfs", 0, fmt.Sprintf("size=1m,uid=%d,gid=%d", sandboxUser, sandboxUser)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Unmount(small, syscall.MNT_DETACH) })
	target := filepath.Join(small, "big.bin")
	err := client.WriteFile(ctxT(t, 30*time.Second), target, bytes.NewReader(make([]byte, 4<<20)), 0o644, false)
	if codeOf(err) != guest.CodeNoSpace {
		t.Fatalf("writing 4 MiB into 1 MiB: %v, want %s", err, guest.CodeNoSpace)
	}
	if _, err := os.Lstat(target); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the failed write left %s: %v", target, err)
	}
	// The space is free again: a write that fits succeeds.
	if err := client.WriteFile(ctxT(t, 30*time.Second), target, bytes.NewReader(make([]byte, 512<<10)), 0o644, false); err != nil {
		t.Errorf("a write that fits after the failed one: %v", err)
	}

	cut := filepath.Join(base, "cut.bin")
	ctx, cancel := context.WithCancel(context.Background())
	r := &cancelAfter{n: 2 << 20, cancel: cancel}
	if err := client.WriteFile(ctx, cut, r, 0o644, false); err == nil {
		t.Fatal("a write whose client went away succeeded")
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, err := os.Lstat(cut); errors.Is(err, os.ErrNotExist) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("a write cut short left its file")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// cancelAfter reads zeros, then cancels its call after n bytes and blocks until then.
type cancelAfter struct {
	n      int
	cancel func()
}

func (c *cancelAfter) Read(p []byte) (int, error) {
	if c.n <= 0 {
		c.cancel()
		time.Sleep(50 * time.Millisecond)
		return 0, io.ErrUnexpectedEOF
	}
	n := min(len(p), c.n)
	clear(p[:n])
	c.n -= n
	return n, nil
}

func TestMkdirCreatedAndRenameRemove(t *testing.T) {
	testenv.Needs(t, testenv.Root)
	base := scratch(t)
	ctx := ctxT(t, 30*time.Second)
	made, err := client.MkdirCreated(ctx, filepath.Join(base, "x", "y"), true)
	if err != nil || !made {
		t.Fatalf("mkdir -p of a new directory: made %v, %v", made, err)
	}
	made, err = client.MkdirCreated(ctx, filepath.Join(base, "x", "y"), true)
	if err != nil || made {
		t.Fatalf("mkdir -p of an existing directory: made %v, %v, want false, nil", made, err)
	}
	if err := client.WriteFile(ctx, filepath.Join(base, "f"), strings.NewReader("x"), 0o644, false); err != nil {
		t.Fatal(err)
	}
	if _, err := client.MkdirCreated(ctx, filepath.Join(base, "f"), true); codeOf(err) != guest.CodeInvalid {
		t.Errorf("mkdir over a file: %v, want invalid", err)
	}
	if err := os.Symlink(base, filepath.Join(base, "loop")); err != nil {
		t.Fatal(err)
	}
	asSandboxUser(t, filepath.Join(base, "loop"))
	if _, err := client.MkdirCreated(ctx, filepath.Join(base, "loop", "z"), true); codeOf(err) != guest.CodePermission {
		t.Errorf("mkdir -p through a symlink: %v, want permission", err)
	}
	// A rename or remove of a symlink acts on the link, never on what it points to.
	if err := client.Rename(ctx, filepath.Join(base, "loop"), filepath.Join(base, "loop2")); err != nil {
		t.Fatal(err)
	}
	if err := client.Remove(ctx, filepath.Join(base, "loop2"), true); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(base, "x", "y")); err != nil {
		t.Errorf("removing a symlink to the tree removed the tree: %v", err)
	}
	if err := client.Remove(ctx, "/", true); codeOf(err) != guest.CodePermission {
		t.Errorf("remove /: %v, want it refused", err)
	}
	if err := client.Rename(ctx, filepath.Join(base, "missing"), filepath.Join(base, "m2")); codeOf(err) != guest.CodeNotFound {
		t.Errorf("rename of a missing path: %v, want not found", err)
	}
}

// watchCollector gathers a watch's events.
type watchCollector struct {
	mu     sync.Mutex
	events []guest.FileEvent
	more   chan struct{}
}

func newCollector() *watchCollector { return &watchCollector{more: make(chan struct{}, 1)} }

func (w *watchCollector) add(b []guest.FileEvent) error {
	w.mu.Lock()
	w.events = append(w.events, b...)
	w.mu.Unlock()
	select {
	case w.more <- struct{}{}:
	default:
	}
	return nil
}

// waitFor waits until an event (name, op) has arrived.
func (w *watchCollector) waitFor(t *testing.T, name, op string) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		w.mu.Lock()
		found := slices.Contains(w.events, guest.FileEvent{Name: name, Op: op})
		got := fmt.Sprintf("%d events, the last %v", len(w.events), w.events[max(0, len(w.events)-5):])
		w.mu.Unlock()
		if found {
			return
		}
		select {
		case <-w.more:
		case <-deadline:
			t.Fatalf("no %s event for %q; got %s", op, name, got)
		}
	}
}

// startWatch starts a watch and waits until it is in place.
func startWatch(t *testing.T, p string, recursive bool) (*watchCollector, chan error, context.CancelFunc) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	col := newCollector()
	started := make(chan struct{})
	done := make(chan error, 1)
	go func() { done <- client.Watch(ctx, p, recursive, func() { close(started) }, col.add) }()
	select {
	case <-started:
	case err := <-done:
		cancel()
		t.Fatalf("watch of %s: %v", p, err)
	}
	t.Cleanup(func() { cancel(); <-done })
	return col, done, cancel
}

func TestWatch(t *testing.T) {
	testenv.Needs(t, testenv.Root)
	base := scratch(t)
	ctx := ctxT(t, 30*time.Second)
	col, _, _ := startWatch(t, base, false)
	f := filepath.Join(base, "f.txt")
	if err := client.WriteFile(ctx, f, strings.NewReader("hello"), 0o644, false); err != nil {
		t.Fatal(err)
	}
	col.waitFor(t, "f.txt", guest.EventCreate)
	col.waitFor(t, "f.txt", guest.EventWrite)
	if err := os.Chmod(f, 0o600); err != nil {
		t.Fatal(err)
	}
	col.waitFor(t, "f.txt", guest.EventChmod)
	if err := client.Rename(ctx, f, filepath.Join(base, "g.txt")); err != nil {
		t.Fatal(err)
	}
	col.waitFor(t, "f.txt", guest.EventRename)
	col.waitFor(t, "g.txt", guest.EventCreate)
	if err := client.Remove(ctx, filepath.Join(base, "g.txt"), false); err != nil {
		t.Fatal(err)
	}
	col.waitFor(t, "g.txt", guest.EventRemove)
	// Not recursive: a file in a new subdirectory is not reported, the directory is.
	if err := client.WriteFile(ctx, filepath.Join(base, "sub", "in.txt"), strings.NewReader("x"), 0o644, true); err != nil {
		t.Fatal(err)
	}
	col.waitFor(t, "sub", guest.EventCreate)
	if err := client.WriteFile(ctx, filepath.Join(base, "marker"), strings.NewReader("x"), 0o644, false); err != nil {
		t.Fatal(err)
	}
	col.waitFor(t, "marker", guest.EventCreate)
	col.mu.Lock()
	for _, ev := range col.events {
		if strings.HasPrefix(ev.Name, "sub/") {
			t.Errorf("a watch that is not recursive reported %v", ev)
		}
	}
	col.mu.Unlock()
}

func TestWatchRecursive(t *testing.T) {
	testenv.Needs(t, testenv.Root)
	base := scratch(t)
	ctx := ctxT(t, 30*time.Second)
	if err := client.WriteFile(ctx, filepath.Join(base, "old", "x"), strings.NewReader("x"), 0o644, true); err != nil {
		t.Fatal(err)
	}
	col, done, _ := startWatch(t, base, true)
	// A file in an existing subdirectory, then a tree made at once, then a file in it.
	if err := client.WriteFile(ctx, filepath.Join(base, "old", "y"), strings.NewReader("y"), 0o644, false); err != nil {
		t.Fatal(err)
	}
	col.waitFor(t, "old/y", guest.EventCreate)
	if _, err := client.MkdirCreated(ctx, filepath.Join(base, "new", "a", "b"), true); err != nil {
		t.Fatal(err)
	}
	col.waitFor(t, "new", guest.EventCreate)
	col.waitFor(t, "new/a/b", guest.EventCreate)
	if err := client.WriteFile(ctx, filepath.Join(base, "new", "a", "b", "deep.txt"), strings.NewReader("d"), 0o644, false); err != nil {
		t.Fatal(err)
	}
	col.waitFor(t, "new/a/b/deep.txt", guest.EventCreate)
	// A directory moved within the tree is followed under its new name.
	if err := client.Rename(ctx, filepath.Join(base, "new"), filepath.Join(base, "moved")); err != nil {
		t.Fatal(err)
	}
	col.waitFor(t, "new", guest.EventRename)
	col.waitFor(t, "moved", guest.EventCreate)
	if err := client.WriteFile(ctx, filepath.Join(base, "moved", "a", "later.txt"), strings.NewReader("l"), 0o644, false); err != nil {
		t.Fatal(err)
	}
	col.waitFor(t, "moved/a/later.txt", guest.EventCreate)
	// The watched directory removed: its own remove event is the last, and the watch ends.
	if err := os.RemoveAll(base); err != nil {
		t.Fatal(err)
	}
	col.waitFor(t, "", guest.EventRemove)
	select {
	case err := <-done:
		if !errors.Is(err, guest.ErrWatchEnded) {
			t.Errorf("the watch of a removed directory ended with %v, want ErrWatchEnded", err)
		}
		done <- err // for the cleanup
	case <-time.After(10 * time.Second):
		t.Error("the watch of a removed directory did not end")
	}
}

// TestWatchOverflow: a client that stops reading loses events, and is told how many in
// an overflow event instead of silently.
func TestWatchOverflow(t *testing.T) {
	testenv.Needs(t, testenv.Root)
	base := scratch(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	col := newCollector()
	blocked := make(chan struct{})
	var once sync.Once
	started := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- client.Watch(ctx, base, false, func() { close(started) }, func(b []guest.FileEvent) error {
			once.Do(func() { <-blocked }) // the reader stalls on its first batch
			return col.add(b)
		})
	}()
	<-started
	const files = 30000
	for i := range files {
		f, err := os.Create(filepath.Join(base, fmt.Sprintf("f%05d", i)))
		if err != nil {
			t.Fatal(err)
		}
		f.Close()
	}
	close(blocked)
	// The losses are reported once the reader catches up; the watch goes on after them.
	deadline := time.After(30 * time.Second)
	for {
		col.mu.Lock()
		seen := slices.ContainsFunc(col.events, func(ev guest.FileEvent) bool { return ev.Op == guest.EventOverflow })
		n := len(col.events)
		col.mu.Unlock()
		if seen {
			break
		}
		select {
		case <-col.more:
		case <-deadline:
			t.Fatalf("%d events delivered of %d made and no overflow event: losses went unreported", n, files)
		}
	}
	if err := os.WriteFile(filepath.Join(base, "zz-last"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	col.waitFor(t, "zz-last", guest.EventCreate)
	cancel()
	<-done
	var delivered, overflows int
	var lost int64
	for _, ev := range col.events {
		if ev.Op == guest.EventOverflow {
			overflows++
			lost += ev.Lost
		} else {
			delivered++
		}
	}
	if overflows == 0 {
		t.Fatalf("%d events delivered of %d made and no overflow event: losses went unreported", delivered, files+1)
	}
	if lost == 0 {
		t.Logf("the kernel's queue overflowed (count unknown)")
	}
	t.Logf("%d events delivered, %d overflow events reporting %d lost", delivered, overflows, lost)
}

// TestWatchChargesTheSandboxUser: a watch's inotify instance counts against the sandbox
// user's per-uid limit, not root's (which the host shares): with the user's instances
// used up by a program in the sandbox, a watch is refused with a clear error.
func TestWatchChargesTheSandboxUser(t *testing.T) {
	testenv.Needs(t, testenv.Root)
	base := scratch(t)
	hog := `
import ctypes, time
libc = ctypes.CDLL(None, use_errno=True)
fds = []
while len(fds) < 100000:
    fd = libc.inotify_init1(0)
    if fd < 0:
        break
    fds.append(fd)
print('held', len(fds), flush=True)
time.sleep(120)`
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	out := make(chan string, 1)
	done := make(chan error, 1)
	go func() {
		w := &lineWriter{ch: out}
		_, err := client.Exec(ctx, guest.Request{Cmd: []string{"python3", "-c", hog}, TimeoutMS: 120_000}, guest.ExecOptions{Stdout: w, Stderr: io.Discard})
		done <- err
	}()
	select {
	case line := <-out:
		t.Logf("the sandbox user's program %s inotify instances", line)
	case err := <-done:
		t.Fatalf("the inotify hog ended early: %v", err)
	case <-time.After(60 * time.Second):
		t.Fatal("the inotify hog printed nothing")
	}
	err := client.Watch(ctxT(t, 10*time.Second), base, false, nil, func([]guest.FileEvent) error { return nil })
	if codeOf(err) != guest.CodeExhausted || !strings.Contains(err.Error(), "inotify instances") {
		t.Errorf("a watch while the sandbox user holds every inotify instance: %v, want it refused as exhausted", err)
	}
	cancel()
	<-done
	// Once the program is gone, its instances are the user's again.
	deadline := time.Now().Add(20 * time.Second)
	for {
		wctx, wcancel := context.WithCancel(context.Background())
		err := client.Watch(wctx, base, false, wcancel, func([]guest.FileEvent) error { return nil })
		wcancel()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a watch after the hog ended: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

type lineWriter struct {
	buf  bytes.Buffer
	ch   chan string
	sent bool
}

func (l *lineWriter) Write(p []byte) (int, error) {
	l.buf.Write(p)
	if line, _, ok := strings.Cut(l.buf.String(), "\n"); ok && !l.sent {
		l.sent = true
		l.ch <- line
	}
	return len(p), nil
}

// TestWatchLimit: an agent serves at most guest.MaxWatches watches at once. (Watches of
// earlier tests may still be closing: watches are started until one is refused.)
func TestWatchLimit(t *testing.T) {
	testenv.Needs(t, testenv.Root)
	base := scratch(t)
	for i := 0; ; i++ {
		ctx, cancel := context.WithCancel(context.Background())
		started := make(chan struct{})
		done := make(chan error, 1)
		go func() {
			done <- client.Watch(ctx, base, false, func() { close(started) }, func([]guest.FileEvent) error { return nil })
		}()
		select {
		case <-started:
			t.Cleanup(func() { cancel(); <-done })
			if i == guest.MaxWatches {
				t.Fatalf("watch %d was started: the limit is %d", i+1, guest.MaxWatches)
			}
		case err := <-done:
			cancel()
			if codeOf(err) != guest.CodeExhausted || !strings.Contains(err.Error(), "watches open") {
				t.Fatalf("watch %d: %v, want refused as exhausted", i+1, err)
			}
			return
		}
	}
}
