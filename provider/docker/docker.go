// Package docker runs Roche sandboxes as Docker containers through the Engine API
// (never the docker CLI), mapping roche.Config's secure defaults onto HostConfig.
package docker

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/api/types/image"
	"github.com/docker/docker/api/types/mount"
	"github.com/docker/docker/client"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/egress"
	"github.com/roche-sandbox/roche/internal/defaults"
	"github.com/roche-sandbox/roche/internal/guest"
	"github.com/roche-sandbox/roche/internal/guest/guestbin"
	"github.com/roche-sandbox/roche/provider/internal/agentspec"
	"github.com/roche-sandbox/roche/provider/internal/egresswire"
	"github.com/roche-sandbox/roche/provider/internal/engine"
	"github.com/roche-sandbox/roche/provider/internal/guestfwd"
	"github.com/roche-sandbox/roche/provider/internal/seccomp"
	"github.com/roche-sandbox/roche/provider/kit"
)

// Labels put on every container Roche creates, so that list, gc and reconciliation
// find them by label and never touch anything else.
const (
	LabelManaged   = "roche.managed"
	LabelProvider  = "roche.provider"
	LabelExpires   = "roche.expires"
	LabelConfig    = "roche.config"
	LabelTransport = "roche.transport"
	LabelAgentDir  = "roche.agent_dir"
	// LabelRunDir, "run", says the sandbox's sockets are in that subdirectory of its
	// LabelAgentDir, the one bound into it (agentdir.go).
	LabelRunDir = "roche.run_dir"
	// LabelStartBy is when (unix seconds) the create that made the container gives up:
	// one not started by then never will be (sweepUnstartedSoon).
	LabelStartBy = "roche.start_by"
	// LabelOwner is the sandbox's owner (kit.CreateOptions), also kept in LabelConfig; it is set on every container,
	// even empty, so that one made from a snapshot does not inherit the image's.
	LabelOwner = "roche.owner"
)

// Transports: how commands reach a sandbox.
const (
	TransportAgent = defaults.Transport // "agent", the default

	TransportDockerExec = "docker-exec"
)

// NoImage is the error for an image that is not on the host and could not be had,
// with its fix: roche image build python makes roche/python:local from Debian
// packages, no registry needed (the oci and microVM providers read Docker's images too).
func NoImage(err error) error {
	return &roche.Remedy{Err: err, Run: "roche image build python", AsRoot: true, Image: "roche/python:local"}
}

var (
	_ roche.Provider         = (*Provider)(nil)
	_ kit.Creator            = (*Provider)(nil)
	_ roche.FileCopier       = (*Provider)(nil)
	_ roche.TarCopier        = (*Provider)(nil)
	_ roche.Pauser           = (*Provider)(nil)
	_ roche.GarbageCollector = (*Provider)(nil)
	_ roche.FileSystem       = (*Provider)(nil)
)

// Provider is the Docker backend.
type Provider struct {
	// forwarder serves what roche-agent serves (guestfwd); Exec and the tar streams are
	// overridden for sandboxes on the exec-API transport.
	forwarder
	cli         *client.Client
	log         *slog.Logger
	pullTimeout time.Duration
	// engine names the Docker engine in errors; engineTimeout bounds a create.
	engine        engine.Engine
	engineTimeout time.Duration
	// transport is how commands reach sandboxes (TransportAgent or TransportDockerExec);
	// execFallback lets an agent sandbox whose agent cannot start fall back to Docker's
	// exec API, which is slower and has no files API, so only when asked.
	transport    string
	execFallback bool
	// agentPath is the host path of the static roche-agent binary; empty means it was not
	// found (or transport is TransportDockerExec).
	agentPath string
	// stateDir holds, for each engine, one directory per sandbox for its agent socket
	// (agentRoot, agentdir.go).
	stateDir string
	// agentRoot is this engine's directory under stateDir.
	agentRoot string
	// dataDir holds what outlives reboots: snapshots' /tmp archives.
	dataDir string
	// egress: this process serves the egress proxies of sandboxes with an allowlist,
	// one per socket directory (WithEgressProxy).
	egress  bool
	proxies egresswire.Proxies
	// firewallDir, when set, is where the iptables tools are found instead of $PATH
	// (tests point it at a directory without them).
	firewallDir string
	// uidFirst and uidCount are the range sandboxes' and workspaces' uids are drawn from.
	uidFirst, uidCount int
	// pinMounts: host mounts are bound from what the provider opened (WithPinnedMounts).
	pinMounts bool
	// runtime is the engine runtime sandboxes run on (WithRuntime, runtime.go).
	runtime string

	// verified caches ids known to name Roche containers, so that each exec does not
	// pay an inspect round trip to check the label again.
	mu       sync.Mutex
	verified map[string]sandbox
	// leases holds the leases of the leased sandboxes this provider made.
	leases guestfwd.Leases

	// halfMade removes, in the background, containers a create left when the engine
	// stopped answering midway (halfmade.go); closing stops it.
	// lastSweep is when (unix ns) a create last looked for never-started leftovers.
	lastSweep atomic.Int64
	halfMade  sync.WaitGroup
	closing   context.Context
	close     context.CancelFunc
}

// sandbox is what the provider remembers about a container it has checked.
type sandbox struct {
	id      string
	expires time.Time
	cfg     kit.Spec
	// agent is set when roche-agent serves the sandbox; agentDir is its directory on
	// the host, runDir the one of its sockets, bound into it (agentdir.go).
	agent    *guest.Client
	agentDir string
	runDir   string
}

func (s sandbox) transport() string {
	if s.agent != nil {
		return TransportAgent
	}
	return TransportDockerExec
}

// Option configures a Provider.
type Option func(*Provider)

// WithLogger sets the logger; the default discards.
func WithLogger(l *slog.Logger) Option { return func(p *Provider) { p.log = l } }

// WithClient uses an existing Engine API client instead of one configured from the
// environment (DOCKER_HOST and friends).
func WithClient(c *client.Client) Option { return func(p *Provider) { p.cli = c } }

// WithPullTimeout bounds how long Create waits for a missing image to be pulled.
func WithPullTimeout(d time.Duration) Option { return func(p *Provider) { p.pullTimeout = d } }

