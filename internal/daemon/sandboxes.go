package daemon

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"path"
	"strings"
	"time"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/pool"
)

// save writes the current state. Callers must not hold d.mu.
func (d *Daemon) save() error {
	d.mu.Lock()
	d.seq++
	seq := d.seq
	recs := make([]*record, 0, len(d.sandboxes))
	for _, r := range d.sandboxes {
		c := *r
		recs = append(recs, &c)
	}
	d.mu.Unlock()
	return d.store.save(seq, recs)
}

// saveOrWarn saves, logging a failure: the daemon keeps serving without its state
// file, only losing crash recovery for what changed.
func (d *Daemon) saveOrWarn() {
	if err := d.save(); err != nil {
		d.log.Error("saving state (crash recovery is degraded until it succeeds)", "err", err)
	}
}

// pooledCreated is the pool hook: record a new idle sandbox before it can be claimed, so
// that a restart after a crash recognises it as a leftover.
func (d *Daemon) pooledCreated(key pool.Key, sb roche.SandboxInfo) {
	d.mu.Lock()
	d.sandboxes[sb.ID] = &record{
		ID: sb.ID, Provider: key.Provider, Image: sb.Image, Kind: kindPooled, Pool: key.String(),
		CreatedAt: sb.CreatedAt, ExpiresAt: sb.ExpiresAt, since: time.Now(),
	}
	d.mu.Unlock()
	d.saveOrWarn()
}

// pooledDestroyed is the pool hook for an idle sandbox it destroyed.
func (d *Daemon) pooledDestroyed(_ pool.Key, id string) {
	d.mu.Lock()
	delete(d.sandboxes, id)
	d.mu.Unlock()
	d.saveOrWarn()
}

// visible reports whether tenant t may see the record: its own sandboxes, handed out or
// being destroyed. Idle pooled sandboxes are nobody's.
func (r *record) visible(t *tenant) bool {
	return r.Kind != kindPooled && r.tenantName() == t.name
}

// lookupLocked finds one of tenant t's sandboxes by id or unique id prefix, as Docker
// accepts. Other tenants' sandboxes are not there to find.
func (d *Daemon) lookupLocked(t *tenant, id string) *record {
	if r, ok := d.sandboxes[id]; ok {
		if r.visible(t) {
			return r
		}
		return nil
	}
	if len(id) < 4 {
		return nil
	}
	var found *record
	for full, r := range d.sandboxes {
		if strings.HasPrefix(full, id) && r.visible(t) {
			if found != nil {
				return nil // ambiguous
			}
			found = r
		}
	}
	return found
}

// notFound is what a tenant hears of an id that names none of its sandboxes, whether it
// names another tenant's, someone else's on the engine, or nothing.
func notFound(id string) error {
	return fmt.Errorf("%w: no sandbox %s (roche list shows the live ones)", roche.ErrNotFound, id)
}

// target is a sandbox resolved for a call: its provider and a copy of what the daemon
// knows of it.
type target struct {
	id  string
	p   roche.Provider
	rec *record
}

// resolve finds the sandbox of tenant t that a call names. Idle pooled sandboxes are
// nobody's, destroyed ones are gone, and what the daemon does not track (another
// tenant's, another daemon's, a direct-mode user's) is not its to serve: all are "not
// found".
func (d *Daemon) resolve(t *tenant, id string) (target, error) {
	if id == "" {
		return target{}, fmt.Errorf("%w: empty sandbox id", roche.ErrNotFound)
	}
	d.mu.Lock()
	r := d.lookupLocked(t, id)
	var rec *record
	if r != nil && r.Kind == kindClient {
		c := *r
		rec = &c
	}
	d.mu.Unlock()
	if rec == nil {
		return target{}, d.ended.notFound(t, id)
	}
	p, err := d.provider(rec.Provider)
	return target{id: rec.ID, p: p, rec: rec}, err
}

