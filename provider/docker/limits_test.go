package docker_test

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
	"github.com/roche-sandbox/roche/provider/docker"
)

// holdFiles forks until the process limit refuses, then every process opens files until
// its open-file limit refuses and keeps them; it prints "held PROCESSES FILES" and sleeps.
const holdFiles = `
import os, time
r, w = os.pipe()
kids = []
while True:
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        os.close(r)
        n = 0
        try:
            while True:
                os.open('/dev/null', os.O_RDONLY)
                n += 1
        except OSError:
            pass
        os.write(w, b'%d\n' % n)
        time.sleep(600)
        os._exit(0)
    kids.append(pid)
os.close(w)
f = os.fdopen(r)
total = sum(int(f.readline()) for _ in kids)
own = 0
try:
    while True:
        os.open('/dev/null', os.O_RDONLY)
        own += 1
except OSError:
    pass
print('held', len(kids) + 1, total + own, flush=True)
time.sleep(600)`

// TestOpenFilesBoundOnTheHost: a sandbox that forks to its process limit and opens files
// in every process until refused holds at most the PID limit times the open-file limit
// (64 x 1024) of the host's files, whose kernel limit every sandbox shares. Once one
// sandbox opened 1.2 million (64 processes at the engine's 20,000 each, and more where
// the engine allows a million). The host's count of allocated files (fs.file-nr) is read
// while the sandbox holds them.
func TestOpenFilesBoundOnTheHost(t *testing.T) {
	testenv.Needs(t, testenv.Docker)
	for _, rt := range []string{docker.RuntimeRunc, docker.RuntimeGVisor} {
		t.Run(rt, func(t *testing.T) {
			p := newProvider(t, docker.WithRuntime(rt))
			id := sandbox(t, p, testConfig())
			bound := int64(roche.DefaultPidsLimit) * roche.DefaultOpenFiles
			before := hostFiles(t)
			held := &lineWatch{prefix: "held ", seen: make(chan string, 1)}
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			done := make(chan error, 1)
			go func() {
				_, err := p.Exec(ctx, id, roche.ExecRequest{Cmd: []string{"python3", "-c", holdFiles}, Stdout: held, Timeout: 3 * time.Minute})
				done <- err
			}()
			var line string
			select {
			case line = <-held.seen:
			case err := <-done:
				t.Fatalf("the program ended before it held its files: %v", err)
			case <-ctx.Done():
				t.Fatal("the program did not report what it held")
			}
			grew := hostFiles(t) - before
			cancel()
			<-done
			f := strings.Fields(line)
			procs, _ := strconv.ParseInt(f[1], 10, 64)
			files, _ := strconv.ParseInt(f[2], 10, 64)
			t.Logf("%d processes held %d files; the host's allocated files grew by %d (bound %d)", procs, files, grew, bound)
			if procs != roche.DefaultPidsLimit {
				t.Errorf("the program ran %d processes, want the limit, %d", procs, roche.DefaultPidsLimit)
			}
			if files > bound {
				t.Errorf("the sandbox held %d files, past %d", files, bound)
			}
			// Margin for what the rest of the machine opens meanwhile.
			if margin := int64(20000); grew > bound+margin {
				t.Errorf("the host's allocated files grew by %d while the sandbox held its files, past %d and a margin of %d", grew, bound, margin)
			}
		})
	}
}

// hostFiles is the number of file handles the host's kernel has allocated.
func hostFiles(t *testing.T) int64 {
	t.Helper()
	b, err := os.ReadFile("/proc/sys/fs/file-nr")
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.ParseInt(strings.Fields(string(b))[0], 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// lineWatch passes on the first output line that starts with prefix.
type lineWatch struct {
	prefix string
	seen   chan string
	mu     sync.Mutex
	buf    strings.Builder
	sent   bool
}

func (w *lineWatch) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(b)
	if !w.sent {
		for _, l := range strings.Split(w.buf.String(), "\n") {
			if strings.HasPrefix(l, w.prefix) && strings.HasSuffix(w.buf.String(), "\n") {
				w.seen <- l
				w.sent = true
				break
			}
		}
	}
	return len(b), nil
}
