package mcp_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
	"go.uber.org/goleak"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/internal/catalog"
	"github.com/roche-sandbox/roche/internal/mcp"
	"github.com/roche-sandbox/roche/internal/testenv"
	"github.com/roche-sandbox/roche/provider/docker"
	"github.com/roche-sandbox/roche/provider/kit"
)

// TestMain builds roche-agent, so sandboxes run as they do in production.
func TestMain(m *testing.M) {
	cleanup, err := testenv.SetupAgent()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	goleak.VerifyTestMain(m, goleak.Cleanup(func(code int) { cleanup(); os.Exit(code) }))
}

// providers serves the real Docker provider.
type providers struct{ p roche.Provider }

func (p providers) Get(name string) (roche.Provider, error) {
	if name != "docker" {
		return nil, fmt.Errorf("%w: unknown provider %q", roche.ErrInvalidConfig, name)
	}
	return p.p, nil
}
func (p providers) List(ctx context.Context, _ string) ([]roche.SandboxInfo, error) {
	return p.p.List(ctx)
}

func newServer(t *testing.T, cfg mcp.Config) (*mcp.Server, *docker.Provider) {
	t.Helper()
	testenv.Needs(t, testenv.Docker)
	dp, err := docker.New()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := dp.Ping(ctx); err != nil {
		t.Fatalf("%v (the README's test command starts dockerd and builds the image)", err)
	}
	cfg.DefaultImage = testenv.Image()
	s := mcp.New(providers{dp}, cfg)
	t.Cleanup(func() {
		if err := s.Close(context.Background()); err != nil {
			t.Error(err)
		}
		dp.Close()
	})
	return s, dp
}

// connect joins a go-sdk client to the server over in-memory transports.
func connect(t *testing.T, s *mcp.Server) *sdk.ClientSession {
	t.Helper()
	ctx := context.Background()
	st, ct := sdk.NewInMemoryTransports()
	ss, err := s.MCP().Connect(ctx, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := sdk.NewClient(&sdk.Implementation{Name: "test", Version: "1"}, nil).Connect(ctx, ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cs.Close()
		ss.Wait()
	})
	return cs
}

// call calls a tool and decodes its structured result into out; it fails the test on a
// tool error unless wantErr, and returns the text of the result.
func call(t *testing.T, cs *sdk.ClientSession, name string, args map[string]any, out any) (string, bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := cs.CallTool(ctx, &sdk.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	var text strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*sdk.TextContent); ok {
			text.WriteString(tc.Text)
		}
	}
	if !res.IsError && out != nil {
		b, err := json.Marshal(res.StructuredContent)
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(b, out); err != nil {
			t.Fatalf("%s: structured content %s: %v", name, b, err)
		}
	}
	return text.String(), res.IsError
}

