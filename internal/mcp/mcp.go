// Package mcp serves Roche to any Model Context Protocol client (Claude Desktop, Claude
// Code, Cursor, VS Code, ...): tools to create a sandbox, run commands in it (in the
// foreground, or in the background to read from as they go: commands.go), write and
// read its files, list sandboxes and destroy them. It sits on the same provider access as
// the CLI (roched when it answers, else the provider in-process) and keeps Roche's secure
// defaults: a client cannot mount host paths, and cannot turn the network on unless the
// server was started with AllowNetwork. A session sees only the sandboxes it created:
// every other id, whoever made it, is "not found".
package mcp

import (
	"bytes"
	"cmp"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/internal/buildinfo"
	"github.com/roche-sandbox/roche/internal/catalog"
	"github.com/roche-sandbox/roche/internal/remedy"
	"github.com/roche-sandbox/roche/internal/size"
	"github.com/roche-sandbox/roche/internal/wire"
	"github.com/roche-sandbox/roche/provider/kit"
)

// Providers is how the server reaches sandboxes.
type Providers interface {
	// Get opens the named provider.
	Get(name string) (roche.Provider, error)
	// List lists the sandboxes of the named provider, or of every available one when
	// name is empty.
	List(ctx context.Context, name string) ([]roche.SandboxInfo, error)
}

// Config is what the server offers.
type Config struct {
	// DefaultProvider is used when a create names none (providers.Default when empty).
	DefaultProvider string
	// DefaultImage is used when a create names none (roche.DefaultImage when empty).
	DefaultImage string
	// AllowNetwork lets clients create sandboxes with a network. Off, a create asking
	// for one is refused: the code an LLM writes must not reach the network unless the
	// person running the server chose so.
	AllowNetwork bool
	// Version is reported to clients.
	Version string
	// Owner is the roche.Config.Owner of the sandboxes the server creates in-process
	// (through roched, the daemon sets its own).
	Owner string
}

// The limits on what a tool returns: a model's context is small, and a file or a
// command's output may not be. A client may raise them up to the maximums.
const (
	DefaultReadLimit   = 1 << 20
	MaxReadLimit       = 8 << 20
	DefaultOutputLimit = 100 << 10
)

// Server is Roche's MCP server. It remembers the sandboxes it created, and for which
// session: a session's tools reach only its own, and Close destroys those still alive,
// so a client that goes away leaves nothing running.
type Server struct {
	cfg       Config
	providers Providers
	log       *slog.Logger
	server    *mcp.Server

	mu      sync.Mutex
	created map[string]created
	// destroyed are the sandboxes each session has destroyed, so that destroying one
	// again succeeds (destroy_sandbox is idempotent) while an id the session never had
	// stays "not found"; the last maxRemembered of them, oldest first in forget.
	destroyed map[destroyedKey]bool
	forget    []destroyedKey
}

// maxRemembered bounds the destroyed sandboxes remembered for idempotent destroys.
const maxRemembered = 4096

type destroyedKey struct {
	session *mcp.ServerSession
	id      string
}

// created is a sandbox the server made: its provider and the session that asked.
type created struct {
	p       roche.Provider
	session *mcp.ServerSession
}

// Option configures a Server.
type Option func(*Server)

// WithLogger sets the logger; the default discards.
func WithLogger(l *slog.Logger) Option { return func(s *Server) { s.log = l } }

// New returns a server with Roche's tools.
func New(p Providers, cfg Config, opts ...Option) *Server {
	if cfg.DefaultProvider == "" {
		cfg.DefaultProvider = catalog.Default
	}
	if cfg.DefaultImage == "" {
		cfg.DefaultImage = roche.DefaultImage
	}
	if cfg.Version == "" {
		cfg.Version = buildinfo.Version()
	}
	s := &Server{cfg: cfg, providers: p, log: slog.New(slog.DiscardHandler), created: map[string]created{}, destroyed: map[destroyedKey]bool{}}
	for _, o := range opts {
		o(s)
	}
	s.server = mcp.NewServer(&mcp.Implementation{Name: "roche", Title: "Roche sandboxes", Version: cfg.Version},
		&mcp.ServerOptions{Instructions: instructions, Logger: s.log})
	s.server.AddReceivingMiddleware(argumentErrors)
	s.addTools()
	return s
}

const instructions = `Roche runs untrusted code in isolated sandboxes: no network, a read-only root with a
writable /tmp, 512 MiB, 1 CPU, 64 processes, a non-root user, and a lifetime (300 s by
default) after which the sandbox is destroyed. Create a sandbox, run commands in it
(e.g. ["python3", "-c", "print(1)"]), move files in and out with write_file and
read_file, and destroy it when done. To keep files from one sandbox to the next, give
create_sandbox a workspace name: it is mounted at /workspace and outlives the sandbox.
For a long-running command (a server, a build), start_command returns its pid at once;
read_command_output reads its output from offsets as it goes, kill_command stops it.
A sandbox made with allow_hosts reaches those hosts only; when a download fails in it,
egress_log shows what was refused and the allow_hosts entries it needed.`

// MCP is the underlying go-sdk server, for transports of the caller's choosing.
func (s *Server) MCP() *mcp.Server { return s.server }

// Close destroys the sandboxes this server created that are still alive.
func (s *Server) Close(ctx context.Context) error {
	s.mu.Lock()
	all := s.created
	s.created = map[string]created{}
	s.mu.Unlock()
	var errs []error
	for id, c := range all {
		if err := c.p.Destroy(ctx, id); err != nil {
			errs = append(errs, fmt.Errorf("destroying sandbox %s: %w", id, err))
		}
	}
	return errors.Join(errs...)
}

func boolPtr(b bool) *bool { return &b }

// own returns the provider of sandbox id if the session created it. Any other id (a
// mistyped one, another session's, one made outside this server) is "not found" alike,
// so a session learns nothing of sandboxes that are not its own.
func (s *Server) own(session *mcp.ServerSession, id string) (roche.Provider, error) {
	s.mu.Lock()
	c, ok := s.created[id]
	s.mu.Unlock()
	if !ok || c.session != session {
		return nil, fmt.Errorf("%w: no sandbox %s in this session: create_sandbox makes one, list_sandboxes shows this session's", roche.ErrNotFound, id)
	}
	return c.p, nil
}

