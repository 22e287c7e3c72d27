package oci

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/internal/cgroupwarm"
	"github.com/roche-sandbox/roche/internal/guest"
	"github.com/roche-sandbox/roche/provider/internal/agentspec"
	"github.com/roche-sandbox/roche/provider/internal/sizedfs"
	"github.com/roche-sandbox/roche/provider/kit"
)

// Create implements roche.Provider: CreateFor with no owner, not leased.
func (p *Provider) Create(ctx context.Context, cfg roche.Config) (roche.SandboxInfo, error) {
	return p.CreateFor(ctx, cfg, kit.CreateOptions{})
}

// CreateFor implements kit.Creator.
func (p *Provider) CreateFor(ctx context.Context, cfg roche.Config, opts kit.CreateOptions) (_ roche.SandboxInfo, err error) {
	if err := cfg.Validate(); err != nil {
		return roche.SandboxInfo{}, err
	}
	if err := p.check(cfg); err != nil {
		return roche.SandboxInfo{}, err
	}
	if err := p.canRun(); err != nil {
		return roche.SandboxInfo{}, err
	}
	// No warm-up here: the image's lookup may unpack it, seconds on its first use, and
	// the warm-up's cgroup moves stall forks and exits host-wide for a moment each. It
	// begins in create, once the image is ready (roche-run's one-shot began it already,
	// for a while: internal/rocherun/ociwarm).
	rt, img, confirm, stop, err := p.runtimeAndGuess(ctx, cfg.Image)
	defer stop()
	if err != nil {
		return roche.SandboxInfo{}, err
	}
	p.sweepSoon()
	spec := kit.Spec{Config: cfg, CreateOptions: opts}
	bounded := func() (context.Context, context.CancelFunc) {
		return context.WithTimeoutCause(ctx, p.createTimeout,
			fmt.Errorf("%w: creating an oci sandbox took longer than %v", roche.ErrTimeout, p.createTimeout))
	}
	cctx, cancel := bounded()
	defer cancel()
	info, err := p.create(cctx, rt, img, spec, confirm)
	if !errors.Is(err, errImageMoved) {
		return info, err
	}
	// The guess was another image: this one, unpacked if new, and a create of its own.
	p.log.Info("the image's name moved since it was unpacked; making the sandbox from the image it names now", "image", cfg.Image)
	if img, err = p.image(ctx, cfg.Image); err != nil {
		return roche.SandboxInfo{}, err
	}
	cctx, cancel = bounded()
	defer cancel()
	return p.create(cctx, rt, img, spec, nil)
}

// check refuses, before anything is made, what this provider does not do.
func (p *Provider) check(cfg roche.Config) error {
	switch {
	case cfg.Network:
		return fmt.Errorf("%w: network=true: oci sandboxes have only lo (a network namespace of their own); use network_allowlist through roched, or the docker provider", roche.ErrUnsupported)
	case cfg.Workspace != "":
		return fmt.Errorf("%w: workspace %s: the oci provider has no workspaces; use the docker provider", roche.ErrUnsupported, cfg.Workspace)
	case cfg.FromSnapshot != "":
		return fmt.Errorf("%w: from_snapshot: the oci provider has no snapshots; use the docker provider", roche.ErrUnsupported)
	case len(cfg.NetworkAllowlist) > 0 && !p.egress:
		return fmt.Errorf("%w: network_allowlist needs a host process that outlives the sandbox to run its proxy: use roched (roche daemon start) or roche run", roche.ErrUnsupported)
	}
	for _, m := range cfg.Mounts {
		if _, err := os.Stat(m.Source); err != nil {
			return fmt.Errorf("%w: mount source %s does not exist on the host: create it or fix the path", roche.ErrInvalidConfig, m.Source)
		}
	}
	return nil
}

