package wasm

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/provider/kit"
)

const (
	idPrefix   = "wasm-"
	recordFile = "sandbox.json"
	rootDir    = "root" // the sandbox's /, holding tmp/ and workspace/ beside mount points
	trashName  = ".trash-"

	// GuestTmp and GuestWorkspace are the sandbox's writable directories.
	GuestTmp       = "/tmp"
	GuestWorkspace = "/workspace"
	// DefaultWorkdir is where Python starts when neither the config nor the exec names
	// a working directory: the root holds nothing, the workspace is meant for the work.
	DefaultWorkdir = GuestWorkspace

	// guestBoot holds the start-up hook that moves Python into its working directory.
	guestBoot = "/.roche"
	// guestStdlib is where python.wasm's packed standard library appears.
	guestStdlib = "/usr"

	// orphanAge is how old a sandbox directory without a record must be before GC takes
	// it for the remains of a crashed Create rather than one still being made.
	orphanAge = 10 * time.Minute
)

// record is the sandbox's state on disk, in sandbox.json in its directory.
type record struct {
	Version   int       `json:"version"`
	ID        string    `json:"id"`
	Config    kit.Spec  `json:"config"`
	CreatedAt time.Time `json:"created_at"`
	ExpiresAt time.Time `json:"expires_at"`
	// Claim is set once a pooled sandbox is claimed for a holder (claim.go); Config's
	// Owner and ExpiresAt are then the claim's.
	Claim *kit.Claim `json:"claim,omitempty"`
}

func (r record) info() roche.SandboxInfo {
	// Nothing runs between execs, but the sandbox is ready for one: that is "running"
	// to a caller, as a started container is.
	return roche.SandboxInfo{
		ID: r.ID, Provider: "wasm", Image: r.Config.Image, State: roche.StateRunning,
		CreatedAt: r.CreatedAt, ExpiresAt: r.ExpiresAt, Owner: r.Config.Owner, Metadata: r.Config.Metadata,
	}
}