func (s *Server) addTools() {
	// Every tool acts inside sandboxes, a closed world: none reaches the internet.
	readOnly := &mcp.ToolAnnotations{ReadOnlyHint: true, IdempotentHint: true, OpenWorldHint: boolPtr(false)}
	addTool(s.server, &mcp.Tool{
		Name:  "create_sandbox",
		Title: "Create a sandbox",
		Description: "Create an isolated sandbox with secure defaults (no network, read-only root, writable /tmp, " +
			"512 MiB, 1 CPU, 300 s lifetime; a writable root holds 1 GiB) and return its id. Destroy it when done.",
		InputSchema: s.createSchema(),
		Annotations: &mcp.ToolAnnotations{DestructiveHint: boolPtr(false), OpenWorldHint: boolPtr(false)},
	}, s.create)
	addTool(s.server, &mcp.Tool{
		Name:  "run_code",
		Title: "Run code in a sandbox",
		Description: "Run a piece of code (python, sh or bash; javascript where the image has node) and return its " +
			"stdout, stderr and exit code. Without sandbox_id it runs in a new sandbox with the secure defaults, " +
			"destroyed afterwards; with one, it runs there and files it writes stay for the next call. Where the " +
			"sandbox has a code interpreter (python on most providers), the code runs in it as in a notebook: with " +
			"sandbox_id, variables and imports stay for the next call; the value of the last expression is returned, " +
			"charts (matplotlib) come back as images, and an exception as an error with its traceback.",
		Annotations: &mcp.ToolAnnotations{DestructiveHint: boolPtr(false), OpenWorldHint: boolPtr(false)},
	}, s.runCode)
	addTool(s.server, &mcp.Tool{
		Name:  "exec",
		Title: "Run a command in a sandbox",
		Description: "Run a command in a sandbox and return its stdout, stderr and exit code. The command is an " +
			`argv list, e.g. ["python3", "-c", "print(2 + 2)"] or ["sh", "-c", "ls /tmp"]. A timeout kills it ` +
			"and everything it started.",
		Annotations: &mcp.ToolAnnotations{OpenWorldHint: boolPtr(false)},
	}, s.exec)
	addTool(s.server, &mcp.Tool{
		Name:        "write_file",
		Title:       "Write a file into a sandbox",
		Description: "Write a file at an absolute path in a sandbox (under /tmp unless it is writable), replacing it and creating parent directories.",
		Annotations: &mcp.ToolAnnotations{IdempotentHint: true, OpenWorldHint: boolPtr(false)},
	}, s.writeFile)
	addTool(s.server, &mcp.Tool{
		Name:        "read_file",
		Title:       "Read a file from a sandbox",
		Description: "Read a file from a sandbox: UTF-8 text as is, anything else as base64.",
		Annotations: readOnly,
	}, s.readFile)
	addTool(s.server, &mcp.Tool{
		Name:  "list_files",
		Title: "List a directory in a sandbox",
		Description: "List the files and directories below a directory in a sandbox, to a depth (1, the default, " +
			"lists its entries; at most 5), with each one's type, size, permissions and modification time. " +
			"Symlinks are listed, not followed.",
		Annotations: readOnly,
	}, s.listFiles)
	addTool(s.server, &mcp.Tool{
		Name:        "list_sandboxes",
		Title:       "List sandboxes",
		Description: "List the live sandboxes this session created, with their ids, images and expiry times.",
		Annotations: readOnly,
	}, s.list)
	addTool(s.server, &mcp.Tool{
		Name:  "set_sandbox_timeout",
		Title: "Change a sandbox's lifetime",
		Description: "Make a sandbox of this session end timeout_secs from now instead of when it was to end: " +
			"more time to finish long work, or less to free it sooner. Returns the sandbox with its new expiry.",
		Annotations: &mcp.ToolAnnotations{IdempotentHint: true, OpenWorldHint: boolPtr(false)},
	}, s.setTimeout)
	addTool(s.server, &mcp.Tool{
		Name:        "destroy_sandbox",
		Title:       "Destroy a sandbox",
		Description: "Destroy a sandbox and everything in it.",
		Annotations: &mcp.ToolAnnotations{DestructiveHint: boolPtr(true), IdempotentHint: true, OpenWorldHint: boolPtr(false)},
	}, s.destroy)
	s.addCommandTools()
	s.addEgressTools()
}

// addTool adds a tool whose input schema is In's, tidied for models (schemaFor), and
// whose errors are worded for the model that called it (forModel).
func addTool[In, Out any](server *mcp.Server, t *mcp.Tool, h mcp.ToolHandlerFor[In, Out]) {
	if t.InputSchema == nil {
		t.InputSchema = schemaFor[In]()
	}
	mcp.AddTool(server, t, func(ctx context.Context, req *mcp.CallToolRequest, in In) (*mcp.CallToolResult, Out, error) {
		res, out, err := h(ctx, req, in)
		if err != nil {
			return nil, out, forModel(err)
		}
		return res, out, nil
	})
}

// schemaFor is T's JSON schema as a model should read it. Go's nil slices and maps make
// jsonschema-go type a field "null or array" (or object); no tool takes a null, and a
// required argv typed as nullable invites one, so every such field gets its one type.
func schemaFor[T any]() *jsonschema.Schema {
	schema, err := jsonschema.For[T](nil)
	if err != nil {
		panic(fmt.Sprintf("mcp: the input schema of %T: %v", *new(T), err)) // the inputs are fixed: a bug, seen by every test
	}
	for _, p := range schema.Properties {
		if len(p.Types) == 2 && slices.Contains(p.Types, "null") {
			p.Type = p.Types[0]
			if p.Type == "null" {
				p.Type = p.Types[1]
			}
			p.Types = nil
		}
	}
	return schema
}