// admit reserves room for one more sandbox of tenant t, or refuses at once: the
// daemon's bound first, then the tenant's.
func (d *Daemon) admit(t *tenant) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	all, mine := d.reserved, d.reservedBy[t.name]
	for _, r := range d.sandboxes {
		if r.Kind == kindClient {
			all++
			if r.tenantName() == t.name {
				mine++
			}
		}
	}
	if max := d.cfg.MaxSandboxes; max > 0 && all >= max {
		d.metrics.rejected.Inc()
		return fmt.Errorf("%w: roched is at its limit of %d sandboxes (--max-sandboxes): destroy some (roche list shows them) or raise the limit",
			roche.ErrExhausted, max)
	}
	if max := t.maxSandboxes; max > 0 && mine >= max {
		d.metrics.rejected.Inc()
		return fmt.Errorf("%w: tenant %s is at its limit of %d sandboxes (max_sandboxes in roched's tokens file): destroy some (roche list shows them)",
			roche.ErrExhausted, t.name, max)
	}
	d.reserved++
	d.reservedBy[t.name]++
	return nil
}

// unreserveLocked gives back what admit reserved. Callers hold d.mu.
func (d *Daemon) unreserveLocked(t *tenant) {
	d.reserved--
	if d.reservedBy[t.name]--; d.reservedBy[t.name] <= 0 {
		delete(d.reservedBy, t.name)
	}
}

// create serves tenant t's Create: from a matching pool when one has a sandbox ready,
// else cold. What the tenant may ask for is checked first (tenancy.go).
func (d *Daemon) create(ctx context.Context, t *tenant, providerName string, cfg roche.Config) (roche.SandboxInfo, bool, error) {
	start := time.Now()
	p, err := d.provider(providerName)
	if err != nil {
		return roche.SandboxInfo{}, false, err
	}
	providerName = p.Name()
	if err := cfg.Validate(); err != nil {
		return roche.SandboxInfo{}, false, err
	}
	if err := d.refuseWhileDown(providerName); err != nil {
		return roche.SandboxInfo{}, false, err
	}
	if cfg, err = d.permit(t, p, cfg); err != nil {
		return roche.SandboxInfo{}, false, err
	}
	// A leased sandbox is held by its client through Hold (lease.go) and, where the
	// provider has leases, by roched's own lease too.
	clientLeased := cfg.Leased
	cfg.Leased = clientLeased && p.Capabilities().Leases
	if err := d.admit(t); err != nil {
		return roche.SandboxInfo{}, false, err
	}
	admitted := true
	defer func() {
		if admitted {
			d.mu.Lock()
			d.unreserveLocked(t)
			d.mu.Unlock()
		}
	}()

	if sb, ok := d.fromPool(ctx, t, providerName, cfg); ok && d.leasePooled(ctx, p, sb.ID, clientLeased) {
		d.mu.Lock()
		d.unreserveLocked(t) // the record just made counts instead
		admitted = false
		d.mu.Unlock()
		d.metrics.create.WithLabelValues("pool").Observe(time.Since(start).Seconds())
		return sb, true, nil
	}

	// Not cancelled midway, so a client that goes away cannot leave a half-made sandbox;
	// one made for a client that is gone is destroyed below.
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Minute)
	defer cancel()
	sb, err := p.Create(cctx, cfg)
	if err != nil {
		d.noteCallError(providerName, err)
		return roche.SandboxInfo{}, false, err
	}
	d.mu.Lock()
	d.unreserveLocked(t)
	admitted = false
	d.sandboxes[sb.ID] = &record{
		ID: sb.ID, Provider: providerName, Image: cfg.Image, Kind: kindClient, Tenant: t.name,
		CreatedAt: sb.CreatedAt, ExpiresAt: sb.ExpiresAt, since: time.Now(), Leased: clientLeased,
	}
	d.mu.Unlock()
	if clientLeased {
		d.leaseCreated(sb.ID, firstHold)
	}
	if ctx.Err() != nil {
		d.markDestroying(sb.ID)
		return roche.SandboxInfo{}, false, fmt.Errorf("creating a sandbox: %w (the client went away; it was destroyed)", ctx.Err())
	}
	d.saveOrWarn()
	d.metrics.create.WithLabelValues("cold").Observe(time.Since(start).Seconds())
	return sb, false, nil
}

// maxPooledEnv bounds the env a create served from a pool may have: it is kept in the
// state file, which is rewritten on every change, so a larger env gets a sandbox made for
// it (where the engine keeps the env) and the file stays small.
const maxPooledEnv = 4 << 10

