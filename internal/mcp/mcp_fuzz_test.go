package mcp_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/internal/mcp"
	"github.com/roche-sandbox/roche/provider/kit"
)

// fuzzSandboxes is the provider behind the MCP fuzz target: sandboxes in memory, one of
// them made before the session ("victim", another client's), and a record of every
// call, which must only ever be what the server's rules allow.
type fuzzSandboxes struct {
	mu       sync.Mutex
	next     int
	live     map[string]roche.Config
	problems []string
}

const victim = "fuzz-victim"

func (p *fuzzSandboxes) problem(format string, args ...any) {
	p.problems = append(p.problems, fmt.Sprintf(format, args...))
}

// fuzzProviders serves the one provider as the server's Providers.
type fuzzProviders struct{ p *fuzzSandboxes }

func (f fuzzProviders) Get(name string) (roche.Provider, error) {
	if name != "mem" {
		return nil, fmt.Errorf("%w: unknown provider %q", roche.ErrInvalidConfig, name)
	}
	return f.p, nil
}

func (f fuzzProviders) List(context.Context, string) ([]roche.SandboxInfo, error) {
	return f.p.List(context.Background())
}

func (p *fuzzSandboxes) List(context.Context) ([]roche.SandboxInfo, error) { return p.listAll(), nil }

func (p *fuzzSandboxes) Name() string { return "mem" }
func (p *fuzzSandboxes) Capabilities() roche.Capabilities {
	return roche.Capabilities{Code: []string{roche.LanguagePython}}
}

func (p *fuzzSandboxes) Create(ctx context.Context, cfg roche.Config) (roche.SandboxInfo, error) {
	return p.CreateFor(ctx, cfg, kit.CreateOptions{})
}

func (p *fuzzSandboxes) CreateFor(_ context.Context, cfg roche.Config, _ kit.CreateOptions) (roche.SandboxInfo, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := cfg.Validate(); err != nil {
		p.problem("create reached the provider with an invalid config: %v", err)
	}
	if cfg.Network || len(cfg.NetworkAllowlist) > 0 {
		p.problem("create reached the provider with a network, which this server does not allow")
	}
	if len(cfg.Mounts) > 0 {
		p.problem("create reached the provider with host mounts %v", cfg.Mounts)
	}
	if cfg.Writable && cfg.DiskBytes() == 0 {
		p.problem("create reached the provider with an unbounded writable root")
	}
	p.next++
	id := fmt.Sprintf("fuzz-%d", p.next)
	p.live[id] = cfg
	return roche.SandboxInfo{ID: id, Provider: "mem", Image: cfg.Image, State: roche.StateRunning}, nil
}

func (p *fuzzSandboxes) touch(op, id string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if id == victim {
		p.problem("%s reached another client's sandbox", op)
	}
	if _, ok := p.live[id]; !ok {
		return fmt.Errorf("%w: no sandbox %s", roche.ErrNotFound, id)
	}
	return nil
}

func (p *fuzzSandboxes) Exec(_ context.Context, id string, req roche.ExecRequest) (roche.ExecResult, error) {
	if err := p.touch("exec", id); err != nil {
		return roche.ExecResult{}, err
	}
	if req.Timeout < 0 {
		p.mu.Lock()
		p.problem("exec reached the provider with a timeout of %v: a conversion wrapped", req.Timeout)
		p.mu.Unlock()
	}
	if err := req.Validate(); err != nil {
		return roche.ExecResult{}, err // as every provider does first
	}
	if req.Stdin != nil {
		_, _ = io.Copy(io.Discard, req.Stdin)
	}
	return roche.ExecResult{Stdout: strings.Join(req.Cmd, " "), ExitCode: 0}, nil
}

func (p *fuzzSandboxes) RunCode(_ context.Context, id string, req roche.CodeRequest) (roche.Execution, error) {
	if err := p.touch("run_code", id); err != nil {
		return roche.Execution{}, err
	}
	if req.Timeout < 0 {
		p.mu.Lock()
		p.problem("run_code reached the provider with a timeout of %v: a conversion wrapped", req.Timeout)
		p.mu.Unlock()
	}
	if err := req.Validate(); err != nil {
		return roche.Execution{}, err
	}
	return roche.Execution{Logs: roche.CodeLogs{Stdout: []string{req.Code}}}, nil
}

func (p *fuzzSandboxes) CreateContext(_ context.Context, id string, _ roche.ContextOptions) (roche.CodeContext, error) {
	return roche.CodeContext{}, p.touch("create_context", id)
}