func TestTools(t *testing.T) {
	s, dp := newServer(t, mcp.Config{})
	cs := connect(t, s)
	ctx := context.Background()

	tools, err := cs.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tool := range tools.Tools {
		names = append(names, tool.Name)
	}
	if got := strings.Join(names, " "); got != "create_sandbox destroy_sandbox egress_log exec kill_command list_commands list_files list_sandboxes read_command_output read_file run_code set_sandbox_timeout start_command write_file" {
		t.Fatalf("tools: %s", got)
	}

	var sb mcp.Sandbox
	if text, isErr := call(t, cs, "create_sandbox", map[string]any{"env": map[string]string{"WHO": "mcp"}}, &sb); isErr {
		t.Fatalf("create_sandbox: %s", text)
	}
	if sb.ID == "" || sb.Image != testenv.Image() || sb.ExpiresAt == "" {
		t.Fatalf("sandbox: %+v", sb)
	}

	var out mcp.ExecOutput
	text, _ := call(t, cs, "exec", map[string]any{
		"sandbox_id": sb.ID, "command": []string{"python3", "-c", "import os, sys; print('hi', os.environ['WHO']); print('oops', file=sys.stderr); sys.exit(3)"},
	}, &out)
	if out.Stdout != "hi mcp\n" || out.Stderr != "oops\n" || out.ExitCode != 3 {
		t.Fatalf("exec: %+v", out)
	}
	if !strings.Contains(text, "exit code 3") || !strings.Contains(text, "hi mcp") || !strings.Contains(text, "oops") {
		t.Fatalf("exec text: %q", text)
	}
	call(t, cs, "exec", map[string]any{"sandbox_id": sb.ID, "command": []string{"cat"}, "stdin": "piped"}, &out)
	if out.Stdout != "piped" {
		t.Fatalf("exec with stdin: %+v", out)
	}
	call(t, cs, "exec", map[string]any{"sandbox_id": sb.ID, "command": []string{"head", "-c", "300000", "/dev/zero"}}, &out)
	if !out.Truncated || len(out.Stdout) != mcp.DefaultOutputLimit {
		t.Fatalf("exec of 300 kB of output: truncated %v, %d bytes kept, want %d", out.Truncated, len(out.Stdout), mcp.DefaultOutputLimit)
	}
	call(t, cs, "exec", map[string]any{"sandbox_id": sb.ID, "command": []string{"head", "-c", "300000", "/dev/zero"}, "max_output_bytes": 1 << 20}, &out)
	if out.Truncated || len(out.Stdout) != 300000 {
		t.Fatalf("exec with max_output_bytes: truncated %v, %d bytes", out.Truncated, len(out.Stdout))
	}
	call(t, cs, "exec", map[string]any{"sandbox_id": sb.ID, "command": []string{"sleep", "30"}, "timeout_secs": 1}, &out)
	if !out.TimedOut {
		t.Fatalf("exec past its timeout: %+v", out)
	}

	var wrote mcp.WriteOutput
	call(t, cs, "write_file", map[string]any{"sandbox_id": sb.ID, "path": "/tmp/app/main.py", "content": "print(6 * 7)\n"}, &wrote)
	call(t, cs, "exec", map[string]any{"sandbox_id": sb.ID, "command": []string{"python3", "/tmp/app/main.py"}}, &out)
	if out.Stdout != "42\n" {
		t.Fatalf("running the written file: %+v", out)
	}
	blob := []byte{0, 1, 2, 0xff, 0xfe}
	call(t, cs, "write_file", map[string]any{
		"sandbox_id": sb.ID, "path": "/tmp/blob", "content": base64.StdEncoding.EncodeToString(blob), "encoding": "base64", "mode": "0600",
	}, &wrote)
	var read mcp.ReadOutput
	call(t, cs, "read_file", map[string]any{"sandbox_id": sb.ID, "path": "/tmp/blob"}, &read)
	if read.Encoding != "base64" || read.Content != base64.StdEncoding.EncodeToString(blob) {
		t.Fatalf("read_file of binary: %+v", read)
	}
	call(t, cs, "read_file", map[string]any{"sandbox_id": sb.ID, "path": "/tmp/app/main.py", "max_bytes": 5}, &read)
	if read.Encoding != "utf-8" || read.Content != "print" || !read.Truncated {
		t.Fatalf("read_file with max_bytes: %+v", read)
	}

	var files mcp.ListFilesOutput
	call(t, cs, "list_files", map[string]any{"sandbox_id": sb.ID, "path": "/tmp", "depth": 2}, &files)
	var listed []string
	for _, e := range files.Entries {
		listed = append(listed, e.Path+":"+e.Type)
	}
	if !slices.Contains(listed, "/tmp/app:dir") || !slices.Contains(listed, "/tmp/app/main.py:file") || !slices.Contains(listed, "/tmp/blob:file") {
		t.Fatalf("list_files of /tmp to depth 2: %v", listed)
	}
	if text, isErr := call(t, cs, "list_files", map[string]any{"sandbox_id": sb.ID, "path": "/tmp", "depth": 9}, &files); !isErr || !strings.Contains(text, "depth 9") {
		t.Fatalf("list_files deeper than allowed: %q", text)
	}

	var list mcp.ListOutput
	call(t, cs, "list_sandboxes", nil, &list)
	found := false
	for _, l := range list.Sandboxes {
		found = found || l.ID == sb.ID
	}
	if !found {
		t.Fatalf("list_sandboxes does not have %s: %+v", sb.ID, list)
	}

	var destroyed mcp.DestroyOutput
	call(t, cs, "destroy_sandbox", map[string]any{"sandbox_id": sb.ID}, &destroyed)
	if destroyed.Destroyed != sb.ID {
		t.Fatalf("destroy_sandbox: %+v", destroyed)
	}
	if _, err := dp.Inspect(ctx, sb.ID); !errors.Is(err, roche.ErrNotFound) {
		t.Fatalf("after destroy_sandbox: %v", err)
	}
	text, isErr := call(t, cs, "exec", map[string]any{"sandbox_id": sb.ID, "command": []string{"true"}}, nil)
	if !isErr || !strings.Contains(text, "not found") {
		t.Fatalf("exec in a destroyed sandbox: %v %q", isErr, text)
	}
	// destroy_sandbox is idempotent, as its annotations say: again, it succeeds and says
	// the sandbox was already gone.
	var again mcp.DestroyOutput
	text, isErr = call(t, cs, "destroy_sandbox", map[string]any{"sandbox_id": sb.ID}, &again)
	if isErr || again.Destroyed != sb.ID || !again.AlreadyGone || !strings.Contains(text, "already gone") {
		t.Fatalf("destroying it again: %v %q %+v, want success saying it was already gone", isErr, text, again)
	}
	// So is one that ended behind the session's back (its lifetime, an operator).
	var other mcp.Sandbox
	call(t, cs, "create_sandbox", nil, &other)
	if err := dp.Destroy(ctx, other.ID); err != nil {
		t.Fatal(err)
	}
	text, isErr = call(t, cs, "destroy_sandbox", map[string]any{"sandbox_id": other.ID}, &again)
	if isErr || !again.AlreadyGone {
		t.Fatalf("destroying a sandbox that ended on its own: %v %q %+v", isErr, text, again)
	}
	// An id the session never had is still not found.
	text, isErr = call(t, cs, "destroy_sandbox", map[string]any{"sandbox_id": "0123456789ab"}, nil)
	if !isErr || !strings.Contains(text, "not found") {
		t.Fatalf("destroying an unknown id: %v %q", isErr, text)
	}
}

