// Package defaults is what Roche uses when nothing says otherwise: where roched is found
// (its unix socket and, beside it, its state file), and the settings of the Docker
// provider that the CLI's and roched's flags default to. The daemon (internal/daemon),
// its clients (client, internal/cli), the ledger's state file and the providers all read
// these, so they live here, in a package that imports nothing of theirs (the thin roche
// binary reads them without linking a provider); client re-exports the socket's as its
// public API.
package defaults

import (
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/roche-sandbox/roche/internal/rocherun"
)

// EngineTimeout bounds a create against an engine (the Docker engine, an OCI runtime)
// and everything it waits for, unless set otherwise (docker.WithEngineTimeout, roche and
// roched --engine-timeout).
const EngineTimeout = 30 * time.Second

// Transport is how commands reach a Docker sandbox unless set otherwise: through
// roche-agent inside it (docker.TransportAgent; roche --transport).
const Transport = "agent"

// Socket is the unix socket roched listens on and clients dial when none is given:
// $ROCHE_SOCKET, else $XDG_RUNTIME_DIR/roche/roched.sock, else ~/.roche/roched.sock.
func Socket() string {
	if s := os.Getenv("ROCHE_SOCKET"); s != "" {
		return s
	}
	return StandardSocket()
}

// StandardSocket is Socket without the ROCHE_SOCKET override: rocherun.StandardSocket,
// which the thin roche reads before it initialises path/filepath, cleaned.
// With no home (a bare container) it is a per-user directory under the temp dir, which
// roched creates 0700 so other users cannot reach the socket.
func StandardSocket() string {
	return filepath.Clean(rocherun.StandardSocket(os.Getenv))
}

// StateFile is where a daemon listening on socket keeps its state by default: beside
// the socket, named after it (roched.sock -> roched.state.json), so that two daemons on
// two sockets never share one.
func StateFile(socket string) string {
	return strings.TrimSuffix(socket, ".sock") + ".state.json"
}

// DaemonOwnerPrefix begins the owner (roche.Config.Owner) of every sandbox a roched makes
// (internal/ledger, owner.go): the sandbox itself says it is a daemon's, whatever became
// of that daemon's state file.
const DaemonOwnerPrefix = "roched:"

// DirectOwner is the owner (roche.Config.Owner) the CLI gives the sandboxes it makes in
// direct mode: ROCHE_OWNER when set (e.g. to share one owner across a CI job's hosts),
// else cli:USER@HOST for this process's user on this host. roched takes over its own
// user's (internal/ledger, direct.go), as this function answers in roched's environment.
func DirectOwner() string {
	if o := os.Getenv("ROCHE_OWNER"); o != "" {
		return o
	}
	name := strconv.Itoa(os.Getuid())
	if u, err := user.Current(); err == nil && u.Username != "" {
		name = u.Username
	}
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "localhost"
	}
	return "cli:" + name + "@" + host
}