// WithAgentPath sets the host path of the static roche-agent binary (by default
// guestbin.Path: $ROCHE_AGENT, else roche-agent beside the running executable, else the
// executable itself when it carries the agent, as roche and roched do). An empty path
// turns the agent off, leaving Docker's exec API.
func WithAgentPath(path string) Option { return func(p *Provider) { p.agentPath = path } }

// WithDataDir sets where snapshots' /tmp archives are kept.
func WithDataDir(dir string) Option { return func(p *Provider) { p.dataDir = dir } }

// WithStateDir sets where per-sandbox agent socket directories live on the host.
func WithStateDir(dir string) Option { return func(p *Provider) { p.stateDir = dir } }

// WithPinnedMounts binds each host mount from the directory or file the provider opened
// itself, refusing a symbolic link anywhere on its path, instead of letting the engine
// resolve the path when the container starts, so that nothing swapped on the way in the
// meantime can redirect it (see pin_linux.go). roched sets it: it needs root and an
// engine on this host, in this mount namespace.
func WithPinnedMounts() Option { return func(p *Provider) { p.pinMounts = true } }

// PinsMounts reports whether the provider pins host mounts (WithPinnedMounts).
func (p *Provider) PinsMounts() bool { return p.pinMounts }

// DefaultEngineTimeout bounds a create when WithEngineTimeout does not.
const DefaultEngineTimeout = engine.DefaultTimeout

// WithEngineTimeout bounds a create and everything it waits for (default 30 s): when the
// engine has not answered by then, Create fails, naming the engine, and leaves nothing.
// Calls that need one quick answer (list, inspect, destroy, pause) are bounded by 10 s.
func WithEngineTimeout(d time.Duration) Option { return func(p *Provider) { p.engineTimeout = d } }

// WithTransport chooses how commands reach sandboxes: TransportAgent (the default:
// roche-agent inside each sandbox; a sandbox whose agent cannot start is an error) or
// TransportDockerExec (Docker's exec API: slower, no files API, workspaces or snapshots).
func WithTransport(t string) Option { return func(p *Provider) { p.transport = t } }

// WithExecFallback lets a sandbox whose agent cannot start (or a provider that cannot find
// roche-agent) fall back to Docker's exec API, with a warning, instead of failing. The
// sandbox then works differently (see WithTransport), so this is never the default.
func WithExecFallback() Option { return func(p *Provider) { p.execFallback = true } }

// New returns a Docker provider. It does not contact the engine: the first call that
// needs it reports ErrUnavailable, with how to start it, when it does not answer.
func New(opts ...Option) (*Provider, error) {
	p := &Provider{
		log:         slog.New(slog.DiscardHandler),
		pullTimeout: 2 * time.Minute,
		verified:    map[string]sandbox{},
		agentPath:   guestbin.Path(),
		stateDir:    defaultStateDir(),
		dataDir:     defaultDataDir(),
		uidFirst:    DefaultUIDFirst,
		uidCount:    DefaultUIDCount,
	}
	p.engineTimeout, p.transport = engine.DefaultTimeout, TransportAgent
	p.closing, p.close = context.WithCancel(context.Background())
	p.forwarder = guestfwd.Forwarder{Reach: p.reach}
	for _, o := range opts {
		o(p)
	}
	if err := p.checkUIDRange(); err != nil {
		return nil, err
	}
	if err := p.checkRuntime(); err != nil {
		return nil, err
	}
	switch p.transport {
	case TransportAgent:
	case TransportDockerExec:
		p.agentPath = ""
	default:
		return nil, fmt.Errorf("%w: transport %q: use %s or %s", roche.ErrInvalidConfig, p.transport, TransportAgent, TransportDockerExec)
	}
	if p.engineTimeout <= 0 {
		return nil, fmt.Errorf("%w: engine timeout %v: give a positive duration such as 30s", roche.ErrInvalidConfig, p.engineTimeout)
	}
	if p.cli == nil {
		c, err := engine.DockerClient()
		if err != nil {
			return nil, fmt.Errorf("%w: configuring the Docker client: %v", roche.ErrUnavailable, err)
		}
		p.cli = c
	}
	p.agentRoot = agentRootOf(p.stateDir, p.cli.DaemonHost())
	p.engine = engine.Engine{
		Name: "the Docker engine", Addr: p.cli.DaemonHost(),
		Hint: "check that dockerd runs and is not stuck (sudo systemctl status docker), or raise --engine-timeout",
	}
	p.engine.Ready = engine.NewNegotiation(p.cli, p.engine).Wait
	return p, nil
}

// Close stops the egress proxies this process serves and the removal of half-made
// sandboxes, and releases the Engine API client.
func (p *Provider) Close() error {
	p.leases.DropAll()
	p.proxies.StopAll()
	p.close()
	p.halfMade.Wait()
	return p.cli.Close()
}

// bound limits ctx for an operation that needs one quick answer from the engine.
func (p *Provider) bound(ctx context.Context, op string) (context.Context, func(*error)) {
	return p.engine.Bound(ctx, op, engine.ControlTimeout)
}

// Name implements roche.Provider.
func (p *Provider) Name() string { return "docker" }

// Capabilities implements roche.Provider: Docker honours every field of Config, but
// network on gVisor (runtime.go).
func (p *Provider) Capabilities() roche.Capabilities {
	caps := roche.Capabilities{
		Network: !p.gvisor(), Egress: p.egress && p.agentPath != "", Writable: true, Mounts: true,
		Files: true, Pause: true, Stdin: true, Processes: true, Leases: p.agentPath != "",
	}
	// Code contexts are roche-agent's. Not on gVisor, where a cell past the memory limit
	// ends the whole sandbox rather than its interpreter (the conformance suite's check).
	if p.agentPath != "" && !p.gvisor() {
		caps.Code, caps.RichResults = guestfwd.CodeLanguages, true
	}
	return caps
}

// Ping checks that the engine answers, within 10 s at most.
func (p *Provider) Ping(ctx context.Context) (err error) {
	ctx, done := p.bound(ctx, "a ping")
	defer done(&err)
	_, err = p.cli.Ping(ctx)
	return p.engineErr("reaching the Docker engine", err)
}