// TestRefusals: the secure defaults hold against what a client asks.
// TestCreateSchemaNamesProviders: create_sandbox tells the model every provider of the
// registry and which one it gets when it names none, the server's default.
func TestCreateSchemaNamesProviders(t *testing.T) {
	s := mcp.New(providers{}, mcp.Config{DefaultProvider: "wasm"})
	defer s.Close(context.Background())
	cs := connect(t, s)
	tools, err := cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tool := range tools.Tools {
		if tool.Name != "create_sandbox" {
			continue
		}
		b, err := json.Marshal(tool.InputSchema)
		if err != nil {
			t.Fatal(err)
		}
		var schema struct {
			Properties map[string]struct {
				Type        string `json:"type"`
				Description string `json:"description"`
			} `json:"properties"`
		}
		if err := json.Unmarshal(b, &schema); err != nil {
			t.Fatal(err)
		}
		p := schema.Properties["provider"]
		names := catalog.Names()
		want := fmt.Sprintf("isolation backend: %s or %s (wasm when left out)", strings.Join(names[:len(names)-1], ", "), names[len(names)-1])
		if p.Type != "string" || p.Description != want || !strings.Contains(want, "docker, ") || !strings.Contains(want, " wasm ") {
			t.Fatalf("create_sandbox's provider: %+v, want a string described %q", p, want)
		}
		if len(schema.Properties) != reflect.TypeFor[mcp.CreateInput]().NumField() || schema.Properties["image"].Description == "" {
			t.Fatalf("create_sandbox's other arguments lost their schema: %s", b)
		}
		return
	}
	t.Fatal("no create_sandbox tool")
}

func TestRefusals(t *testing.T) {
	s, _ := newServer(t, mcp.Config{})
	cs := connect(t, s)
	for _, c := range []struct {
		tool string
		args map[string]any
		want string
	}{
		{"create_sandbox", map[string]any{"network": true}, "--allow-network"},
		{"create_sandbox", map[string]any{"mounts": []string{"/:/host"}}, "mounts"},
		{"create_sandbox", map[string]any{"memory": "lots"}, "not a size"},
		{"create_sandbox", map[string]any{"memory": "lots"}, "(change the arguments and call again)"},
		{"run_code", map[string]any{"language": "cobol", "code": "DISPLAY 'HI'."}, "give python, sh, bash or javascript"},
		{"run_code", map[string]any{"language": "python", "code": "print(1)", "sandbox_id": "x"}, "no sandbox x in this session"},
		{"create_sandbox", map[string]any{"writable": true, "disk": "0"}, "disk 0 (no limit) is not offered"},
		{"create_sandbox", map[string]any{"writable": true, "disk": "-1g"}, "negative"},
		{"create_sandbox", map[string]any{"workspace_size": "1g"}, "without a workspace"},
		{"exec", map[string]any{"sandbox_id": "x", "command": []string{}}, "command is empty"},
		{"exec", map[string]any{"sandbox_id": "x"}, "command"},
		{"write_file", map[string]any{"sandbox_id": "x", "path": "/tmp/x", "content": "!", "encoding": "base64"}, "base64"},
		{"write_file", map[string]any{"sandbox_id": "x", "path": "/tmp/x", "content": "", "mode": "999"}, "octal"},
	} {
		text, isErr := call(t, cs, c.tool, c.args, nil)
		if !isErr || !strings.Contains(text, c.want) {
			t.Errorf("%s %v: error %v %q, want one mentioning %q", c.tool, c.args, isErr, text, c.want)
		}
	}
}

