package cli

import (
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/internal/catalog"
)

// Local is what only a binary that links the providers can do, given to Main: roched's
// (internal/cli/full), which runs as the full roche when started under that name. The roche binary itself is thin, to start fast: it links no provider, passes
// none, and hands a command that needs one to roched (handoff).
type Local interface {
	// Open opens the named provider in this process.
	Open(name string, o catalog.Options) (roche.Provider, error)
	// WriteAgentImage, WriteRochedImage and SeccompProfile are the kubernetes
	// provider's, for roche kubernetes.
	WriteAgentImage(w io.Writer, agentPath string) (string, error)
	WriteRochedImage(w io.Writer, rochedPath, agentPath string) (string, error)
	SeccompProfile() ([]byte, error)
	// NewMCP makes roche mcp's server.
	NewMCP(c MCPConfig) (MCPServer, error)
	// BuildImage makes a provider's image without a registry (roche image build).
	BuildImage(ctx context.Context, b ImageBuild) error
}

// errNoFullBinary is why the thin roche could not hand a command over.
var errNoFullBinary = errors.New("this needs roched, the full binary, next to roche or on PATH (roche alone only talks to a running roched): " + installBoth)

// installBoth says how roche, roched and roche-agent are installed together.
const installBoth = "CGO_ENABLED=0 go install github.com/roche-sandbox/roche/cmd/...@latest installs them together (from a clone: make build puts them in bin/)"

// handoffError is a handoff that did not happen; the command has done nothing yet.
type handoffError struct{ err error }

func (h handoffError) Error() string { return h.err.Error() }
func (h handoffError) Unwrap() error { return h.err }

// handoff runs this command again in the full binary, roched, as roche: with the same
// arguments, environment and standard streams, before the command has read or written
// anything. It is for a command of the thin roche that needs a provider in this process
// (no roched answers, it does not serve the provider, or --direct) or the kubernetes
// provider's tools. It returns only when it could not (see runFull), or with the exit
// status of the full binary where a process cannot be replaced.
func (e *env) handoff() error {
	full, err := fullBinary()
	if err != nil {
		return handoffError{err}
	}
	name := "roche"
	if len(os.Args) > 0 && filepath.Base(os.Args[0]) == name {
		name = os.Args[0]
	}
	e.log.Debug("handing the command to the full binary", "roched", full)
	return runFull(full, append([]string{name}, e.args...))
}

// fullBinary is roched, found as findRoched finds it, but never this executable itself
// (a roched that is a copy of the thin roche), which would hand the command to itself
// forever.
func fullBinary() (string, error) {
	self := executable()
	for _, p := range rochedCandidates(self) {
		fi, err := os.Stat(p)
		if err != nil || fi.IsDir() {
			continue
		}
		if me, err := os.Stat(self); err == nil && os.SameFile(me, fi) {
			continue
		}
		return p, nil
	}
	return "", errNoFullBinary
}

// executable is this program's path with its symlinks resolved (so that roched is
// found beside the file, not beside a link to it); empty when unknown.
func executable() string {
	self, err := os.Executable()
	if err != nil {
		return ""
	}
	if resolved, err := filepath.EvalSymlinks(self); err == nil {
		return resolved
	}
	return self
}

// rochedCandidates are where roched may be, in order: beside self, then on PATH.
func rochedCandidates(self string) []string {
	var candidates []string
	if self != "" {
		candidates = append(candidates, filepath.Join(filepath.Dir(self), "roched"))
	}
	if p, err := exec.LookPath("roched"); err == nil {
		candidates = append(candidates, p)
	}
	return candidates
}