// validID reports whether id has the form Create gives, which also keeps ids from
// naming anything outside the state directory.
func validID(id string) bool {
	if len(id) != len(idPrefix)+12 || !strings.HasPrefix(id, idPrefix) {
		return false
	}
	for _, c := range id[len(idPrefix):] {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

func newID() (string, error) {
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	return idPrefix + hex.EncodeToString(b[:]), nil
}

func (p *Provider) sandboxDir(id string) string { return filepath.Join(p.stateDir, id) }

// Create implements roche.Provider: CreateFor with no owner, not leased.
func (p *Provider) Create(ctx context.Context, cfg roche.Config) (roche.SandboxInfo, error) {
	return p.CreateFor(ctx, cfg, kit.CreateOptions{})
}

// CreateFor implements kit.Creator. The sandbox is a directory; nothing is started.
func (p *Provider) CreateFor(ctx context.Context, config roche.Config, opts kit.CreateOptions) (roche.SandboxInfo, error) {
	cfg := kit.Spec{Config: config, CreateOptions: opts}
	if err := p.checkConfig(cfg); err != nil {
		return roche.SandboxInfo{}, err
	}
	if usesData(cfg) {
		unlock, err := p.lockData()
		if err != nil {
			return roche.SandboxInfo{}, err
		}
		defer unlock()
	}
	return p.create(ctx, cfg)
}

// checkConfig is what Create checks before it makes anything.
func (p *Provider) checkConfig(cfg kit.Spec) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	if err := refuseUnsupported(cfg); err != nil {
		return err
	}
	if err := checkMountSources(cfg.Mounts); err != nil {
		return err
	}
	return p.checkPython()
}

// usesData reports whether a sandbox made from cfg depends on the data directory: while
// it lives, its workspace or snapshot must not be removed (see lockData).
func usesData(cfg kit.Spec) bool { return cfg.Workspace != "" || cfg.FromSnapshot != "" }

// create makes the sandbox from a checked cfg. When usesData(cfg), the caller holds the
// data lock, so that the workspace or snapshot cannot go before the record naming it is
// written.
func (p *Provider) create(ctx context.Context, cfg kit.Spec) (roche.SandboxInfo, error) {
	if err := ctx.Err(); err != nil {
		return roche.SandboxInfo{}, fmt.Errorf("creating wasm sandbox: %w", err)
	}
	var snapshot string
	if cfg.FromSnapshot != "" {
		var err error
		if snapshot, err = p.existingSnapshot(cfg.FromSnapshot); err != nil {
			return roche.SandboxInfo{}, err
		}
	}
	done := false
	if cfg.Workspace != "" {
		made, err := p.ensureWorkspace(cfg.Workspace, cfg.WorkspaceBytes())
		if err != nil {
			return roche.SandboxInfo{}, err
		}
		defer func() {
			// A workspace made for this sandbox goes with it; one that was there stays.
			if !done && made {
				_ = p.removeWorkspaceFiles(cfg.Workspace)
			}
		}()
	}

	var id, dir string
	for range 5 {
		var err error
		if id, err = newID(); err != nil {
			return roche.SandboxInfo{}, fmt.Errorf("creating wasm sandbox: generating an id: %w", err)
		}
		dir = p.sandboxDir(id)
		if err = os.Mkdir(dir, 0o700); err == nil {
			break
		} else if !errors.Is(err, fs.ErrExist) {
			return roche.SandboxInfo{}, fmt.Errorf("%w: creating wasm sandbox directory %s: %v", roche.ErrUnavailable, dir, err)
		}
		id = ""
	}
	if id == "" {
		return roche.SandboxInfo{}, fmt.Errorf("%w: creating wasm sandbox: no free id after 5 tries", roche.ErrUnavailable)
	}
	defer func() {
		if !done {
			_ = removeAll(dir)
		}
	}()

	if snapshot != "" {
		if err := copySandboxRoot(ctx, snapshot, dir, cfg.Workspace != ""); err != nil {
			return roche.SandboxInfo{}, fmt.Errorf("creating wasm sandbox %s from snapshot %s: %w", id, cfg.FromSnapshot, err)
		}
	}
	root := filepath.Join(dir, rootDir)
	for _, d := range []string{root, filepath.Join(root, "tmp"), filepath.Join(root, "workspace")} {
		if err := os.Mkdir(d, 0o700); err != nil && !(snapshot != "" && errors.Is(err, fs.ErrExist)) {
			return roche.SandboxInfo{}, fmt.Errorf("%w: creating wasm sandbox %s: %v", roche.ErrUnavailable, id, err)
		}
	}
	mounts, err := p.sandboxMounts(id, cfg)
	if err != nil {
		return roche.SandboxInfo{}, fmt.Errorf("creating wasm sandbox %s: %w", id, err)
	}
	// Mount points and the working directory are made in the sandbox's own directories,
	// as an image would hold them, so that listing / shows them; never in a host mount.
	wants := make([]string, 0, len(cfg.Mounts)+1)
	for _, m := range cfg.Mounts {
		wants = append(wants, path.Clean(m.Target))
	}
	if cfg.Workdir != "" {
		wants = append(wants, path.Clean(cfg.Workdir))
	}
	for _, guest := range wants {
		if err := makeOwnDir(mounts, guest); err != nil {
			return roche.SandboxInfo{}, fmt.Errorf("creating wasm sandbox %s: %w", id, err)
		}
	}

	now := time.Now().UTC()
	rec := record{
		Version: 1, ID: id, Config: cfg, CreatedAt: now,
		ExpiresAt: now.Add(time.Duration(cfg.TimeoutSecs) * time.Second),
	}
	if err := writeRecord(dir, rec); err != nil {
		return roche.SandboxInfo{}, fmt.Errorf("%w: creating wasm sandbox %s: %v", roche.ErrUnavailable, id, err)
	}
	done = true
	p.log.Debug("wasm: sandbox created", "id", id, "dir", dir)
	p.startWarm(rec, warmDelay)
	return rec.info(), nil
}

// refuseUnsupported turns away config this backend cannot honour, rather than running
// with less isolation or smaller limits than were asked for.
func refuseUnsupported(cfg kit.Spec) error {
	var problems []string
	if cfg.Network {
		problems = append(problems, "network=true: a WASI module has no sockets, so wasm sandboxes have no network; use the docker provider")
	}
	if len(cfg.NetworkAllowlist) > 0 {
		problems = append(problems, "network_allowlist: a WASI module has no sockets to reach even allowed hosts; use the docker provider")
	}
	if cfg.Leased {
		problems = append(problems, "leased: wasm sandboxes have no leases and live out their lifetime (timeout_secs) once made, unless destroyed; use the docker provider")
	}
	if cfg.CPUs < 1 {
		problems = append(problems, fmt.Sprintf("cpus=%v: a module runs on one thread and cannot be throttled below one CPU; give cpus of 1 or more", cfg.CPUs))
	}
	if err := checkWorkdir(cfg.Workdir); err != nil {
		problems = append(problems, strings.TrimPrefix(err.Error(), roche.ErrUnsupported.Error()+": "))
	}
	if !pythonImage(cfg.Image) {
		problems = append(problems, fmt.Sprintf("image %q: wasm sandboxes run CPython 3.12 (python.wasm); use image %s (or leave it unset), and run other programs as .wasm modules copied into the sandbox", cfg.Image, roche.DefaultImage))
	}
	seen := map[string]bool{}
	for _, m := range cfg.Mounts {
		t := path.Clean(m.Target)
		switch {
		case seen[t]:
			problems = append(problems, fmt.Sprintf("mount target %s is given twice", t))
		case t == GuestTmp || t == GuestWorkspace:
			problems = append(problems, fmt.Sprintf("mount target %s is the sandbox's own writable directory: mount somewhere else, e.g. /mnt/data", t))
		case within(t, guestBoot):
			problems = append(problems, fmt.Sprintf("mount target %s is reserved for Roche's Python start-up hook", t))
		case within(t, guestStdlib):
			problems = append(problems, fmt.Sprintf("mount target %s would hide or shadow Python's standard library under %s: mount somewhere else, e.g. /mnt/data", t, guestStdlib))
		}
		seen[t] = true
	}
	if len(problems) == 0 {
		return nil
	}
	return fmt.Errorf("%w: wasm provider: %s", roche.ErrUnsupported, strings.Join(problems, "; "))
}

// pythonImage reports whether image names CPython 3.12, the one runtime this provider
// has: the default python:3.12-slim and its relatives, from any registry.
func pythonImage(image string) bool {
	ref := strings.ToLower(strings.TrimSpace(image))
	ref, _, _ = strings.Cut(ref, "@") // a digest pins bytes we do not run anyway
	name, tag := ref, ""
	if i := strings.LastIndex(ref, ":"); i > strings.LastIndex(ref, "/") {
		name, tag = ref[:i], ref[i+1:]
	}
	if base := path.Base(name); base != "python" && base != "python3" {
		return false
	}
	switch {
	case tag == "", tag == "latest", tag == "3", tag == "3.12":
		return true
	case strings.HasPrefix(tag, "3.12-"), strings.HasPrefix(tag, "3.12."), strings.HasPrefix(tag, "3-"):
		return true
	}
	return false
}

// checkMountSources makes sure every mount source is a directory: WASI preopens are
// directories, so a single file cannot be mounted.
func checkMountSources(mounts []roche.Mount) error {
	var errs []error
	for _, m := range mounts {
		fi, err := os.Stat(m.Source)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			errs = append(errs, fmt.Errorf("%w: mount source %s does not exist", roche.ErrInvalidConfig, m.Source))
		case err != nil:
			errs = append(errs, fmt.Errorf("%w: mount source %s: %v", roche.ErrInvalidConfig, m.Source, err))
		case !fi.IsDir():
			errs = append(errs, fmt.Errorf("%w: mount source %s is not a directory: wasm sandboxes mount directories only, so mount the directory holding it", roche.ErrUnsupported, m.Source))
		}
	}
	return errors.Join(errs...)
}