// TestRunCode: code given as a string runs in a sandbox of its own, which is gone when
// the call returns, or in the session's sandbox, where its files stay.
func TestRunCode(t *testing.T) {
	// An owner of this test's own: other tests on the shared engine make sandboxes meanwhile.
	owner := fmt.Sprintf("mcp-test-%d-%d", os.Getpid(), time.Now().UnixNano())
	s, dp := newServer(t, mcp.Config{Owner: owner})
	cs := connect(t, s)
	ctx := context.Background()
	before := map[string]bool{}
	list, err := dp.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, sb := range list {
		before[sb.ID] = true
	}

	var out mcp.ExecOutput
	text, isErr := call(t, cs, "run_code", map[string]any{"language": "python", "code": "import sys\nprint(6 * 7)\nprint('warn', file=sys.stderr)\nsys.exit(4)"}, &out)
	if isErr || out.Stdout != "42\n" || out.Stderr != "warn\n" || out.ExitCode != 4 || !strings.Contains(text, "exit code 4") {
		t.Fatalf("run_code in a sandbox of its own: %v %q %+v", isErr, text, out)
	}
	call(t, cs, "run_code", map[string]any{"language": "sh", "code": "id -u; cat", "stdin": "in"}, &out)
	if out.ExitCode != 0 || strings.HasPrefix(out.Stdout, "0\n") || !strings.HasSuffix(out.Stdout, "\nin") {
		t.Fatalf("run_code sh (non-root, with stdin): %+v", out)
	}
	// Both one-shot sandboxes are gone, and the session owns nothing.
	list, err = dp.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, sb := range list {
		if !before[sb.ID] && sb.Owner == owner {
			t.Errorf("sandbox %s outlived the run_code call that made it", sb.ID)
		}
	}
	var mine mcp.ListOutput
	call(t, cs, "list_sandboxes", nil, &mine)
	if len(mine.Sandboxes) != 0 {
		t.Fatalf("run_code's sandboxes are still the session's: %+v", mine)
	}

	var sb mcp.Sandbox
	call(t, cs, "create_sandbox", nil, &sb)
	call(t, cs, "run_code", map[string]any{"language": "python", "code": "open('/tmp/state', 'w').write('kept')", "sandbox_id": sb.ID}, &out)
	call(t, cs, "run_code", map[string]any{"language": "bash", "code": "cat /tmp/state", "sandbox_id": sb.ID}, &out)
	if out.Stdout != "kept" {
		t.Fatalf("run_code in the session's sandbox: the second call read %+v", out)
	}
	call(t, cs, "run_code", map[string]any{"language": "bash", "code": "sleep 30", "sandbox_id": sb.ID, "timeout_secs": 1}, &out)
	if !out.TimedOut {
		t.Fatalf("run_code past its timeout: %+v", out)
	}
}

// callRaw calls a tool and returns its whole result, its structured content decoded
// into out even when it is an error.
func callRaw(t *testing.T, cs *sdk.ClientSession, name string, args map[string]any, out any) *sdk.CallToolResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := cs.CallTool(ctx, &sdk.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	b, err := json.Marshal(res.StructuredContent)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, out); err != nil {
		t.Fatalf("%s: structured content %s: %v", name, b, err)
	}
	return res
}

func textOf(res *sdk.CallToolResult) string {
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*sdk.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}