// fromPool hands out a sandbox from the pool matching cfg, if one is ready and can
// have cfg's workdir, recording it as the client's with its real expiry, env and workdir.
func (d *Daemon) fromPool(ctx context.Context, t *tenant, providerName string, cfg roche.Config) (roche.SandboxInfo, bool) {
	pl := d.pools.Match(providerName, cfg)
	if pl == nil || !d.workdirPoolable(pl, cfg.Workdir) || roche.EnvBytes(cfg.Env) > maxPooledEnv {
		return roche.SandboxInfo{}, false
	}
	sb, ok := pl.Acquire(ctx)
	if !ok {
		return sb, false
	}
	if err := d.prepareWorkdir(ctx, pl, sb.ID, cfg.Workdir); err != nil {
		// Nothing of the client's ran in it, but it is not what was asked for.
		d.log.Info("pooled sandbox cannot have the workdir: creating one for it", "workdir", cfg.Workdir, "err", err)
		d.markDestroying(sb.ID)
		return roche.SandboxInfo{}, false
	}
	now := time.Now()
	expires := now.Add(time.Duration(cfg.TimeoutSecs) * time.Second)
	d.mu.Lock()
	if r := d.sandboxes[sb.ID]; r == nil || r.Kind != kindPooled {
		// It ended (events.go) while it was being handed out: the create goes cold.
		d.mu.Unlock()
		pl.Forget(sb.ID)
		return roche.SandboxInfo{}, false
	}
	d.sandboxes[sb.ID] = &record{
		ID: sb.ID, Provider: providerName, Image: cfg.Image, Kind: kindClient, Pool: pl.Spec().Key.String(), Tenant: t.name,
		CreatedAt: sb.CreatedAt, ExpiresAt: expires, Env: maps.Clone(cfg.Env), Workdir: cfg.Workdir, since: now,
	}
	d.mu.Unlock()
	// Saved before the client hears of it: a crash now must not destroy it as a leftover.
	d.saveOrWarn()
	sb.ExpiresAt = expires
	sb.State = roche.StateRunning
	sb.Owner = d.ownerFor(t.name)
	return sb, true
}

// underTmp: the sandbox's own tmpfs, where a workdir can be made at any time.
func underTmp(dir string) bool {
	dir = path.Clean(dir)
	return dir == "/tmp" || strings.HasPrefix(dir, "/tmp/")
}

func workdirKey(pl *pool.Pool, dir string) string {
	return pl.Spec().Key.String() + "\x00" + path.Clean(dir)
}

// workdirPoolable: a create asking for a workdir that a pooled sandbox was found unable
// to have (missing from the image, on the read-only root) goes cold without trying.
func (d *Daemon) workdirPoolable(pl *pool.Pool, dir string) bool {
	if dir == "" {
		return true
	}
	d.mu.Lock()
	ok, known := d.workdirs[workdirKey(pl, dir)]
	d.mu.Unlock()
	return ok || !known
}

// prepareWorkdir makes sure a pooled sandbox has the workdir its create asked for. A
// cold sandbox gets it from the engine, which creates it before the root turns
// read-only; a pooled one was made before anyone asked, so the directory must exist in
// the image, or be made now under /tmp. What was learnt about the image is remembered,
// so each pool and directory pays for the check once (under /tmp: once per sandbox).
func (d *Daemon) prepareWorkdir(ctx context.Context, pl *pool.Pool, id, dir string) error {
	if dir == "" {
		return nil
	}
	key := workdirKey(pl, dir)
	d.mu.Lock()
	ok := d.workdirs[key]
	d.mu.Unlock()
	if ok {
		return nil
	}
	err := makeWorkdir(ctx, pl.Provider(), id, dir)
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	if _, files := filesOnly(pl.Provider()); files {
		// Made with the files API, in each sandbox, as under /tmp. One it cannot make
		// (on the read-only root) it never will, and that is remembered.
		if err != nil {
			d.mu.Lock()
			d.workdirs[key] = false
			d.mu.Unlock()
		}
		return err
	}
	if !underTmp(dir) {
		d.mu.Lock()
		d.workdirs[key] = err == nil
		d.mu.Unlock()
	}
	return err
}

// filesOnly returns the files API of a provider whose sandboxes run no programs but
// their interpreter (wasm): there is no mkdir to run there.
func filesOnly(p roche.Provider) (roche.FileSystem, bool) {
	fsys, ok := p.(roche.FileSystem)
	return fsys, ok && !p.Capabilities().Processes
}