// makeOwnDir creates guest (a mount point or working directory) when it falls in one of
// the sandbox's own directories; in a host mount it must already exist.
func makeOwnDir(mounts []mountPoint, guest string) error {
	// A mount point is looked for in what lies beneath the mount, not in the mount itself.
	var under []mountPoint
	for _, m := range mounts {
		if m.guest != guest || m.guest == "/" {
			under = append(under, m)
		}
	}
	m, rel := resolve(under, guest)
	if rel == "" {
		return nil
	}
	if !m.own {
		if fi, err := statIn(m.host, rel); err != nil || !fi.IsDir() {
			return fmt.Errorf("%w: %s is not a directory in the host mount %s", roche.ErrInvalidConfig, guest, m.host)
		}
		return nil
	}
	r, err := os.OpenRoot(m.host)
	if err != nil {
		return fmt.Errorf("%w: %v", roche.ErrUnavailable, err)
	}
	defer r.Close()
	if err := r.MkdirAll(rel, 0o755); err != nil {
		return fmt.Errorf("%w: making %s: %v", roche.ErrInvalidConfig, guest, err)
	}
	return nil
}

func writeRecord(dir string, rec record) error {
	b, err := json.MarshalIndent(rec, "", "  ")
	if err != nil {
		return err
	}
	// Written under a temporary name and renamed, so that a concurrent List never reads
	// half a record.
	tmp := filepath.Join(dir, recordFile+".tmp")
	if err := os.WriteFile(tmp, append(b, '\n'), 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(dir, recordFile))
}

