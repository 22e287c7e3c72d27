package providertest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/roche-sandbox/roche"
)

// The files API's checks: single calls, listings to a depth, the attacks on its path
// handling from inside the sandbox (a symlink planted, a FIFO, a device, /proc, a file
// growing while read, a write past the disk's space) and watches. A sandbox without the
// files API at all (Docker's exec transport) refuses in one line and is done.

// filesOf returns the provider's files API, or nil after logging why a sandbox has none.
func (s *suite) filesOf(t *testing.T, id string) roche.FileSystem {
	t.Helper()
	fsys, ok := s.p.(roche.FileSystem)
	if !ok {
		t.Fatal("the provider says it has files (Capabilities.Files) but no files API (roche.FileSystem)")
	}
	err := fsys.Mkdir(ctxFor(t, time.Minute), id, "/tmp/files")
	if errors.Is(err, roche.ErrUnsupported) {
		if strings.Contains(err.Error(), "\n") {
			t.Errorf("the refusal is not one line: %q", err)
		}
		t.Logf("no files API in this sandbox, refused as: %v", err)
		return nil
	}
	if err != nil {
		t.Fatalf("Mkdir /tmp/files: %v", err)
	}
	return fsys
}

func (s *suite) testFilesAPI(t *testing.T) {
	id := s.create(t, s.opts.Config)
	fsys := s.filesOf(t, id)
	if fsys == nil {
		return
	}
	ctx := ctxFor(t, 2*time.Minute)
	payload := make([]byte, 1<<20+3)
	for i := range payload {
		payload[i] = byte(i*31 + i>>8)
	}
	if err := fsys.WriteFile(ctx, id, "/tmp/files/a/b/data.bin", bytes.NewReader(payload), 0o640); err != nil {
		t.Fatalf("WriteFile with parents to make: %v", err)
	}
	var got bytes.Buffer
	if err := fsys.ReadFile(ctx, id, "/tmp/files/a/b/data.bin", &got); err != nil || !bytes.Equal(got.Bytes(), payload) {
		t.Fatalf("ReadFile: %d bytes, %v; want the %d written", got.Len(), err, len(payload))
	}
	fi, err := fsys.Stat(ctx, id, "/tmp/files/a/b/data.bin")
	if err != nil {
		t.Fatal(err)
	}
	if fi.Name != "data.bin" || fi.Path != "/tmp/files/a/b/data.bin" || fi.Size != int64(len(payload)) ||
		fi.FileType() != "file" || fi.Mode.Perm() != 0o640 || time.Since(fi.ModTime) > 10*time.Minute {
		t.Errorf("Stat: %+v (type %s), want a 0640 file of %d bytes written just now", fi, fi.FileType(), len(payload))
	}
	if s.caps.Processes {
		uid := s.pyOK(t, id, "import os; print(os.getuid())")
		if fmt.Sprint(fi.UID) != uid {
			t.Errorf("a file written through the API is uid %d's, want the sandbox user's (%s)", fi.UID, uid)
		}
	}
	if err := fsys.Rename(ctx, id, "/tmp/files/a/b/data.bin", "/tmp/files/a/moved.bin"); err != nil {
		t.Fatalf("Rename: %v", err)
	}
	if _, err := fsys.Stat(ctx, id, "/tmp/files/a/b/data.bin"); !errors.Is(err, roche.ErrNotFound) {
		t.Errorf("Stat of the old name after a rename: %v, want ErrNotFound", err)
	}
	dw, ok := s.p.(roche.DirWalker)
	if !ok {
		t.Fatal("the provider has a files API but lists no directory to a depth (roche.DirWalker)")
	}
	names := func(depth int) string {
		var out []string
		err := dw.WalkDir(ctx, id, "/tmp/files", depth, 0, func(fi roche.FileInfo) error {
			out = append(out, strings.TrimPrefix(fi.Path, "/tmp/files/")+":"+fi.FileType())
			return nil
		})
		if err != nil {
			t.Fatalf("WalkDir depth %d: %v", depth, err)
		}
		return strings.Join(out, " ")
	}
	if got, want := names(1), "a:dir"; got != want {
		t.Errorf("WalkDir depth 1: %q, want %q", got, want)
	}
	if got, want := names(3), "a:dir a/b:dir a/moved.bin:file"; got != want {
		t.Errorf("WalkDir depth 3: %q, want %q", got, want)
	}
	err = dw.WalkDir(ctx, id, "/tmp/files", 3, 2, func(roche.FileInfo) error { return nil })
	if !errors.Is(err, roche.ErrExhausted) {
		t.Errorf("WalkDir past its entry cap: %v, want ErrExhausted", err)
	}
	if err := dw.WalkDir(ctx, id, "/tmp/files", roche.MaxListDepth+1, 0, func(roche.FileInfo) error { return nil }); !errors.Is(err, roche.ErrInvalidConfig) {
		t.Errorf("WalkDir deeper than %d: %v, want ErrInvalidConfig", roche.MaxListDepth, err)
	}
	if err := fsys.Remove(ctx, id, "/tmp/files/a"); err != nil {
		t.Fatalf("Remove of a tree: %v", err)
	}
	if got := names(1); got != "" {
		t.Errorf("after removing the tree: %q left", got)
	}
	var sink bytes.Buffer
	if err := fsys.ReadFile(ctx, id, "/tmp/../etc/hostname", &sink); !errors.Is(err, roche.ErrInvalidConfig) {
		t.Errorf("ReadFile of a path with ..: %v, want ErrInvalidConfig (refused, not cleaned)", err)
	}
	if err := fsys.ReadFile(ctx, id, "tmp/x", &sink); !errors.Is(err, roche.ErrInvalidConfig) {
		t.Errorf("ReadFile of a relative path: %v, want ErrInvalidConfig", err)
	}
	if err := fsys.ReadFile(ctx, id, "/tmp/files", &sink); !errors.Is(err, roche.ErrInvalidConfig) {
		t.Errorf("ReadFile of a directory: %v, want ErrInvalidConfig", err)
	}
	if sink.Len() != 0 {
		t.Errorf("refused reads sent %d bytes", sink.Len())
	}
}

