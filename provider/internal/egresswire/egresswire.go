// Package egresswire holds what the providers share in wiring a sandbox to package
// egress: its secrets as the proxy takes them.
package egresswire

import (
	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/egress"
)

// SecretSpecs are a config's secrets as package egress takes them.
func SecretSpecs(ss []roche.Secret) []egress.SecretSpec {
	var out []egress.SecretSpec
	for _, s := range ss {
		out = append(out, egress.SecretSpec{Name: s.Name, Value: s.Value, Hosts: s.Hosts, Header: s.Header})
	}
	return out
}
