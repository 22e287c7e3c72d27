package ledger

import (
	"go.opentelemetry.io/otel/attribute"

	"context"
	"errors"
	"fmt"
	"maps"
	"path"
	"slices"
	"strings"
	"time"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/pool"
	"github.com/roche-sandbox/roche/provider/kit"
)

// save writes the current state. Callers must not hold l.mu.
func (l *Ledger) save() error {
	l.mu.Lock()
	l.seq++
	seq := l.seq
	l.mu.Unlock()
	return l.store.saveThrough(seq, l.snapshot)
}

// snapshot copies the records and returns them with the change they include up to.
func (l *Ledger) snapshot() (uint64, []*Record) {
	l.mu.Lock()
	defer l.mu.Unlock()
	recs := make([]*Record, 0, len(l.sandboxes))
	for _, r := range l.sandboxes {
		if r.direct {
			continue // the CLI's, served for now (direct.go)
		}
		if r.adopted && r.Kind == KindClient && l.shared(r) {
			// The replica group's, given out by another replica or before this one
			// started: its Pod says all its record would (owner, tenant, end, claim),
			// and this replica, restarted, finds it there as any replica does. Left
			// out, a claim writes this replica's share of the group, not all of it.
			continue
		}
		c := *r
		recs = append(recs, &c)
	}
	return l.seq, recs
}

// saveOrWarn saves, logging a failure: the daemon keeps serving without its state
// file, only losing crash recovery for what changed.
func (l *Ledger) saveOrWarn() {
	if err := l.save(); err != nil {
		l.log.Error("saving state (crash recovery is degraded until it succeeds)", "err", err)
	}
}

// pooledCreated is the pool hook: record a new idle sandbox before it can be claimed, so
// that a restart after a crash recognises it as a leftover.
func (l *Ledger) pooledCreated(key pool.Key, sb roche.SandboxInfo) {
	l.mu.Lock()
	l.sandboxes[sb.ID] = &Record{
		ID: sb.ID, Provider: key.Provider, Image: sb.Image, Kind: KindPooled, Pool: key.String(),
		CreatedAt: sb.CreatedAt, ExpiresAt: sb.ExpiresAt, since: time.Now(),
	}
	l.mu.Unlock()
	l.saveOrWarn()
}

// pooledDestroyed is the pool hook for an idle sandbox it destroyed.
func (l *Ledger) pooledDestroyed(_ pool.Key, id string) {
	l.mu.Lock()
	delete(l.sandboxes, id)
	l.mu.Unlock()
	l.saveOrWarn()
}

// visible reports whether tenant t may see the record: its own sandboxes, handed out or
// being destroyed, and a direct-mode one only if it is its user's (direct.go). Idle
// pooled sandboxes are nobody's.
func (r *Record) visible(t *Tenant) bool {
	return r.Kind != KindPooled && r.TenantName() == t.Name && (!r.direct || t.Direct)
}

// lookupLocked finds one of tenant t's sandboxes by id or unique id prefix, as Docker
// accepts. Other tenants' sandboxes are not there to find.
func (l *Ledger) lookupLocked(t *Tenant, id string) *Record {
	if r, ok := l.sandboxes[id]; ok {
		if r.visible(t) {
			return r
		}
		return nil
	}
	if len(id) < 4 {
		return nil
	}
	var found *Record
	for full, r := range l.sandboxes {
		if strings.HasPrefix(full, id) && r.visible(t) {
			if found != nil {
				return nil // ambiguous
			}
			found = r
		}
	}
	return found
}

// find is lookupLocked, returning a copy, which on a miss takes over a direct-mode
// sandbox of t's user that id names (direct.go).
func (l *Ledger) find(t *Tenant, id string) (Record, bool) {
	l.mu.Lock()
	r := l.lookupLocked(t, id)
	var c Record
	if r != nil {
		c = *r
	}
	l.mu.Unlock()
	if r != nil || !l.findDirect(t, id) && !l.findShared(t, id) {
		return c, r != nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if r = l.lookupLocked(t, id); r == nil {
		return Record{}, false
	}
	return *r, true
}

// NotFound is what a tenant hears of an id that names none of its sandboxes, whether it
// names another tenant's, someone else's on the engine, or nothing. The words fit every
// caller: roche list, an SDK's list and the List call all show the tenant's own.
func NotFound(id string) error {
	return fmt.Errorf("%w: no sandbox %s among yours (listing your sandboxes shows the live ones)", roche.ErrNotFound, id)
}

// Target is a sandbox resolved for a call: its full id, its provider and a copy of what
// the daemon knows of it.
type Target struct {
	ID       string
	Provider roche.Provider
	rec      *Record
}

// Resolve finds the sandbox of tenant t that a call names. Idle pooled sandboxes are
// nobody's, destroyed ones are gone, and what the daemon does not track (another
// tenant's, another daemon's, another user's direct-mode ones) is not its to serve: all
// are "not found". A direct-mode sandbox of roched's own user is taken over for that
// user (direct.go).
func (l *Ledger) Resolve(t *Tenant, id string) (Target, error) {
	if id == "" {
		return Target{}, fmt.Errorf("%w: empty sandbox id", roche.ErrNotFound)
	}
	r, ok := l.find(t, id)
	var rec *Record
	if ok && r.Kind == KindClient {
		rec = &r
	}
	if rec == nil {
		return Target{}, l.ended.notFound(t, id)
	}
	p, err := l.Provider(rec.Provider)
	return Target{ID: rec.ID, Provider: p, rec: rec}, err
}

// admit reserves room for one more sandbox of tenant t, or refuses at once: the
// daemon's bound first, then the tenant's.
func (l *Ledger) admit(t *Tenant) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	all, mine := l.reserved, l.reservedBy[t.Name]
	for _, r := range l.sandboxes {
		if r.Kind == KindClient && !r.direct && !r.admitting {
			all++
			if r.TenantName() == t.Name {
				mine++
			}
		}
	}
	if max := l.cfg.MaxSandboxes; max > 0 && all >= max {
		l.obs.Rejected()
		return fmt.Errorf("%w: roched is at its limit of %d sandboxes (--max-sandboxes), every tenant's together: destroy some of yours (listing your sandboxes shows them), or have the limit raised",
			roche.ErrExhausted, max)
	}
	if max := t.MaxSandboxes; max > 0 && mine >= max {
		l.obs.Rejected()
		return fmt.Errorf("%w: tenant %s is at its limit of %d sandboxes (max_sandboxes in roched's tokens file): destroy some (listing your sandboxes shows them)",
			roche.ErrExhausted, t.Name, max)
	}
	l.reserved++
	l.reservedBy[t.Name]++
	return nil
}