// forModel words an error for the model that called a tool. The providers' messages are
// written for a person at a terminal; a model needs to know whether to change its call,
// wait, or stop and tell its user, so each kind of failure says which.
func forModel(err error) error {
	msg := strings.Join(strings.Fields(remedy.Advise(err, remedy.ForModel)), " ")
	switch {
	case errors.Is(err, roche.ErrNotFound), errors.Is(err, roche.ErrImageNotFound):
		return errors.New(msg)
	case errors.Is(err, roche.ErrOutputGone):
		return fmt.Errorf("%s (change the arguments: read again from the first offset still kept)", msg)
	case errors.Is(err, roche.ErrInvalidConfig), errors.Is(err, roche.ErrUnsupported), errors.Is(err, roche.ErrPermission):
		return fmt.Errorf("%s (change the arguments and call again)", msg)
	case errors.Is(err, roche.ErrExhausted), errors.Is(err, roche.ErrInUse):
		return fmt.Errorf("%s (the server is at a limit: destroy sandboxes you no longer need, or wait, then call again)", msg)
	case errors.Is(err, roche.ErrTimeout):
		return fmt.Errorf("%s (the call took too long: call again, with a smaller task or a longer timeout)", msg)
	case errors.Is(err, roche.ErrUnavailable):
		return fmt.Errorf("the sandbox backend failed: %s (not caused by the arguments: tell the user rather than calling again)", msg)
	}
	return errors.New(msg)
}

// argumentErrors words the go-sdk's refusals of a tool call's arguments (its schema
// validator's text: `validating "arguments": validating root: required: missing
// properties: ["code"]`) as forModel words the tools' own errors.
func argumentErrors(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		res, err := next(ctx, method, req)
		r, ok := res.(*mcp.CallToolResult)
		if err != nil || !ok || !r.IsError || len(r.Content) != 1 {
			return res, err
		}
		tc, ok := r.Content[0].(*mcp.TextContent)
		if !ok {
			return res, err
		}
		if msg, ok := strings.CutPrefix(tc.Text, `validating "arguments": `); ok {
			tool := ""
			if p, ok := req.GetParams().(*mcp.CallToolParamsRaw); ok {
				tool = p.Name
			}
			tc.Text = forModel(fmt.Errorf("%w: %s", roche.ErrInvalidConfig, badArguments(tool, msg))).Error()
		}
		return res, err
	}
}

var (
	missingArgs  = regexp.MustCompile(`required: missing properties: \[(.*)\]$`)
	wrongType    = regexp.MustCompile(`validating /properties/([\w-]+): type: .* has type "(\w+)", want "(\w+)"$`)
	unknownArgs  = regexp.MustCompile(`unexpected additional properties \[(.*)\]$`)
	validatingAt = regexp.MustCompile(`^(?:validating [^:]*: )+`)
)

// badArguments says what is wrong with a tool's arguments, from the validator's text.
func badArguments(tool, msg string) string {
	names := func(list string) string { return strings.ReplaceAll(strings.ReplaceAll(list, `"`, ""), ",", ", ") }
	prefix := "the arguments"
	if tool != "" {
		prefix = tool + "'s arguments"
	}
	switch {
	case missingArgs.MatchString(msg):
		return fmt.Sprintf("%s lack %s, which it needs", prefix, names(missingArgs.FindStringSubmatch(msg)[1]))
	case wrongType.MatchString(msg):
		m := wrongType.FindStringSubmatch(msg)
		want := map[string]string{"array": "a list (a JSON array)", "object": "an object", "number": "a number",
			"integer": "a whole number", "string": "a string", "boolean": "true or false"}[m[3]]
		return fmt.Sprintf("%s: %s must be %s, not a %s", prefix, m[1], cmp.Or(want, "a "+m[3]), m[2])
	case unknownArgs.MatchString(msg):
		return fmt.Sprintf("%s: %s is not one of them", prefix, names(unknownArgs.FindStringSubmatch(msg)[1]))
	}
	return prefix + ": " + validatingAt.ReplaceAllString(msg, "")
}

// createSchema is create_sandbox's input schema, its provider field naming the
// providers from the registry and this server's default, which a struct tag cannot.
func (s *Server) createSchema() *jsonschema.Schema {
	schema := schemaFor[CreateInput]()
	names := catalog.Names()
	schema.Properties["provider"].Description = fmt.Sprintf("isolation backend: %s or %s (%s when left out)",
		strings.Join(names[:len(names)-1], ", "), names[len(names)-1], s.cfg.DefaultProvider)
	return schema
}

// CreateInput is create_sandbox's arguments; what is left out takes the secure default.
type CreateInput struct {
	Provider      string            `json:"provider,omitempty" jsonschema:"isolation backend (see createSchema)"`
	Image         string            `json:"image,omitempty" jsonschema:"image to run (the server's default when left out)"`
	Network       bool              `json:"network,omitempty" jsonschema:"give the sandbox a network; refused unless the server allows it"`
	Writable      bool              `json:"writable,omitempty" jsonschema:"make the root filesystem writable"`
	Disk          string            `json:"disk,omitempty" jsonschema:"what a writable root may hold, e.g. 1g (the default) or 5g; past it writes fail with ENOSPC"`
	TimeoutSecs   int               `json:"timeout_secs,omitempty" jsonschema:"lifetime in seconds, after which the sandbox is destroyed (default 300)"`
	Memory        string            `json:"memory,omitempty" jsonschema:"memory limit, e.g. 512m (the default) or 1g"`
	CPUs          float64           `json:"cpus,omitempty" jsonschema:"CPUs the sandbox may use, e.g. 1 (the default) or 0.5"`
	Env           map[string]string `json:"env,omitempty" jsonschema:"environment variables for every command"`
	Workdir       string            `json:"workdir,omitempty" jsonschema:"working directory of commands, an absolute path"`
	Workspace     string            `json:"workspace,omitempty" jsonschema:"name of a persistent workspace to mount at /workspace: its files outlive the sandbox, and a later sandbox with the same name sees them"`
	WorkspaceSize string            `json:"workspace_size,omitempty" jsonschema:"size of a new workspace, e.g. 1g (the default); an existing one keeps its own"`
	AllowHosts    []string          `json:"allow_hosts,omitempty" jsonschema:"hosts the sandbox may reach over HTTP(S), and only those, through an egress proxy (e.g. [\"pypi.org\", \"files.pythonhosted.org\"]); refused unless the server allows network; egress_log shows what it allowed and refused"`
}

