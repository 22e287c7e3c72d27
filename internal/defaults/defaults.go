// Package defaults is where roched is found when nothing says otherwise: its unix socket
// and, beside it, its state file. The daemon (internal/daemon), its clients (client,
// internal/cli) and the ledger's state file all read these, so they live here, in a
// package that imports nothing of theirs; client re-exports them as its public API.
package defaults

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// Socket is the unix socket roched listens on and clients dial when none is given:
// $ROCHE_SOCKET, else $XDG_RUNTIME_DIR/roche/roched.sock, else ~/.roche/roched.sock.
func Socket() string {
	if s := os.Getenv("ROCHE_SOCKET"); s != "" {
		return s
	}
	return StandardSocket()
}

// StandardSocket is Socket without the ROCHE_SOCKET override.
func StandardSocket() string {
	if d := os.Getenv("XDG_RUNTIME_DIR"); d != "" {
		return filepath.Join(d, "roche", "roched.sock")
	}
	if home, err := os.UserHomeDir(); err == nil && home != "" {
		return filepath.Join(home, ".roche", "roched.sock")
	}
	// No home (a bare container): a per-user directory under the temp dir; roched
	// creates it 0700 so other users cannot reach the socket.
	return filepath.Join(os.TempDir(), fmt.Sprintf("roche-%d", os.Getuid()), "roched.sock")
}

// StateFile is where a daemon listening on socket keeps its state by default: beside
// the socket, named after it (roched.sock -> roched.state.json), so that two daemons on
// two sockets never share one.
func StateFile(socket string) string {
	return strings.TrimSuffix(socket, ".sock") + ".state.json"
}
