package ledger

import (
	"fmt"
	"maps"

	"github.com/roche-sandbox/roche"
)

// Terminal finds the sandbox of tenant tn that a terminal call names and its provider's
// terminals. With req, the sandbox's own environment and working directory (a pooled
// sandbox gets them per command, as Exec does) fill in what req leaves out.
func (l *Ledger) Terminal(tn *Tenant, id string, req *roche.TerminalRequest) (Target, roche.Terminal, error) {
	t, err := l.Resolve(tn, id)
	if err != nil {
		return t, nil, err
	}
	term, ok := t.Provider.(roche.Terminal)
	if !ok {
		return t, nil, fmt.Errorf("%w: the %s provider has no terminals (its sandboxes are not Linux process trees); use exec", roche.ErrUnsupported, t.Provider.Name())
	}
	if r := t.rec; r != nil && req != nil {
		if len(r.Env) > 0 {
			env := maps.Clone(r.Env)
			maps.Copy(env, req.Env)
			req.Env = env
		}
		if req.Workdir == "" {
			req.Workdir = r.Workdir
		}
	}
	return t, term, nil
}