// TestRunCodeInContext: in a session's sandbox on a provider with code contexts,
// run_code keeps variables from one call to the next, returns the last expression's
// value, charts as PNG image content, and exceptions as errors with their traceback;
// a timeout interrupts the code and the variables stay.
func TestRunCodeInContext(t *testing.T) {
	s, _ := newServer(t, mcp.Config{})
	cs := connect(t, s)
	var sb mcp.Sandbox
	call(t, cs, "create_sandbox", nil, &sb)
	py := func(code string, extra ...any) map[string]any {
		args := map[string]any{"language": "python", "code": code, "sandbox_id": sb.ID}
		for i := 0; i+1 < len(extra); i += 2 {
			args[extra[i].(string)] = extra[i+1]
		}
		return args
	}

	var out mcp.CodeOutput
	if res := callRaw(t, cs, "run_code", py("x = 41"), &out); res.IsError || out.Result != "" {
		t.Fatalf("x = 41: %v %+v", res.IsError, out)
	}
	first := out.ExecutionCount
	res := callRaw(t, cs, "run_code", py("print('hi')\nx + 1"), &out)
	if res.IsError || out.Result != "42" || out.Stdout != "hi\n" || out.ExecutionCount != first+1 {
		t.Fatalf("x + 1 in the same sandbox: %v %+v", res.IsError, out)
	}
	if text := textOf(res); !strings.Contains(text, "--- result ---\n42") {
		t.Fatalf("x + 1's text: %q", text)
	}

	res = callRaw(t, cs, "run_code", py("import matplotlib.pyplot as plt\nplt.figure(figsize=(2, 1), dpi=50)\nplt.plot([1, 3, 2])\nplt.show()"), &out)
	var images []*sdk.ImageContent
	for _, c := range res.Content {
		if ic, ok := c.(*sdk.ImageContent); ok {
			images = append(images, ic)
		}
	}
	if res.IsError || out.Images != 1 || len(images) != 1 {
		t.Fatalf("a chart: %v %q %+v", res.IsError, textOf(res), out)
	}
	if images[0].MIMEType != "image/png" || !strings.HasPrefix(string(images[0].Data), "\x89PNG\r\n\x1a\n") {
		t.Fatalf("the chart's image: %s %q", images[0].MIMEType, images[0].Data[:min(16, len(images[0].Data))])
	}
	// On the wire, as MCP has it: base64 data and its MIME type.
	wire, err := json.Marshal(images[0])
	if err != nil {
		t.Fatal(err)
	}
	var w struct{ Type, MIMEType, Data string }
	if err := json.Unmarshal(wire, &w); err != nil || w.Type != "image" {
		t.Fatalf("the chart on the wire: %s %v", wire[:min(80, len(wire))], err)
	}
	if png, err := base64.StdEncoding.DecodeString(w.Data); err != nil || !strings.HasPrefix(string(png), "\x89PNG") {
		t.Fatalf("the chart's data is not base64 PNG: %v", err)
	}

	res = callRaw(t, cs, "run_code", py("def f():\n    return 1 / 0\nf()"), &out)
	text := textOf(res)
	if !res.IsError || out.Error == nil || out.Error.Name != "ZeroDivisionError" || out.ExitCode != 1 ||
		!strings.Contains(text, "Traceback (most recent call last)") || !strings.Contains(text, "return 1 / 0") {
		t.Fatalf("an exception: %v %q %+v", res.IsError, text, out)
	}

	res = callRaw(t, cs, "run_code", py("while True:\n    pass", "timeout_secs", 1), &out)
	if !res.IsError || !out.TimedOut || out.Error == nil || out.Error.Name != "KeyboardInterrupt" ||
		!strings.Contains(textOf(res), "interrupted at its timeout") {
		t.Fatalf("a timeout: %v %q %+v", res.IsError, textOf(res), out)
	}
	if res := callRaw(t, cs, "run_code", py("x"), &out); res.IsError || out.Result != "41" {
		t.Fatalf("x after the timeout: %v %+v", res.IsError, out)
	}
	// Standard input needs a process of its own: run as a script.
	var script mcp.CodeOutput
	if res := callRaw(t, cs, "run_code", py("import sys; print(sys.stdin.read()); print('x' in dir())", "stdin", "in"), &script); res.IsError ||
		script.Stdout != "in\nFalse\n" || script.ExecutionCount != 0 || script.Result != "" {
		t.Fatalf("with stdin: %v %+v", res.IsError, script)
	}
}

// TestSchemasForModels: what a model reads of each tool is typed as it must call it (no
// argument may be null, a required one is listed so), and the tools that change
// nothing say so.
func TestSchemasForModels(t *testing.T) {
	s := mcp.New(providers{}, mcp.Config{})
	defer s.Close(context.Background())
	cs := connect(t, s)
	tools, err := cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	seen := 0
	for _, tool := range tools.Tools {
		b, err := json.Marshal(tool.InputSchema)
		if err != nil {
			t.Fatal(err)
		}
		var schema struct {
			Required   []string                   `json:"required"`
			Properties map[string]json.RawMessage `json:"properties"`
		}
		if err := json.Unmarshal(b, &schema); err != nil {
			t.Fatal(err)
		}
		for name, raw := range schema.Properties {
			var p struct {
				Type any `json:"type"`
			}
			if err := json.Unmarshal(raw, &p); err != nil {
				t.Fatal(err)
			}
			if _, one := p.Type.(string); !one {
				t.Errorf("%s: argument %s is typed %v, want one type", tool.Name, name, p.Type)
			}
		}
		readOnly := tool.Annotations != nil && tool.Annotations.ReadOnlyHint && tool.Annotations.IdempotentHint
		switch tool.Name {
		case "exec":
			seen++
			if !slices.Contains(schema.Required, "command") || !strings.Contains(string(schema.Properties["command"]), `"type":"array"`) {
				t.Errorf("exec's command: required %v, schema %s", schema.Required, schema.Properties["command"])
			}
		case "run_code":
			seen++
			if !slices.Equal(schema.Required, []string{"code"}) {
				t.Errorf("run_code requires %v, want code alone (language defaults to python)", schema.Required)
			}
		case "read_file", "list_sandboxes", "list_files", "read_command_output", "list_commands", "egress_log":
			seen++
			if !readOnly {
				t.Errorf("%s does not say it is read-only and idempotent: %+v", tool.Name, tool.Annotations)
			}
		default:
			if readOnly {
				t.Errorf("%s says it changes nothing", tool.Name)
			}
		}
	}
	if seen != 8 {
		t.Fatalf("saw %d of exec, run_code, read_file, list_sandboxes, list_files, read_command_output, list_commands and egress_log", seen)
	}
}

