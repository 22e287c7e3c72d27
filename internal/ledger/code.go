package ledger

import (
	"context"
	"errors"
	"fmt"
	"maps"

	"github.com/roche-sandbox/roche"
)

// coder finds tenant t's sandbox id and its provider's code contexts.
func (l *Ledger) coder(t *Tenant, id string) (Target, roche.CodeRunner, error) {
	tg, err := l.Resolve(t, id)
	if err != nil {
		return tg, nil, err
	}
	cr, ok := tg.Provider.(roche.CodeRunner)
	if !ok || len(tg.Provider.Capabilities().Code) == 0 {
		return tg, nil, fmt.Errorf("%w: the %s provider has no code contexts: run the code with exec instead",
			roche.ErrUnsupported, tg.Provider.Name())
	}
	return tg, cr, nil
}

// withRecord applies what the daemon remembers of a sandbox to a context it starts: the
// env and workdir a pooled sandbox's create asked for.
func (tg Target) withRecord(env map[string]string, cwd string) (map[string]string, string) {
	r := tg.rec
	if r == nil {
		return env, cwd
	}
	if len(r.Env) > 0 {
		merged := maps.Clone(r.Env)
		maps.Copy(merged, env)
		env = merged
	}
	if cwd == "" {
		cwd = r.Workdir
	}
	return env, cwd
}

// RunCode runs a cell in one of tenant t's sandboxes.
func (l *Ledger) RunCode(ctx context.Context, t *Tenant, id string, req roche.CodeRequest) (roche.Execution, error) {
	if err := req.Validate(); err != nil {
		return roche.Execution{}, err
	}
	tg, cr, err := l.coder(t, id)
	if err != nil {
		return roche.Execution{}, err
	}
	req.Env, req.Cwd = tg.withRecord(req.Env, req.Cwd)
	ctx, sp := l.span(ctx, "provider.run_code", tg.Provider.Name(), tg.ID)
	ex, err := cr.RunCode(ctx, tg.ID, req)
	l.endSpan(sp, err)
	l.forgetIfGone(tg, err)
	return ex, err
}

// CreateContext starts a context in one of tenant t's sandboxes.
func (l *Ledger) CreateContext(ctx context.Context, t *Tenant, id string, opts roche.ContextOptions) (roche.CodeContext, error) {
	if err := opts.Validate(); err != nil {
		return roche.CodeContext{}, err
	}
	tg, cr, err := l.coder(t, id)
	if err != nil {
		return roche.CodeContext{}, err
	}
	opts.Env, opts.Cwd = tg.withRecord(opts.Env, opts.Cwd)
	c, err := cr.CreateContext(ctx, tg.ID, opts)
	l.forgetIfGone(tg, err)
	return c, err
}

// Contexts lists the contexts of one of tenant t's sandboxes.
func (l *Ledger) Contexts(ctx context.Context, t *Tenant, id string) ([]roche.CodeContext, error) {
	tg, cr, err := l.coder(t, id)
	if err != nil {
		return nil, err
	}
	list, err := cr.Contexts(ctx, tg.ID)
	l.forgetIfGone(tg, err)
	return list, err
}

// RestartContext replaces a context's interpreter.
func (l *Ledger) RestartContext(ctx context.Context, t *Tenant, id, contextID string) error {
	tg, cr, err := l.coder(t, id)
	if err != nil {
		return err
	}
	err = cr.RestartContext(ctx, tg.ID, contextID)
	l.forgetIfGone(tg, err)
	return err
}

// ForkContext forks a context of one of tenant t's sandboxes.
func (l *Ledger) ForkContext(ctx context.Context, t *Tenant, id, contextID string) (roche.CodeContext, error) {
	tg, cr, err := l.coder(t, id)
	if err != nil {
		return roche.CodeContext{}, err
	}
	fk, ok := cr.(roche.ContextForker)
	if !ok {
		return roche.CodeContext{}, fmt.Errorf("%w: %s sandboxes' interpreters cannot fork themselves (python.wasm: WASI has no fork): create a context and run its cells again", roche.ErrUnsupported, tg.Provider.Name())
	}
	c, err := fk.ForkContext(ctx, tg.ID, contextID)
	l.forgetIfGone(tg, err)
	return c, err
}

// RemoveContext stops a context's interpreter.
func (l *Ledger) RemoveContext(ctx context.Context, t *Tenant, id, contextID string) error {
	tg, cr, err := l.coder(t, id)
	if err != nil {
		return err
	}
	err = cr.RemoveContext(ctx, tg.ID, contextID)
	l.forgetIfGone(tg, err)
	return err
}

// forgetIfGone drops the record of a sandbox a call found gone behind the daemon's back.
// A context the call named but the sandbox lacks is also ErrNotFound, so only a record
// whose sandbox Inspect no longer finds is dropped.
func (l *Ledger) forgetIfGone(tg Target, err error) {
	if !errors.Is(err, roche.ErrNotFound) || tg.rec == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), engineCheckTimeout)
	defer cancel()
	if _, ierr := tg.Provider.Inspect(ctx, tg.ID); errors.Is(ierr, roche.ErrNotFound) {
		l.forgetEnded(tg.ID, err)
	}
}