// planted is what the attacks plant from inside the sandbox, as its code could.
const planted = `
import os, sys
os.makedirs('/tmp/atk', exist_ok=True)
os.symlink('/', '/tmp/atk/root')
os.symlink('/etc/hostname', '/tmp/atk/hostname')
os.mkfifo('/tmp/atk/fifo')
print('planted')`

// testFilesAttacks: what the sandboxed code can plant does not steer the files API.
func (s *suite) testFilesAttacks(t *testing.T) {
	id := s.create(t, s.opts.Config)
	fsys := s.filesOf(t, id)
	if fsys == nil {
		return
	}
	if got := s.pyOK(t, id, planted); got != "planted" {
		t.Fatalf("planting: %q", got)
	}
	ctx := ctxFor(t, 3*time.Minute)
	quick := func() context.Context { return ctxFor(t, 20*time.Second) }
	for _, c := range []struct {
		what string
		err  func() error
		want error
	}{
		{"a read through a symlinked directory", func() error {
			return fsys.ReadFile(quick(), id, "/tmp/atk/root/etc/hostname", io.Discard)
		}, roche.ErrPermission},
		{"a read of a symlink", func() error { return fsys.ReadFile(quick(), id, "/tmp/atk/hostname", io.Discard) }, roche.ErrPermission},
		{"a write through a symlinked directory", func() error {
			return fsys.WriteFile(quick(), id, "/tmp/atk/root/tmp/dropped", strings.NewReader("x"), 0o644)
		}, roche.ErrPermission},
		{"a write over a symlink", func() error {
			return fsys.WriteFile(quick(), id, "/tmp/atk/hostname", strings.NewReader("x"), 0o644)
		}, roche.ErrPermission},
		{"a directory made through a symlink", func() error { return fsys.Mkdir(quick(), id, "/tmp/atk/root/tmp/made") }, roche.ErrPermission},
		{"a FIFO read (which would wait for a writer)", func() error { return fsys.ReadFile(quick(), id, "/tmp/atk/fifo", io.Discard) }, roche.ErrInvalidConfig},
		{"a FIFO written", func() error {
			return fsys.WriteFile(quick(), id, "/tmp/atk/fifo", strings.NewReader("x"), 0o644)
		}, roche.ErrInvalidConfig},
		{"a device read (which would stream forever)", func() error { return fsys.ReadFile(quick(), id, "/dev/zero", io.Discard) }, roche.ErrInvalidConfig},
		{"the agent's /proc entries", func() error { return fsys.ReadFile(quick(), id, "/proc/1/environ", io.Discard) }, roche.ErrPermission},
		// World-readable where the others are the agent's alone: only the files API's own
		// refusal of /proc keeps it (the agent's command line and credentials) unread.
		{"the agent's /proc/1/status", func() error { return fsys.ReadFile(quick(), id, "/proc/1/status", io.Discard) }, roche.ErrPermission},
		{"/proc/self, which would be the agent", func() error { return fsys.ReadFile(quick(), id, "/proc/self/status", io.Discard) }, roche.ErrPermission},
	} {
		err := c.err()
		if !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", c.what, err, c.want)
		} else if strings.Contains(err.Error(), "\n") {
			t.Errorf("%s: the error is not one line: %q", c.what, err)
		}
	}
	if got := s.pyOK(t, id, `import os; print(os.path.exists('/tmp/dropped'), os.path.exists('/tmp/made'), open('/etc/hostname').read() != 'x')`); got != "False False True" {
		t.Errorf("after the refused writes (dropped, made, hostname intact): %s", got)
	}

	// A file growing as fast as the sandbox can write it: the read ends.
	grow := make(chan error, 1)
	gctx, stop := context.WithCancel(context.Background())
	go func() {
		_, err := s.p.Exec(gctx, id, roche.ExecRequest{Cmd: append(append([]string{}, s.opts.Python...), "-c",
			"f = open('/tmp/grow', 'ab', buffering=0)\nf.write(b'a' * (4 << 20))\nprint('grown', flush=True)\nwhile True:\n    f.write(b'b' * 65536)"),
			Timeout: 2 * time.Minute})
		grow <- err
	}()
	defer func() { stop(); <-grow }()
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(50 * time.Millisecond) {
		if fi, err := fsys.Stat(ctx, id, "/tmp/grow"); err == nil && fi.Size >= 4<<20 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the growing file did not reach 4 MiB")
		}
	}
	var n countingWriter
	if err := fsys.ReadFile(ctxFor(t, time.Minute), id, "/tmp/grow", &n); err != nil && !errors.Is(err, roche.ErrExhausted) {
		t.Fatalf("reading a file that grows meanwhile: %v", err)
	}
	if n < 4<<20 {
		t.Errorf("read %d bytes of a growing file, want at least the 4 MiB it had", n)
	}
	stop()

	// A write past /tmp's space fails saying so and leaves no file behind.
	big := io.LimitReader(noise{}, 80<<20)
	err := fsys.WriteFile(ctx, id, "/tmp/too-big", big, 0o644)
	if !errors.Is(err, roche.ErrExhausted) || !strings.Contains(err.Error(), "no space") {
		t.Errorf("writing 80 MiB into the 64 MiB /tmp: %v, want ErrExhausted saying no space", err)
	}
	if _, err := fsys.Stat(ctx, id, "/tmp/too-big"); !errors.Is(err, roche.ErrNotFound) {
		t.Errorf("the failed write left /tmp/too-big: %v", err)
	}
}