func readRecord(dir string) (record, error) {
	var rec record
	b, err := os.ReadFile(filepath.Join(dir, recordFile))
	if err != nil {
		return rec, err
	}
	if err := json.Unmarshal(b, &rec); err != nil {
		return rec, fmt.Errorf("%s is corrupt: %v", filepath.Join(dir, recordFile), err)
	}
	if rec.Config.Disk == "" {
		rec.Config.Disk = roche.DefaultDisk // recorded before configs had a disk limit
	}
	return rec, nil
}

// lookup reads the record of sandbox id, or fails with ErrNotFound.
func (p *Provider) lookup(id string) (record, error) {
	if !validID(id) {
		return record{}, fmt.Errorf("%w: %q is not a wasm sandbox id (they look like wasm-0123456789ab)", roche.ErrNotFound, id)
	}
	rec, err := readRecord(p.sandboxDir(id))
	if errors.Is(err, fs.ErrNotExist) {
		return record{}, fmt.Errorf("%w: no wasm sandbox %s (listing your sandboxes shows the live ones)", roche.ErrNotFound, id)
	}
	if err != nil {
		return record{}, fmt.Errorf("reading wasm sandbox %s: %w", id, err)
	}
	if rec.ID != id {
		return record{}, fmt.Errorf("reading wasm sandbox %s: its record names %q", id, rec.ID)
	}
	return rec, nil
}

// Inspect implements roche.Provider.
func (p *Provider) Inspect(_ context.Context, id string) (roche.SandboxInfo, error) {
	rec, err := p.lookup(id)
	if err != nil {
		return roche.SandboxInfo{}, err
	}
	return rec.info(), nil
}

// List implements roche.Provider.
func (p *Provider) List(_ context.Context) ([]roche.SandboxInfo, error) {
	recs, err := p.records()
	if err != nil {
		return nil, err
	}
	out := make([]roche.SandboxInfo, len(recs))
	for i, r := range recs {
		out[i] = r.info()
	}
	return out, nil
}

// records reads every sandbox's record, oldest first. Directories without a readable
// record (a Create in progress, or one that crashed) are not sandboxes yet; GC removes
// them once they are old.
func (p *Provider) records() ([]record, error) {
	entries, err := os.ReadDir(p.stateDir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("%w: listing wasm sandboxes in %s: %v", roche.ErrUnavailable, p.stateDir, err)
	}
	var recs []record
	for _, e := range entries {
		if !e.IsDir() || !validID(e.Name()) {
			continue
		}
		rec, err := readRecord(p.sandboxDir(e.Name()))
		if err != nil {
			if !errors.Is(err, fs.ErrNotExist) {
				p.log.Warn("wasm: skipping unreadable sandbox", "id", e.Name(), "err", err)
			}
			continue
		}
		recs = append(recs, rec)
	}
	slices.SortFunc(recs, func(a, b record) int { return a.CreatedAt.Compare(b.CreatedAt) })
	return recs, nil
}

