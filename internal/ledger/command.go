package ledger

import (
	"context"
	"fmt"
	"maps"
	"time"

	"github.com/roche-sandbox/roche"
)

// Commands finds the sandbox of tenant tn that a durable-command call names, and its
// provider's commands. Another tenant's sandbox is not there to find, so neither are its
// commands.
func (l *Ledger) Commands(tn *Tenant, id string) (Target, roche.BackgroundRunner, error) {
	t, err := l.Resolve(tn, id)
	if err != nil {
		return t, nil, err
	}
	r, ok := t.Provider.(roche.BackgroundRunner)
	if !ok || !t.Provider.Capabilities().Processes {
		return t, nil, fmt.Errorf("%w: the %s provider has no background commands (its sandboxes are not Linux process trees): use exec",
			roche.ErrUnsupported, t.Provider.Name())
	}
	return t, r, nil
}

// StartCommand starts a durable command in tenant tn's sandbox id, applying what the
// daemon remembers of the sandbox as Exec does (a pooled sandbox's env and workdir, its
// real expiry as the default timeout) and the daemon's bound on commands running at
// once in one sandbox (Config.MaxCommands), which the sandbox's agent enforces.
func (l *Ledger) StartCommand(ctx context.Context, tn *Tenant, id string, req roche.CommandRequest) (roche.Command, error) {
	if err := req.Validate(); err != nil {
		return roche.Command{}, err
	}
	t, r, err := l.Commands(tn, id)
	if err != nil {
		return roche.Command{}, err
	}
	if rec := t.rec; rec != nil {
		if len(rec.Env) > 0 {
			env := maps.Clone(rec.Env)
			maps.Copy(env, req.Env)
			req.Env = env
		}
		if req.Workdir == "" {
			req.Workdir = rec.Workdir
		}
		if req.Timeout <= 0 && !rec.ExpiresAt.IsZero() {
			req.Timeout = max(time.Until(rec.ExpiresAt), time.Second)
		}
	}
	req.MaxRunning = l.cfg.MaxCommands
	return r.StartCommand(ctx, t.ID, req)
}