// TestArgumentErrorsForModels: arguments the schema refuses are said as the tools' own
// errors are, naming the argument and what it wants, not in the validator's words; and
// run_code without a language runs python, as its schema says.
func TestArgumentErrorsForModels(t *testing.T) {
	s, _ := newServer(t, mcp.Config{})
	cs := connect(t, s)
	for _, c := range []struct {
		tool string
		args map[string]any
		want string
	}{
		{"run_code", map[string]any{"language": "python"}, "run_code's arguments lack code, which it needs (change the arguments and call again)"},
		{"exec", map[string]any{"sandbox_id": "x", "command": "ls -l"}, "exec's arguments: command must be a list (a JSON array), not a string (change the arguments and call again)"},
		{"create_sandbox", map[string]any{"cpus": "two"}, "create_sandbox's arguments: cpus must be a number, not a string"},
		{"destroy_sandbox", map[string]any{}, "destroy_sandbox's arguments lack sandbox_id"},
	} {
		text, isErr := call(t, cs, c.tool, c.args, nil)
		if !isErr || !strings.Contains(text, c.want) || strings.Contains(text, "validating") {
			t.Errorf("%s %v: %v %q, want %q", c.tool, c.args, isErr, text, c.want)
		}
	}
	var out mcp.CodeOutput
	if text, isErr := call(t, cs, "run_code", map[string]any{"code": "import sys; print(sys.version_info[0])"}, &out); isErr || out.Stdout != "3\n" {
		t.Fatalf("run_code without a language: %v %q %+v, want python's 3", isErr, text, out)
	}
}

// downProviders is a server whose backend is down.
type downProviders struct{}

func (downProviders) Get(string) (roche.Provider, error) {
	return nil, fmt.Errorf("%w: docker: the engine at unix:///var/run/docker.sock is not answering (is dockerd running?)", roche.ErrUnavailable)
}
func (downProviders) List(context.Context, string) ([]roche.SandboxInfo, error) { return nil, nil }

// TestErrorsForModels: a failure that is not the model's fault says so, and to tell the
// user rather than retry.
func TestErrorsForModels(t *testing.T) {
	s := mcp.New(downProviders{}, mcp.Config{})
	defer s.Close(context.Background())
	cs := connect(t, s)
	for tool, args := range map[string]map[string]any{"create_sandbox": nil, "run_code": {"language": "python", "code": "1"}} {
		text, isErr := call(t, cs, tool, args, nil)
		if !isErr || !strings.HasPrefix(text, "the sandbox backend failed: ") || !strings.Contains(text, "not answering") ||
			!strings.HasSuffix(text, "(not caused by the arguments: tell the user rather than calling again)") {
			t.Errorf("%s with the backend down: %v %q", tool, isErr, text)
		}
	}
}