// Destroy implements roche.Provider. Execs of the sandbox running in this process are
// stopped; in another process they lose their files and fail.
func (p *Provider) Destroy(_ context.Context, id string) error {
	if !validID(id) {
		return nil // never a sandbox of ours, so already gone
	}
	p.dropContexts(id)
	p.stopExecs(id)
	p.runMu.Lock()
	delete(p.openFiles, id)
	p.runMu.Unlock()
	dir := p.sandboxDir(id)
	// Renamed away first, in one step, so that the sandbox vanishes from List and
	// lookups at once however long removing its files takes.
	suffix, err := newID()
	if err != nil {
		return fmt.Errorf("destroying wasm sandbox %s: %w", id, err)
	}
	trash := filepath.Join(p.stateDir, trashName+id+"-"+strings.TrimPrefix(suffix, idPrefix))
	err = os.Rename(dir, trash)
	// After the rename, so that no interpreter can be started for it again (startWarm).
	p.stopWarm(id, errDestroyed)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return fmt.Errorf("%w: destroying wasm sandbox %s: %v", roche.ErrUnavailable, id, err)
	}
	if err := removeAll(trash); err != nil {
		return fmt.Errorf("destroying wasm sandbox %s: removing its files at %s: %w (roche gc retries)", id, trash, err)
	}
	p.log.Debug("wasm: sandbox destroyed", "id", id)
	return nil
}

// removeAll is os.RemoveAll that also copes with directories a guest made read-only
// (chmod 0500), which would otherwise keep their entries from being unlinked.
func removeAll(dir string) error {
	if err := os.RemoveAll(dir); err == nil {
		return nil
	}
	_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			_ = os.Chmod(p, 0o700)
		}
		return nil
	})
	return os.RemoveAll(dir)
}

// GC implements roche.GarbageCollector: it destroys expired sandboxes (all with
// opts.All) and clears what crashed processes left: half-created sandboxes and files of
// destroyed ones.
func (p *Provider) GC(ctx context.Context, opts roche.GCOptions) ([]roche.SandboxInfo, error) {
	recs, err := p.records()
	if err != nil {
		return nil, err
	}
	list := make([]roche.SandboxInfo, len(recs))
	for i, rec := range recs {
		list[i] = rec.info()
	}
	removed, err := kit.Collect(ctx, list, opts, p.Destroy)
	if !opts.DryRun {
		p.sweepLeftovers(time.Now())
	}
	return removed, err
}

// sweepLeftovers removes files of destroyed sandboxes that could not be removed at the
// time, and sandbox directories whose Create crashed before writing the record.
func (p *Provider) sweepLeftovers(now time.Time) {
	entries, err := os.ReadDir(p.stateDir)
	if err != nil {
		return
	}
	p.sweepData(now)
	for _, e := range entries {
		name := e.Name()
		full := filepath.Join(p.stateDir, name)
		switch {
		case strings.HasPrefix(name, trashName):
		case strings.HasPrefix(name, preinitTempPrefix) && e.IsDir():
			// The empty directories of a pre-initialised interpreter's making, left by a
			// process that ended during it.
			if fi, err := e.Info(); err != nil || now.Sub(fi.ModTime()) < orphanAge {
				continue
			}
		case validID(name):
			if _, err := os.Stat(filepath.Join(full, recordFile)); !errors.Is(err, fs.ErrNotExist) {
				continue
			}
			if fi, err := e.Info(); err != nil || now.Sub(fi.ModTime()) < orphanAge {
				continue
			}
		default:
			continue
		}
		if err := removeAll(full); err != nil {
			p.log.Warn("wasm: gc could not remove leftover files", "dir", full, "err", err)
		}
	}
}

// within reports whether p is dir or below it (both clean and absolute).
func within(p, dir string) bool {
	return p == dir || dir == "/" || strings.HasPrefix(p, dir+"/")
}