type countingWriter int64

func (c *countingWriter) Write(p []byte) (int, error) {
	*c += countingWriter(len(p))
	return len(p), nil
}

// noise is an endless reader of bytes that are not zeros (zeros could become holes).
type noise struct{}

func (noise) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = byte(i*131 + 7)
	}
	return len(p), nil
}

// events collects a watch's events.
type events struct {
	mu   sync.Mutex
	list []roche.FileEvent
	more chan struct{}
}

func (e *events) add(ev roche.FileEvent) error {
	e.mu.Lock()
	e.list = append(e.list, ev)
	e.mu.Unlock()
	select {
	case e.more <- struct{}{}:
	default:
	}
	return nil
}

// wait waits for an event (name, op).
func (e *events) wait(t *testing.T, name string, op roche.FileOp) {
	t.Helper()
	deadline := time.After(30 * time.Second)
	for {
		e.mu.Lock()
		found := slices.Contains(e.list, roche.FileEvent{Name: name, Op: op})
		seen := fmt.Sprint(e.list[max(0, len(e.list)-8):])
		e.mu.Unlock()
		if found {
			return
		}
		select {
		case <-e.more:
		case <-deadline:
			t.Fatalf("no %s event for %q within 30 s; the last seen: %s", op, name, seen)
		}
	}
}