// Sandbox describes a sandbox.
type Sandbox struct {
	ID        string `json:"id"`
	Provider  string `json:"provider"`
	Image     string `json:"image"`
	State     string `json:"state"`
	ExpiresAt string `json:"expires_at,omitempty" jsonschema:"when the sandbox will be destroyed, RFC 3339"`
}

func sandboxOf(sb roche.SandboxInfo) Sandbox {
	out := Sandbox{ID: sb.ID, Provider: sb.Provider, Image: sb.Image, State: string(sb.State)}
	if !sb.ExpiresAt.IsZero() {
		out.ExpiresAt = sb.ExpiresAt.UTC().Format(time.RFC3339)
	}
	return out
}

func (s *Server) create(ctx context.Context, req *mcp.CallToolRequest, in CreateInput) (*mcp.CallToolResult, Sandbox, error) {
	sb, _, err := s.newSandbox(ctx, req.Session, in)
	if err != nil {
		return nil, Sandbox{}, err
	}
	return nil, sandboxOf(sb), nil
}

// newSandbox creates a sandbox for the session and remembers it as the session's.
func (s *Server) newSandbox(ctx context.Context, session *mcp.ServerSession, in CreateInput) (roche.SandboxInfo, roche.Provider, error) {
	if (in.Network || len(in.AllowHosts) > 0) && !s.cfg.AllowNetwork {
		return roche.SandboxInfo{}, nil, fmt.Errorf("%w: network access is off for this server: sandboxes run without a network; "+
			"do the work offline, or ask the user to allow it (roche mcp --allow-network)", roche.ErrPermission)
	}
	cfg := roche.DefaultConfig()
	cfg.Image = s.cfg.DefaultImage
	if in.Image != "" {
		cfg.Image = in.Image
	}
	cfg.Network, cfg.Writable, cfg.Env, cfg.Workdir, cfg.Workspace = in.Network, in.Writable, in.Env, in.Workdir, in.Workspace
	cfg.NetworkAllowlist = in.AllowHosts
	if in.TimeoutSecs != 0 {
		cfg.TimeoutSecs = in.TimeoutSecs
	}
	if in.Memory != "" {
		cfg.Memory = in.Memory
	}
	if in.CPUs != 0 {
		cfg.CPUs = in.CPUs
	}
	if in.Disk != "" {
		// A model does not get to lift the bound; whoever runs the server could, in Go.
		if n, err := size.Parse(in.Disk); err == nil && n == 0 {
			return roche.SandboxInfo{}, nil, fmt.Errorf("%w: disk 0 (no limit) is not offered here: give a size such as 5g", roche.ErrInvalidConfig)
		}
		cfg.Disk = in.Disk
	}
	cfg.WorkspaceSize = in.WorkspaceSize
	if err := cfg.Validate(); err != nil {
		return roche.SandboxInfo{}, nil, err
	}
	name := in.Provider
	if name == "" {
		name = s.cfg.DefaultProvider
	}
	p, err := s.providers.Get(name)
	if err != nil {
		return roche.SandboxInfo{}, nil, err
	}
	// A create is finished even if the client gives up midway, so that nothing
	// half-made is left; what the client never hears of is destroyed by Close.
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Minute)
	defer cancel()
	sb, err := kit.Create(cctx, p, cfg, kit.CreateOptions{Owner: s.cfg.Owner})
	if err != nil {
		return roche.SandboxInfo{}, nil, err
	}
	s.mu.Lock()
	s.created[sb.ID] = created{p: p, session: session}
	s.mu.Unlock()
	s.log.Info("sandbox created", "id", sb.ID, "provider", name, "image", sb.Image)
	return sb, p, nil
}

// ExecInput is exec's arguments.
type ExecInput struct {
	SandboxID   string            `json:"sandbox_id" jsonschema:"the sandbox's id, from create_sandbox"`
	Command     []string          `json:"command" jsonschema:"the program and its arguments, e.g. [\"python3\", \"-c\", \"print(1)\"]"`
	TimeoutSecs float64           `json:"timeout_secs,omitempty" jsonschema:"kill the command after this many seconds (default: the sandbox's remaining lifetime)"`
	Stdin       string            `json:"stdin,omitempty" jsonschema:"standard input for the command"`
	Env         map[string]string `json:"env,omitempty" jsonschema:"environment variables for this command"`
	Workdir     string            `json:"workdir,omitempty" jsonschema:"working directory for this command"`
	MaxOutput   int               `json:"max_output_bytes,omitempty" jsonschema:"keep at most this many bytes of each of stdout and stderr (default 100 KiB, at most 10 MiB); more is cut and flagged truncated"`
}

// ExecOutput is a command's outcome.
type ExecOutput struct {
	Stdout     string  `json:"stdout"`
	Stderr     string  `json:"stderr"`
	ExitCode   int     `json:"exit_code"`
	TimedOut   bool    `json:"timed_out"`
	Truncated  bool    `json:"truncated"`
	OOMKilled  bool    `json:"oom_killed"`
	DurationMS float64 `json:"duration_ms"`
}

func (s *Server) exec(ctx context.Context, req *mcp.CallToolRequest, in ExecInput) (*mcp.CallToolResult, ExecOutput, error) {
	if len(in.Command) == 0 {
		return nil, ExecOutput{}, fmt.Errorf(`%w: command is empty: give the program and its arguments, e.g. ["python3", "-c", "print(1)"]`, roche.ErrInvalidConfig)
	}
	if in.TimeoutSecs < 0 {
		return nil, ExecOutput{}, fmt.Errorf("%w: timeout_secs %v is negative: give seconds, or leave it out", roche.ErrInvalidConfig, in.TimeoutSecs)
	}
	p, err := s.own(req.Session, in.SandboxID)
	if err != nil {
		return nil, ExecOutput{}, err
	}
	return run(ctx, p, in)
}

