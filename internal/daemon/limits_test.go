package daemon

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/roche-sandbox/roche"
	rochev1 "github.com/roche-sandbox/roche/api/roche/v1"
	"github.com/roche-sandbox/roche/client"
	"github.com/roche-sandbox/roche/internal/testenv"
	"github.com/roche-sandbox/roche/pool"
)

// jsonString quotes s for a JSON body.
func jsonString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// bigEnvJSON is a JSON env object of about n bytes, in entries the kernel would take.
func bigEnvJSON(n int) string {
	var parts []string
	for i := 0; n > 0; i++ {
		size := min(n, 60<<10)
		parts = append(parts, fmt.Sprintf(`"K%06d": "%s"`, i, strings.Repeat("v", size)))
		n -= size
	}
	return "{" + strings.Join(parts, ", ") + "}"
}

// bigArgvJSON is a JSON argv of about n bytes after "sh -c 'touch MARKER'".
func bigArgvJSON(marker string, n int) string {
	parts := []string{`"sh"`, `"-c"`, jsonString("touch " + marker)}
	for n > 0 {
		size := min(n, 60<<10)
		parts = append(parts, `"`+strings.Repeat("a", size)+`"`)
		n -= size
	}
	return "[" + strings.Join(parts, ", ") + "]"
}

