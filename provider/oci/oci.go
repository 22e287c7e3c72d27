// Package oci runs Roche sandboxes as containers made directly with an OCI runtime binary
// (crun or runc; gVisor's runsc is refused, see runscRefusal), without dockerd: Roche
// writes each bundle itself, an overlay over the image unpacked once into a cache, and a
// config.json that carries roche.Config's secure defaults, with roche-agent as PID 1.
//
// Everything a sandbox is lives on disk, under the state directory (one directory per
// sandbox, with its record) and the runtime's own state: a restarted process finds its
// sandboxes there, and List, GC and every create clear away those that ended.
package oci

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/docker/docker/client"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/internal/guest"
	"github.com/roche-sandbox/roche/internal/guest/guestbin"
	"github.com/roche-sandbox/roche/provider/internal/agentspec"
	"github.com/roche-sandbox/roche/provider/internal/egresswire"
	"github.com/roche-sandbox/roche/provider/internal/engine"
	"github.com/roche-sandbox/roche/provider/internal/guestfwd"
	"github.com/roche-sandbox/roche/provider/internal/uidrange"
	"github.com/roche-sandbox/roche/provider/kit"
)

// Name is the provider's name, and the prefix of its sandbox ids.
const Name = "oci"

var (
	_ roche.Provider         = (*Provider)(nil)
	_ kit.Creator            = (*Provider)(nil)
	_ roche.FileCopier       = (*Provider)(nil)
	_ roche.TarCopier        = (*Provider)(nil)
	_ roche.Pauser           = (*Provider)(nil)
	_ roche.GarbageCollector = (*Provider)(nil)
	_ roche.FileSystem       = (*Provider)(nil)
	_ roche.BackgroundRunner = (*Provider)(nil)
	_ kit.Leaser             = (*Provider)(nil)
)

// forwarder is embedded under a name of its own, so that the Provider's Keep wins.
type forwarder = guestfwd.Forwarder

// Provider is the OCI-runtime backend.
type Provider struct {
	forwarder
	log *slog.Logger
	// runtimeName is the runtime asked for ("" chooses); rt the one in use, resolved on
	// first need (resolveRuntime).
	runtimeName string
	rtMu        sync.Mutex
	rt          *ociRuntime
	agentPath   string
	// stateDir holds each sandbox's bundle, record and agent socket, and the runtimes'
	// state: it is on /run, gone at reboot with the sandboxes. dataDir holds the image
	// cache and writable roots' disks.
	stateDir, dataDir  string
	createTimeout      time.Duration
	uidFirst, uidCount int
	egress             bool
	// pinLayouts: image layouts are opened without following links (WithPinnedLayouts).
	pinLayouts bool

	dockerOnce sync.Once
	docker     *client.Client
	dockerErr  error
	dockerd    engine.Engine
	refsMu     sync.Mutex
	refs       map[string]recentRef

	mu       sync.Mutex
	verified map[string]*sandbox
	// uids memoizes the uid in each sandbox record drawUID has read (a record's uid never
	// changes), so that a create reads only the records new since the last one; it is
	// used only under the state directory's lock.
	uids    map[string]int
	leases  guestfwd.Leases
	proxies egresswire.Proxies
	// exitWatches are the pidfds of the sandboxes whose PID 1 this process watches, to
	// tear each down when it exits (exit_linux.go); exitClosed: Close stopped them.
	exitWatches map[string]*os.File
	exitClosed  bool
	exitWaits   sync.WaitGroup
	// exitTornDown marks the watches whose sandbox a caller tears down: they go on to
	// the exit only to tell watchers of it (unwatchExit).
	exitTornDown map[string]bool
	// events tells Watch's callers (events.go) of each sandbox's OOM kills and PID 1's
	// exit as the exit watch sees them.
	events kit.EventHub
	// oomSeen is the OOM-kill count last seen of each sandbox whose PID 1 is watched,
	// until its exit is told (died). oomTell orders the telling: a read of the counter
	// and the event it gives are one step, so that a teardown's read (which may see an
	// OOM kill first) never tells it after the exit's died.
	oomSeen map[string]int64
	oomTell sync.Mutex
	// tearing marks the teardowns under way, one per sandbox at a time.
	tearing map[string]chan struct{}
	// oneShots are the runs of the one-shot sandboxes this process made (oneshot.go).
	oneShots map[string]*oneShot

	lastSweep atomic.Int64
	sweeps    sync.WaitGroup
}