// unreserveLocked gives back what admit reserved. Callers hold l.mu.
func (l *Ledger) unreserveLocked(t *Tenant) {
	l.reserved--
	if l.reservedBy[t.Name]--; l.reservedBy[t.Name] <= 0 {
		delete(l.reservedBy, t.Name)
	}
}

// Create serves tenant t's Create: from a matching pool when one has a sandbox ready,
// else cold. What the tenant may ask for is checked first (tenant.go). The sandbox is
// the daemon's, for t; leased ties it to the client's Hold stream (lease.go).
func (l *Ledger) Create(ctx context.Context, t *Tenant, providerName string, cfg roche.Config, leased bool) (roche.SandboxInfo, bool, error) {
	return l.CreateKeyed(ctx, t, providerName, cfg, leased, "")
}

// maxIdempotencyKey bounds a create's idempotency key.
const maxIdempotencyKey = 256

// CreateKeyed is Create with an idempotency key (none: ""): a create with the key of an
// earlier one of the same tenant answers with that one's sandbox (group.go's byKey), and
// in a replica group the provider finds it whichever replica made it.
func (l *Ledger) CreateKeyed(ctx context.Context, t *Tenant, providerName string, cfg roche.Config, leased bool, key string) (roche.SandboxInfo, bool, error) {
	if key == "" {
		return l.create(ctx, t, providerName, cfg, leased, "")
	}
	if len(key) > maxIdempotencyKey {
		return roche.SandboxInfo{}, false, fmt.Errorf("%w: idempotency key of %d bytes: give at most %d", roche.ErrInvalidConfig, len(key), maxIdempotencyKey)
	}
	return l.byKey(t, key, func() (roche.SandboxInfo, bool, error) { return l.create(ctx, t, providerName, cfg, leased, key) })
}