// run runs in.Command in sandbox in.SandboxID of p.
func run(ctx context.Context, p roche.Provider, in ExecInput) (*mcp.CallToolResult, ExecOutput, error) {
	limit := in.MaxOutput
	if limit <= 0 {
		limit = DefaultOutputLimit
	}
	// Converted with the API's checks: a float past a Duration's range would wrap.
	timeout, err := wire.ExecTimeout(in.TimeoutSecs)
	if err != nil {
		return nil, ExecOutput{}, err
	}
	er := roche.ExecRequest{
		Cmd: in.Command, Env: in.Env, Workdir: in.Workdir,
		Timeout:     timeout,
		OutputLimit: int64(min(limit, roche.DefaultOutputLimit)),
	}
	if in.Stdin != "" {
		er.Stdin = strings.NewReader(in.Stdin)
	}
	// Cancelling the call (the client gave up) kills the command and all it started.
	res, err := p.Exec(ctx, in.SandboxID, er)
	if err != nil {
		return nil, ExecOutput{}, err
	}
	out := ExecOutput{
		Stdout: res.Stdout, Stderr: res.Stderr, ExitCode: res.ExitCode, TimedOut: res.TimedOut,
		Truncated: res.Truncated, OOMKilled: res.OOMKilled, DurationMS: float64(res.Duration.Microseconds()) / 1000,
	}
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: execText(out)}}}, out, nil
}

// RunCodeInput is run_code's arguments.
type RunCodeInput struct {
	Language    string  `json:"language,omitempty" jsonschema:"python (when left out), sh or bash (javascript where the image has node)"`
	Code        string  `json:"code" jsonschema:"the program's source"`
	SandboxID   string  `json:"sandbox_id,omitempty" jsonschema:"run in this sandbox, from create_sandbox, where files stay between calls; left out, a new sandbox with the secure defaults runs the code and is destroyed afterwards"`
	TimeoutSecs float64 `json:"timeout_secs,omitempty" jsonschema:"kill the program after this many seconds (default: the sandbox's remaining lifetime)"`
	Stdin       string  `json:"stdin,omitempty" jsonschema:"standard input for the program"`
	MaxOutput   int     `json:"max_output_bytes,omitempty" jsonschema:"keep at most this many bytes of each of stdout and stderr (default 100 KiB, at most 10 MiB)"`
}

// interpreters is the argv that runs code given as a string, by language.
var interpreters = map[string][]string{
	"python":     {"python3", "-c"},
	"python3":    {"python3", "-c"},
	"sh":         {"sh", "-c"},
	"bash":       {"bash", "-c"},
	"javascript": {"node", "-e"},
	"node":       {"node", "-e"},
}

// contextLanguages maps run_code's language names to the code context languages.
var contextLanguages = map[string]string{
	"python": roche.LanguagePython, "python3": roche.LanguagePython,
	"bash": roche.LanguageBash, "javascript": roche.LanguageJavaScript, "node": roche.LanguageJavaScript,
}

// coder is p's code contexts for language, when it has them: the cell then runs in a
// long-lived interpreter that keeps its variables, and returns charts and tracebacks.
func coder(p roche.Provider, language string) (roche.CodeRunner, string, bool) {
	lang, ok := contextLanguages[strings.ToLower(language)]
	if !ok {
		return nil, "", false
	}
	cr, ok := p.(roche.CodeRunner)
	if !ok || !slices.Contains(p.Capabilities().Code, lang) {
		return nil, "", false
	}
	return cr, lang, true
}

func (s *Server) runCode(ctx context.Context, req *mcp.CallToolRequest, in RunCodeInput) (*mcp.CallToolResult, CodeOutput, error) {
	if in.Language == "" {
		in.Language = "python"
	}
	argv, ok := interpreters[strings.ToLower(in.Language)]
	if !ok {
		return nil, CodeOutput{}, fmt.Errorf("%w: language %q: give python, sh, bash or javascript", roche.ErrInvalidConfig, in.Language)
	}
	if in.TimeoutSecs < 0 {
		return nil, CodeOutput{}, fmt.Errorf("%w: timeout_secs %v is negative: give seconds, or leave it out", roche.ErrInvalidConfig, in.TimeoutSecs)
	}
	ex := ExecInput{
		SandboxID: in.SandboxID, Command: append(slices.Clone(argv), in.Code),
		TimeoutSecs: in.TimeoutSecs, Stdin: in.Stdin, MaxOutput: in.MaxOutput,
	}
	// A context where the provider has them: standard input is the one thing it cannot take.
	runIn := func(p roche.Provider, id string) (*mcp.CallToolResult, CodeOutput, error) {
		if cr, lang, ok := coder(p, in.Language); ok && in.Stdin == "" {
			return runCell(ctx, cr, id, lang, in)
		}
		ex.SandboxID = id
		res, out, err := run(ctx, p, ex)
		return res, CodeOutput{ExecOutput: out}, err
	}
	if in.SandboxID != "" {
		p, err := s.own(req.Session, in.SandboxID)
		if err != nil {
			return nil, CodeOutput{}, err
		}
		return runIn(p, in.SandboxID)
	}
	sb, p, err := s.newSandbox(ctx, req.Session, CreateInput{})
	if err != nil {
		return nil, CodeOutput{}, err
	}
	// The sandbox is this call's alone: it goes when the call ends, however it ends.
	defer func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		if err := p.Destroy(dctx, sb.ID); err != nil && !errors.Is(err, roche.ErrNotFound) {
			s.log.Warn("destroying run_code's sandbox", "id", sb.ID, "err", err)
			return // Close tries again
		}
		s.mu.Lock()
		delete(s.created, sb.ID)
		s.mu.Unlock()
	}()
	return runIn(p, sb.ID)
}