// engineErr wraps an Engine API error with context and the matching sentinel.
func (p *Provider) engineErr(what string, err error) error {
	var notAnswering *engine.NotAnsweringError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &notAnswering):
		return notAnswering
	case errors.Is(err, context.Canceled):
		// The caller gave up (a signal); the engine is not at fault.
		return fmt.Errorf("%s: %w", what, context.Canceled)
	case client.IsErrConnectionFailed(err) || isConnRefused(err):
		err := fmt.Errorf("%w: the Docker engine is not reachable at %s: start it (sudo dockerd &, or sudo systemctl start docker) or use --provider wasm",
			roche.ErrUnavailable, p.cli.DaemonHost())
		if p.engineNotHere() {
			// Nothing was ever started there, or this user may not reach it: Docker is not
			// set up here for them, which a list across providers passes over, unlike an
			// engine that refuses or hangs.
			return kit.NotConfigured(err)
		}
		return err
	case cerrdefs.IsNotFound(err):
		return fmt.Errorf("%s: %w: %v", what, roche.ErrNotFound, err)
	case errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("%s: %w", what, roche.ErrTimeout)
	case cerrdefs.IsInvalidArgument(err):
		return fmt.Errorf("%s: %w: %v", what, roche.ErrInvalidConfig, err)
	}
	return fmt.Errorf("%s: %w", what, err)
}

// engineNotHere reports whether the engine's address is a unix socket that does not
// exist, or that this user may not write to (not in the docker group).
func (p *Provider) engineNotHere() bool {
	path, ok := strings.CutPrefix(p.cli.DaemonHost(), "unix://")
	if !ok {
		return false
	}
	if _, err := os.Stat(path); err != nil {
		return errors.Is(err, os.ErrNotExist)
	}
	return syscall.Access(path, 2 /* W_OK */) == syscall.EACCES
}

func isConnRefused(err error) bool {
	s := err.Error()
	return strings.Contains(s, "connect: connection refused") || strings.Contains(s, "connect: no such file or directory") ||
		strings.Contains(s, "Cannot connect to the Docker daemon")
}

// Create implements roche.Provider: CreateFor with no owner, not leased.
func (p *Provider) Create(ctx context.Context, cfg roche.Config) (roche.SandboxInfo, error) {
	return p.CreateFor(ctx, cfg, kit.CreateOptions{})
}

// CreateFor implements kit.Creator. Pulling a missing image has its own deadline
// (WithPullTimeout); the rest is bounded by the engine timeout (WithEngineTimeout). A
// sandbox the engine may still make after Create gave up is removed once it answers.
func (p *Provider) CreateFor(ctx context.Context, config roche.Config, opts kit.CreateOptions) (_ roche.SandboxInfo, err error) {
	cfg := kit.Spec{Config: config, CreateOptions: opts}
	if err := cfg.Validate(); err != nil {
		return roche.SandboxInfo{}, err
	}
	for _, m := range cfg.Mounts {
		if _, err := os.Stat(m.Source); err != nil {
			return roche.SandboxInfo{}, fmt.Errorf("%w: mount source %s does not exist on the host: create it or fix the path", roche.ErrInvalidConfig, m.Source)
		}
	}
	if err := p.checkEgress(cfg.Config); err != nil {
		return roche.SandboxInfo{}, err
	}
	if err := p.checkTransport(cfg); err != nil {
		return roche.SandboxInfo{}, err
	}
	if err := p.checkRuntimeConfig(cfg.Config); err != nil {
		return roche.SandboxInfo{}, err
	}
	if err := p.checkDisk(cfg.Config); err != nil {
		return roche.SandboxInfo{}, err
	}
	fromSnapshot := cfg.FromSnapshot != ""
	caller := ctx
	ctx, done := p.engine.Bound(caller, "creating a sandbox", p.engineTimeout)
	defer func() { done(&err) }()
	if !fromSnapshot {
		present, err := p.imagePresent(ctx, cfg.Image)
		if err != nil {
			return roche.SandboxInfo{}, err
		}
		if !present {
			// A pull has a deadline of its own (WithPullTimeout); making the sandbox then
			// gets a whole one.
			done(nil)
			if err := p.pull(caller, cfg.Image); err != nil {
				return roche.SandboxInfo{}, err
			}
			ctx, done = p.engine.Bound(caller, "creating a sandbox", p.engineTimeout)
		}
	}
	if cfg.Network {
		if err := p.ensureNetwork(ctx); err != nil {
			return roche.SandboxInfo{}, err
		}
	}
	wsUID := -1
	if cfg.Workspace != "" {
		var release func(failed bool)
		var werr error
		if wsUID, release, werr = p.ensureWorkspace(ctx, cfg.Workspace, cfg.WorkspaceBytes()); werr != nil {
			return roche.SandboxInfo{}, werr
		}
		defer func() { release(err != nil) }()
	}
	snapshotUID := -1
	if fromSnapshot {
		img, err := p.cli.ImageInspect(ctx, snapshotRef(cfg.FromSnapshot))
		if err != nil {
			if cerrdefs.IsNotFound(err) {
				return roche.SandboxInfo{}, fmt.Errorf("%w: no snapshot %s (roche snapshot list shows them)", roche.ErrNotFound, cfg.FromSnapshot)
			}
			return roche.SandboxInfo{}, p.engineErr("inspecting snapshot "+cfg.FromSnapshot, err)
		}
		// The snapshot keeps the labels of the sandbox it was taken of, its uid among them.
		if img.Config != nil {
			snapshotUID = uidOf(img.Config.Labels)
		}
	}
	who := p.runAsFor(cfg.Config, wsUID, snapshotUID)
	if fromSnapshot {
		info, err := p.createAndFallBack(ctx, cfg, who)
		if err != nil {
			return info, err
		}
		if err := p.restoreTmp(ctx, info.ID, cfg.FromSnapshot); err != nil {
			// Destroy bounds itself, and removes the socket directory too.
			p.Destroy(context.WithoutCancel(ctx), info.ID)
			return roche.SandboxInfo{}, fmt.Errorf("restoring /tmp from snapshot %s: %w", cfg.FromSnapshot, err)
		}
		return info, nil
	}
	return p.createAndFallBack(ctx, cfg, who)
}

// askExecHint says how to ask for Docker's exec API, for errors about the agent.
const askExecHint = "to run commands through Docker's exec API instead (slower, no files API), pass --transport docker-exec (docker.WithTransport or WithExecFallback in Go)"

