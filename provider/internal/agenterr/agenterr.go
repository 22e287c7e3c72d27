// Package agenterr maps the errors roche-agent reports onto the core's sentinels, for
// every provider whose sandboxes run the agent (docker, the microVMs).
package agenterr

import (
	"errors"
	"fmt"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/agent"
)

// Map returns the core error for an error the agent of sandbox id reported, and false
// when err did not come from the agent (the connection failed: the provider decides
// whether the sandbox is gone).
func Map(id string, err error) (error, bool) {
	var ae *agent.Error
	if !errors.As(err, &ae) {
		return err, false
	}
	sentinel := roche.ErrInvalidConfig
	switch ae.Code {
	case agent.CodeNotFound:
		sentinel = roche.ErrNotFound
	case agent.CodePermission:
		sentinel = roche.ErrPermission
	case agent.CodeUnsupported:
		sentinel = roche.ErrUnsupported
	case agent.CodeInternal:
		return fmt.Errorf("sandbox %s: %s", id, ae.Message), true
	}
	return fmt.Errorf("%w: %s", sentinel, ae.Message), true
}