// Option configures a Provider.
type Option func(*Provider)

// WithLogger sets the logger; the default discards.
func WithLogger(l *slog.Logger) Option { return func(p *Provider) { p.log = l } }

// WithRuntime names the OCI runtime: RuntimeCrun or RuntimeRunc (RuntimeRunsc is refused,
// saying why). Empty (the default) takes the fastest that runs a probe sandbox here:
// crun, else runc.
func WithRuntime(name string) Option { return func(p *Provider) { p.runtimeName = name } }

// WithPinnedLayouts opens the directory of an image layout (LayoutPrefix) one component
// at a time without following a link, refusing any, rather than by its path: a process
// that checked the path as a string (roched, for its TCP tenants) reads the layout that
// was checked, not one a link swapped in since leads to. Inside the layout, links never
// lead out of it in any case.
func WithPinnedLayouts() Option { return func(p *Provider) { p.pinLayouts = true } }

// PinsLayouts reports whether the provider pins image layouts (WithPinnedLayouts).
func (p *Provider) PinsLayouts() bool { return p.pinLayouts }

// WithAgentPath sets the host path of the static roche-agent binary (default
// guestbin.Path).
func WithAgentPath(path string) Option { return func(p *Provider) { p.agentPath = path } }

// WithStateDir sets where sandboxes' bundles, records and sockets live (default
// /run/roche/oci).
func WithStateDir(dir string) Option { return func(p *Provider) { p.stateDir = dir } }

// WithDataDir sets where the image cache and writable roots' disks live (default
// /var/lib/roche/oci).
func WithDataDir(dir string) Option { return func(p *Provider) { p.dataDir = dir } }

// WithCreateTimeout bounds a create once the image is unpacked (default 30 s).
func WithCreateTimeout(d time.Duration) Option { return func(p *Provider) { p.createTimeout = d } }

// DefaultUIDFirst and DefaultUIDCount are the range oci sandboxes' uids are drawn from:
// the million after the Docker provider's (provider/internal/uidrange), so that an oci
// sandbox never shares a uid, and so per-user kernel limits, with a Docker one on the
// same host; the records under the state directory keep oci sandboxes apart.
const (
	DefaultUIDFirst = uidrange.OCIFirst
	DefaultUIDCount = uidrange.OCICount
)

// WithUIDRange sets the range sandboxes' uids are drawn from (DefaultUIDFirst,
// DefaultUIDCount).
func WithUIDRange(first, count int) Option {
	return func(p *Provider) { p.uidFirst, p.uidCount = first, count }
}

// WithEgressProxy lets sandboxes have a network_allowlist: this process then serves the
// egress proxy of each, so it must outlive them (roched, roche run).
func WithEgressProxy() Option { return func(p *Provider) { p.egress = true } }