func (l *Ledger) create(ctx context.Context, t *Tenant, providerName string, cfg roche.Config, leased bool, key string) (roche.SandboxInfo, bool, error) {
	start := time.Now()
	p, err := l.Provider(providerName)
	if err != nil {
		return roche.SandboxInfo{}, false, err
	}
	providerName = p.Name()
	if err := cfg.Validate(); err != nil {
		return roche.SandboxInfo{}, false, err
	}
	if err := l.refuseWhileDown(providerName); err != nil {
		return roche.SandboxInfo{}, false, err
	}
	if cfg, err = l.permit(t, p, cfg); err != nil {
		return roche.SandboxInfo{}, false, err
	}
	// A leased sandbox is held by its client through Hold (lease.go) and, where the
	// provider has leases, by roched's own lease too.
	opts := kit.CreateOptions{Owner: l.ownerFor(t.Name), Leased: leased && p.Capabilities().Leases, IdempotencyKey: key}
	if err := l.admit(t); err != nil {
		return roche.SandboxInfo{}, false, err
	}
	admitted := true
	var claimed string // the pooled sandbox handed out, whose record counts once released
	// release gives back the reservation, in the same step as the record it reserved
	// for starts to count. Callers hold l.mu.
	release := func() {
		l.unreserveLocked(t)
		admitted = false
		if r := l.sandboxes[claimed]; claimed != "" && r != nil {
			r.admitting = false
		}
	}
	defer func() {
		if admitted {
			l.mu.Lock()
			release()
			l.mu.Unlock()
		}
	}()

	var sb roche.SandboxInfo
	ok := false
	if key == "" || !l.grouped() {
		// A replica group's keyed create is made cold: the key names the sandbox, so
		// that any replica finds it.
		cctx, sp := l.span(ctx, "pool.claim", providerName, "")
		sb, ok, err = l.fromPool(cctx, t, providerName, cfg)
		if sp.IsRecording() {
			sp.SetAttributes(attribute.Bool("roche.pooled", ok), attribute.String("roche.sandbox_id", sb.ID))
		}
		l.endSpan(sp, err)
	}
	if err != nil {
		return roche.SandboxInfo{}, false, err
	}
	if ok {
		claimed = sb.ID
	}
	if ok && l.leasePooled(ctx, p, sb.ID, leased) {
		if ctx.Err() != nil && key == "" {
			return roche.SandboxInfo{}, false, l.abandon(ctx, sb.ID, "creating a sandbox", "the pooled sandbox handed to it")
		}
		l.mu.Lock()
		release() // the record counts instead
		l.mu.Unlock()
		l.obs.Created("pool", time.Since(start))
		return sb, true, nil
	}

	// Not cancelled midway, so a client that goes away cannot leave a half-made sandbox;
	// one made for a client that is gone is destroyed below, unless its create is keyed.
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Minute)
	defer cancel()
	cctx, sp := l.span(cctx, "provider.create", providerName, "")
	sb, err = kit.Create(cctx, p, cfg, opts)
	if sp.IsRecording() && err == nil {
		sp.SetAttributes(attribute.String("roche.sandbox_id", sb.ID))
	}
	l.endSpan(sp, err)
	if err != nil {
		l.noteCallError(providerName, err)
		return roche.SandboxInfo{}, false, err
	}
	l.mu.Lock()
	release()
	// In a replica group the leader may have found it in the provider's list already:
	// the create's record replaces that one.
	l.sandboxes[sb.ID] = &Record{
		ID: sb.ID, Provider: providerName, Image: cfg.Image, Kind: KindClient, Tenant: t.Name,
		CreatedAt: sb.CreatedAt, ExpiresAt: sb.ExpiresAt, since: time.Now(), Leased: leased,
	}
	l.mu.Unlock()
	if leased {
		l.leaseCreated(sb.ID, FirstHold)
	}
	if ctx.Err() != nil && key == "" {
		return roche.SandboxInfo{}, false, l.abandon(ctx, sb.ID, "creating a sandbox", "the sandbox made for it")
	}
	if ctx.Err() != nil {
		// A keyed create's client that went away asks again with the same key, here
		// (byKey) or through another replica (the provider finds the sandbox by its
		// key), and is answered with this sandbox: destroyed now, it would be handed
		// out while going. Unheld, a leased one goes with its lease (FirstHold).
		l.log.Debug("the client of a keyed create went away before it heard of it: kept for its retry", "id", sb.ID)
	}
	if err := l.saveCreated(sb.ID); err != nil {
		return roche.SandboxInfo{}, false, err
	}
	l.obs.Created("cold", time.Since(start))
	return sb, false, nil
}

// saveCreated saves the record of a sandbox just made or handed out for a client, before
// the client hears of it. One the state file does not hold is destroyed after a crash,
// as a create the crash cut short (reconcile), so when the save fails the create fails
// too and the sandbox goes now: a client is never told of a sandbox a restart would lose.
func (l *Ledger) saveCreated(id string) error {
	err := l.save()
	if err == nil {
		return nil
	}
	l.log.Error("saving state for a create: failing the create", "id", id, "err", err)
	l.markDestroying(id)
	return fmt.Errorf("%w: roched could not save its state file, so a restart would not know the sandbox is yours: %v "+
		"(it was destroyed; free the state file's disk or fix its directory, then create again)", roche.ErrUnavailable, err)
}

// maxPooledEnv bounds the env a create served from a pool may have: it is kept in the
// state file, which is rewritten on every change, so a larger env gets a sandbox made for
// it (where the engine keeps the env) and the file stays small.
const maxPooledEnv = 4 << 10

// envSize is what env takes, counted as the limits count it: its KEY=VALUE strings.
func envSize(env map[string]string) int {
	n := 0
	for k, v := range env {
		n += len(k) + 1 + len(v)
	}
	return n
}