// watch starts a watch and waits for it to be in place.
func (s *suite) watch(t *testing.T, dw roche.DirWatcher, id, dir string, recursive bool) (*events, chan error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	ev := &events{more: make(chan struct{}, 1)}
	started := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- dw.WatchDir(ctx, id, dir, roche.WatchOptions{Recursive: recursive, Started: func() { close(started) }}, ev.add)
	}()
	select {
	case <-started:
	case err := <-done:
		cancel()
		t.Fatalf("WatchDir %s: %v", dir, err)
	case <-time.After(time.Minute):
		cancel()
		t.Fatalf("WatchDir %s did not start within a minute", dir)
	}
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Errorf("WatchDir %s did not end within 30 s of its context", dir)
		}
	})
	return ev, done
}

func (s *suite) testFilesWatch(t *testing.T) {
	id := s.create(t, s.opts.Config)
	fsys := s.filesOf(t, id)
	if fsys == nil {
		return
	}
	dw, ok := s.p.(roche.DirWatcher)
	if !ok {
		t.Fatal("the provider has a files API but no watches (roche.DirWatcher)")
	}
	ctx := ctxFor(t, 3*time.Minute)
	if err := fsys.Mkdir(ctx, id, "/tmp/w/old"); err != nil {
		t.Fatal(err)
	}
	flat, _ := s.watch(t, dw, id, "/tmp/w", false)
	tree, done := s.watch(t, dw, id, "/tmp/w", true)
	if err := fsys.WriteFile(ctx, id, "/tmp/w/f.txt", strings.NewReader("hello"), 0o644); err != nil {
		t.Fatal(err)
	}
	flat.wait(t, "f.txt", roche.FileCreate)
	if err := fsys.WriteFile(ctx, id, "/tmp/w/f.txt", strings.NewReader("hello again"), 0o644); err != nil {
		t.Fatal(err)
	}
	if s.caps.Processes {
		// Polling (wasm) sees the rewrite as a write; inotify a write of each piece.
		flat.wait(t, "f.txt", roche.FileWrite)
		s.pyOK(t, id, "import os; os.chmod('/tmp/w/f.txt', 0o600)")
		flat.wait(t, "f.txt", roche.FileChmod)
	}
	if err := fsys.Rename(ctx, id, "/tmp/w/f.txt", "/tmp/w/g.txt"); err != nil {
		t.Fatal(err)
	}
	flat.wait(t, "g.txt", roche.FileCreate)
	if s.caps.Processes {
		flat.wait(t, "f.txt", roche.FileRename)
	}
	if err := fsys.Remove(ctx, id, "/tmp/w/g.txt"); err != nil {
		t.Fatal(err)
	}
	flat.wait(t, "g.txt", roche.FileRemove)
	// Below: only the recursive watch sees it, directories made later included.
	if err := fsys.WriteFile(ctx, id, "/tmp/w/old/deep/er/x.txt", strings.NewReader("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	tree.wait(t, "old/deep/er/x.txt", roche.FileCreate)
	if err := fsys.WriteFile(ctx, id, "/tmp/w/marker", strings.NewReader("m"), 0o644); err != nil {
		t.Fatal(err)
	}
	flat.wait(t, "marker", roche.FileCreate)
	flat.mu.Lock()
	for _, ev := range flat.list {
		if strings.HasPrefix(ev.Name, "old/") {
			t.Errorf("the watch that is not recursive reported %v", ev)
		}
	}
	flat.mu.Unlock()
	// The watched directory removed: its own event is the last, and the watch ends.
	if err := fsys.Remove(ctx, id, "/tmp/w"); err != nil {
		t.Fatal(err)
	}
	tree.wait(t, "", roche.FileRemove)
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("the watch of a removed directory ended with %v, want nil", err)
		}
		done <- err
	case <-time.After(30 * time.Second):
		t.Error("the watch of a removed directory did not end")
	}
	if err := func() error {
		wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		return dw.WatchDir(wctx, id, "/tmp/no-such-dir", roche.WatchOptions{}, func(roche.FileEvent) error { return nil })
	}(); !errors.Is(err, roche.ErrNotFound) {
		t.Errorf("watching a missing directory: %v, want ErrNotFound", err)
	}
}