// checkTransport refuses, before anything is made, a config this provider's transport
// cannot serve.
func (p *Provider) checkTransport(cfg kit.Spec) error {
	switch {
	case p.agentPath != "" || p.transport == TransportAgent && p.execFallback && cfg.Workspace == "" && !cfg.Leased:
		return nil
	case p.transport == TransportAgent && !p.execFallback:
		return fmt.Errorf("%w: roche-agent was not found: Docker sandboxes run commands through it; %s; or %s",
			roche.ErrUnavailable, guestbin.Install, askExecHint)
	case cfg.Leased:
		return fmt.Errorf("%w: a leased sandbox (one that stops when its creator goes) needs roche-agent, and this provider runs without it (transport %s)",
			roche.ErrUnsupported, TransportDockerExec)
	case cfg.Workspace != "":
		// A new workspace belongs to root, and without the agent nothing hands it to the
		// sandbox user, who could then not write in it.
		return fmt.Errorf("%w: workspace %s: Docker sandboxes need roche-agent to make /workspace writable for the sandbox user, and this provider runs without it (transport %s)",
			roche.ErrUnsupported, cfg.Workspace, TransportDockerExec)
	}
	return nil
}

// createAndFallBack makes the sandbox with roche-agent or, with TransportDockerExec,
// without. An agent that cannot start is an error quoting why, unless WithExecFallback
// asked for the exec API then.
func (p *Provider) createAndFallBack(ctx context.Context, cfg kit.Spec, who runAs) (roche.SandboxInfo, error) {
	if p.agentPath == "" {
		if p.transport == TransportAgent {
			p.log.Warn("roche-agent not found: this sandbox runs commands through Docker's exec API, which is slower and has no files API, as WithExecFallback allows")
		}
		return p.create(ctx, cfg, who, false)
	}
	info, err := p.create(ctx, cfg, who, true)
	if err == nil || !errors.Is(err, errAgentFailed) {
		return info, err
	}
	// The exec API has no relay, so an allowlist cannot fall back; nor can a workspace
	// (see checkTransport).
	if !p.execFallback || len(cfg.NetworkAllowlist) > 0 || cfg.Workspace != "" || cfg.Leased {
		return roche.SandboxInfo{}, fmt.Errorf("%w: %v; %s", roche.ErrUnavailable, err, askExecHint)
	}
	p.log.Warn("roche-agent did not start; falling back to Docker's exec API for this sandbox, as WithExecFallback allows", "err", err)
	return p.create(ctx, cfg, who, false)
}

// errAgentFailed marks a sandbox whose agent did not come up (the sandbox is removed).
var errAgentFailed = errors.New("roche-agent did not start in the sandbox")

func (p *Provider) create(ctx context.Context, cfg kit.Spec, who runAs, withAgent bool) (roche.SandboxInfo, error) {
	now := time.Now()
	expires := now.Add(time.Duration(cfg.TimeoutSecs) * time.Second)
	name := "roche-" + randomHex(6)
	sb := sandbox{expires: expires, cfg: cfg}
	if withAgent {
		dir, err := p.makeAgentDir(ctx, name)
		if err != nil {
			return roche.SandboxInfo{}, err
		}
		sb.agentDir, sb.runDir = dir, filepath.Join(dir, runSubdir)
		sb.agent = guest.NewClient(filepath.Join(sb.runDir, agentspec.SocketName))
		if len(cfg.NetworkAllowlist) > 0 {
			if err := p.startEgress(sb.agentDir, sb.runDir, name, cfg.Config); err != nil {
				p.removeAgentDir(sb.agentDir)
				return roche.SandboxInfo{}, err
			}
		}
	}
	id, unpin, err := p.createContainer(ctx, cfg, who, expires, name, sb.agentDir)
	if err != nil {
		if ctx.Err() != nil {
			// Cut short, the request may still reach the engine and make the container.
			p.undo(name, sb.agentDir, false, context.Cause(ctx))
		} else {
			p.removeAgentDir(sb.agentDir)
		}
		return roche.SandboxInfo{}, err
	}
	sb.id = id
	p.proxies.Name(sb.runDir, id)
	settleAgentDir(sb.agentDir) // the container carries it now: sweeps see it live
	// The container holds its own binds once started; the staging points go with create.
	defer unpin()
	layer, err := p.sizeRoot(ctx, id, cfg.Config)
	if err != nil {
		p.undo(id, sb.agentDir, true, context.Cause(ctx))
		return roche.SandboxInfo{}, err
	}
	if err := p.cli.ContainerStart(ctx, id, container.StartOptions{}); err != nil {
		// Undo the half-made sandbox even when the caller's context is what failed.
		p.undo(id, sb.agentDir, true, context.Cause(ctx))
		return roche.SandboxInfo{}, p.engineErr("starting container "+id, err)
	}
	if err := p.checkRootSized(ctx, id, layer); err != nil {
		p.undo(id, sb.agentDir, true, context.Cause(ctx))
		return roche.SandboxInfo{}, err
	}
	if sb.agent != nil {
		// Wait for the agent, but give up at once if the container exits instead.
		wctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		exited, waitErr := p.cli.ContainerWait(wctx, id, container.WaitConditionNotRunning)
		go func() {
			select {
			case <-exited:
			case <-waitErr:
			case <-wctx.Done():
			}
			cancel()
		}()
		err := sb.agent.WaitReady(wctx)
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				p.undo(id, sb.agentDir, true, context.Cause(ctx))
				return roche.SandboxInfo{}, context.Cause(ctx)
			}
			reason := p.exitReason(ctx, id)
			p.undo(id, sb.agentDir, true, nil)
			return roche.SandboxInfo{}, fmt.Errorf("%w: %v%s", errAgentFailed, err, reason)
		}
		if cfg.Leased {
			if err := p.leases.Take(ctx, sb.id, sb.agent); err != nil {
				p.undo(id, sb.agentDir, true, context.Cause(ctx))
				return roche.SandboxInfo{}, err
			}
		}
	}
	p.remember(sb)
	p.log.Debug("sandbox created", "id", id, "image", cfg.Image, "transport", sb.transport())
	// The engine answers: a good time to look for what dead creators left.
	p.sweepUnstartedSoon()
	return roche.SandboxInfo{
		ID: id, Provider: p.Name(), Image: cfg.Image, State: roche.StateRunning,
		CreatedAt: now, ExpiresAt: expires, Transport: sb.transport(), Owner: cfg.Owner,
		Metadata: cfg.Metadata,
	}, nil
}