// New returns an OCI-runtime provider. It runs nothing: the runtime is chosen, and a
// missing one reported, on first use.
func New(opts ...Option) (*Provider, error) {
	p := &Provider{
		log:           slog.New(slog.DiscardHandler),
		agentPath:     guestbin.Path(),
		stateDir:      "/run/roche/oci",
		dataDir:       "/var/lib/roche/oci",
		createTimeout: engine.DefaultTimeout,
		uidFirst:      DefaultUIDFirst,
		uidCount:      DefaultUIDCount,
		verified:      map[string]*sandbox{},
		uids:          map[string]int{},
	}
	p.forwarder = guestfwd.Forwarder{Reach: p.reach}
	for _, o := range opts {
		o(p)
	}
	var errs []error
	if p.runtimeName == RuntimeRunsc {
		errs = append(errs, fmt.Errorf("%w: %s", roche.ErrUnsupported, runscRefusal))
	} else if p.runtimeName != "" && !slices.Contains(Runtimes(), p.runtimeName) {
		errs = append(errs, fmt.Errorf("%w: runtime %q: use one of %s", roche.ErrInvalidConfig, p.runtimeName, strings.Join(Runtimes(), ", ")))
	}
	if p.createTimeout <= 0 {
		errs = append(errs, fmt.Errorf("%w: create timeout %v: give a positive duration", roche.ErrInvalidConfig, p.createTimeout))
	}
	if err := uidrange.Check(p.uidFirst, p.uidCount, 1); err != nil {
		errs = append(errs, err)
	}
	if !filepath.IsAbs(p.stateDir) || !filepath.IsAbs(p.dataDir) {
		errs = append(errs, fmt.Errorf("%w: state and data directories must be absolute paths", roche.ErrInvalidConfig))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	p.dockerd = engine.Engine{Name: "the Docker engine", Hint: "the oci provider reads images from it; check that dockerd runs"}
	return p, nil
}

// Close lets go of leases (those sandboxes stop within the grace) and of the one-shot
// sandboxes' connections (those stop at once), and stops the egress proxies this
// process serves.
func (p *Provider) Close() error {
	p.stopExitWatches()
	p.closeOneShots()
	p.leases.DropAll()
	p.proxies.StopAll()
	p.sweeps.Wait()
	p.rtMu.Lock()
	rt := p.rt
	p.rtMu.Unlock()
	if rt != nil {
		rt.closeSealed()
	}
	if p.docker != nil {
		return p.docker.Close()
	}
	return nil
}

// Name implements roche.Provider.
func (p *Provider) Name() string { return Name }

// Capabilities implements roche.Provider. The sandbox has only lo (no network, so no
// network=true); workspaces, reset and snapshots are not implemented.
func (p *Provider) Capabilities() roche.Capabilities {
	caps := roche.Capabilities{
		Egress: p.egress && p.agentPath != "", Writable: true, Mounts: true, Files: true, Pause: true,
		Stdin: true, Processes: true, Leases: p.agentPath != "",
	}
	if p.agentPath != "" { // code contexts are roche-agent's
		caps.Code, caps.RichResults = guestfwd.CodeLanguages, true
	}
	return caps
}

// Available reports why the provider cannot make sandboxes here, or nil: it needs root,
// roche-agent and a runtime that passes the probe.
func (p *Provider) Available() error {
	if err := p.canRun(); err != nil {
		return err
	}
	_, err := p.resolveRuntime(context.Background())
	return err
}

// Runtime returns the runtime in use, choosing it if not done yet.
func (p *Provider) Runtime(ctx context.Context) (string, error) {
	r, err := p.resolveRuntime(ctx)
	if err != nil {
		return "", err
	}
	return r.name, nil
}

func (p *Provider) canRun() error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("%w: the oci provider runs the OCI runtime as root (it mounts each sandbox's root and sets its cgroup limits): run roche as root or through roched", roche.ErrUnavailable)
	}
	if p.agentPath == "" {
		return fmt.Errorf("%w: roche-agent was not found: oci sandboxes run it as PID 1; %s", roche.ErrUnavailable, guestbin.Install)
	}
	return nil
}

func (p *Provider) dockerClient() (*client.Client, error) {
	p.dockerOnce.Do(func() {
		p.docker, p.dockerErr = engine.DockerClient()
		if p.dockerErr != nil {
			p.dockerErr = fmt.Errorf("%w: configuring the Docker client (the oci provider reads images from it): %v", roche.ErrUnavailable, p.dockerErr)
			return
		}
		p.dockerd.Addr = p.docker.DaemonHost()
	})
	return p.docker, p.dockerErr
}

// sandbox is what the provider knows of one sandbox: its record on disk, and its agent.
type sandbox struct {
	record
	dir   string
	agent *guest.Client
}

// record is a sandbox's record.json, written before anything of it is made, so that a
// process that dies at any point leaves enough on disk for another to clear it away.
type record struct {
	ID      string    `json:"id"`
	Runtime string    `json:"runtime"`
	Config  kit.Spec  `json:"config"`
	Created time.Time `json:"created"`
	Expires time.Time `json:"expires"`
	// StartBy is when a create that has not started the container gives up: one found
	// unstarted after it is a leftover.
	StartBy time.Time `json:"start_by"`
	UID     int       `json:"uid"` // the drawn uid, -1 for the caller's own user
	ImageID string    `json:"image_id"`
	// Claim is set once a pooled sandbox is claimed for a holder (claim.go); Config's
	// Owner and Expires are then the claim's.
	Claim *kit.Claim `json:"claim,omitempty"`
}

func (p *Provider) sandboxDir(id string) string { return filepath.Join(p.stateDir, id) }
func (p *Provider) diskDir(id string) string    { return filepath.Join(p.dataDir, "sandboxes", id) }

func (s *sandbox) runDir() string { return filepath.Join(s.dir, "run") }