// fromPool hands out a sandbox from the pool matching cfg, if one is ready (or, with
// the pool's queue, the next one it makes) and can have cfg's workdir, recording it as
// the client's with its real expiry, env and workdir. An error (a full queue, a wait
// past the deadline) ends the create; ok false without one sends it to make its own.
func (l *Ledger) fromPool(ctx context.Context, t *Tenant, providerName string, cfg roche.Config) (roche.SandboxInfo, bool, error) {
	pl := l.pools.Match(providerName, cfg)
	// A pooled sandbox was made without the client's metadata, which a sandbox keeps
	// from its create: a create with metadata makes its own.
	if pl == nil || !l.workdirPoolable(pl, cfg.Workdir) || envSize(cfg.Env) > maxPooledEnv || len(cfg.Metadata) > 0 {
		return roche.SandboxInfo{}, false, nil
	}
	sb, ok := pl.Acquire(ctx)
	if !ok {
		var err error
		if sb, ok, err = pl.Wait(ctx); !ok {
			return sb, false, err
		}
	}
	if err := l.prepareWorkdir(ctx, pl, sb.ID, cfg.Workdir); err != nil {
		// Nothing of the client's ran in it, but it is not what was asked for.
		l.log.Info("pooled sandbox cannot have the workdir: creating one for it", "workdir", cfg.Workdir, "err", err)
		l.markDestroying(sb.ID)
		return roche.SandboxInfo{}, false, nil
	}
	now := time.Now()
	expires := now.Add(time.Duration(cfg.TimeoutSecs) * time.Second)
	owner := l.ownerFor(t.Name)
	if c, ok := pl.Provider().(kit.Claimer); ok {
		// The sandbox itself keeps its holder (a Pod's labels, a file beside a Docker
		// sandbox's agent socket, an oci, wasm or VM record), so that a roched restarted
		// without its state still finds it as the tenant's, ending when the client was
		// told, with its env and workdir.
		claim := kit.Claim{Owner: owner, Expires: expires, Env: maps.Clone(cfg.Env), Workdir: cfg.Workdir}
		if err := c.Claim(ctx, sb.ID, claim); err != nil {
			l.log.Warn("a pooled sandbox could not be claimed for its client: destroying it and creating one", "id", sb.ID, "err", err)
			l.markDestroying(sb.ID)
			return roche.SandboxInfo{}, false, nil
		}
	}
	l.mu.Lock()
	if r := l.sandboxes[sb.ID]; r == nil || r.Kind != KindPooled {
		// It ended (events.go) while it was being handed out: the create goes cold.
		l.mu.Unlock()
		pl.Forget(sb.ID)
		return roche.SandboxInfo{}, false, nil
	}
	// The create's reservation counts it until the create ends (admitting): a record
	// counted too would have a claim count twice while its state is saved and its lease
	// ended, and refuse another claim at MaxSandboxes with one sandbox fewer given out.
	l.sandboxes[sb.ID] = &Record{
		ID: sb.ID, Provider: providerName, Image: cfg.Image, Kind: KindClient, Pool: pl.Spec().Key.String(), Tenant: t.Name,
		CreatedAt: sb.CreatedAt, ExpiresAt: expires, Env: maps.Clone(cfg.Env), Workdir: cfg.Workdir, since: now, admitting: true,
	}
	l.mu.Unlock()
	// Saved before the client hears of it: a crash now must not destroy it as a leftover.
	if err := l.saveCreated(sb.ID); err != nil {
		return roche.SandboxInfo{}, false, err
	}
	sb.ExpiresAt = expires
	sb.State = roche.StateRunning
	sb.Owner = owner
	return sb, true, nil
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
func (l *Ledger) workdirPoolable(pl *pool.Pool, dir string) bool {
	if dir == "" {
		return true
	}
	l.mu.Lock()
	ok, known := l.workdirs[workdirKey(pl, dir)]
	l.mu.Unlock()
	return ok || !known
}

// prepareWorkdir makes sure a pooled sandbox has the workdir its create asked for. A
// cold sandbox gets it from the engine, which creates it before the root turns
// read-only; a pooled one was made before anyone asked, so the directory must exist in
// the image, or be made now under /tmp. What was learnt about the image is remembered,
// so each pool and directory pays for the check once (under /tmp: once per sandbox).
func (l *Ledger) prepareWorkdir(ctx context.Context, pl *pool.Pool, id, dir string) error {
	if dir == "" {
		return nil
	}
	key := workdirKey(pl, dir)
	l.mu.Lock()
	ok := l.workdirs[key]
	l.mu.Unlock()
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
			l.mu.Lock()
			l.workdirs[key] = false
			l.mu.Unlock()
		}
		return err
	}
	if !underTmp(dir) {
		l.mu.Lock()
		l.workdirs[key] = err == nil
		l.mu.Unlock()
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

// Exec runs a command, applying what the daemon remembers of the sandbox: the env and
// workdir a pooled sandbox's create asked for, and its real expiry as the default timeout.
func (l *Ledger) Exec(ctx context.Context, tn *Tenant, id string, req roche.ExecRequest) (roche.ExecResult, error) {
	start := time.Now()
	// A malformed request is that whatever it names.
	if err := req.Validate(); err != nil {
		return roche.ExecResult{}, err
	}
	t, err := l.Resolve(tn, id)
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
	ctx, sp := l.span(ctx, "provider.exec", t.Provider.Name(), t.ID)
	res, err := t.Provider.Exec(ctx, t.ID, req)
	if sp.IsRecording() && err == nil {
		sp.SetAttributes(attribute.Int("roche.exit_code", res.ExitCode))
	}
	l.endSpan(sp, err)
	if errors.Is(err, roche.ErrNotFound) && t.rec != nil {
		l.forgetEnded(t.ID, err) // removed or stopped behind our back
	}
	l.obs.Executed(time.Since(start))
	return res, err
}

// forget drops a record whose sandbox no longer exists.
func (l *Ledger) forget(id string) {
	l.mu.Lock()
	r, ok := l.sandboxes[id]
	delete(l.sandboxes, id)
	l.mu.Unlock()
	if ok {
		l.forgetInPool(r)
		l.saveOrWarn()
	}
}

func (l *Ledger) forgetInPool(r *Record) {
	if pl := l.poolOf(r); pl != nil {
		if r.Kind == KindPooled {
			pl.Discard(r.ID)
		} else {
			pl.Forget(r.ID)
		}
	}
}

// poolOf is the pool a record's sandbox came from, or nil.
func (l *Ledger) poolOf(r *Record) *pool.Pool {
	if r.Pool == "" {
		return nil
	}
	key, err := pool.ParseKey(r.Pool)
	if err != nil {
		return nil
	}
	pl, err := l.pools.Get(key)
	if err != nil {
		return nil
	}
	return pl
}

// Destroy removes one of tenant t's sandboxes. It is marked destroyed at once (every
// later call sees "not found") and removed in the background, which keeps a client's
// create-exec-destroy cycle short; the mark is saved, so a crash cannot leak it. An id
// that names none of the tenant's sandboxes is "not found" (the clients, as the
// providers, treat that as already destroyed); one being destroyed is done.
func (l *Ledger) Destroy(t *Tenant, id string) (string, error) {
	r, ok := l.find(t, id)
	full, k := r.ID, r.Kind
	switch {
	case !ok:
		return "", NotFound(id)
	case k == KindDestroying:
		return full, nil
	}
	by := "tenant:" + t.Name
	if r.direct {
		by = r.owner
	}
	l.recordEnd(&r, roche.EndReason{Kind: roche.EndDestroyed, By: by, Detail: "destroyed by " + strings.Replace(by, ":", " ", 1)}, false)
	l.markDestroying(full)
	l.saveOrWarn()
	return full, nil
}

// abandon destroys sandbox id, made or handed out for a client that went away (ctx
// ended) and so would never hear of it: left, it would live out its lifetime unused.
// It returns the error the client's call ends with; doing names the call, which the
// sandbox.
func (l *Ledger) abandon(ctx context.Context, id, doing, which string) error {
	if r, ok := l.Tracked(id); ok {
		l.recordEnd(&r, roche.EndReason{Kind: roche.EndDestroyed, By: "roched",
			Detail: "destroyed by roched: the client " + doing + " went away before it heard of it"}, false)
	}
	l.markDestroying(id)
	l.saveOrWarn()
	return fmt.Errorf("%s: %w (the client went away; %s was destroyed)", doing, ctx.Err(), which)
}

// markDestroying marks a tracked sandbox destroyed and starts its removal.
func (l *Ledger) markDestroying(id string) {
	l.mu.Lock()
	r, ok := l.sandboxes[id]
	if ok {
		r.Kind = KindDestroying
	}
	l.mu.Unlock()
	if ok {
		l.startRemoval(id)
	}
}

// startRemoval removes a sandbox marked destroying, in the background, unless a
// removal is already in flight. A failure leaves the mark for the reaper to retry.
func (l *Ledger) startRemoval(id string) {
	l.mu.Lock()
	r, ok := l.sandboxes[id]
	if !ok || r.removing || r.Kind != KindDestroying {
		l.mu.Unlock()
		return
	}
	r.removing = true
	provider := r.Provider
	l.removals.Add(1)
	l.mu.Unlock()
	go func() {
		defer l.removals.Done()
		l.removeSlots <- struct{}{}
		defer func() { <-l.removeSlots }()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		p, err := l.Provider(provider)
		if err == nil {
			err = p.Destroy(ctx, id)
		}
		l.mu.Lock()
		r := l.sandboxes[id]
		if err != nil {
			if r != nil {
				r.removing = false
			}
			l.mu.Unlock()
			l.log.Warn("removing a destroyed sandbox (will retry)", "id", id, "err", err)
			return
		}
		delete(l.sandboxes, id)
		l.mu.Unlock()
		if r != nil {
			l.forgetInPool(r)
		}
		l.log.Debug("sandbox removed", "id", id)
		l.saveOrWarn()
	}()
}

// Counts counts tracked sandboxes by state, for /metrics: idle, creating, running,
// paused, destroying and adopted.
func (l *Ledger) Counts() map[string]int {
	c := map[string]int{}
	l.mu.Lock()
	for _, r := range l.sandboxes {
		switch {
		case r.admitting && r.Kind == KindClient:
			// Being handed out: its create's reservation counts it, as creating.
		case r.adopted && r.Kind == KindClient:
			c["adopted"]++
		case r.Kind == KindPooled:
			c["idle"]++
		case r.Kind == KindDestroying:
			c["destroying"]++
		case r.Paused:
			c["paused"]++
		default:
			c["running"]++
		}
	}
	c["creating"] = l.reserved
	l.mu.Unlock()
	for _, p := range l.pools.Pools() {
		c["creating"] += p.Status().Creating
	}
	return c
}

// reapLoop destroys expired sandboxes every ReapInterval and reconciles with the
// providers every ReconcileInterval.
func (l *Ledger) reapLoop() {
	defer l.bg.Done()
	reap := time.NewTicker(l.cfg.ReapInterval)
	defer reap.Stop()
	reconcile := time.NewTicker(l.cfg.ReconcileInterval)
	defer reconcile.Stop()
	var sweeps int
	for {
		select {
		case <-l.stop:
			return
		case <-reap.C:
			// A replica of a group looks at every sandbox of the group every third
			// reap: those made or destroyed through other replicas, and (the leader)
			// those their agents stopped.
			if sweeps++; l.grouped() && sweeps%3 == 0 {
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				l.reconcile(ctx, false)
				cancel()
			}
			l.reap(time.Now())
		case <-reconcile.C:
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			l.reconcile(ctx, false)
			cancel()
		}
	}
}

// reap destroys client sandboxes past their expiry and retries failed removals.
func (l *Ledger) reap(now time.Time) {
	var expired, retry []string
	tenantOfRecord := map[string]string{}
	l.mu.Lock()
	for id, r := range l.sandboxes {
		switch {
		case r.Kind == KindClient && !r.direct && !r.ExpiresAt.IsZero() && !now.Before(r.ExpiresAt) && l.mayReap(r):
			expired = append(expired, id)
			tenantOfRecord[id] = r.TenantName()
			l.recordEnd(r, roche.EndReason{Kind: roche.EndLifetime, At: now,
				Detail:   fmt.Sprintf("its lifetime ended at %s", r.ExpiresAt.Local().Format(time.TimeOnly)),
				Evidence: fmt.Sprintf("expires_at %s; roched's reaper found it expired at %s", r.ExpiresAt.Local().Format(time.RFC3339), now.Local().Format("15:04:05.000"))}, false)
		case r.Kind == KindDestroying && !r.removing:
			retry = append(retry, id)
		}
	}
	l.mu.Unlock()
	for _, id := range expired {
		l.log.Info("sandbox expired: destroying it", "id", id)
		l.Audit(tenantOfRecord[id], "expire", nil, "id", id)
		l.markDestroying(id)
	}
	for _, id := range retry {
		l.startRemoval(id)
	}
	if len(expired) > 0 {
		l.saveOrWarn()
	}
}

// recover loads the state a previous daemon left and reconciles it with the providers.
func (l *Ledger) recover(ctx context.Context) error {
	recs, err := l.store.load()
	if err != nil {
		return err
	}
	now := time.Now()
	for _, r := range recs {
		r.since = now
		l.sandboxes[r.ID] = r
		if r.Leased && r.Kind == KindClient {
			// Its client may hold it again (the Go client retries its Hold); if not, it
			// goes as one never held does.
			l.awaitHoldLocked(r.ID, FirstHold)
		}
	}
	l.reconcile(ctx, true)
	l.reap(now)
	// Sandboxes handed out from a pool before the restart still count towards its total.
	l.mu.Lock()
	for _, r := range l.sandboxes {
		if r.Kind == KindClient && r.Pool != "" {
			if key, err := pool.ParseKey(r.Pool); err == nil {
				if pl, err := l.pools.Get(key); err == nil {
					pl.TrackInUse(r.ID)
				}
			}
		}
	}
	l.mu.Unlock()
	l.recovered = true
	return l.save()
}

// reconcile compares the records with what each provider has (sandboxesOf: its list, or
// what its watch holds). Records of vanished
// sandboxes are dropped; at start-up, idle pooled sandboxes of the previous daemon are
// destroyed, as are expired and stopped ones. Of the sandboxes the daemon has no record
// of, only the orphans of its state file are adopted (see owner.go): a tenant's is
// served to that tenant and reaped at its expiry, a pool's is a leftover and destroyed.
// Its own without a record are, at start-up, creates a crash cut short, whose clients
// heard only that they failed: destroyed; later they are creates in flight, which record
// themselves. Everything else is left alone.
func (l *Ledger) reconcile(ctx context.Context, startup bool) {
	for _, name := range l.names {
		p := l.providers[name]
		list, listed, err := l.sandboxesOf(ctx, name, startup)
		if err != nil {
			l.log.Warn("reconcile: listing sandboxes", "provider", name, "err", err)
			continue
		}
		live := make(map[string]roche.SandboxInfo, len(list))
		for _, sb := range list {
			live[sb.ID] = sb
		}
		var leftovers, stale, cutShort, adoptedIDs []string
		adopted := 0
		l.mu.Lock()
		for id, r := range l.sandboxes {
			if r.Provider != name || r.since.After(listed) {
				continue
			}
			sb, ok := live[id]
			switch {
			case !ok:
				switch {
				case r.Kind == KindClient && l.shared(r):
					l.recordEnd(r, roche.UnknownEnd(listed, "it was gone from the %s provider's list at a reconciliation: destroyed through another replica of group %s, reaped by its leader, or removed behind roched's back", name, l.cfg.Group), true)
				case r.Kind == KindClient:
					l.recordEnd(r, roche.UnknownEnd(listed, "it was gone from the %s provider's list at a reconciliation, with no event saying why (the watch of its engine was down, or the provider has none)", name), true)
				}
				delete(l.sandboxes, id)
				if !startup {
					l.forgetInPoolLocked(r)
				}
			case startup && r.Kind == KindPooled:
				r.Kind = KindDestroying
				leftovers = append(leftovers, id)
			case r.Kind == KindClient && sb.State == roche.StateExited && !r.direct && l.mayReap(r):
				// Found stopped before its engine's event came (a list, or a watch's
				// view, read between the two): its end is recorded here, and the event,
				// finding it destroying, tells why.
				l.recordEnd(r, l.staleEnd(r, sb, listed), true)
				r.Kind = KindDestroying
				stale = append(stale, id)
			}
		}
		for id, sb := range live {
			if _, known := l.sandboxes[id]; known {
				continue
			}
			class, tenant := l.classify(sb.Owner)
			if class == foreignOwner || class == ownOwner && !startup {
				continue
			}
			now := time.Now()
			if class == sharedOwner {
				// The group's: tracked by every replica, reaped by the leader alone.
				ended := sb.State == roche.StateExited || sb.Expired(now)
				if tenant == "" || ended && !l.leads(name) {
					continue
				}
				r := l.adoptSharedLocked(name, sb, tenant)
				if ended {
					r.Kind = KindDestroying
					stale = append(stale, id)
				}
				continue
			}
			r := &Record{
				ID: id, Provider: name, Image: sb.Image, Kind: KindClient, Tenant: tenant, CreatedAt: sb.CreatedAt,
				ExpiresAt: sb.ExpiresAt, Paused: sb.State == roche.StatePaused, adopted: true, since: now,
			}
			switch {
			case class == ownOwner:
				// Made by a create the crash cut short: every sandbox a client was told
				// of is in the state file, saved before the reply (saveCreated), so this
				// one's client heard only that its create failed.
				r.Kind = KindDestroying
				cutShort = append(cutShort, id)
			case tenant == "":
				r.Kind = KindDestroying
				leftovers = append(leftovers, id)
			case sb.State == roche.StateExited || sb.Expired(now):
				r.Kind = KindDestroying
				stale = append(stale, id)
			default:
				adopted++
				adoptedIDs = append(adoptedIDs, id)
			}
			l.sandboxes[id] = r
		}
		l.mu.Unlock()
		l.readClaims(ctx, p, adoptedIDs)
		if len(leftovers)+len(stale)+len(cutShort)+adopted > 0 {
			l.log.Info("reconciled with provider", "provider", name, "pool_leftovers_destroyed", len(leftovers),
				"stale_destroyed", len(stale), "cut_short_destroyed", len(cutShort), "adopted", adopted)
		}
		if l.grouped() {
			for _, id := range stale {
				l.log.Info("replica group's leader: reaping a stopped or expired sandbox", "provider", name, "id", id)
			}
		}
		for _, id := range slices.Concat(leftovers, stale, cutShort) {
			l.startRemoval(id)
		}
	}
}

// staleEnd is why a client's sandbox that a reconciliation found stopped ended: what its
// provider says (sb.End), else unknown, which its engine's event, still on its way,
// replaces (sandboxEvent); a replica group's leaves that event to the reaper, this.
func (l *Ledger) staleEnd(r *Record, sb roche.SandboxInfo, listed time.Time) roche.EndReason {
	switch {
	case sb.End != nil:
		return *sb.End
	case l.shared(r):
		return roche.UnknownEnd(listed, "the leader of replica group %s found it stopped at a reconciliation: its lease let go of by every holder, its lifetime over, or its main process ended", l.cfg.Group)
	}
	return roche.UnknownEnd(listed, "it was found stopped in the %s provider's sandboxes at a reconciliation, before its engine's event said why", r.Provider)
}

// watchResync is how often a reconciliation lists a provider's sandboxes although its
// watch has them (kit.WatchLister): a check on the watch's view, however it might drift.
const watchResync = 5 * time.Minute

// sandboxesOf returns what provider name has, for a reconciliation, and when it was
// read: what its watch holds (kit.WatchLister) when that has every sandbox tracked
// before then, else a list, as at start-up and every watchResync. One tracked but not
// in the watch's view has gone or has not reached the view yet, which only a list
// tells apart; so a reconciliation lists while sandboxes go and reads the watch while
// they stay, such as while a pool's sandboxes are being claimed.
func (l *Ledger) sandboxesOf(ctx context.Context, name string, startup bool) ([]roche.SandboxInfo, time.Time, error) {
	p := l.providers[name]
	if wl, ok := p.(kit.WatchLister); ok && !startup {
		at := time.Now()
		l.mu.Lock()
		fresh := at.Sub(l.listedAt[name]) < watchResync
		l.mu.Unlock()
		if list, ok := wl.Watched(); ok && fresh && l.tracksAllIn(name, list, at) {
			return list, at, nil
		}
	}
	at := time.Now()
	list, err := p.List(ctx)
	if err == nil {
		l.mu.Lock()
		l.listedAt[name] = at
		l.mu.Unlock()
	}
	return list, at, err
}

// tracksAllIn reports whether every sandbox of provider name tracked before at is in list.
func (l *Ledger) tracksAllIn(name string, list []roche.SandboxInfo, at time.Time) bool {
	ids := make(map[string]bool, len(list))
	for _, sb := range list {
		ids[sb.ID] = true
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for id, r := range l.sandboxes {
		if r.Provider == name && !r.since.After(at) && !ids[id] {
			return false
		}
	}
	return true
}

// readClaims gives adopted sandboxes that were handed out from a pool the env and
// workdir their holders' creates asked for, from the claims the sandboxes keep
// (kit.Claimer): their owner and end came with the provider's list.
func (l *Ledger) readClaims(ctx context.Context, p roche.Provider, ids []string) {
	cl, ok := p.(kit.Claimer)
	if !ok {
		return
	}
	for _, id := range ids {
		c, ok, err := cl.Claimed(ctx, id)
		if err != nil {
			l.log.Warn("reconcile: reading an adopted sandbox's claim: serving it without its env and workdir", "id", id, "err", err)
		}
		if !ok {
			continue
		}
		l.mu.Lock()
		if r := l.sandboxes[id]; r != nil {
			r.Env, r.Workdir = maps.Clone(c.Env), c.Workdir
		}
		l.mu.Unlock()
	}
}

// forgetInPoolLocked tells the pool a sandbox vanished; the pools take their own lock
// only, so this is safe under l.mu.
func (l *Ledger) forgetInPoolLocked(r *Record) { l.forgetInPool(r) }

// VerifyIdleSoon checks, once the pools' creations in flight have finished, that every
// idle pooled sandbox still exists, discarding those that do not. A destroy of every
// sandbox (or a gc) can remove a pool sandbox still being created, which nothing would
// otherwise notice before handing it out; this keeps the check off the pool-hit path.
func (l *Ledger) VerifyIdleSoon() {
	if !l.verifying.CompareAndSwap(false, true) {
		return // one pending check covers every destroy before it starts
	}
	l.bg.Add(1)
	go func() {
		defer l.bg.Done()
		deadline := time.Now().Add(2 * time.Minute)
		for _, pl := range l.pools.Pools() {
			for pl.Status().Creating > 0 && time.Now().Before(deadline) {
				select {
				case <-l.stop:
					l.verifying.Store(false)
					return
				case <-time.After(50 * time.Millisecond):
				}
			}
		}
		// From here on a new destroy needs a check of its own.
		l.verifying.Store(false)
		for _, pl := range l.pools.Pools() {
			for _, id := range pl.IdleIDs() {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				_, err := pl.Provider().Inspect(ctx, id)
				cancel()
				if errors.Is(err, roche.ErrNotFound) {
					l.log.Warn("an idle pool sandbox was removed behind the pool's back: discarding it", "id", id)
					l.forget(id)
				}
			}
		}
	}()
}

// List lists tenant t's sandboxes (every provider's, or one's), with the expiry the
// daemon enforces; idle pooled and destroyed sandboxes, other tenants' and whatever else
// is on the engine are left out. Across providers, one not set up here
// (roche.ErrNotConfigured) is passed over, one that fails is skipped and the error is
// then a *roche.PartialError naming it, with the others' sandboxes; when every one
// failed, it is their errors.
func (l *Ledger) List(ctx context.Context, t *Tenant, provider string) ([]roche.SandboxInfo, error) {
	names := l.names
	if provider != "" {
		p, err := l.Provider(provider)
		if err != nil {
			return nil, err
		}
		names = []string{p.Name()}
	}
	out := []roche.SandboxInfo{}
	var errs []error
	var skipped []roche.SkippedProvider
	asked := len(names)
	for _, n := range names {
		list, err := l.providers[n].List(ctx)
		if err != nil && provider == "" && errors.Is(err, roche.ErrNotConfigured) {
			asked-- // not set up here (no Docker socket): nothing of it to list
			continue
		}
		if err != nil {
			l.noteCallError(n, err)
			errs = append(errs, err)
			skipped = append(skipped, roche.SkippedProvider{Provider: n, Err: err})
			continue
		}
		l.mu.Lock()
		for _, sb := range list {
			r, ok := l.sandboxes[sb.ID]
			if !ok && l.takesOver(t, sb) {
				r, ok = l.adoptDirectLocked(n, sb), true
			}
			if class, tenant := l.classify(sb.Owner); !ok && class == sharedOwner && tenant == t.Name && sb.State != roche.StateExited {
				r, ok = l.adoptSharedLocked(n, sb, tenant), true
			}
			if !ok || r.Kind != KindClient || !r.visible(t) {
				continue
			}
			if !r.direct {
				sb.ExpiresAt, sb.Owner = r.ExpiresAt, l.ownerFor(r.TenantName())
			}
			out = append(out, sb)
		}
		l.mu.Unlock()
	}
	if len(skipped) > 0 && len(skipped) < asked {
		return out, &roche.PartialError{Skipped: skipped}
	}
	return out, errors.Join(errs...)
}

// Inspect asks the provider about one of tenant t's sandboxes, with the expiry the
// daemon enforces. One that ended is not found here; InspectEnded says why it ended.
func (l *Ledger) Inspect(ctx context.Context, t *Tenant, id string) (roche.SandboxInfo, error) {
	tg, err := l.Resolve(t, id)
	if err != nil {
		return roche.SandboxInfo{}, err
	}
	sb, err := tg.Provider.Inspect(ctx, tg.ID)
	if err != nil {
		return roche.SandboxInfo{}, err
	}
	if !tg.rec.direct {
		sb.ExpiresAt, sb.Owner = tg.rec.ExpiresAt, l.ownerFor(tg.rec.TenantName())
	}
	return sb, nil
}

// Pause pauses or unpauses one of tenant t's sandboxes, remembering it for /metrics.
func (l *Ledger) Pause(ctx context.Context, t *Tenant, id string, pause bool) error {
	tg, err := l.Resolve(t, id)
	if err != nil {
		return err
	}
	pz, ok := tg.Provider.(roche.Pauser)
	if !ok {
		return fmt.Errorf("%w: the %s provider cannot pause sandboxes", roche.ErrUnsupported, tg.Provider.Name())
	}
	if pause {
		err = pz.Pause(ctx, tg.ID)
	} else {
		err = pz.Unpause(ctx, tg.ID)
	}
	if err == nil {
		l.mu.Lock()
		if r, ok := l.sandboxes[tg.ID]; ok {
			r.Paused = pause
		}
		l.mu.Unlock()
	}
	return err
}

// Serving is how many sandboxes are handed to clients, for /healthz.
func (l *Ledger) Serving() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, r := range l.sandboxes {
		if r.Kind == KindClient {
			n++
		}
	}
	return n
}

// Records returns a copy of every record, in no order: what the state file would hold
// now.
func (l *Ledger) Records() []Record {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]Record, 0, len(l.sandboxes))
	for _, r := range l.sandboxes {
		out = append(out, *r)
	}
	return out
}

// Tracked returns a copy of the record of sandbox id (a full id), if there is one.
func (l *Ledger) Tracked(id string) (Record, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	r, ok := l.sandboxes[id]
	if !ok {
		return Record{}, false
	}
	return *r, true
}