// create makes the sandbox: its directory and record first, then the root (an overlay
// over the cached image, on a sized filesystem when writable), the bundle, and the
// container, run detached with roche-agent as PID 1 (in the foreground for a one-shot
// sandbox). Anything made is undone on failure. confirm, when not nil, says whether img
// is the image to use (runtimeAndGuess); it is asked once the agent is up.
func (p *Provider) create(ctx context.Context, rt *ociRuntime, img imageRoot, cfg kit.Spec, confirm func(context.Context) error) (_ roche.SandboxInfo, err error) {
	now := time.Now()
	// The kernel's wait before the runtime's first cgroup move, begun beside what comes
	// before it (the image is ready by now) and kept from recurring until the runtime's
	// run returns (internal/cgroupwarm).
	warmed := cgroupwarm.Start()
	defer warmed()
	id := Name + "-" + randomHex(8)
	s := &sandbox{dir: p.sandboxDir(id), record: record{
		ID: id, Runtime: rt.name, Config: cfg, Created: now, Expires: now.Add(durationSecs(cfg.TimeoutSecs)),
		UID: -1, ImageID: img.ID,
	}}
	if dl, ok := ctx.Deadline(); ok {
		s.StartBy = dl.Add(time.Second)
	}
	if err := os.MkdirAll(p.stateDir, 0o700); err != nil {
		return roche.SandboxInfo{}, fmt.Errorf("%w: making the state directory: %v", roche.ErrUnavailable, err)
	}
	// The directory appears with its start-by already in it (made under a hidden name,
	// then renamed): a maker killed at any point leaves nothing the sweep must guess the
	// age of (sweepUnrecorded).
	making := filepath.Join(p.stateDir, "."+id)
	if err := os.Mkdir(making, 0o700); err != nil {
		return roche.SandboxInfo{}, fmt.Errorf("%w: making the sandbox's directory: %v", roche.ErrUnavailable, err)
	}
	markStartBy(making, s.StartBy) // until the record is written
	if err := os.Rename(making, s.dir); err != nil {
		_ = os.RemoveAll(making)
		return roche.SandboxInfo{}, fmt.Errorf("%w: making the sandbox's directory: %v", roche.ErrUnavailable, err)
	}
	defer func() {
		if err != nil {
			p.teardown(context.WithoutCancel(ctx), rt, s)
		}
	}()
	user := cfg.User
	if cfg.User == roche.UserAuto {
		uid, unlock, err := p.drawUID(ctx, id)
		if err != nil {
			return roche.SandboxInfo{}, err
		}
		s.UID = uid
		user = fmt.Sprintf("%d:%d", uid, uid)
		err = writeRecord(s.dir, s.record)
		unlock()
		if err != nil {
			return roche.SandboxInfo{}, err
		}
	} else if err := writeRecord(s.dir, s.record); err != nil {
		return roche.SandboxInfo{}, err
	}
	b := bundleSpec{
		id: id, cfg: cfg.Config, image: img, rootfs: filepath.Join(s.dir, "rootfs"), runDir: s.runDir(),
		agent: p.agentPath, user: user, cgroup: cgroupOf(id), lifetime: cfg.TimeoutSecs,
		compiledSeccomp: rt.compiledSeccomp(),
	}
	if cfg.OneShot {
		b.connFD = oneShotFD // its connection is its lease
	} else if cfg.Leased {
		b.lease = p.createTimeout
	}
	if err := os.Mkdir(b.runDir, 0o700); err != nil {
		return roche.SandboxInfo{}, err
	}
	if len(cfg.NetworkAllowlist) > 0 {
		// The proxy first: its CA and the secrets' placeholders go into the spec.
		if b.trust, err = p.proxies.Start(b.runDir, s.dir, id, cfg.Config, p.log); err != nil {
			return roche.SandboxInfo{}, err
		}
	}
	tPrep := time.Now()
	if err := p.mountRoot(s, b); err != nil {
		return roche.SandboxInfo{}, err
	}
	spec, err := b.spec()
	if err != nil {
		return roche.SandboxInfo{}, err
	}
	js, err := json.Marshal(spec)
	if err != nil {
		return roche.SandboxInfo{}, err
	}
	if err := os.WriteFile(filepath.Join(s.dir, "config.json"), js, 0o600); err != nil {
		return roche.SandboxInfo{}, err
	}
	s.agent = guest.NewClient(filepath.Join(b.runDir, agentspec.SocketName))
	tMount := time.Now()
	if cfg.OneShot {
		// Its runtime run is this process's child, which returns when it ends.
		if err := p.startOneShot(ctx, rt, s, warmed); err != nil {
			return roche.SandboxInfo{}, err
		}
	} else {
		if err := p.start(ctx, rt, s, warmed); err != nil {
			return roche.SandboxInfo{}, err
		}
		if cfg.Leased {
			if err := p.leases.Take(ctx, id, s.agent); err != nil {
				return roche.SandboxInfo{}, err
			}
		}
	}
	if confirm != nil {
		if err := confirm(ctx); err != nil {
			return roche.SandboxInfo{}, err
		}
	}
	p.remember(s)
	if !cfg.OneShot {
		p.watchExit(s)
	}
	p.log.Debug("sandbox created", "id", id, "image", cfg.Image, "runtime", rt.name, "took", time.Since(now),
		"prepare", tPrep.Sub(now), "mount+spec", tMount.Sub(tPrep), "run+ready", time.Since(tMount))
	return p.info(s, roche.StateRunning), nil
}