// createContainer creates the sandbox's container, not yet started, and returns what
// removes its mounts' staging points (see pinMountSources) once it has started. A drawn
// uid is checked once the container carries it in its label, before anything runs as
// it: if another container has it too, this one is removed and the uid drawn again.
func (p *Provider) createContainer(ctx context.Context, cfg kit.Spec, who runAs, expires time.Time, name, agentDir string) (string, func(), error) {
	for range maxUIDDraws {
		if who.draw {
			who.uid = p.drawSandboxUID()
			who.user = fmt.Sprintf("%d:%d", who.uid, who.uid)
		}
		ccfg, hcfg, err := p.containerConfig(cfg, who, expires, agentDir)
		if err != nil {
			return "", nil, err
		}
		if deadline, ok := ctx.Deadline(); ok {
			ccfg.Labels[LabelStartBy] = strconv.FormatInt(deadline.Unix()+1, 10)
		}
		unpin, err := p.pinMountSources(cfg.Config, hcfg)
		if err != nil {
			return "", nil, err
		}
		resp, err := p.cli.ContainerCreate(ctx, ccfg, hcfg, nil, nil, name)
		if err != nil {
			unpin()
			if rerr := p.runtimeErr(err); rerr != nil {
				return "", nil, rerr
			}
			return "", nil, p.engineErr("creating container", err)
		}
		for _, w := range resp.Warnings {
			p.log.Warn("docker create warning", "container", resp.ID, "warning", w)
		}
		if !who.draw {
			return resp.ID, unpin, nil
		}
		taken, err := p.uidTakenElsewhere(ctx, who.uid, resp.ID)
		if err == nil && !taken {
			return resp.ID, unpin, nil
		}
		// Drawn again under the same name: this container goes first, now.
		p.undo(resp.ID, "", true, nil)
		unpin()
		if err != nil {
			return "", nil, err
		}
		p.log.Debug("uid taken by another sandbox, drawing again", "uid", who.uid)
	}
	return "", nil, noFreeUID("sandbox", p.uidFirst, p.uidCount/2)
}

// pinMountSources, with WithPinnedMounts, replaces the sources of cfg's host mounts in
// hcfg by pinned staging points and returns what removes them.
func (p *Provider) pinMountSources(cfg roche.Config, hcfg *container.HostConfig) (func(), error) {
	var undo []func()
	release := func() {
		for _, u := range undo {
			u()
		}
	}
	if !p.pinMounts {
		return release, nil
	}
	for i := range hcfg.Mounts {
		m := &hcfg.Mounts[i]
		if m.Type != mount.TypeBind || !slices.ContainsFunc(cfg.Mounts, func(cm roche.Mount) bool {
			return cm.Source == m.Source && cm.Target == m.Target
		}) {
			continue
		}
		staged, u, err := p.pinSource(m.Source)
		if err != nil {
			release()
			return nil, err
		}
		undo = append(undo, u)
		m.Source = staged
	}
	return release, nil
}

// exitReason describes why a container stopped, for error messages.
func (p *Provider) exitReason(ctx context.Context, id string) string {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	c, err := p.cli.ContainerInspect(ctx, id)
	if err != nil || c.State == nil || c.State.Running {
		return ""
	}
	if c.State.Error != "" {
		return fmt.Sprintf(" (container exited %d: %s)", c.State.ExitCode, c.State.Error)
	}
	return fmt.Sprintf(" (container exited %d)", c.State.ExitCode)
}