// makeWorkdir makes dir (and its parents) in a sandbox.
func makeWorkdir(ctx context.Context, p roche.Provider, id, dir string) error {
	if fsys, ok := filesOnly(p); ok {
		return fsys.Mkdir(ctx, id, dir)
	}
	res, err := p.Exec(ctx, id, roche.ExecRequest{Cmd: []string{"mkdir", "-p", "--", dir}, Timeout: 10 * time.Second})
	if err == nil && res.ExitCode != 0 {
		err = fmt.Errorf("mkdir -p %s exited %d: %s", dir, res.ExitCode, strings.TrimSpace(res.Stderr))
	}
	return err
}

// exec runs a command, applying what the daemon remembers of the sandbox: the env and
// workdir a pooled sandbox's create asked for, and its real expiry as the default timeout.
func (d *Daemon) exec(ctx context.Context, tn *tenant, id string, req roche.ExecRequest) (roche.ExecResult, error) {
	start := time.Now()
	// A malformed request is that whatever it names.
	if err := req.Validate(); err != nil {
		return roche.ExecResult{}, err
	}
	t, err := d.resolve(tn, id)
	if err != nil {
		return roche.ExecResult{}, err
	}
	if r := t.rec; r != nil {
		if len(r.Env) > 0 {
			env := maps.Clone(r.Env)
			maps.Copy(env, req.Env)
			req.Env = env
		}
		if req.Workdir == "" {
			req.Workdir = r.Workdir
		}
		if req.Timeout <= 0 && !r.ExpiresAt.IsZero() {
			req.Timeout = max(time.Until(r.ExpiresAt), time.Second)
		}
	}
	res, err := t.p.Exec(ctx, t.id, req)
	if errors.Is(err, roche.ErrNotFound) && t.rec != nil {
		d.forgetEnded(t.id, err) // removed or stopped behind our back
	}
	d.metrics.exec.Observe(time.Since(start).Seconds())
	return res, err
}

// forget drops a record whose sandbox no longer exists.
func (d *Daemon) forget(id string) {
	d.mu.Lock()
	r, ok := d.sandboxes[id]
	delete(d.sandboxes, id)
	d.mu.Unlock()
	if ok {
		d.forgetInPool(r)
		d.saveOrWarn()
	}
}

func (d *Daemon) forgetInPool(r *record) {
	if pl := d.poolOf(r); pl != nil {
		if r.Kind == kindPooled {
			pl.Discard(r.ID)
		} else {
			pl.Forget(r.ID)
		}
	}
}

// poolOf is the pool a record's sandbox came from, or nil.
func (d *Daemon) poolOf(r *record) *pool.Pool {
	if r.Pool == "" {
		return nil
	}
	key, err := pool.ParseKey(r.Pool)
	if err != nil {
		return nil
	}
	pl, err := d.pools.Get(key)
	if err != nil {
		return nil
	}
	return pl
}

// destroy removes one of tenant t's sandboxes. It is marked destroyed at once (every
// later call sees "not found") and removed in the background, which keeps a client's
// create-exec-destroy cycle short; the mark is saved, so a crash cannot leak it. An id
// that names none of the tenant's sandboxes is "not found" (the clients, as the
// providers, treat that as already destroyed); one being destroyed is done.
func (d *Daemon) destroy(t *tenant, id string) (string, error) {
	d.mu.Lock()
	r := d.lookupLocked(t, id)
	var full string
	var k kind
	if r != nil {
		full, k = r.ID, r.Kind
	}
	d.mu.Unlock()
	switch {
	case r == nil:
		return "", notFound(id)
	case k == kindDestroying:
		return full, nil
	}
	d.markDestroying(full)
	d.saveOrWarn()
	return full, nil
}

// markDestroying marks a tracked sandbox destroyed and starts its removal.
func (d *Daemon) markDestroying(id string) {
	d.mu.Lock()
	r, ok := d.sandboxes[id]
	if ok {
		r.Kind = kindDestroying
	}
	d.mu.Unlock()
	if ok {
		d.startRemoval(id)
	}
}