// TestLimitTableThroughAPI sends every row of docs/limits.md's table to a real
// roched, as curl would (Connect JSON over net/http) and through the Go client, and
// wants INVALID_ARGUMENT naming the field and the limit, with nothing created and
// nothing run.
func TestLimitTableThroughAPI(t *testing.T) {
	// The upload limit is lowered (from 1 GiB) so that passing it is cheap.
	td := startDaemon(t, Config{MaxUploadBytes: 1 << 20})
	hc := unixHTTP(td.socket)
	defer hc.CloseIdleConnections()
	img := jsonString(testImage())

	creates := []struct {
		name   string
		config string
		want   []string
	}{
		{"lifetime", `"timeoutSecs": 2147483647`, []string{"timeout_secs 2147483647", "limit of 86400"}},
		{"memory", `"memory": "999999999g"`, []string{`memory "999999999g"`, "limit of 64 GiB"}},
		{"cpus", `"cpus": 1000`, []string{"cpus 1000", "limit of 64"}},
		{"pids", `"pidsLimit": 100000`, []string{"pids_limit 100000", "limit of 32768"}},
		{"env", `"env": ` + bigEnvJSON(10<<20), []string{"env is", "limit of 128 KiB"}},
		{"workdir", `"workdir": "/` + strings.Repeat("w", 5000) + `"`, []string{"workdir is 5001 bytes", "limit of 4096"}},
		{"image", `"image": "` + strings.Repeat("i", 2000) + `"`, []string{"image is 2000 bytes", "limit of 1024"}},
		{"user", `"user": "` + strings.Repeat("u", 2000) + `"`, []string{"user is 2000 bytes", "limit of 1024"}},
		{"mounts", `"mounts": [` + strings.Repeat(`{"source": "/tmp", "target": "/m"}, `, 64) + `{"source": "/tmp", "target": "/n"}]`,
			[]string{"mounts has 65 entries", "limit of 64"}},
		{"allowlist", `"networkAllowlist": [` + strings.Repeat(`"example.com", `, 64) + `"example.org"]`,
			[]string{"network_allowlist has 65 entries", "limit of 64"}},
		{"unknown field", `"memroy": "4g"`, []string{`unknown field "memroy"`}},
	}
	for _, c := range creates {
		t.Run("create "+c.name, func(t *testing.T) {
			body := `{"config": {"image": ` + img + `, ` + c.config + `}}`
			if c.name == "image" {
				body = `{"config": {` + c.config + `}}`
			}
			code, out := postJSON(t, hc, "http://roched", "Create", body)
			msg, _ := out["message"].(string)
			if code != 400 || out["code"] != "invalid_argument" {
				t.Fatalf("HTTP %d %v, want 400 invalid_argument", code, truncate(out))
			}
			for _, w := range c.want {
				if !strings.Contains(msg, w) {
					t.Errorf("message %q does not say %q", truncateString(msg), w)
				}
			}
		})
	}
	if n := len(td.rec.ids()); n != 0 {
		t.Fatalf("refused creates made %d sandboxes", n)
	}

	// One sandbox for the exec rows; each would touch a marker if it ran at all.
	sb, err := td.p.Create(ctxFor(t, time.Minute), pyConfig())
	if err != nil {
		t.Fatal(err)
	}
	id := jsonString(sb.ID)
	execs := []struct {
		name, method, body string
		want               []string
	}{
		{"output", "Exec", `"outputLimit": 536870912`, []string{"output_limit 536870912", "limit of 16 MiB per stream for Exec", "use ExecStream"}},
		{"env", "Exec", `"env": ` + bigEnvJSON(10<<20), []string{"env is", "limit of 128 KiB"}},
		{"timeout", "Exec", `"timeoutSecs": 2147483647`, []string{"timeout_secs 2147483647", "limit of 86400"}},
		{"timeout overflow", "Exec", `"timeoutSecs": 9999999999`, []string{"timeout_secs 9999999999", "limit of 86400"}},
		{"stdin", "Exec", `"stdin": "` + base64.StdEncoding.EncodeToString(make([]byte, 17<<20)) + `"`, []string{"stdin is 17825792 bytes", "limit of 16 MiB"}},
		{"unknown field", "Exec", `"outputLimt": 5`, []string{`unknown field "outputLimt"`}},
		{"one argument", "Exec", `"cmd": ["sh", "-c", "touch /tmp/ran-arg", "` + strings.Repeat("a", roche.MaxArgBytes+1) + `"]`,
			[]string{"cmd[3] is 131072 bytes", "limit of 131071 bytes for one argument"}},
	}
	for i, c := range execs {
		t.Run("exec "+c.name, func(t *testing.T) {
			marker := fmt.Sprintf("/tmp/ran-%d", i)
			body := `{"sandboxId": ` + id + `, "cmd": ["sh", "-c", "touch ` + marker + `"], ` + c.body + `}`
			if strings.HasPrefix(c.body, `"cmd"`) {
				body = `{"sandboxId": ` + id + `, ` + c.body + `}`
			}
			code, out := postJSON(t, hc, "http://roched", c.method, body)
			msg, _ := out["message"].(string)
			if code != 400 || out["code"] != "invalid_argument" {
				t.Fatalf("HTTP %d %v, want 400 invalid_argument", code, truncate(out))
			}
			for _, w := range c.want {
				if !strings.Contains(msg, w) {
					t.Errorf("message %q does not say %q", truncateString(msg), w)
				}
			}
		})
	}
	t.Run("exec argv", func(t *testing.T) {
		code, out := postJSON(t, hc, "http://roched", "Exec", `{"sandboxId": `+id+`, "cmd": `+bigArgvJSON("/tmp/ran-argv", 10<<20)+`}`)
		if msg, _ := out["message"].(string); code != 400 || !strings.Contains(msg, "cmd is") || !strings.Contains(msg, "limit of 512 KiB") {
			t.Fatalf("HTTP %d %v, want 400 naming cmd and 512 KiB", code, truncate(out))
		}
	})
	// A request over roched's 24 MiB is cut off before it is read whole.
	t.Run("request size", func(t *testing.T) {
		big := base64.StdEncoding.EncodeToString(make([]byte, 19<<20))
		code, out := postJSON(t, hc, "http://roched", "Exec", `{"sandboxId": `+id+`, "cmd": ["touch", "/tmp/ran-big"], "stdin": "`+big+`"}`)
		if msg, _ := out["message"].(string); code == 200 || out["code"] != "resource_exhausted" || !strings.Contains(msg, "25165824") {
			t.Fatalf("HTTP %d %v, want resource_exhausted naming the 24 MiB maximum", code, truncate(out))
		}
	})
	// A copy into the sandbox stops at the upload limit, before anything is copied in.
	t.Run("upload", func(t *testing.T) {
		dir := t.TempDir()
		small, big := filepath.Join(dir, "small"), filepath.Join(dir, "big")
		os.WriteFile(small, make([]byte, 512<<10), 0o644)
		os.WriteFile(big, make([]byte, 2<<20), 0o644)
		ctx := ctxFor(t, time.Minute)
		if err := td.p.CopyTo(ctx, sb.ID, small, "/tmp/small"); err != nil {
			t.Fatalf("an upload within the limit: %v", err)
		}
		err := td.p.CopyTo(ctx, sb.ID, big, "/tmp/ran-upload")
		if !errors.Is(err, roche.ErrInvalidConfig) || !strings.Contains(err.Error(), "the upload is over the limit of 1 MiB per copy into a sandbox") {
			t.Fatalf("an upload over the limit: %v", err)
		}
	})

	// ExecStream streams, so it may ask for more, up to the core's maximum.
	rpc, tr := grpcClient(td.socket)
	defer tr.CloseIdleConnections()
	stream, err := rpc.ExecStream(ctxFor(t, time.Minute), connect.NewRequest(&rochev1.ExecStreamRequest{
		SandboxId: sb.ID, Cmd: []string{"touch", "/tmp/ran-stream"}, OutputLimit: 512 << 20,
	}))
	if err == nil {
		for stream.Receive() {
		}
		err = stream.Err()
		stream.Close()
	}
	if connect.CodeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), "output_limit 536870912 is over the limit of 64 MiB per stream") {
		t.Errorf("ExecStream with 512 MiB: %v", err)
	}

	// The Go client refuses the same rows in the same words.
	p := td.p
	ctx := ctxFor(t, time.Minute)
	for _, c := range []struct {
		mod  func(*roche.Config)
		want string
	}{
		{func(c *roche.Config) { c.TimeoutSecs = 9999999999 }, "timeout_secs 9999999999 is over the limit of 86400"},
		{func(c *roche.Config) { c.Memory = "999999999g" }, `memory "999999999g" is over the limit of 64 GiB`},
		{func(c *roche.Config) { c.CPUs = 1000 }, "cpus 1000 is over the limit of 64"},
		{func(c *roche.Config) { c.PidsLimit = 100000 }, "pids_limit 100000 is over the limit of 32768"},
		{func(c *roche.Config) {
			c.Env = map[string]string{"BIG": strings.Repeat("v", 100<<10), "BIG2": strings.Repeat("v", 100<<10)}
		}, "limit of 128 KiB"},
	} {
		cfg := pyConfig()
		c.mod(&cfg)
		if _, err := p.Create(ctx, cfg); !errors.Is(err, roche.ErrInvalidConfig) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("client create: %v, want ErrInvalidConfig saying %q", err, c.want)
		}
	}
	for _, c := range []struct {
		mod  func(*roche.ExecRequest)
		want string
	}{
		{func(r *roche.ExecRequest) { r.OutputLimit = 512 << 20 }, "output_limit 536870912 is over the limit of 64 MiB per stream"},
		{func(r *roche.ExecRequest) { r.Timeout = 9999999 * time.Second }, "over the limit of 86400"},
		{func(r *roche.ExecRequest) {
			r.Env = map[string]string{"A": strings.Repeat("v", 100<<10), "B": strings.Repeat("v", 100<<10)}
		}, "limit of 128 KiB"},
		{func(r *roche.ExecRequest) {
			for range 6 {
				r.Cmd = append(r.Cmd, strings.Repeat("a", 100<<10))
			}
		}, "limit of 512 KiB"},
		{func(r *roche.ExecRequest) { r.Stdin = strings.NewReader(strings.Repeat("i", 17<<20)) }, "stdin is over the limit of 16 MiB"},
	} {
		r := roche.ExecRequest{Cmd: []string{"touch", "/tmp/ran-client"}}
		c.mod(&r)
		if _, err := p.Exec(ctx, sb.ID, r); !errors.Is(err, roche.ErrInvalidConfig) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("client exec: %v, want ErrInvalidConfig saying %q", truncateString(fmt.Sprint(err)), c.want)
		}
	}

	// Nothing ran, and the only sandbox is the one made for the exec rows.
	res, err := p.Exec(ctx, sb.ID, roche.ExecRequest{Cmd: []string{"sh", "-c", "ls /tmp | grep ran- || true"}})
	if err != nil || res.Stdout != "" {
		t.Errorf("a refused exec ran: %q %v", res.Stdout, err)
	}
	if ids := td.rec.ids(); len(ids) != 1 {
		t.Errorf("made %d sandboxes, want the 1 for the exec rows", len(ids))
	}
}

