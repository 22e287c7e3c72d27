package daemon

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/client"
)

// TestFilesTenants: a tenant reaches only its own sandboxes' files and watchers; every
// other id is "not found", as if it did not exist; the calls that change files are
// audited.
func TestFilesTenants(t *testing.T) {
	td := startTenantDaemon(t, Config{}, []string{"acme", "bolt"}, nil)
	acme, bolt := td.client(t, "acme"), td.client(t, "bolt")
	ctx := ctxFor(t, 3*time.Minute)
	sb, err := acme.Create(ctx, pyConfig())
	if err != nil {
		t.Fatal(err)
	}
	if err := acme.WriteFile(ctx, sb.ID, "/tmp/secret.txt", strings.NewReader("acme's"), 0o600); err != nil {
		t.Fatal(err)
	}
	watcher, err := acme.Client().CreateWatcher(ctx, sb.ID, "/tmp", false)
	if err != nil {
		t.Fatal(err)
	}
	for what, err := range map[string]error{
		"ReadFile":  bolt.ReadFile(ctx, sb.ID, "/tmp/secret.txt", io.Discard),
		"WriteFile": bolt.WriteFile(ctx, sb.ID, "/tmp/dropped", strings.NewReader("x"), 0o644),
		"ListDir":   func() error { _, err := bolt.ListDir(ctx, sb.ID, "/tmp"); return err }(),
		"Stat":      func() error { _, err := bolt.Stat(ctx, sb.ID, "/tmp/secret.txt"); return err }(),
		"Exists":    func() error { _, err := bolt.Exists(ctx, sb.ID, "/tmp/secret.txt"); return err }(),
		"MakeDir":   bolt.Mkdir(ctx, sb.ID, "/tmp/made"),
		"Rename":    bolt.Rename(ctx, sb.ID, "/tmp/secret.txt", "/tmp/taken"),
		"Remove":    bolt.Remove(ctx, sb.ID, "/tmp/secret.txt"),
		"WatchDir":  bolt.WatchDir(ctx, sb.ID, "/tmp", roche.WatchOptions{}, func(roche.FileEvent) error { return nil }),
		"CreateWatcher": func() error {
			_, err := bolt.Client().CreateWatcher(ctx, sb.ID, "/tmp", false)
			return err
		}(),
		"GetWatcherEvents": func() error { _, err := bolt.Client().WatcherEvents(ctx, watcher); return err }(),
		"RemoveWatcher":    bolt.Client().RemoveWatcher(ctx, watcher),
	} {
		if !errors.Is(err, roche.ErrNotFound) {
			t.Errorf("bolt's %s on acme's sandbox: %v, want ErrNotFound", what, err)
		}
	}
	var got bytes.Buffer
	if err := acme.ReadFile(ctx, sb.ID, "/tmp/secret.txt", &got); err != nil || got.String() != "acme's" {
		t.Errorf("acme's file after bolt's attempts: %q, %v", got.String(), err)
	}
	if ok, err := acme.Exists(ctx, sb.ID, "/tmp/dropped"); ok || err != nil {
		t.Errorf("bolt's write landed: %v %v", ok, err)
	}
	// The watcher still serves its tenant, and saw acme's own write.
	if err := acme.WriteFile(ctx, sb.ID, "/tmp/after.txt", strings.NewReader("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	eventually(t, 20*time.Second, "the watcher reports acme's write", func() bool {
		evs, err := acme.Client().WatcherEvents(ctx, watcher)
		if err != nil {
			t.Fatal(err)
		}
		for _, ev := range evs {
			if ev.Name == "after.txt" && ev.Op == roche.FileCreate {
				return true
			}
		}
		return false
	})
	if err := acme.Client().RemoveWatcher(ctx, watcher); err != nil {
		t.Fatal(err)
	}
	if _, err := acme.Client().WatcherEvents(ctx, watcher); !errors.Is(err, roche.ErrNotFound) {
		t.Errorf("events of a removed watcher: %v, want ErrNotFound", err)
	}
	lines := td.auditLines(t)
	for _, want := range []map[string]any{
		{"op": "write_file", "tenant": "acme", "path": "/tmp/secret.txt", "ok": true},
		{"op": "read_file", "tenant": "bolt", "ok": false},
		{"op": "remove", "tenant": "bolt", "ok": false},
		{"op": "create_watcher", "tenant": "acme", "ok": true},
	} {
		if !hasAudit(lines, want) {
			t.Errorf("no audit line %v", want)
		}
	}
	if err := acme.Destroy(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
}

// TestFilesCapsAndPaths: roched's cap (--copy-max-bytes) bounds reads and writes, a
// write over it leaves no file, and paths are refused for their form before any
// sandbox is asked.
func TestFilesCapsAndPaths(t *testing.T) {
	td := startDaemon(t, Config{CopyMaxBytes: 1 << 20})
	ctx := ctxFor(t, 3*time.Minute)
	sb, err := td.p.Create(ctx, pyConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer td.p.Destroy(context.WithoutCancel(ctx), sb.ID)
	err = td.p.WriteFile(ctx, sb.ID, "/tmp/big", bytes.NewReader(make([]byte, 3<<20)), 0o644)
	if !errors.Is(err, roche.ErrExhausted) || !strings.Contains(err.Error(), "1 MiB") {
		t.Errorf("a 3 MiB write past a 1 MiB cap: %v, want ErrExhausted naming the cap", err)
	}
	eventually(t, 10*time.Second, "the refused write leaves no file", func() bool {
		ok, err := td.p.Exists(ctx, sb.ID, "/tmp/big")
		return err == nil && !ok
	})
	if _, err := td.p.WriteFileLimit(ctx, sb.ID, "/tmp/x", strings.NewReader("x"), 0o644, 2<<20); !errors.Is(err, roche.ErrInvalidConfig) {
		t.Errorf("asking for a cap over roched's: %v, want ErrInvalidConfig", err)
	}
	res, err := td.p.Exec(ctx, sb.ID, roche.ExecRequest{Cmd: []string{"python3", "-c", "open('/tmp/two','wb').write(b'z' * (2 << 20))"}})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("making a 2 MiB file: %v %+v", err, res)
	}
	var n countingWriter
	if err := td.p.ReadFile(ctx, sb.ID, "/tmp/two", &n); !errors.Is(err, roche.ErrExhausted) || n.n != 0 {
		t.Errorf("reading 2 MiB past a 1 MiB cap: %v after %d bytes, want ErrExhausted before any", err, n.n)
	}
	for _, p := range []string{"tmp/x", "/tmp/../etc/passwd", "/tmp/a\x00b", "/" + strings.Repeat("a", 5000)} {
		if err := td.p.WriteFile(ctx, sb.ID, p, strings.NewReader("x"), 0o644); !errors.Is(err, roche.ErrInvalidConfig) {
			t.Errorf("write %q: %v, want ErrInvalidConfig", p[:min(len(p), 40)], err)
		}
		if _, err := td.p.Stat(ctx, sb.ID, p); !errors.Is(err, roche.ErrInvalidConfig) {
			t.Errorf("stat %q: %v, want ErrInvalidConfig", p[:min(len(p), 40)], err)
		}
	}
	if err := td.p.WalkDir(ctx, sb.ID, "/tmp", 65, 0, func(roche.FileInfo) error { return nil }); !errors.Is(err, roche.ErrInvalidConfig) {
		t.Errorf("a listing 65 deep: %v, want ErrInvalidConfig", err)
	}
	// exists on a missing path is false; on a missing sandbox it is an error, not false.
	if ok, err := td.p.Exists(ctx, sb.ID, "/tmp/nothing"); ok || err != nil {
		t.Errorf("exists of a missing path: %v %v, want false, nil", ok, err)
	}
	if _, err := td.p.Exists(ctx, "no-such-sandbox", "/tmp"); !errors.Is(err, roche.ErrNotFound) {
		t.Errorf("exists in a missing sandbox: %v, want ErrNotFound", err)
	}
	fi, made, err := td.p.MakeDir(ctx, sb.ID, "/tmp/d/e")
	if err != nil || !made || !fi.IsDir || fi.Path != "/tmp/d/e" {
		t.Errorf("MakeDir of a new directory: %+v %v %v", fi, made, err)
	}
	if _, made, err := td.p.MakeDir(ctx, sb.ID, "/tmp/d/e"); made || err != nil {
		t.Errorf("MakeDir of an existing directory: made %v, %v; want false, nil", made, err)
	}
	if _, _, err := td.p.MakeDir(ctx, sb.ID, "/tmp/two"); !errors.Is(err, roche.ErrInvalidConfig) {
		t.Errorf("MakeDir over a file: %v, want ErrInvalidConfig", err)
	}
}

// TestWatchesPerTenant: a tenant's watches, streams and watchers together, stop at
// MaxWatchesPerTenant; removing one frees its place; another tenant is not held up.
func TestWatchesPerTenant(t *testing.T) {
	td := startTenantDaemon(t, Config{}, []string{"acme", "bolt"}, nil)
	acme, bolt := td.client(t, "acme"), td.client(t, "bolt")
	ctx := ctxFor(t, 5*time.Minute)
	var sbs []string
	for range 2 {
		sb, err := acme.Create(ctx, pyConfig())
		if err != nil {
			t.Fatal(err)
		}
		sbs = append(sbs, sb.ID)
	}
	half := MaxWatchesPerTenant / 2
	wctx, stopStreams := context.WithCancel(ctx)
	defer stopStreams()
	streams := make(chan error, half)
	for range half {
		started := make(chan struct{})
		go func() {
			streams <- acme.WatchDir(wctx, sbs[0], "/tmp", roche.WatchOptions{Started: func() { close(started) }}, func(roche.FileEvent) error { return nil })
		}()
		select {
		case <-started:
		case err := <-streams:
			t.Fatalf("a WatchDir below the limit: %v", err)
		}
	}
	var watchers []string
	for range MaxWatchesPerTenant - half {
		w, err := acme.Client().CreateWatcher(ctx, sbs[1], "/tmp", false)
		if err != nil {
			t.Fatalf("a watcher below the limit: %v", err)
		}
		watchers = append(watchers, w)
	}
	_, err := acme.Client().CreateWatcher(ctx, sbs[1], "/tmp", false)
	if !errors.Is(err, roche.ErrExhausted) || !strings.Contains(err.Error(), fmt.Sprintf("%d watches are open", MaxWatchesPerTenant)) {
		t.Errorf("watch %d: %v, want ErrExhausted from roched's limit", MaxWatchesPerTenant+1, err)
	}
	err = acme.WatchDir(ctx, sbs[0], "/tmp", roche.WatchOptions{}, func(roche.FileEvent) error { return nil })
	if !errors.Is(err, roche.ErrExhausted) {
		t.Errorf("a WatchDir past the limit: %v, want ErrExhausted", err)
	}
	sb, err := bolt.Create(ctx, pyConfig())
	if err != nil {
		t.Fatal(err)
	}
	if w, err := bolt.Client().CreateWatcher(ctx, sb.ID, "/tmp", false); err != nil {
		t.Errorf("another tenant's watch while acme is at its limit: %v", err)
	} else if err := bolt.Client().RemoveWatcher(ctx, w); err != nil {
		t.Error(err)
	}
	if err := acme.Client().RemoveWatcher(ctx, watchers[0]); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "a removed watcher frees its place", func() bool {
		w, err := acme.Client().CreateWatcher(ctx, sbs[1], "/tmp", false)
		if err == nil {
			watchers[0] = w
		}
		return err == nil
	})
	stopStreams()
	for range half {
		if err := <-streams; err != nil {
			t.Errorf("a WatchDir ended by its caller: %v, want nil", err)
		}
	}
	for _, w := range watchers {
		if err := acme.Client().RemoveWatcher(ctx, w); err != nil {
			t.Error(err)
		}
	}
}