// startRemoval removes a sandbox marked destroying, in the background, unless a
// removal is already in flight. A failure leaves the mark for the reaper to retry.
func (d *Daemon) startRemoval(id string) {
	d.mu.Lock()
	r, ok := d.sandboxes[id]
	if !ok || r.removing || r.Kind != kindDestroying {
		d.mu.Unlock()
		return
	}
	r.removing = true
	provider := r.Provider
	d.removals.Add(1)
	d.mu.Unlock()
	go func() {
		defer d.removals.Done()
		d.removeSlots <- struct{}{}
		defer func() { <-d.removeSlots }()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		p, err := d.provider(provider)
		if err == nil {
			err = p.Destroy(ctx, id)
		}
		d.mu.Lock()
		r := d.sandboxes[id]
		if err != nil {
			if r != nil {
				r.removing = false
			}
			d.mu.Unlock()
			d.log.Warn("removing a destroyed sandbox (will retry)", "id", id, "err", err)
			return
		}
		delete(d.sandboxes, id)
		d.mu.Unlock()
		if r != nil {
			d.forgetInPool(r)
		}
		d.log.Debug("sandbox removed", "id", id)
		d.saveOrWarn()
	}()
}

// countByState counts tracked sandboxes for /metrics.
func (d *Daemon) countByState() map[string]int {
	c := map[string]int{}
	d.mu.Lock()
	for _, r := range d.sandboxes {
		switch {
		case r.adopted && r.Kind == kindClient:
			c["adopted"]++
		case r.Kind == kindPooled:
			c["idle"]++
		case r.Kind == kindDestroying:
			c["destroying"]++
		case r.Paused:
			c["paused"]++
		default:
			c["running"]++
		}
	}
	c["creating"] = d.reserved
	d.mu.Unlock()
	for _, p := range d.pools.Pools() {
		c["creating"] += p.Status().Creating
	}
	return c
}

// reapLoop destroys expired sandboxes every ReapInterval and reconciles with the
// providers every ReconcileInterval.
func (d *Daemon) reapLoop() {
	defer d.bg.Done()
	reap := time.NewTicker(d.cfg.ReapInterval)
	defer reap.Stop()
	reconcile := time.NewTicker(d.cfg.ReconcileInterval)
	defer reconcile.Stop()
	for {
		select {
		case <-d.stop:
			return
		case <-reap.C:
			d.reap(time.Now())
		case <-reconcile.C:
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			d.reconcile(ctx, false)
			cancel()
		}
	}
}

// reap destroys client sandboxes past their expiry and retries failed removals.
func (d *Daemon) reap(now time.Time) {
	var expired, retry []string
	tenantOfRecord := map[string]string{}
	d.mu.Lock()
	for id, r := range d.sandboxes {
		switch {
		case r.Kind == kindClient && !r.ExpiresAt.IsZero() && !now.Before(r.ExpiresAt):
			expired = append(expired, id)
			tenantOfRecord[id] = r.tenantName()
		case r.Kind == kindDestroying && !r.removing:
			retry = append(retry, id)
		}
	}
	d.mu.Unlock()
	for _, id := range expired {
		d.log.Info("sandbox expired: destroying it", "id", id)
		d.auditAs(tenantOfRecord[id], "expire", nil, "id", id)
		d.markDestroying(id)
	}
	for _, id := range retry {
		d.startRemoval(id)
	}
	if len(expired) > 0 {
		d.saveOrWarn()
	}
}

// recover loads the state a previous daemon left and reconciles it with the providers.
func (d *Daemon) recover(ctx context.Context) error {
	recs, err := d.store.load()
	if err != nil {
		return err
	}
	now := time.Now()
	for _, r := range recs {
		r.since = now
		d.sandboxes[r.ID] = r
		if r.Leased && r.Kind == kindClient {
			// Its client may hold it again (the Go client retries its Hold); if not, it
			// goes as one never held does.
			d.awaitHoldLocked(r.ID, firstHold)
		}
	}
	d.reconcile(ctx, true)
	d.reap(now)
	// Sandboxes handed out from a pool before the restart still count towards its total.
	d.mu.Lock()
	for _, r := range d.sandboxes {
		if r.Kind == kindClient && r.Pool != "" {
			if key, err := pool.ParseKey(r.Pool); err == nil {
				if pl, err := d.pools.Get(key); err == nil {
					pl.TrackInUse(r.ID)
				}
			}
		}
	}
	d.mu.Unlock()
	d.recovered = true
	return d.save()
}