func truncate(m map[string]any) map[string]any {
	if s, ok := m["message"].(string); ok {
		m["message"] = truncateString(s)
	}
	return m
}

func truncateString(s string) string {
	if len(s) > 300 {
		return s[:300] + "..."
	}
	return s
}

// TestRochedMemoryUnderMaxOutputs runs a real roched process and a burst of commands
// that each print the most output a client may ask for, on both streams, through unary
// Exec and ExecStream at once, and reports roched's resident memory before, at its peak
// and after. What one client asks must not decide it: the assertion is only a generous
// bound (once, 512 MiB asked for through Exec took roched to 3.4 GB).
func TestRochedMemoryUnderMaxOutputs(t *testing.T) {
	testenv.Needs(t, testenv.Docker)
	dir := shortDir(t)
	sock := filepath.Join(dir, "roched.sock")
	r := startRoched(t, sock)
	t.Cleanup(func() {
		r.cmd.Process.Signal(os.Interrupt)
		r.cmd.Wait()
	})
	c, err := client.New(client.WithSocket(sock))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	p := c.Provider("docker")
	ctx := ctxFor(t, 5*time.Minute)
	cfg := pyConfig()
	cfg.Memory = "2g" // sixteen Pythons each holding what they print
	sb, err := p.Create(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Destroy(context.WithoutCancel(ctx), sb.ID)
	pid := r.cmd.Process.Pid
	before := procStatusKiB(t, pid, "VmRSS")

	const calls = 8
	print := func(n int) []string {
		return []string{"python3", "-c", fmt.Sprintf("import sys\nb = b'x' * %d\nsys.stdout.buffer.write(b)\nsys.stderr.buffer.write(b)", n)}
	}
	var wg sync.WaitGroup
	errs := make(chan error, 2*calls)
	for i := 0; i < calls; i++ {
		wg.Add(2)
		go func() { // unary Exec, each asking for the most it may: 16 MiB per stream
			defer wg.Done()
			res, err := p.Exec(ctx, sb.ID, roche.ExecRequest{Cmd: print(16 << 20), OutputLimit: 16 << 20, Timeout: 2 * time.Minute})
			if err == nil && (res.ExitCode != 0 || len(res.Stdout) == 0) {
				err = fmt.Errorf("unary exec: exit %d, %d bytes", res.ExitCode, len(res.Stdout))
			}
			errs <- err
		}()
		go func() { // ExecStream at the core's maximum, 64 MiB per stream
			defer wg.Done()
			var n countingWriter
			res, err := p.Exec(ctx, sb.ID, roche.ExecRequest{Cmd: print(64 << 20), OutputLimit: 64 << 20, Timeout: 2 * time.Minute,
				Stdout: &n, Stderr: &n, StreamOnly: true})
			if err == nil && (res.ExitCode != 0 || n.n != 128<<20) {
				err = fmt.Errorf("stream exec: exit %d, %d bytes", res.ExitCode, n.n)
			}
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	peak := procStatusKiB(t, pid, "VmHWM")
	after := procStatusKiB(t, pid, "VmRSS")
	asked := calls * (2*16 + 2*64)
	t.Logf("roched RSS: %d MiB before, %d MiB peak, %d MiB after %d concurrent calls asking for %d MiB of output in all",
		before>>10, peak>>10, after>>10, 2*calls, asked)
	if peak > 1<<20 {
		t.Errorf("roched's resident memory peaked at %d MiB", peak>>10)
	}
}

type countingWriter struct {
	mu sync.Mutex
	n  int
}

func (w *countingWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	w.n += len(p)
	w.mu.Unlock()
	return len(p), nil
}

// procStatusKiB reads a "Vm..." line of /proc/PID/status, in KiB.
func procStatusKiB(t *testing.T, pid int, field string) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			n, err := strconv.Atoi(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")))
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatalf("no %s in /proc/%d/status", field, pid)
	return 0
}

// TestLargeEnvNotPooled: a create whose env is over what roched keeps in its state file
// gets a sandbox made for it (the engine keeps its env), so the file, rewritten on every
// change, stays small whatever clients ask; the env still reaches the commands.
func TestLargeEnvNotPooled(t *testing.T) {
	spec, err := pool.ParseSpec("docker/" + testImage() + "?min=1&max=1")
	if err != nil {
		t.Fatal(err)
	}
	td := startDaemon(t, Config{Pools: []pool.Spec{spec}})
	ctx := ctxFor(t, 2*time.Minute)
	if _, err := td.c.PoolWarmup(ctx, spec.Key.String(), 0); err != nil {
		t.Fatal(err)
	}
	big := pyConfig()
	big.Env = map[string]string{"BIG": strings.Repeat("b", 100<<10)}
	sb, pooled, err := td.c.Create(ctx, "docker", big)
	if err != nil || pooled {
		t.Fatalf("create with a 100 KiB env: pooled %v, %v; want a sandbox made for it", pooled, err)
	}
	res, err := td.p.Exec(ctx, sb.ID, roche.ExecRequest{Cmd: []string{"sh", "-c", "echo ${#BIG}"}})
	if err != nil || res.Stdout != "102400\n" {
		t.Fatalf("the env in the sandbox made for it: %q %v", res.Stdout, err)
	}
	small := pyConfig()
	small.Env = map[string]string{"SMALL": strings.Repeat("s", 1<<10)}
	if _, pooled, err := td.c.Create(ctx, "docker", small); err != nil || !pooled {
		t.Fatalf("create with a 1 KiB env: pooled %v, %v; want it from the pool", pooled, err)
	}
	fi, err := os.Stat(td.d.cfg.StateFile)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Size() > 16<<10 {
		t.Fatalf("the state file is %d bytes: a client's env grew it", fi.Size())
	}
	t.Logf("state file: %d bytes", fi.Size())
}