// TestFilesOverConnectJSON: WriteFile's client stream and ReadFile's server stream
// through the Connect protocol in JSON over HTTP/1.1, as the Python SDK and curl speak it.
func TestFilesOverConnectJSON(t *testing.T) {
	td := startDaemon(t, Config{})
	ctx := ctxFor(t, 3*time.Minute)
	sb, err := td.p.Create(ctx, pyConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer td.p.Destroy(context.WithoutCancel(ctx), sb.ID)
	hc := unixHTTP(td.socket)
	envelope := func(v any) []byte {
		b, _ := json.Marshal(v)
		var head [5]byte
		binary.BigEndian.PutUint32(head[1:], uint32(len(b)))
		return append(head[:], b...)
	}
	content := bytes.Repeat([]byte("0123456789abcdef"), 100_000) // 1.6 MB, in pieces
	pr, pw := io.Pipe()
	go func() {
		pw.Write(envelope(map[string]any{"sandboxId": sb.ID, "path": "/tmp/json/up.bin", "mode": 0o600}))
		for off := 0; off < len(content); off += 300_000 {
			piece := content[off:min(off+300_000, len(content))]
			pw.Write(envelope(map[string]any{"data": base64.StdEncoding.EncodeToString(piece)}))
		}
		pw.Close()
	}()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://roched/roche.v1.SandboxService/WriteFile", pr)
	req.Header.Set("Content-Type", "application/connect+json")
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	msgs := readEnvelopes(t, resp.Body)
	resp.Body.Close()
	if len(msgs) < 2 || !strings.Contains(string(msgs[0]), `"size":"1600000"`) || string(msgs[len(msgs)-1]) != "{}" {
		t.Fatalf("WriteFile over Connect JSON answered %q", msgs)
	}
	body, _ := json.Marshal(map[string]any{"sandboxId": sb.ID, "path": "/tmp/json/up.bin"})
	req, _ = http.NewRequestWithContext(ctx, http.MethodPost, "http://roched/roche.v1.SandboxService/ReadFile", bytes.NewReader(envelope(json.RawMessage(body))))
	req.Header.Set("Content-Type", "application/connect+json")
	resp, err = hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	msgs = readEnvelopes(t, resp.Body)
	resp.Body.Close()
	var got []byte
	for i, m := range msgs[:len(msgs)-1] {
		var r struct {
			Entry *struct {
				Type string `json:"type"`
				Size string `json:"size"`
			} `json:"entry"`
			Data []byte `json:"data"`
		}
		if err := json.Unmarshal(m, &r); err != nil {
			t.Fatal(err)
		}
		if i == 0 && (r.Entry == nil || r.Entry.Type != "FILE_TYPE_FILE" || r.Entry.Size != "1600000") {
			t.Errorf("the first ReadFile message: %s", m)
		}
		got = append(got, r.Data...)
	}
	if !bytes.Equal(got, content) {
		t.Errorf("read back %d bytes over Connect JSON, want the %d written", len(got), len(content))
	}
}

// readEnvelopes splits a Connect stream into its messages, the end-of-stream one last.
func readEnvelopes(t *testing.T, r io.Reader) [][]byte {
	t.Helper()
	br := bufio.NewReader(r)
	var out [][]byte
	for {
		var head [5]byte
		if _, err := io.ReadFull(br, head[:]); err != nil {
			if errors.Is(err, io.EOF) {
				return out
			}
			t.Fatal(err)
		}
		b := make([]byte, binary.BigEndian.Uint32(head[1:]))
		if _, err := io.ReadFull(br, b); err != nil {
			t.Fatal(err)
		}
		out = append(out, b)
		if head[0]&2 != 0 {
			return out
		}
	}
}

// TestRochedMemoryOverGiBFile writes a 1 GiB file into a sandbox and reads it back
// through a real roched process, streamed on both sides (the content is made and hashed
// as it goes, never held), and bounds roched's resident memory meanwhile: a file's size
// must not decide it.
func TestRochedMemoryOverGiBFile(t *testing.T) {
	// The real binary, as users run it: its soft memory limit and collector settings
	// are part of what is measured. Docker alone: wasm's start (python.wasm compiled in
	// the background) would land in the measurement.
	r := startRochedBinary(t, append(os.Environ(), "ROCHE_TOKEN="+randomToken()), "--copy-max-bytes", "2g", "--providers", "docker")
	c, err := client.New(client.WithSocket(r.socket))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	p := c.Provider("docker")
	ctx := ctxFor(t, 10*time.Minute)
	cfg := pyConfig()
	cfg.Writable, cfg.Disk = true, "2g"
	sb, err := p.Create(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Destroy(context.WithoutCancel(ctx), sb.ID)
	const big = "/var/tmp/big.bin" // on the writable root, 2 GiB of disk
	pid := r.cmd.Process.Pid
	// The peak from here on: what roched reached starting (python.wasm compiled for the
	// wasm provider, ...) is not the files API's.
	if err := os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", pid), []byte("5"), 0); err != nil {
		t.Fatalf("resetting roched's peak resident memory: %v", err)
	}
	before := procStatusKiB(t, pid, "VmRSS")
	const size = 1 << 30
	in := sha256.New()
	start := time.Now()
	fi, err := p.WriteFileLimit(ctx, sb.ID, big, io.TeeReader(io.LimitReader(pattern{}, size), in), 0o644, 0)
	if err != nil {
		t.Fatal(err)
	}
	wrote := time.Since(start)
	if fi.Size != size {
		t.Fatalf("wrote %d bytes, want %d", fi.Size, size)
	}
	out := sha256.New()
	start = time.Now()
	got, err := p.ReadFileLimit(ctx, sb.ID, big, out, 0)
	if err != nil {
		t.Fatal(err)
	}
	read := time.Since(start)
	if got.Size != size || !bytes.Equal(in.Sum(nil), out.Sum(nil)) {
		t.Fatalf("read back %d bytes, hash %x, want %d bytes, hash %x", got.Size, out.Sum(nil), size, in.Sum(nil))
	}
	peak := procStatusKiB(t, pid, "VmHWM")
	after := procStatusKiB(t, pid, "VmRSS")
	t.Logf("1 GiB written in %s (%.0f MiB/s), read in %s (%.0f MiB/s); roched RSS %d MiB before, %d MiB peak, %d MiB after",
		wrote.Round(time.Millisecond), 1024/wrote.Seconds(), read.Round(time.Millisecond), 1024/read.Seconds(), before>>10, peak>>10, after>>10)
	if peak-before > 64<<10 {
		t.Errorf("roched's resident memory rose %d MiB moving a 1 GiB file (%d to %d MiB): it must stream, not hold", (peak-before)>>10, before>>10, peak>>10)
	}
}

// pattern is an endless reader of bytes that are not all zeros.
type pattern struct{}

func (pattern) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = byte(i*7 + i>>11)
	}
	return len(p), nil
}
