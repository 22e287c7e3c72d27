// Package egresswire holds what the providers share in wiring a sandbox to package
// egress: its secrets as the proxy takes them.
package egresswire

import (
	"fmt"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/egress"
)

// SecretSpecs are a config's secrets as package egress takes them.
func SecretSpecs(ss []roche.Secret) []egress.SecretSpec {
	var out []egress.SecretSpec
	for _, s := range ss {
		out = append(out, egress.SecretSpec{Name: s.Name, Value: s.Value, Hosts: s.Hosts, Header: s.Header, Stored: s.FromStore})
	}
	return out
}

// CarryValues gives secrets, a sandbox's as its provider recorded them (no values), the
// values the proxy of sandbox id holds, for a sandbox made again from its config
// (Reset). It refuses, before anything is undone, a secret given as a value that the
// proxy no longer holds (a process restarted since): the sandbox made again could not
// be given it. A secret from roched's store may go without; roched gives it the stored
// value.
func CarryValues(id string, secrets []roche.Secret) error {
	var values map[string]string
	if px := egress.Lookup(id); px != nil {
		values = px.SecretValues()
	}
	for i := range secrets {
		s := &secrets[i]
		s.Value = values[s.Name]
		if s.Value == "" && !s.FromStore {
			return fmt.Errorf("%w: sandbox %s's secret %s has no value in this process (it restarted since): give it again (roche secret set %s --sandbox %s) before resetting",
				roche.ErrInvalidConfig, id, s.Name, s.Name, id)
		}
	}
	return nil
}