// start runs the container detached and waits for its agent to answer.
// warmed is called once the runtime's run returns (cgroupwarm.Start).
func (p *Provider) start(ctx context.Context, rt *ociRuntime, s *sandbox, warmed func()) (err error) {
	defer func() {
		// A compiled filter the sandbox failed with (its init loads it after the run
		// returns) is not handed to the next sandbox, which compiles its own again.
		if err != nil {
			rt.forgetSeccomp()
		}
	}()
	logf, err := os.OpenFile(filepath.Join(s.dir, "agent.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close()
	watch := watchSocket(s.agent.Socket())
	defer watch.close()
	cmd := rt.command(ctx, "run", "--detach", "--bundle", s.dir, "--pid-file", filepath.Join(s.dir, "pid"), s.ID)
	// The agent's stdio is the log file: nothing of this process is held open by it.
	cmd.Stdin, cmd.Stdout, cmd.Stderr = nil, logf, logf
	t0 := time.Now()
	err = cmd.Run()
	warmed()
	if err != nil {
		return fmt.Errorf("%w: %s run: %v: %s", roche.ErrUnavailable, rt.name, err, p.logTail(s))
	}
	p.log.Debug("runtime ran the sandbox", "id", s.ID, "took", time.Since(t0))
	rt.learnSeccomp(s.ID)
	wctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	ready := make(chan error, 1)
	go func() {
		watch.wait(wctx)
		ready <- s.agent.WaitReady(wctx)
	}()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case err := <-ready:
			if err != nil {
				if ctx.Err() != nil {
					return context.Cause(ctx)
				}
				return fmt.Errorf("%w: roche-agent did not start in the sandbox: %v: %s", roche.ErrUnavailable, err, p.logTail(s))
			}
			return nil
		case <-tick.C:
			// Give up at once when the container stopped instead.
			if st, ok := rt.state(ctx, s.ID); ok && st.Status == "stopped" {
				cancel()
				<-ready
				return fmt.Errorf("%w: the sandbox stopped before roche-agent answered: %s", roche.ErrUnavailable, p.logTail(s))
			}
		}
	}
}

// logTail is the end of the agent's log, for errors.
func (p *Provider) logTail(s *sandbox) string {
	b, _ := os.ReadFile(filepath.Join(s.dir, "agent.log"))
	line := lastLine(b)
	if line == "" {
		return "(no output)"
	}
	return line
}