// containerConfig maps a validated roche.Config onto Docker's container and host config.
// With an agent directory, roche-agent is PID 1; otherwise an init and sleep keep the
// container alive for Docker's exec API.
func (p *Provider) containerConfig(cfg kit.Spec, who runAs, expires time.Time, agentDir string) (*container.Config, *container.HostConfig, error) {
	cfgJSON, err := json.Marshal(cfg)
	if err != nil {
		return nil, nil, err
	}
	env := make([]string, 0, len(cfg.Env)+1)
	for k, v := range cfg.Env {
		env = append(env, k+"="+v)
	}
	// HOME is somewhere the sandbox user can write (the image's passwd knows no drawn
	// uid, and the agent itself runs as root, whose HOME is /root).
	if _, set := cfg.Env["HOME"]; !set {
		env = append(env, "HOME=/tmp")
	}
	mem := cfg.MemoryBytes()
	pids := int64(cfg.PidsLimit)
	initOn := true
	img := cfg.Image
	if cfg.FromSnapshot != "" {
		img = snapshotRef(cfg.FromSnapshot)
		// A snapshot's image keeps the environment its sandbox had, proxy settings included;
		// blank them unless this sandbox has its own allowlist.
		if len(cfg.NetworkAllowlist) == 0 {
			env = append(env, "HTTP_PROXY=", "HTTPS_PROXY=", "http_proxy=", "https_proxy=")
		}
	}
	ccfg := &container.Config{
		Image:      img,
		User:       who.user,
		Env:        env,
		WorkingDir: cfg.Workdir,
		// The container's main process lives exactly as long as the sandbox may: when the
		// lifetime ends it exits, the engine stops the container and removes it (AutoRemove),
		// so a sandbox is destroyed on time even when the caller crashed and no daemon runs.
		Entrypoint: []string{"sleep"},
		Cmd:        []string{strconv.Itoa(cfg.TimeoutSecs)},
		Labels: map[string]string{
			LabelManaged:  "true",
			LabelProvider: "docker",
			LabelExpires:  strconv.FormatInt(expires.Unix(), 10),
			LabelConfig:   string(cfgJSON),
			// Always set, so that a sandbox made from a snapshot does not carry the uid
			// label of the one the snapshot was taken of.
			LabelUID:   who.label(),
			LabelOwner: cfg.Owner,
		},
	}
	// With a network, the sandbox joins Roche's own bridge network, which the host's
	// firewall keeps off the host and cloud metadata (network.go), never Docker's default.
	networkMode := "none"
	var sysctls map[string]string
	if cfg.Network {
		networkMode, sysctls = NetworkName, networkSysctls
	}
	tmpSize := cfg.TmpSize()
	hcfg := &container.HostConfig{
		NetworkMode:    container.NetworkMode(networkMode),
		Sysctls:        sysctls,
		ReadonlyRootfs: !cfg.Writable,
		Tmpfs:          map[string]string{"/tmp": fmt.Sprintf("rw,nosuid,nodev,size=%d,mode=1777", tmpSize)},
		AutoRemove:     true,
		ShmSize:        tmpSize, // /dev/shm, capped like /tmp whatever the engine's default
		// An init as PID 1 reaps zombies orphaned by the sandbox's programs.
		Init:    &initOn,
		CapDrop: []string{"ALL"},
		// no-new-privileges, and Roche's seccomp profile rather than the engine's default,
		// which on engines before 25.0 still allows io_uring (provider/internal/seccomp).
		SecurityOpt: []string{"no-new-privileges:true", seccomp.DockerOpt()},
		LogConfig:   container.LogConfig{Type: "none"},
		Resources: container.Resources{
			Memory:     mem,
			MemorySwap: mem, // equal to Memory: no swap
			NanoCPUs:   int64(cfg.CPUs * 1e9),
			PidsLimit:  &pids,
		},
	}
	if p.runtime != RuntimeRunc {
		hcfg.Runtime = p.runtime
	}
	if p.gvisor() {
		hideGVisorDevices(hcfg)
	}
	limitOpenFiles(hcfg)
	for _, m := range cfg.Mounts {
		hcfg.Mounts = append(hcfg.Mounts, mount.Mount{
			Type: mount.TypeBind, Source: m.Source, Target: m.Target, ReadOnly: !m.ReadWrite,
		})
	}
	ccfg.Labels[LabelTransport] = TransportDockerExec
	if cfg.Workspace != "" {
		ccfg.Labels[LabelWorkspace] = cfg.Workspace
		hcfg.Mounts = append(hcfg.Mounts, p.workspaceMount(cfg.Workspace))
	}
	if agentDir != "" {
		// roche-agent is PID 1 and reaps zombies itself. It runs as root with the few
		// capabilities it needs (to run commands as the sandbox user, kill them, and hand
		// its socket to the host user), drops every capability from the bounding set at
		// start, and runs each command as cfg.User with none: CapEff, CapPrm and CapBnd
		// are all zero in everything the sandbox runs.
		ccfg.Labels[LabelTransport] = TransportAgent
		ccfg.Labels[LabelAgentDir] = agentDir
		ccfg.Labels[LabelRunDir] = runSubdir
		ccfg.User = "0:0"
		agent := agentspec.Spec{
			Socket: agentspec.RunDir + "/" + agentspec.SocketName, Owner: os.Geteuid(), User: who.user,
			Lifetime: time.Duration(cfg.TimeoutSecs) * time.Second, ChownFrom: who.chownFrom,
		}
		if cfg.Workspace != "" {
			agent.Own = roche.WorkspacePath
		}
		if cfg.Leased {
			agent.Lease = p.engineTimeout
		}
		if len(cfg.NetworkAllowlist) > 0 {
			agent.EgressSocket = agentspec.RunDir + "/" + agentspec.EgressSocketName
			ccfg.Env = append(ccfg.Env, egress.SandboxEnv()...)
			env, mounts := p.egressTrust(filepath.Join(agentDir, runSubdir))
			ccfg.Env = append(ccfg.Env, env...)
			hcfg.Mounts = append(hcfg.Mounts, mounts...)
		}
		ccfg.Cmd = nil
		noInit := false
		hcfg.Init = &noInit
		hcfg.CapAdd = slices.Clone(agentspec.Caps)
		// The sandbox's process limit is the agent's to hold, exactly (limits.go).
		p.limitProcesses(cfg.Config, &agent, hcfg)
		ccfg.Entrypoint = append([]string{agentspec.Binary}, agent.Args()...)
		hcfg.Mounts = append(hcfg.Mounts,
			mount.Mount{Type: mount.TypeBind, Source: p.agentPath, Target: agentspec.Binary, ReadOnly: true},
			mount.Mount{Type: mount.TypeBind, Source: filepath.Join(agentDir, runSubdir), Target: agentspec.RunDir},
		)
	}
	return ccfg, hcfg, nil
}

// imagePresent reports whether the engine has the image.
func (p *Provider) imagePresent(ctx context.Context, ref string) (bool, error) {
	_, err := p.cli.ImageInspect(ctx, ref)
	switch {
	case err == nil:
		return true, nil
	case cerrdefs.IsNotFound(err):
		return false, nil
	}
	return false, p.engineErr("inspecting image "+ref, err)
}

// pull pulls a missing image within the pull timeout, and says how to build a local one
// when the pull fails (machines without a registry).
func (p *Provider) pull(ctx context.Context, ref string) error {
	p.log.Info("pulling image", "image", ref)
	pctx, cancel := context.WithTimeout(ctx, p.pullTimeout)
	defer cancel()
	rc, err := p.cli.ImagePull(pctx, ref, image.PullOptions{})
	if err == nil {
		err = pullResult(rc)
	}
	if err != nil {
		if e := p.engineErr("", err); errors.Is(e, roche.ErrUnavailable) {
			return e
		}
		return NoImage(fmt.Errorf("%w: image %s is not available locally and could not be pulled (%s)",
			roche.ErrImageNotFound, ref, firstLine(err.Error())))
	}
	return nil
}