// CodeOutput is run_code's outcome: a command's, and what a code context adds.
type CodeOutput struct {
	ExecOutput
	Result         string     `json:"result,omitempty" jsonschema:"the value of the code's last expression, as text (code contexts only)"`
	Error          *CodeError `json:"error,omitempty" jsonschema:"the exception that ended the code (code contexts only)"`
	ExecutionCount int        `json:"execution_count,omitempty" jsonschema:"how many runs the sandbox's interpreter has made, this one included (code contexts only)"`
	Restarted      bool       `json:"restarted,omitempty" jsonschema:"the interpreter had died and a fresh one, without the earlier variables, ran the code"`
	Images         int        `json:"images,omitempty" jsonschema:"how many images (charts) the result's content holds"`
}

// CodeError is an exception, with its traceback.
type CodeError struct {
	Name      string `json:"name"`
	Value     string `json:"value"`
	Traceback string `json:"traceback"`
}

// runCell runs in.Code in sandbox id's default context for lang. A Python script's
// sys.exit(n) gives exit code n, as a one-shot run would; any other exception makes
// the result an error whose text holds the traceback.
func runCell(ctx context.Context, cr roche.CodeRunner, id, lang string, in RunCodeInput) (*mcp.CallToolResult, CodeOutput, error) {
	limit := in.MaxOutput
	if limit <= 0 {
		limit = DefaultOutputLimit
	}
	timeout, err := wire.ExecTimeout(in.TimeoutSecs)
	if err != nil {
		return nil, CodeOutput{}, err
	}
	ex, err := cr.RunCode(ctx, id, roche.CodeRequest{
		Code: in.Code, Language: lang,
		Timeout:     timeout,
		OutputLimit: int64(min(limit, roche.DefaultOutputLimit)),
	})
	if err != nil {
		return nil, CodeOutput{}, err
	}
	out := CodeOutput{
		ExecOutput: ExecOutput{
			Stdout: strings.Join(ex.Logs.Stdout, ""), Stderr: strings.Join(ex.Logs.Stderr, ""),
			TimedOut: ex.TimedOut, Truncated: ex.Truncated, DurationMS: float64(ex.Duration.Microseconds()) / 1000,
		},
		Result: ex.Text(), ExecutionCount: ex.ExecutionCount, Restarted: ex.Restarted,
	}
	failed := false
	if e := ex.Error; e != nil {
		if n, err := strconv.Atoi(e.Value); e.Name == "SystemExit" && (err == nil || e.Value == "" || e.Value == "None") {
			out.ExitCode = n
		} else {
			out.ExitCode, failed = 1, true
			out.Error = &CodeError{Name: e.Name, Value: e.Value, Traceback: e.Traceback}
		}
	}
	var images []mcp.Content
	for _, r := range ex.Results {
		switch {
		case len(r.PNG) > 0:
			images = append(images, &mcp.ImageContent{Data: r.PNG, MIMEType: "image/png"})
		case len(r.JPEG) > 0:
			images = append(images, &mcp.ImageContent{Data: r.JPEG, MIMEType: "image/jpeg"})
		}
	}
	out.Images = len(images)
	content := append([]mcp.Content{&mcp.TextContent{Text: cellText(out)}}, images...)
	return &mcp.CallToolResult{Content: content, IsError: failed}, out, nil
}

// cellText is a cell's outcome as a model reads it best: what it printed, its value,
// then the traceback.
func cellText(o CodeOutput) string {
	var b strings.Builder
	b.WriteString(execText(o.ExecOutput))
	if o.Restarted {
		b.WriteString("\n(the interpreter had died: a fresh one ran this code, without the earlier variables)")
	}
	if o.Result != "" {
		fmt.Fprintf(&b, "\n--- result ---\n%s", o.Result)
	}
	if o.Images > 0 {
		fmt.Fprintf(&b, "\n--- %d image(s) follow ---", o.Images)
	}
	if o.Error != nil {
		tb := o.Error.Traceback
		if tb == "" {
			tb = o.Error.Name + ": " + o.Error.Value
		}
		fmt.Fprintf(&b, "\n--- error ---\n%s", tb)
		if o.TimedOut {
			b.WriteString("\n(the code was interrupted at its timeout; the interpreter keeps its variables)")
		}
	}
	return b.String()
}

// execText is the result as a model reads it best: the output, then what else happened.
func execText(o ExecOutput) string {
	var b strings.Builder
	fmt.Fprintf(&b, "exit code %d", o.ExitCode)
	if o.TimedOut {
		b.WriteString(" (timed out: the command was killed)")
	}
	if o.OOMKilled {
		b.WriteString(" (killed for exceeding the memory limit)")
	}
	if o.Truncated {
		b.WriteString(" (output truncated: raise max_output_bytes to see more)")
	}
	fmt.Fprintf(&b, "\n--- stdout ---\n%s", o.Stdout)
	if o.Stderr != "" {
		fmt.Fprintf(&b, "\n--- stderr ---\n%s", o.Stderr)
	}
	return b.String()
}

// WriteInput is write_file's arguments.
type WriteInput struct {
	SandboxID string `json:"sandbox_id" jsonschema:"the sandbox's id"`
	Path      string `json:"path" jsonschema:"absolute path in the sandbox, e.g. /tmp/main.py"`
	Content   string `json:"content" jsonschema:"the file's content"`
	Encoding  string `json:"encoding,omitempty" jsonschema:"utf-8 (the default) or base64 for binary content"`
	Mode      string `json:"mode,omitempty" jsonschema:"permission bits in octal, e.g. 0755 (default 0644)"`
}

// WriteOutput says what was written.
type WriteOutput struct {
	Path  string `json:"path"`
	Bytes int    `json:"bytes"`
}

// fileIO is what every provider (and the daemon's client) offers for single files.
type fileIO interface {
	WriteFile(ctx context.Context, id, path string, r io.Reader, mode fs.FileMode) error
	ReadFile(ctx context.Context, id, path string, w io.Writer) error
}

func (s *Server) files(session *mcp.ServerSession, id string) (fileIO, error) {
	p, err := s.own(session, id)
	if err != nil {
		return nil, err
	}
	f, ok := p.(fileIO)
	if !ok {
		return nil, fmt.Errorf("%w: the %s provider cannot read or write files", roche.ErrUnsupported, p.Name())
	}
	return f, nil
}