// mountRoot mounts the sandbox's root at b.rootfs: the stubs (mount points the image
// lacks) over the cached image, read-only; with a writable root, the upper and work
// directories sit on a sized ext4 filesystem of cfg.Disk (the Docker provider's), or,
// with disk 0, in the data directory without a bound.
func (p *Provider) mountRoot(s *sandbox, b bundleSpec) error {
	stubs := filepath.Join(s.dir, "stubs")
	if err := makeStubs(stubs, b.image.dir, b.mountPoints()); err != nil {
		return fmt.Errorf("preparing the sandbox's mount points: %w", err)
	}
	if err := os.Mkdir(b.rootfs, 0o755); err != nil {
		return err
	}
	var upper, work string
	if b.cfg.Writable {
		disk := p.diskDir(s.ID)
		if err := os.MkdirAll(disk, 0o700); err != nil {
			return fmt.Errorf("%w: making the sandbox's disk directory: %v", roche.ErrUnavailable, err)
		}
		layer := filepath.Join(disk, "layer")
		if err := os.Mkdir(layer, 0o700); err != nil {
			return err
		}
		if size := b.cfg.DiskBytes(); size > 0 {
			if err := sizedfs.MountNew(filepath.Join(disk, "disk.img"), layer, size); err != nil {
				return fmt.Errorf("bounding the writable root to %s: %w", b.cfg.Disk, err)
			}
		}
		upper, work = filepath.Join(layer, "upper"), filepath.Join(layer, "work")
		for _, d := range []string{upper, work} {
			if err := os.Mkdir(d, 0o755); err != nil {
				return err
			}
		}
	}
	return mountOverlay(b.rootfs, stubs, b.image.dir, upper, work)
}