// pullResult drains a pull's progress stream and returns the error it reports, if any.
func pullResult(rc io.ReadCloser) error {
	defer rc.Close()
	dec := json.NewDecoder(rc)
	for {
		var msg struct {
			Error string `json:"error"`
		}
		if err := dec.Decode(&msg); err == io.EOF {
			return nil
		} else if err != nil {
			return err
		}
		if msg.Error != "" {
			return errors.New(msg.Error)
		}
	}
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	return s
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func (p *Provider) remember(s sandbox) {
	p.mu.Lock()
	p.verified[s.id] = s
	p.mu.Unlock()
}

func (p *Provider) forget(id string) {
	p.mu.Lock()
	delete(p.verified, id)
	p.mu.Unlock()
}

// lookup returns the Roche container named by id (a full id, a unique prefix or a name),
// refusing containers Roche did not create.
func (p *Provider) lookup(ctx context.Context, id string) (sandbox, error) {
	if s, ok := p.cached(id); ok {
		return s, nil
	}
	_, s, err := p.inspect(ctx, id)
	return s, err
}

// cached returns what this process last verified of sandbox id, if anything.
func (p *Provider) cached(id string) (sandbox, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	s, ok := p.verified[id]
	return s, ok
}

func (p *Provider) inspect(ctx context.Context, id string) (container.InspectResponse, sandbox, error) {
	if id == "" {
		return container.InspectResponse{}, sandbox{}, fmt.Errorf("%w: empty sandbox id", roche.ErrNotFound)
	}
	ictx, done := p.bound(ctx, "inspecting sandbox "+id)
	c, err := p.cli.ContainerInspect(ictx, id)
	done(&err)
	if err != nil {
		if cerrdefs.IsNotFound(err) {
			return c, sandbox{}, fmt.Errorf("%w: no sandbox %s (listing your sandboxes shows the live ones)", roche.ErrNotFound, id)
		}
		return c, sandbox{}, p.engineErr("inspecting sandbox "+id, err)
	}
	if c.Config == nil || c.Config.Labels[LabelManaged] != "true" || c.Config.Labels[LabelProvider] != "docker" {
		return c, sandbox{}, fmt.Errorf("%w: %s is not a Roche sandbox", roche.ErrNotFound, id)
	}
	s := sandbox{id: c.ID, expires: expiresFromLabels(c.Config.Labels)}
	_ = json.Unmarshal([]byte(c.Config.Labels[LabelConfig]), &s.cfg)
	if s.cfg.Disk == "" && s.cfg.Image != "" {
		s.cfg.Disk = roche.DefaultDisk // recorded before configs had a disk limit
	}
	if c.Config.Labels[LabelTransport] == TransportAgent {
		s.agentDir = c.Config.Labels[LabelAgentDir]
		s.runDir = runDirOf(s.agentDir, c.Config.Labels)
		s.agent = guest.NewClient(filepath.Join(s.runDir, agentspec.SocketName))
		p.claimed(s.agentDir, &s.cfg.Owner, &s.expires)
		if c.State != nil && c.State.Running {
			p.ensureEgress(s)
		}
	}
	if c.State != nil && c.State.Running {
		p.remember(s)
	}
	return c, s, nil
}

func expiresFromLabels(labels map[string]string) time.Time {
	sec, err := strconv.ParseInt(labels[LabelExpires], 10, 64)
	if err != nil {
		return time.Time{}
	}
	return time.Unix(sec, 0)
}

// Inspect implements roche.Provider.
func (p *Provider) Inspect(ctx context.Context, id string) (roche.SandboxInfo, error) {
	c, s, err := p.inspect(ctx, id)
	if err != nil {
		return roche.SandboxInfo{}, err
	}
	created, _ := time.Parse(time.RFC3339Nano, c.Created)
	state := roche.StateExited
	if c.State != nil {
		state = stateOf(c.State.Status)
	}
	sb := roche.SandboxInfo{
		ID: c.ID, Provider: p.Name(), Image: s.cfg.Image, State: state, CreatedAt: created, ExpiresAt: s.expires,
		Transport: s.transport(), Owner: s.cfg.Owner, Metadata: s.cfg.Metadata,
	}
	if state == roche.StateExited && c.State != nil && c.State.FinishedAt != "" {
		sb.End = endOf(c.State.OOMKilled, c.State.ExitCode, c.State.FinishedAt, s.expires)
	}
	return sb, nil
}

// endOf reads why a stopped container ended from the engine's state of it: OOMKilled
// (which containerd sets from the cgroup's memory.events oom_kill), its lifetime
// (roche-agent stops it at its end), else its main process's exit.
func endOf(oom bool, exit int, finished string, expires time.Time) *roche.EndReason {
	at, err := time.Parse(time.RFC3339Nano, finished)
	if err != nil || at.IsZero() || at.Year() < 2000 {
		return nil // never started, or ended with no time: nothing to say
	}
	e := &roche.EndReason{At: at, ExitCode: exit, ExitKnown: true}
	switch {
	case oom:
		e.Kind, e.Detail = roche.EndOOM, "killed for exceeding its memory limit"
		e.Evidence = fmt.Sprintf("the engine's State.OOMKilled (its cgroup's memory.events oom_kill), exit %d", exit)
	case !expires.IsZero() && !at.Before(expires.Add(-time.Second)):
		e.Kind, e.Detail = roche.EndLifetime, "its lifetime ended at "+expires.Local().Format(time.TimeOnly)
		e.Evidence = fmt.Sprintf("expires %s; the engine's State.FinishedAt %s, exit %d", expires.Local().Format(time.RFC3339), finished, exit)
	default:
		e.Kind, e.Detail = roche.EndAgentExited, fmt.Sprintf("its main process (roche-agent) exited with status %d", exit)
		e.Evidence = fmt.Sprintf("the engine's State: OOMKilled false, ExitCode %d, FinishedAt %s", exit, finished)
	}
	return e
}

func stateOf(status string) roche.SandboxState {
	switch status {
	case "running":
		return roche.StateRunning
	case "paused":
		return roche.StatePaused
	case "created":
		return roche.StateCreated
	}
	return roche.StateExited
}

// Destroy implements roche.Provider. It removes the container and its anonymous volumes;
// a container that is already gone is not an error.
func (p *Provider) Destroy(ctx context.Context, id string) (err error) {
	ctx, done := p.bound(ctx, "destroying sandbox "+id)
	defer done(&err)
	_, s, err := p.inspect(ctx, id)
	if errors.Is(err, roche.ErrNotFound) {
		// Gone already: the engine removed it when it stopped (its lifetime ended, or it
		// was killed). Its socket directory goes too, when this process knows it; else
		// roche gc sweeps it.
		if known, ok := p.cached(id); ok {
			p.removeAgentDir(known.agentDir)
		}
		p.forget(id)
		return nil
	}
	if err != nil {
		return err
	}
	p.forget(s.id)
	defer p.leases.Drop(s.id)
	if err := p.remove(ctx, s.id); err != nil {
		return err
	}
	p.removeAgentDir(s.agentDir)
	return nil
}

// removeOpts removes a sandbox whatever its state, with its anonymous volumes.
var removeOpts = container.RemoveOptions{Force: true, RemoveVolumes: true}

// remove removes container id; it is done when the container is gone.
func (p *Provider) remove(ctx context.Context, id string) error {
	err := p.cli.ContainerRemove(ctx, id, removeOpts)
	switch {
	case err == nil || cerrdefs.IsNotFound(err):
		return nil
	case isRemovalInProgress(err):
		return p.awaitRemoval(ctx, id)
	}
	return p.engineErr("removing sandbox "+id, err)
}

// awaitRemoval returns once container id, which the engine is already removing
// (AutoRemove at the end of a lifetime, a concurrent destroy, a restarted engine cleaning
// up), is gone. That removal is not taken as done: it can fail and leave the container
// "dead", and then nothing but this call would remove it, so a container the engine
// stops removing is removed again. The wait ends a tenth of ctx's time before its
// deadline, with an error that says the engine is still at it: an engine that answers
// "removing" is not one that does not answer.
func (p *Provider) awaitRemoval(ctx context.Context, id string) error {
	const poll = 100 * time.Millisecond
	wctx := ctx
	if deadline, ok := ctx.Deadline(); ok {
		var cancel context.CancelFunc
		wctx, cancel = context.WithDeadline(ctx, deadline.Add(-time.Until(deadline)/10))
		defer cancel()
	}
	began := time.Now()
	for {
		select {
		case <-wctx.Done():
			if ctx.Err() != nil {
				return p.engineErr("waiting for the engine to finish removing sandbox "+id, context.Cause(ctx))
			}
			return fmt.Errorf("removing sandbox %s: the engine is still removing it after %v; destroy it again to wait more, or roche gc removes it later",
				id, time.Since(began).Round(100*time.Millisecond))
		case <-time.After(poll):
		}
		c, err := p.cli.ContainerInspect(wctx, id)
		switch {
		case cerrdefs.IsNotFound(err):
			return nil
		case err != nil && wctx.Err() == nil:
			return p.engineErr("inspecting sandbox "+id+" while the engine removes it", err)
		case err == nil && (c.State == nil || c.State.Status != "removing"):
			// The engine's removal ended and left the container: remove it again.
			err = p.cli.ContainerRemove(ctx, id, removeOpts)
			if err == nil || cerrdefs.IsNotFound(err) {
				return nil
			}
			if !isRemovalInProgress(err) {
				return p.engineErr("removing sandbox "+id, err)
			}
		}
	}
}

// containers lists the engine's containers as ContainerList does, less the ghosts a
// restarted engine can leave: one it lists as "dead" but no longer has, whose inspect
// and remove answer "no such container" (moby/moby#51692; seen with 20.10 when a dockerd
// restarting after a kill removed an AutoRemove container while restoring it). A ghost
// holds nothing, its files are gone, and it goes when the engine next starts; listed,
// it would be a sandbox no destroy removes and a workspace in use by no one.
func (p *Provider) containers(ctx context.Context, opts container.ListOptions) ([]container.Summary, error) {
	cs, err := p.cli.ContainerList(ctx, opts)
	if err != nil {
		return nil, err
	}
	live := cs[:0]
	for _, c := range cs {
		if c.State == container.StateDead {
			if _, err := p.cli.ContainerInspect(ctx, c.ID); cerrdefs.IsNotFound(err) {
				p.log.Debug("the engine lists a container it no longer has: leaving it out", "id", c.ID)
				continue
			}
		}
		live = append(live, c)
	}
	return live, nil
}

// isRemovalInProgress: AutoRemove (or a concurrent destroy) is already removing it.
func isRemovalInProgress(err error) bool {
	return err != nil && strings.Contains(err.Error(), "is already in progress")
}

// List implements roche.Provider.
func (p *Provider) List(ctx context.Context) (_ []roche.SandboxInfo, err error) {
	ctx, done := p.bound(ctx, "listing sandboxes")
	defer done(&err)
	cs, err := p.containers(ctx, container.ListOptions{
		All: true,
		Filters: filters.NewArgs(
			filters.Arg("label", LabelManaged+"=true"),
			filters.Arg("label", LabelProvider+"=docker"),
		),
	})
	if err != nil {
		return nil, p.engineErr("listing sandboxes", err)
	}
	out := make([]roche.SandboxInfo, 0, len(cs))
	for _, c := range cs {
		var cfg kit.Spec
		_ = json.Unmarshal([]byte(c.Labels[LabelConfig]), &cfg)
		img := cfg.Image
		if img == "" {
			img = c.Image
		}
		info := roche.SandboxInfo{
			ID: c.ID, Provider: p.Name(), Image: img, State: stateOf(c.State),
			CreatedAt: time.Unix(c.Created, 0), ExpiresAt: expiresFromLabels(c.Labels),
			Transport: c.Labels[LabelTransport], Owner: cfg.Owner, Metadata: cfg.Metadata,
		}
		if info.Transport == TransportAgent {
			p.claimed(c.Labels[LabelAgentDir], &info.Owner, &info.ExpiresAt)
		}
		out = append(out, info)
	}
	return out, nil
}

// GC implements roche.GarbageCollector: it removes expired and stopped Roche containers
// (every one with opts.All).
func (p *Provider) GC(ctx context.Context, opts roche.GCOptions) ([]roche.SandboxInfo, error) {
	list, err := p.List(ctx)
	if err != nil {
		return nil, err
	}
	kit.MarkUnstarted(list, 2*p.engineTimeout)
	removed, err := kit.Collect(ctx, list, opts, p.Destroy)
	if !opts.DryRun {
		err = errors.Join(err, p.sweepAgentDirs(ctx))
	}
	return removed, err
}

// Pause implements roche.Pauser.
func (p *Provider) Pause(ctx context.Context, id string) (err error) {
	ctx, done := p.bound(ctx, "pausing sandbox "+id)
	defer done(&err)
	s, err := p.lookup(ctx, id)
	if err != nil {
		return err
	}
	return p.engineErr("pausing sandbox "+id, p.cli.ContainerPause(ctx, s.id))
}

// Unpause implements roche.Pauser.
func (p *Provider) Unpause(ctx context.Context, id string) (err error) {
	ctx, done := p.bound(ctx, "unpausing sandbox "+id)
	defer done(&err)
	s, err := p.lookup(ctx, id)
	if err != nil {
		return err
	}
	return p.engineErr("unpausing sandbox "+id, p.cli.ContainerUnpause(ctx, s.id))
}

// defaultStateDir is short on purpose: a unix socket path must fit in 108 bytes.
func defaultStateDir() string {
	if os.Geteuid() == 0 {
		return "/run/roche/docker"
	}
	if d := os.Getenv("XDG_RUNTIME_DIR"); d != "" {
		return filepath.Join(d, "roche", "docker")
	}
	return filepath.Join(os.TempDir(), fmt.Sprintf("roche-%d", os.Geteuid()), "docker")
}