// TestWorkspace: files written to /workspace reach the next sandbox with the same
// workspace, after the first is destroyed.
func TestWorkspace(t *testing.T) {
	s, dp := newServer(t, mcp.Config{})
	cs := connect(t, s)
	ws := fmt.Sprintf("mcp-%d", time.Now().UnixNano())
	t.Cleanup(func() {
		if err := dp.RemoveWorkspace(context.Background(), ws); err != nil {
			t.Errorf("removing the workspace: %v", err)
		}
	})
	var sb mcp.Sandbox
	if text, isErr := call(t, cs, "create_sandbox", map[string]any{"workspace": ws}, &sb); isErr {
		t.Fatalf("create_sandbox with a workspace: %s", text)
	}
	var wrote mcp.WriteOutput
	call(t, cs, "write_file", map[string]any{"sandbox_id": sb.ID, "path": "/workspace/notes.txt", "content": "turn 1\n"}, &wrote)
	var destroyed mcp.DestroyOutput
	call(t, cs, "destroy_sandbox", map[string]any{"sandbox_id": sb.ID}, &destroyed)

	var sb2 mcp.Sandbox
	call(t, cs, "create_sandbox", map[string]any{"workspace": ws}, &sb2)
	var read mcp.ReadOutput
	if text, isErr := call(t, cs, "read_file", map[string]any{"sandbox_id": sb2.ID, "path": "/workspace/notes.txt"}, &read); isErr || read.Content != "turn 1\n" {
		t.Fatalf("the workspace in the next sandbox: %+v %s", read, text)
	}
	call(t, cs, "destroy_sandbox", map[string]any{"sandbox_id": sb2.ID}, &destroyed)
	text, isErr := call(t, cs, "create_sandbox", map[string]any{"workspace": "../etc"}, nil)
	if !isErr || !strings.Contains(text, "workspace") {
		t.Fatalf("a bad workspace name: %v %q", isErr, text)
	}
}

// TestWritableDisk: a writable root asked for with a disk size has that size inside.
func TestWritableDisk(t *testing.T) {
	s, _ := newServer(t, mcp.Config{})
	cs := connect(t, s)
	var sb mcp.Sandbox
	if text, isErr := call(t, cs, "create_sandbox", map[string]any{"writable": true, "disk": "100m"}, &sb); isErr {
		t.Fatalf("create_sandbox with disk 100m: %s", text)
	}
	var out mcp.ExecOutput
	call(t, cs, "exec", map[string]any{"sandbox_id": sb.ID, "command": []string{"python3", "-c",
		"import os; s = os.statvfs('/'); print(s.f_blocks * s.f_frsize >> 20)"}}, &out)
	if mib, _ := strconv.Atoi(strings.TrimSpace(out.Stdout)); mib < 80 || mib > 100 {
		t.Fatalf("a writable root of disk 100m is %q MiB inside", out.Stdout)
	}
	var destroyed mcp.DestroyOutput
	call(t, cs, "destroy_sandbox", map[string]any{"sandbox_id": sb.ID}, &destroyed)
}

// TestSessionsSeeOnlyTheirOwn: a session lists, runs in, reads, writes and destroys only
// the sandboxes it created. Another session's sandbox, and one made outside the server
// (by the CLI, a daemon, another user), get "not found", as a made-up id does, and are
// left as they were.
func TestSessionsSeeOnlyTheirOwn(t *testing.T) {
	s, dp := newServer(t, mcp.Config{Owner: "mcp-test"})
	ctx := context.Background()
	cfg := roche.DefaultConfig()
	cfg.Image = testenv.Image()
	foreign, err := dp.CreateFor(ctx, cfg, kit.CreateOptions{Owner: "cli:someone-else@elsewhere"})
	if err != nil {
		t.Fatal(err)
	}
	defer dp.Destroy(ctx, foreign.ID)
	one, two := connect(t, s), connect(t, s)
	var sb1, sb2 mcp.Sandbox
	call(t, one, "create_sandbox", nil, &sb1)
	call(t, two, "create_sandbox", nil, &sb2)
	if info, err := dp.Inspect(ctx, sb1.ID); err != nil || info.Owner != "mcp-test" {
		t.Fatalf("the server's sandbox: owner %q (%v), want the server's", info.Owner, err)
	}
	for _, id := range []string{sb1.ID, foreign.ID, "0123456789ab"} {
		for tool, args := range map[string]map[string]any{
			"exec":            {"sandbox_id": id, "command": []string{"touch", "/tmp/was-here"}},
			"write_file":      {"sandbox_id": id, "path": "/tmp/was-here", "content": "x"},
			"read_file":       {"sandbox_id": id, "path": "/etc/hostname"},
			"destroy_sandbox": {"sandbox_id": id},
		} {
			text, isErr := call(t, two, tool, args, nil)
			if !isErr || !strings.Contains(text, "not found: no sandbox "+id+" in this session") {
				t.Errorf("%s on %s from another session: %v %q, want not found", tool, id, isErr, text)
			}
		}
	}
	for cs, want := range map[*sdk.ClientSession]string{one: sb1.ID, two: sb2.ID} {
		var list mcp.ListOutput
		call(t, cs, "list_sandboxes", nil, &list)
		if len(list.Sandboxes) != 1 || list.Sandboxes[0].ID != want {
			t.Errorf("list_sandboxes: %+v, want only %s", list, want)
		}
	}
	for _, id := range []string{sb1.ID, foreign.ID} {
		res, err := dp.Exec(ctx, id, roche.ExecRequest{Cmd: []string{"ls", "/tmp"}})
		if err != nil || strings.Contains(res.Stdout, "was-here") {
			t.Errorf("sandbox %s after another session's attempts: %+v %v", id, res, err)
		}
	}
	var out mcp.ExecOutput
	if text, isErr := call(t, one, "exec", map[string]any{"sandbox_id": sb1.ID, "command": []string{"true"}}, &out); isErr {
		t.Fatalf("the owning session's exec: %s", text)
	}
}