func (s *Server) writeFile(ctx context.Context, req *mcp.CallToolRequest, in WriteInput) (*mcp.CallToolResult, WriteOutput, error) {
	data := []byte(in.Content)
	switch strings.ToLower(in.Encoding) {
	case "", "utf-8", "utf8", "text":
	case "base64":
		b, err := base64.StdEncoding.DecodeString(in.Content)
		if err != nil {
			return nil, WriteOutput{}, fmt.Errorf("%w: content is not valid base64: %v", roche.ErrInvalidConfig, err)
		}
		data = b
	default:
		return nil, WriteOutput{}, fmt.Errorf("%w: encoding %q: use utf-8 or base64", roche.ErrInvalidConfig, in.Encoding)
	}
	mode := fs.FileMode(0o644)
	if in.Mode != "" {
		m, err := strconv.ParseUint(in.Mode, 8, 32)
		if err != nil || m > 0o777 {
			return nil, WriteOutput{}, fmt.Errorf("%w: mode %q: give octal permission bits such as 0644 or 0755", roche.ErrInvalidConfig, in.Mode)
		}
		mode = fs.FileMode(m)
	}
	f, err := s.files(req.Session, in.SandboxID)
	if err != nil {
		return nil, WriteOutput{}, err
	}
	if err := f.WriteFile(ctx, in.SandboxID, in.Path, bytes.NewReader(data), mode); err != nil {
		return nil, WriteOutput{}, err
	}
	return nil, WriteOutput{Path: in.Path, Bytes: len(data)}, nil
}

// ReadInput is read_file's arguments.
type ReadInput struct {
	SandboxID string `json:"sandbox_id" jsonschema:"the sandbox's id"`
	Path      string `json:"path" jsonschema:"absolute path in the sandbox"`
	MaxBytes  int    `json:"max_bytes,omitempty" jsonschema:"return at most this many bytes (default 1 MiB, at most 8 MiB)"`
}

// ReadOutput is a file's content.
type ReadOutput struct {
	Path      string `json:"path"`
	Content   string `json:"content"`
	Encoding  string `json:"encoding" jsonschema:"utf-8, or base64 when the content is not UTF-8 text"`
	Bytes     int    `json:"bytes" jsonschema:"how many bytes of the file content holds"`
	Truncated bool   `json:"truncated" jsonschema:"the file is longer than max_bytes"`
}

// capped keeps the first n bytes written to it, notes whether there were more, and then
// ends the read (errEnough): the rest of a large file is not read at all.
type capped struct {
	buf  bytes.Buffer
	n    int
	over bool
}

var errEnough = errors.New("read enough")

func (c *capped) Write(p []byte) (int, error) {
	room := c.n - c.buf.Len()
	if len(p) > room {
		c.over = true
		c.buf.Write(p[:max(room, 0)])
		return 0, errEnough
	}
	return c.buf.Write(p)
}

func (s *Server) readFile(ctx context.Context, req *mcp.CallToolRequest, in ReadInput) (*mcp.CallToolResult, ReadOutput, error) {
	limit := in.MaxBytes
	if limit <= 0 {
		limit = DefaultReadLimit
	}
	limit = min(limit, MaxReadLimit)
	f, err := s.files(req.Session, in.SandboxID)
	if err != nil {
		return nil, ReadOutput{}, err
	}
	w := &capped{n: limit}
	if err := f.ReadFile(ctx, in.SandboxID, in.Path, w); err != nil && !errors.Is(err, errEnough) {
		return nil, ReadOutput{}, err
	}
	data := w.buf.Bytes()
	out := ReadOutput{Path: in.Path, Bytes: len(data), Truncated: w.over, Encoding: "utf-8", Content: string(data)}
	if !utf8.Valid(data) {
		out.Encoding, out.Content = "base64", base64.StdEncoding.EncodeToString(data)
	}
	return nil, out, nil
}

// ListFilesInput is list_files' arguments.
type ListFilesInput struct {
	SandboxID string `json:"sandbox_id" jsonschema:"the sandbox's id"`
	Path      string `json:"path" jsonschema:"absolute path of a directory in the sandbox, e.g. /tmp"`
	Depth     int    `json:"depth,omitempty" jsonschema:"how many levels to list: 1 (the default) is the directory's entries, at most 5"`
}

// FileEntry describes one path below the directory.
type FileEntry struct {
	Path          string `json:"path"`
	Type          string `json:"type" jsonschema:"file, dir, symlink, or fifo, socket or device"`
	Size          int64  `json:"size"`
	Permissions   string `json:"permissions" jsonschema:"as ls -l shows them, e.g. -rw-r--r--"`
	ModifiedTime  string `json:"modified_time"`
	SymlinkTarget string `json:"symlink_target,omitempty"`
}

// ListFilesOutput is a directory's listing.
type ListFilesOutput struct {
	Entries []FileEntry `json:"entries"`
	// Truncated says the listing stopped at MaxListEntries.
	Truncated bool `json:"truncated,omitempty"`
}

// MaxListDepth and MaxListEntries bound list_files: a model's context, not the API,
// is what a listing must fit.
const (
	MaxListDepth   = 5
	MaxListEntries = 2000
)

var errListFull = errors.New("listing full")

