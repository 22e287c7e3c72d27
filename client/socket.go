package client

import (
	"encoding/json"
	"os"
	"strings"

	"github.com/roche-sandbox/roche/internal/defaults"
)

// DefaultSocket is the unix socket roched listens on and clients dial when none is
// given: $ROCHE_SOCKET, else $XDG_RUNTIME_DIR/roche/roched.sock, else ~/.roche/roched.sock.
func DefaultSocket() string { return defaults.Socket() }

// StandardSocket is DefaultSocket without the ROCHE_SOCKET override.
func StandardSocket() string { return defaults.StandardSocket() }

// StateFile is where a daemon listening on socket keeps its state by default: beside
// the socket, named after it (roched.sock -> roched.state.json), so that two daemons on
// two sockets never share one.
func StateFile(socket string) string { return defaults.StateFile(socket) }

// DaemonManaged reports whether the daemon listening on socket made the sandbox id (a
// full id or a unique prefix of one), from the state file it keeps beside the socket
// (StateFile). Such a sandbox may depend on what only the daemon applies (a pooled
// sandbox's env and workdir, an expiry earlier than the engine's), so a client that
// finds the daemon down acts on it only when told to. A missing or unreadable file
// names nothing.
func DaemonManaged(socket, id string) bool {
	b, err := os.ReadFile(StateFile(socket))
	if err != nil || id == "" {
		return false
	}
	// The part of roched's state file (internal/ledger, stateFile) this needs.
	var state struct {
		Sandboxes []struct {
			ID string `json:"id"`
		} `json:"sandboxes"`
	}
	if json.Unmarshal(b, &state) != nil {
		return false
	}
	matches := 0
	for _, sb := range state.Sandboxes {
		if sb.ID == id {
			return true
		}
		if strings.HasPrefix(sb.ID, id) {
			matches++
		}
	}
	return matches == 1
}