// TestCloseDestroysWhatItCreated: a client that goes away leaves nothing running.
func TestCloseDestroysWhatItCreated(t *testing.T) {
	s, dp := newServer(t, mcp.Config{})
	cs := connect(t, s)
	var sb mcp.Sandbox
	call(t, cs, "create_sandbox", nil, &sb)
	if err := s.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := dp.Inspect(context.Background(), sb.ID); !errors.Is(err, roche.ErrNotFound) {
		t.Fatalf("after Close: %v", err)
	}
}

// bearer adds a token to every request.
type bearer struct{ token string }

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return http.DefaultTransport.RoundTrip(r)
}

// TestStreamableHTTP: the same tools over streamable HTTP, behind a bearer token.
func TestStreamableHTTP(t *testing.T) {
	s, _ := newServer(t, mcp.Config{})
	hs := httptest.NewServer(s.Handler("s3cret"))
	defer hs.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	client := sdk.NewClient(&sdk.Implementation{Name: "test", Version: "1"}, nil)

	_, err := client.Connect(ctx, &sdk.StreamableClientTransport{Endpoint: hs.URL, MaxRetries: -1}, nil)
	if err == nil || !strings.Contains(err.Error(), "Unauthorized") {
		t.Fatalf("connecting without the token: %v, want it unauthorized", err)
	}
	cs, err := client.Connect(ctx, &sdk.StreamableClientTransport{
		Endpoint: hs.URL, HTTPClient: &http.Client{Transport: bearer{"s3cret"}}, DisableStandaloneSSE: true,
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	var sb mcp.Sandbox
	call(t, cs, "create_sandbox", nil, &sb)
	var out mcp.ExecOutput
	call(t, cs, "exec", map[string]any{"sandbox_id": sb.ID, "command": []string{"python3", "-c", "print('over http')"}}, &out)
	if out.Stdout != "over http\n" || out.ExitCode != 0 {
		t.Fatalf("exec over HTTP: %+v", out)
	}
	// Another HTTP session cannot reach it.
	other, err := client.Connect(ctx, &sdk.StreamableClientTransport{
		Endpoint: hs.URL, HTTPClient: &http.Client{Transport: bearer{"s3cret"}}, DisableStandaloneSSE: true,
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if text, isErr := call(t, other, "exec", map[string]any{"sandbox_id": sb.ID, "command": []string{"true"}}, nil); !isErr || !strings.Contains(text, "not found") {
		t.Fatalf("another HTTP session's exec: %v %q", isErr, text)
	}
	call(t, cs, "destroy_sandbox", map[string]any{"sandbox_id": sb.ID}, nil)
}

// TestCheckListen: plain HTTP is served on loopback only, token or not (a token sent in
// the clear is no guard), and the refusal names the safe way; a token is long enough.
func TestCheckListen(t *testing.T) {
	long := strings.Repeat("k", mcp.MinTokenLength)
	for addr, ok := range map[string]bool{
		"127.0.0.1:8765": true, "localhost:0": true, "[::1]:80": true,
		"0.0.0.0:8765": false, ":8765": false, "10.0.0.1:1": false, "nonsense": false,
	} {
		for _, token := range []string{"", long} {
			err := mcp.CheckListen(addr, token)
			if (err == nil) != ok {
				t.Errorf("CheckListen(%q, token %q): %v", addr, token, err)
			}
			if err != nil && addr != "nonsense" && (!strings.Contains(err.Error(), "plain HTTP") || !strings.Contains(err.Error(), "ssh -L")) {
				t.Errorf("CheckListen(%q) refused without naming the safe way: %v", addr, err)
			}
		}
	}
	if err := mcp.CheckListen("127.0.0.1:8765", "short"); err == nil || !strings.Contains(err.Error(), "at least 16") {
		t.Errorf("a 5-character token: %v, want it refused", err)
	}
}