func (p *fuzzSandboxes) Contexts(_ context.Context, id string) ([]roche.CodeContext, error) {
	return nil, p.touch("contexts", id)
}

func (p *fuzzSandboxes) RestartContext(_ context.Context, id, _ string) error {
	return p.touch("restart_context", id)
}

func (p *fuzzSandboxes) RemoveContext(_ context.Context, id, _ string) error {
	return p.touch("remove_context", id)
}

func (p *fuzzSandboxes) Destroy(_ context.Context, id string) error {
	if err := p.touch("destroy", id); err != nil {
		return err
	}
	p.mu.Lock()
	delete(p.live, id)
	p.mu.Unlock()
	return nil
}

func (p *fuzzSandboxes) Inspect(_ context.Context, id string) (roche.SandboxInfo, error) {
	if err := p.touch("inspect", id); err != nil {
		return roche.SandboxInfo{}, err
	}
	return roche.SandboxInfo{ID: id, Provider: "mem", State: roche.StateRunning}, nil
}

func (p *fuzzSandboxes) listAll() []roche.SandboxInfo {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []roche.SandboxInfo
	for id, cfg := range p.live {
		out = append(out, roche.SandboxInfo{ID: id, Provider: "mem", Image: cfg.Image, State: roche.StateRunning})
	}
	return out
}

func (p *fuzzSandboxes) WriteFile(_ context.Context, id, path string, r io.Reader, _ fs.FileMode) error {
	if err := p.touch("write_file", id); err != nil {
		return err
	}
	_, err := io.Copy(io.Discard, r)
	return err
}

func (p *fuzzSandboxes) ReadFile(_ context.Context, id, path string, w io.Writer) error {
	if err := p.touch("read_file", id); err != nil {
		return err
	}
	_, err := io.WriteString(w, strings.Repeat("file content ", 100))
	return err
}

// rpc is one JSON-RPC line.
func rpc(id int, method string, params any) string {
	m := map[string]any{"jsonrpc": "2.0", "method": method}
	if id > 0 {
		m["id"] = id
	}
	if params != nil {
		m["params"] = params
	}
	b, _ := json.Marshal(m)
	return string(b) + "\n"
}

func toolCall(id int, tool string, args map[string]any) string {
	return rpc(id, "tools/call", map[string]any{"name": tool, "arguments": args})
}

var mcpHello = rpc(1, "initialize", map[string]any{"protocolVersion": "2025-06-18", "capabilities": map[string]any{},
	"clientInfo": map[string]any{"name": "fuzz", "version": "1"}}) + rpc(0, "notifications/initialized", nil)