func readRecord(dir string) (record, error) {
	b, err := os.ReadFile(filepath.Join(dir, "record.json"))
	if err != nil {
		return record{}, err
	}
	var r record
	if err := json.Unmarshal(b, &r); err != nil {
		return record{}, fmt.Errorf("reading the record %s: %w", dir, err)
	}
	return r, nil
}

func writeRecord(dir string, r record) error {
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	tmp := filepath.Join(dir, ".record.json")
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(dir, "record.json"))
}

// validID: ids name directories, so only ours pass.
func validID(id string) bool {
	hexPart, ok := strings.CutPrefix(id, Name+"-")
	return ok && len(hexPart) == 16 && isHex(hexPart)
}

// load returns sandbox id from its record on disk.
func (p *Provider) load(id string) (*sandbox, error) {
	if !validID(id) {
		return nil, fmt.Errorf("%w: no sandbox %s (listing your sandboxes shows the live ones)", roche.ErrNotFound, id)
	}
	p.mu.Lock()
	s, ok := p.verified[id]
	p.mu.Unlock()
	if ok {
		return s, nil
	}
	dir := p.sandboxDir(id)
	r, err := readRecord(dir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("%w: no sandbox %s (listing your sandboxes shows the live ones)", roche.ErrNotFound, id)
		}
		return nil, err
	}
	s = &sandbox{record: r, dir: dir}
	s.agent = guest.NewClient(filepath.Join(s.runDir(), agentspec.SocketName))
	p.watchExit(s)
	return s, nil
}

func (p *Provider) remember(s *sandbox) {
	p.mu.Lock()
	p.verified[s.ID] = s
	p.mu.Unlock()
}

func (p *Provider) forget(id string) {
	p.mu.Lock()
	delete(p.verified, id)
	p.mu.Unlock()
}

// reach is guestfwd's way to a sandbox's agent.
func (p *Provider) reach(ctx context.Context, id string) (guestfwd.Target, error) {
	s, err := p.load(id)
	if err != nil {
		return guestfwd.Target{}, err
	}
	if err := p.oneShotUsed(id); err != nil {
		return guestfwd.Target{}, err
	}
	p.ensureEgress(s)
	return guestfwd.Target{
		ID: s.ID, Agent: s.agent, Expires: s.Expires, Workdir: s.Config.Workdir,
		Gone: func() bool {
			r, err := p.resolveRuntime(ctx)
			if err != nil {
				return false
			}
			st, ok := r.state(context.WithoutCancel(ctx), s.ID)
			gone := !ok || st.Status == "stopped"
			if gone {
				p.forget(s.ID)
			}
			return gone
		},
	}, nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func durationSecs(s int) time.Duration { return time.Duration(s) * time.Second }

// drawUID picks a sandbox uid no other live sandbox of this provider has, under the
// state directory's lock (records are the one list of uids taken).
func (p *Provider) drawUID(ctx context.Context, self string) (int, func(), error) {
	unlock, err := lockPath(ctx, p.stateDir)
	if err != nil {
		return 0, nil, fmt.Errorf("locking the state directory %s: %w", p.stateDir, err)
	}
	// Records are the one list of uids taken (other processes make sandboxes here too);
	// each is read once.
	taken := map[int]bool{}
	entries, _ := os.ReadDir(p.stateDir)
	listed := make(map[string]bool, len(entries))
	for _, e := range entries {
		id := e.Name()
		if id == self || !validID(id) {
			continue
		}
		listed[id] = true
		uid, known := p.uids[id]
		if !known {
			r, err := readRecord(filepath.Join(p.stateDir, id))
			if err != nil {
				continue // not written yet: its maker draws after this one
			}
			uid = r.UID
			p.uids[id] = uid
		}
		if uid >= 0 {
			taken[uid] = true
		}
	}
	for id := range p.uids {
		if !listed[id] {
			delete(p.uids, id)
		}
	}
	for range 64 {
		uid := uidrange.Draw(p.uidFirst, p.uidCount)
		if !taken[uid] {
			return uid, unlock, nil
		}
	}
	unlock()
	return 0, nil, fmt.Errorf("%w: no free sandbox uid in %d-%d", roche.ErrUnavailable, p.uidFirst, p.uidFirst+p.uidCount-1)
}

// LeaseGrace is how long a leased sandbox outlives the loss of its lease.
const LeaseGrace = agentspec.LeaseGrace