// makeStubs makes, under stubs, each mount point missing from the image's tree (and its
// missing parents), owned by root.
func makeStubs(stubs, image string, points []mountPoint) error {
	if err := os.Mkdir(stubs, 0o755); err != nil {
		return err
	}
	for _, mp := range points {
		rel := strings.TrimPrefix(filepath.Clean(mp.path), "/")
		if rel == "" || strings.HasPrefix(rel, "..") {
			continue
		}
		if _, err := os.Lstat(filepath.Join(image, rel)); err == nil {
			continue // the image has it (a symbolic link there is the runtime's to refuse)
		}
		parts := strings.Split(rel, "/")
		for i := range parts[:len(parts)-1] {
			d := filepath.Join(parts[:i+1]...)
			if fi, err := os.Lstat(filepath.Join(image, d)); err == nil && !fi.IsDir() {
				return fmt.Errorf("mount point %s: %s is not a directory in the image", mp.path, "/"+d)
			}
			if err := os.MkdirAll(filepath.Join(stubs, d), 0o755); err != nil {
				return err
			}
		}
		p := filepath.Join(stubs, rel)
		if mp.dir {
			if err := os.MkdirAll(p, 0o755); err != nil {
				return err
			}
		} else if err := os.WriteFile(p, nil, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// teardown removes everything of sandbox s: the container, its mounts, its disk and its
// directory. It is idempotent, and safe on a half-made sandbox. Teardowns of one sandbox
// run one at a time (a destroy, and the watch of its PID 1 that sees the exit the
// destroy causes).
func (p *Provider) teardown(ctx context.Context, rt *ociRuntime, s *sandbox) error {
	defer p.tearingDown(s.ID)()
	one, ranOut, rootGone := p.endOneShot(ctx, rt, s)
	p.sawOOMsBeforeTeardown(s.ID) // before its cgroup goes (exit_linux.go)
	p.killWatched(s.ID)
	p.unwatchExit(s.ID)
	p.forget(s.ID)
	p.leases.Drop(s.ID)
	p.proxies.Stop(s.runDir())
	var errs []error
	killedRun := false
	if _, err := os.Stat(filepath.Join(s.dir, "pid")); errors.Is(err, os.ErrNotExist) {
		// Its run never got as far as its pid: one still under way (its maker killed)
		// would go on making the container after this teardown (teardown_linux.go).
		killedRun = stopRunsOf(s.dir)
	}
	if rt != nil {
		dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		var err error
		if !ranOut {
			err = rt.remove(dctx, s.ID, filepath.Join(s.dir, "pid"))
			if one != nil {
				// Its run returns now, if it had not: its own delete is over.
				one.wait(dctx, oneShotEnd)
			}
		}
		cancel()
		if err == nil && killedRun {
			err = forgetHalfMade(rt.root, s.ID)
		}
		if err == nil {
			err = removeCgroups(cgroupOf(s.ID))
		}
		errs = append(errs, err)
	}
	if rootGone != nil {
		errs = append(errs, <-rootGone...)
	}
	for _, mp := range mountsBelow(s.dir, p.diskDir(s.ID)) {
		errs = append(errs, unmountAll(mp))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("destroying sandbox %s: %w", s.ID, err)
	}
	errs = append(errs, os.RemoveAll(p.diskDir(s.ID)))
	// The record goes last, so that a failed destroy is found and retried.
	errs = append(errs, os.RemoveAll(s.dir))
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("destroying sandbox %s: %w", s.ID, err)
	}
	return nil
}

// cgroupOf is the cgroups path of sandbox id's container.
func cgroupOf(id string) string { return "/roche-" + id }

// tearingDown waits for a teardown of sandbox id under way to end, marks one under way,
// and returns what ends it.
func (p *Provider) tearingDown(id string) (done func()) {
	p.mu.Lock()
	for {
		busy, ok := p.tearing[id]
		if !ok {
			break
		}
		p.mu.Unlock()
		<-busy
		p.mu.Lock()
	}
	if p.tearing == nil {
		p.tearing = map[string]chan struct{}{}
	}
	ch := make(chan struct{})
	p.tearing[id] = ch
	p.mu.Unlock()
	return func() {
		p.mu.Lock()
		delete(p.tearing, id)
		p.mu.Unlock()
		close(ch)
	}
}

// runtimeOf returns the runtime that made s: its name is in the record.
func (p *Provider) runtimeOf(ctx context.Context, s *sandbox) (*ociRuntime, error) {
	if r, err := p.resolveRuntime(ctx); err == nil && r.name == s.Runtime {
		return r, nil
	}
	return p.newRuntime(s.Runtime)
}

// Destroy implements roche.Provider; a sandbox already gone is not an error.
func (p *Provider) Destroy(ctx context.Context, id string) error {
	s, err := p.load(id)
	if errors.Is(err, roche.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	rt, err := p.runtimeOf(ctx, s)
	if err != nil {
		return err
	}
	return p.teardown(ctx, rt, s)
}

func (p *Provider) info(s *sandbox, state roche.SandboxState) roche.SandboxInfo {
	return roche.SandboxInfo{
		ID: s.ID, Provider: Name, Image: s.Config.Image, State: state, CreatedAt: s.Created,
		ExpiresAt: s.Expires, Transport: agentspec.Transport, Owner: s.Config.Owner, Metadata: s.Config.Metadata,
	}
}

// stateOf is a sandbox's state from what its runtime says of its container: one the
// runtime does not know is being made, or, past its create's deadline or once the
// PID 1 its run recorded has exited, a leftover (a one-shot sandbox's run deletes the
// container when it ends, and its maker may have been killed before its teardown).
func stateOf(s *sandbox, st containerState, known bool) roche.SandboxState {
	if !known {
		if !s.StartBy.IsZero() && time.Now().After(s.StartBy) {
			return roche.StateExited
		}
		if pid := readPid(filepath.Join(s.dir, "pid")); pid > 0 && pidGone(pid) {
			return roche.StateExited
		}
		return roche.StateCreated
	}
	switch st.Status {
	case "running":
		return roche.StateRunning
	case "paused":
		return roche.StatePaused
	case "created", "creating":
		return roche.StateCreated
	}
	return roche.StateExited
}

// Inspect implements roche.Provider.
func (p *Provider) Inspect(ctx context.Context, id string) (roche.SandboxInfo, error) {
	s, err := p.load(id)
	if err != nil {
		return roche.SandboxInfo{}, err
	}
	rt, err := p.runtimeOf(ctx, s)
	if err != nil {
		return roche.SandboxInfo{}, err
	}
	st, known := rt.state(ctx, s.ID)
	return p.info(s, stateOf(s, st, known)), nil
}

// List implements roche.Provider: every sandbox with a record on disk, in the state its
// runtime reports (created for one whose container was never made or is gone).
func (p *Provider) List(ctx context.Context) ([]roche.SandboxInfo, error) {
	entries, err := os.ReadDir(p.stateDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if errors.Is(err, os.ErrPermission) && p.canRun() != nil {
		// Root's sandboxes, out of a user's reach: the provider is not this user's to use.
		return nil, kit.NotConfigured(p.canRun())
	}
	if err != nil {
		return nil, fmt.Errorf("listing sandboxes in %s: %w", p.stateDir, err)
	}
	states := map[string]map[string]containerState{}
	var out []roche.SandboxInfo
	for _, e := range entries {
		if !validID(e.Name()) {
			continue
		}
		s, err := p.load(e.Name())
		if err != nil {
			continue // being made or removed right now
		}
		if _, ok := states[s.Runtime]; !ok {
			rt, err := p.runtimeOf(ctx, s)
			if err != nil {
				return nil, err
			}
			if states[s.Runtime], err = rt.list(ctx); err != nil {
				// A runtime's list fails whole on one container whose make was cut short
				// (its maker killed; crun: "error opening file .../status"): each
				// sandbox's state is asked for instead (nil marks it), so that the one
				// broken make does not hide every sandbox from a restarted roched.
				p.log.Warn("listing the runtime's containers failed: asking each sandbox", "runtime", s.Runtime, "err", err)
				states[s.Runtime] = nil
			}
		}
		st, known := states[s.Runtime][s.ID]
		if states[s.Runtime] == nil {
			if rt, err := p.runtimeOf(ctx, s); err == nil {
				st, known = rt.state(ctx, s.ID)
			}
		}
		out = append(out, p.info(s, stateOf(s, st, known)))
	}
	return out, nil
}

// GC implements roche.GarbageCollector: it removes expired and stopped sandboxes (every
// one with opts.All), with their mounts and disks.
func (p *Provider) GC(ctx context.Context, opts roche.GCOptions) ([]roche.SandboxInfo, error) {
	if !opts.DryRun {
		// First, and whatever List makes of the runtime: it needs neither, and a create
		// killed before its record is otherwise left for the next sweep, a minute on.
		p.sweepUnrecorded()
	}
	list, err := p.List(ctx)
	if err != nil {
		return nil, err
	}
	removed, err := kit.Collect(ctx, list, opts, p.Destroy)
	if opts.DryRun {
		return removed, err
	}
	// Images: those the remaining sandboxes use stay (a record being written right now
	// names an image used within imageKeep, which stays too).
	inUse := map[string]bool{}
	if entries, rerr := os.ReadDir(p.stateDir); rerr == nil {
		for _, e := range entries {
			if r, rerr := readRecord(filepath.Join(p.stateDir, e.Name())); rerr == nil {
				inUse[r.ImageID] = true
			}
		}
	}
	return removed, errors.Join(err, p.pruneImages(ctx, inUse))
}

// sweepShared is how often, at most, the processes sharing a state directory sweep it.
const sweepShared = 10 * time.Second

// sweepSoon clears away, in the background and at most once a minute, the sandboxes
// whose lifetime ended (their agent stopped, which stops the container, but their mounts
// and directories stay until removed): a restarted process clears what the last one left.
// Across processes, at most once in sweepShared per state directory (claimSweep): every
// one-shot roche run is a process of its own, and would otherwise list the runtime's
// containers, and wait for that on its way out, each time. The shared window is short
// so that a restarted roched still sweeps at its first create what a killed one left
// (its creates give up an engine timeout, 30 s, after they began).
func (p *Provider) sweepSoon() {
	now := time.Now().UnixNano()
	last := p.lastSweep.Load()
	if now-last < int64(time.Minute) || !p.lastSweep.CompareAndSwap(last, now) {
		return
	}
	if !p.claimSweep(sweepShared) {
		// Another process swept within sweepShared, maybe just before what is due now
		// fell due: this process's minute is not used up, its next create asks again.
		p.lastSweep.CompareAndSwap(now, last)
		return
	}
	p.sweeps.Add(1)
	go func() {
		defer p.sweeps.Done()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if removed, err := p.GC(ctx, roche.GCOptions{}); err != nil {
			p.log.Warn("clearing away ended sandboxes", "err", err)
		} else if len(removed) > 0 {
			p.log.Info("cleared away ended sandboxes", "count", len(removed))
		}
	}()
}

// Pause implements roche.Pauser (the runtime's freezer).
func (p *Provider) Pause(ctx context.Context, id string) error { return p.freeze(ctx, id, "pause") }

// Unpause implements roche.Pauser.
func (p *Provider) Unpause(ctx context.Context, id string) error { return p.freeze(ctx, id, "resume") }

func (p *Provider) freeze(ctx context.Context, id, op string) error {
	s, err := p.load(id)
	if err != nil {
		return err
	}
	rt, err := p.runtimeOf(ctx, s)
	if err != nil {
		return err
	}
	if _, err := rt.run(ctx, op, s.ID); err != nil {
		if _, known := rt.state(ctx, s.ID); !known {
			return fmt.Errorf("%w: sandbox %s is gone", roche.ErrNotFound, id)
		}
		return fmt.Errorf("%sing sandbox %s: %w", strings.TrimSuffix(op, "e"), id, err)
	}
	return awaitFreezer(ctx, rt, s.ID, op)
}

// awaitFreezer returns once the runtime reports the state op asked for. On cgroup v1 a
// freeze is asynchronous: the runtime's pause can return while the freezer still says
// FREEZING, and a List made right then saw the sandbox "running". The freezer tells no
// one when it is done, so its state is asked for again, at short and growing intervals,
// for up to 10 s.
func awaitFreezer(ctx context.Context, rt *ociRuntime, id, op string) error {
	want := "paused"
	if op == "resume" {
		want = "running"
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	wait := time.Millisecond
	for {
		st, known := rt.state(ctx, id)
		if !known && ctx.Err() == nil {
			return fmt.Errorf("%w: sandbox %s is gone", roche.ErrNotFound, id)
		}
		if st.Status == want {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("sandbox %s is still %q after its %s, not %s: its processes may be in uninterruptible sleep; try again", id, st.Status, op, want)
		case <-time.After(wait):
		}
		wait = min(2*wait, 50*time.Millisecond)
	}
}

// CopyTo implements roche.FileCopier (see roche.CopyIn).
func (p *Provider) CopyTo(ctx context.Context, id, src, dst string) error {
	_, err := roche.CopyIn(ctx, p, id, src, dst, roche.CopyOptions{})
	return err
}

// CopyFrom implements roche.FileCopier (see roche.CopyOut).
func (p *Provider) CopyFrom(ctx context.Context, id, src, dst string) error {
	_, err := roche.CopyOut(ctx, p, id, src, dst, roche.CopyOptions{})
	return err
}

// Keep implements kit.Leaser: the agent ends the lease, and the one held here goes.
func (p *Provider) Keep(ctx context.Context, id string) error {
	return p.leases.Keep(ctx, p.forwarder, id)
}

var _ io.Closer = (*Provider)(nil)

var _ kit.Prober = (*Provider)(nil)

// Probe implements kit.Prober: the sandbox's agent accepts a connection on its socket
// (no runtime call, well under a millisecond).
func (p *Provider) Probe(ctx context.Context, id string) error {
	s, err := p.load(id)
	if err != nil {
		return err
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", s.agent.Socket())
	if err != nil {
		p.forget(s.ID)
		return fmt.Errorf("%w: the roche-agent of sandbox %s is not there: %v", roche.ErrUnavailable, s.ID, err)
	}
	// Closed unused: the agent reads end-of-file as its first frame and lets it go.
	return c.Close()
}