// FuzzServeStdio serves one MCP client that sends any bytes on stdin. Whatever it sends,
// the server answers in JSON lines and returns when stdin ends, and its tools reach the
// provider only as its rules allow: creates with a valid config, no network and no host
// mount, and nothing at all on a sandbox the session did not create.
func FuzzServeStdio(f *testing.F) {
	for _, s := range []string{
		mcpHello + rpc(2, "tools/list", nil),
		mcpHello + toolCall(2, "create_sandbox", map[string]any{"provider": "mem", "image": "img", "memory": "1g", "env": map[string]string{"A": "1"}}) +
			toolCall(3, "exec", map[string]any{"sandbox_id": "fuzz-1", "command": []string{"echo", "hi"}, "timeout_secs": 1e300}) +
			toolCall(4, "write_file", map[string]any{"sandbox_id": "fuzz-1", "path": "/tmp/a", "content": "aGk=", "encoding": "base64", "mode": "0755"}) +
			toolCall(5, "read_file", map[string]any{"sandbox_id": "fuzz-1", "path": "/tmp/a", "max_bytes": 10}) +
			toolCall(6, "list_sandboxes", map[string]any{}) +
			toolCall(7, "destroy_sandbox", map[string]any{"sandbox_id": "fuzz-1"}),
		mcpHello + toolCall(2, "exec", map[string]any{"sandbox_id": victim, "command": []string{"cat", "/secret"}}) +
			toolCall(3, "destroy_sandbox", map[string]any{"sandbox_id": victim}) +
			toolCall(4, "read_file", map[string]any{"sandbox_id": victim, "path": "/etc/passwd"}) +
			toolCall(5, "run_code", map[string]any{"sandbox_id": victim, "language": "python", "code": "1"}),
		mcpHello + toolCall(2, "create_sandbox", map[string]any{"provider": "mem", "network": true}) +
			toolCall(3, "create_sandbox", map[string]any{"provider": "mem", "writable": true, "disk": "0"}) +
			toolCall(4, "create_sandbox", map[string]any{"provider": "mem", "memory": "1k", "timeout_secs": -1, "cpus": -2}) +
			toolCall(5, "create_sandbox", map[string]any{"provider": "mem", "mounts": []string{"/:/host"}, "workdir": "rel"}),
		mcpHello + toolCall(2, "run_code", map[string]any{"language": "python", "code": "print(1)", "timeout_secs": 5}) +
			toolCall(3, "run_code", map[string]any{"language": "sh", "code": "echo", "timeout_secs": 1e300, "stdin": "x"}) +
			toolCall(4, "run_code", map[string]any{"language": "python", "code": "1", "timeout_secs": 1e300}),
		mcpHello + "{not json\n" + rpc(2, "tools/call", "not an object") + `{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"exec","arguments":{"command":null}}}` + "\n",
		"",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		p := &fuzzSandboxes{live: map[string]roche.Config{victim: roche.DefaultConfig()}}
		s := mcp.New(fuzzProviders{p}, mcp.Config{DefaultProvider: "mem", DefaultImage: "img"})
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		// The input stays open until the server has answered a call sent after it (a
		// tool call: the server starts those in order, while it answers a ping at
		// once), so that the requests in it are served rather than cut off by the end
		// of input.
		stdin, feed := io.Pipe()
		out := &watchWriter{want: []byte(`"id":"fuzz-end"`), seen: make(chan struct{})}
		served := make(chan struct{})
		go func() {
			_ = s.ServeStdio(ctx, stdin, out)
			close(served)
		}()
		stream := append(append(slices.Clip(in), '\n'), lastCall...)
		fed := make(chan struct{})
		go func() {
			defer close(fed)
			_, _ = feed.Write(stream)
			// An input that leaves a JSON value open takes the last call into it, and the
			// server then waits for the rest of the value: no answer comes.
			if lastCallReached(stream) {
				select {
				case <-out.seen:
				case <-served: // an input that ended the session
				case <-time.After(10 * time.Second):
				}
			}
			feed.Close()
		}()
		select {
		case <-served:
		case <-ctx.Done():
			t.Fatal("the server did not return when its input ended")
		}
		stdin.CloseWithError(io.ErrClosedPipe) // a server that stopped reading early
		<-fed
		if err := s.Close(context.Background()); err != nil {
			t.Errorf("close: %v", err)
		}
		p.mu.Lock()
		defer p.mu.Unlock()
		for _, pr := range p.problems {
			t.Error(pr)
		}
		if _, ok := p.live[victim]; !ok {
			t.Error("another client's sandbox was destroyed")
		}
		if len(p.live) != 1 {
			t.Errorf("the server left %d of its sandboxes when it closed", len(p.live)-1)
		}
		for _, line := range bytes.Split(bytes.TrimSpace(out.bytes()), []byte("\n")) {
			if len(line) > 0 && !json.Valid(line) {
				t.Fatalf("the server wrote a line that is not JSON: %q", line)
			}
		}
	})
}

// lastCall ends every input: its answer says the server has taken every call before it.
var lastCall = []byte(`{"jsonrpc":"2.0","id":"fuzz-end","method":"tools/call","params":{"name":"list_sandboxes","arguments":{}}}` + "\n")

// lastCallReached reports whether the stream, decoded as the stdio transport decodes it
// (one JSON value after another), ends with lastCall as a value of its own.
func lastCallReached(stream []byte) bool {
	dec := json.NewDecoder(bytes.NewReader(stream))
	var last json.RawMessage
	for {
		var raw json.RawMessage
		err := dec.Decode(&raw)
		if errors.Is(err, io.EOF) {
			return bytes.Equal(last, bytes.TrimSpace(lastCall))
		}
		if err != nil {
			return false
		}
		last = raw
	}
}

// watchWriter keeps what the server writes and closes seen once a line holds want.
type watchWriter struct {
	mu   sync.Mutex
	buf  bytes.Buffer
	want []byte
	seen chan struct{}
	done bool
}

func (w *watchWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	if !w.done && bytes.Contains(w.buf.Bytes(), w.want) {
		w.done = true
		close(w.seen)
	}
	return len(p), nil
}

func (w *watchWriter) bytes() []byte {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]byte(nil), w.buf.Bytes()...)
}