// reconcile compares the records with what each provider lists. Records of vanished
// sandboxes are dropped; at start-up, idle pooled sandboxes of the previous daemon are
// destroyed, as are expired and stopped ones. Of the sandboxes the daemon has no record
// of, only its own and the orphans of its state file are adopted (see owner.go): a
// tenant's is served to that tenant and reaped at its expiry, a pool's is a leftover and
// destroyed. At start-up its own are the creates a crash cut short; later they are
// creates in flight, which record themselves. Everything else is left alone.
func (d *Daemon) reconcile(ctx context.Context, startup bool) {
	for _, name := range d.names {
		p := d.providers[name]
		listed := time.Now()
		list, err := p.List(ctx)
		if err != nil {
			d.log.Warn("reconcile: listing sandboxes", "provider", name, "err", err)
			continue
		}
		live := make(map[string]roche.SandboxInfo, len(list))
		for _, sb := range list {
			live[sb.ID] = sb
		}
		var leftovers, stale []string
		adopted := 0
		d.mu.Lock()
		for id, r := range d.sandboxes {
			if r.Provider != name || r.since.After(listed) {
				continue
			}
			sb, ok := live[id]
			switch {
			case !ok:
				delete(d.sandboxes, id)
				if !startup {
					d.forgetInPoolLocked(r)
				}
			case startup && r.Kind == kindPooled:
				r.Kind = kindDestroying
				leftovers = append(leftovers, id)
			case r.Kind == kindClient && sb.State == roche.StateExited:
				r.Kind = kindDestroying
				stale = append(stale, id)
			}
		}
		for id, sb := range live {
			if _, known := d.sandboxes[id]; known {
				continue
			}
			class, tenant := d.classify(sb.Owner)
			if class == foreignOwner || class == ownOwner && !startup {
				continue
			}
			now := time.Now()
			r := &record{
				ID: id, Provider: name, Image: sb.Image, Kind: kindClient, Tenant: tenant, CreatedAt: sb.CreatedAt,
				ExpiresAt: sb.ExpiresAt, Paused: sb.State == roche.StatePaused, adopted: true, since: now,
			}
			switch {
			case tenant == "":
				r.Kind = kindDestroying
				leftovers = append(leftovers, id)
			case sb.State == roche.StateExited || sb.Expired(now):
				r.Kind = kindDestroying
				stale = append(stale, id)
			default:
				adopted++
			}
			d.sandboxes[id] = r
		}
		d.mu.Unlock()
		if len(leftovers)+len(stale)+adopted > 0 {
			d.log.Info("reconciled with provider", "provider", name, "pool_leftovers_destroyed", len(leftovers),
				"stale_destroyed", len(stale), "adopted", adopted)
		}
		for _, id := range append(leftovers, stale...) {
			d.startRemoval(id)
		}
	}
}

// forgetInPoolLocked tells the pool a sandbox vanished; the pools take their own lock
// only, so this is safe under d.mu.
func (d *Daemon) forgetInPoolLocked(r *record) { d.forgetInPool(r) }

// verifyIdleSoon checks, once the pools' creations in flight have finished, that every
// idle pooled sandbox still exists, discarding those that do not. A destroy of every
// sandbox (or a gc) can remove a pool sandbox still being created, which nothing would
// otherwise notice before handing it out; this keeps the check off the pool-hit path.
func (d *Daemon) verifyIdleSoon() {
	if !d.verifying.CompareAndSwap(false, true) {
		return // one pending check covers every destroy before it starts
	}
	d.bg.Add(1)
	go func() {
		defer d.bg.Done()
		deadline := time.Now().Add(2 * time.Minute)
		for _, pl := range d.pools.Pools() {
			for pl.Status().Creating > 0 && time.Now().Before(deadline) {
				select {
				case <-d.stop:
					d.verifying.Store(false)
					return
				case <-time.After(50 * time.Millisecond):
				}
			}
		}
		// From here on a new destroy needs a check of its own.
		d.verifying.Store(false)
		for _, pl := range d.pools.Pools() {
			for _, id := range pl.IdleIDs() {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				_, err := pl.Provider().Inspect(ctx, id)
				cancel()
				if errors.Is(err, roche.ErrNotFound) {
					d.log.Warn("an idle pool sandbox was removed behind the pool's back: discarding it", "id", id)
					d.forget(id)
				}
			}
		}
	}()
}