func (s *Server) listFiles(ctx context.Context, req *mcp.CallToolRequest, in ListFilesInput) (*mcp.CallToolResult, ListFilesOutput, error) {
	depth := in.Depth
	switch {
	case depth == 0:
		depth = 1
	case depth < 0 || depth > MaxListDepth:
		return nil, ListFilesOutput{}, fmt.Errorf("%w: depth %d: give 1 to %d", roche.ErrInvalidConfig, depth, MaxListDepth)
	}
	p, err := s.own(req.Session, in.SandboxID)
	if err != nil {
		return nil, ListFilesOutput{}, err
	}
	out := ListFilesOutput{Entries: []FileEntry{}}
	add := func(fi roche.FileInfo) error {
		if len(out.Entries) == MaxListEntries {
			out.Truncated = true
			return errListFull
		}
		out.Entries = append(out.Entries, FileEntry{Path: fi.Path, Type: fi.FileType(), Size: fi.Size,
			Permissions: fi.Mode.String(), ModifiedTime: fi.ModTime.UTC().Format(time.RFC3339), SymlinkTarget: fi.Symlink})
		return nil
	}
	switch fsys := p.(type) {
	case roche.DirWalker:
		err = fsys.WalkDir(ctx, in.SandboxID, in.Path, depth, 0, add)
	case roche.FileSystem:
		if depth > 1 {
			return nil, ListFilesOutput{}, fmt.Errorf("%w: the %s provider lists one level at a time: give depth 1", roche.ErrUnsupported, p.Name())
		}
		var list []roche.FileInfo
		if list, err = fsys.ListDir(ctx, in.SandboxID, in.Path); err == nil {
			for _, fi := range list {
				if add(fi) != nil {
					break
				}
			}
		}
	default:
		return nil, ListFilesOutput{}, fmt.Errorf("%w: the %s provider cannot list files", roche.ErrUnsupported, p.Name())
	}
	if err != nil && !errors.Is(err, errListFull) {
		return nil, ListFilesOutput{}, err
	}
	return nil, out, nil
}

// ListInput is list_sandboxes' arguments.
type ListInput struct {
	Provider string `json:"provider,omitempty" jsonschema:"only this provider's sandboxes"`
}

// ListOutput is the session's live sandboxes.
type ListOutput struct {
	Sandboxes []Sandbox `json:"sandboxes"`
	// Skipped names the providers that could not be asked ("docker: why"): the list
	// lacks whatever sandboxes they hold.
	Skipped []string `json:"skipped,omitempty"`
}

func (s *Server) list(ctx context.Context, req *mcp.CallToolRequest, in ListInput) (*mcp.CallToolResult, ListOutput, error) {
	list, err := s.providers.List(ctx, in.Provider)
	var partial *roche.PartialError
	if err != nil && !errors.As(err, &partial) {
		return nil, ListOutput{}, err
	}
	sort.Slice(list, func(i, j int) bool { return list[i].CreatedAt.Before(list[j].CreatedAt) })
	out := ListOutput{Sandboxes: make([]Sandbox, 0, len(list))}
	if partial != nil {
		for _, sk := range partial.Skipped {
			out.Skipped = append(out.Skipped, sk.Provider+": "+sk.Err.Error())
		}
	}
	for _, sb := range list {
		if _, err := s.own(req.Session, sb.ID); err == nil {
			out.Sandboxes = append(out.Sandboxes, sandboxOf(sb))
		}
	}
	return nil, out, nil
}

// SetTimeoutInput is set_sandbox_timeout's arguments.
type SetTimeoutInput struct {
	SandboxID   string `json:"sandbox_id" jsonschema:"the sandbox's id"`
	TimeoutSecs int    `json:"timeout_secs" jsonschema:"the lifetime left from now, in seconds (1 to 86400)"`
}

func (s *Server) setTimeout(ctx context.Context, req *mcp.CallToolRequest, in SetTimeoutInput) (*mcp.CallToolResult, Sandbox, error) {
	p, err := s.own(req.Session, in.SandboxID)
	if err != nil {
		return nil, Sandbox{}, err
	}
	ls, ok := p.(roche.LifetimeSetter)
	if !ok {
		return nil, Sandbox{}, fmt.Errorf("%w: the %s provider cannot change a sandbox's lifetime", roche.ErrUnsupported, p.Name())
	}
	sb, err := ls.SetTimeout(ctx, in.SandboxID, time.Duration(in.TimeoutSecs)*time.Second)
	if err != nil {
		return nil, Sandbox{}, err
	}
	return nil, sandboxOf(sb), nil
}

// DestroyInput is destroy_sandbox's arguments.
type DestroyInput struct {
	SandboxID string `json:"sandbox_id" jsonschema:"the sandbox's id"`
}

// DestroyOutput names the destroyed sandbox, and says whether it was already gone.
type DestroyOutput struct {
	Destroyed   string `json:"destroyed"`
	AlreadyGone bool   `json:"already_gone,omitempty" jsonschema:"the sandbox had already been destroyed (by an earlier call, or at the end of its lifetime): nothing was left to do"`
}

// destroy is idempotent, as its annotations say: destroying a sandbox this session made
// that is already gone (an earlier destroy, its lifetime's end) succeeds and says so.
func (s *Server) destroy(ctx context.Context, req *mcp.CallToolRequest, in DestroyInput) (*mcp.CallToolResult, DestroyOutput, error) {
	s.mu.Lock()
	gone := s.destroyed[destroyedKey{req.Session, in.SandboxID}]
	s.mu.Unlock()
	if gone {
		return goneResult(in.SandboxID)
	}
	p, err := s.own(req.Session, in.SandboxID)
	if err != nil {
		return nil, DestroyOutput{}, err
	}
	err = p.Destroy(ctx, in.SandboxID)
	if err != nil && !errors.Is(err, roche.ErrNotFound) {
		return nil, DestroyOutput{}, err
	}
	s.mu.Lock()
	delete(s.created, in.SandboxID)
	key := destroyedKey{req.Session, in.SandboxID}
	s.destroyed[key] = true
	if s.forget = append(s.forget, key); len(s.forget) > maxRemembered {
		delete(s.destroyed, s.forget[0])
		s.forget = s.forget[1:]
	}
	s.mu.Unlock()
	if err != nil {
		return goneResult(in.SandboxID)
	}
	return nil, DestroyOutput{Destroyed: in.SandboxID}, nil
}

func goneResult(id string) (*mcp.CallToolResult, DestroyOutput, error) {
	out := DestroyOutput{Destroyed: id, AlreadyGone: true}
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{
		Text: fmt.Sprintf("sandbox %s was already gone (destroyed earlier, or at the end of its lifetime): nothing to do", id)}}}, out, nil
}
