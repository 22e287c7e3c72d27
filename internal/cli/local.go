package cli

import (
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/internal/catalog"
	"github.com/roche-sandbox/roche/internal/rocherun"
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

// Partial is a Local that opens only some providers: roche-run's, which links those of
// catalog.Direct. A command that needs another provider in-process, or the kubernetes
// provider's tools, the MCP server or an image build, it hands to roched as the thin
// roche does.
type Partial interface {
	Local
	// Opens reports whether Open opens the named provider.
	Opens(name string) bool
}

// opens reports whether l opens the named provider in this process.
func opens(l Local, name string) bool {
	if p, ok := l.(Partial); ok {
		return p.Opens(name)
	}
	return l != nil
}

// fullLocal reports whether this process has every provider in it (roched as roche).
func (e *env) fullLocal() bool {
	_, partial := e.local.(Partial)
	return e.local != nil && !partial
}

// handoff runs this command again in another binary, as roche: with the same arguments,
// environment and standard streams, before the command has read or written anything.
// It is for a command that needs a provider this process lacks (no roched answers, it
// does not serve the provider, or --direct) or the kubernetes provider's tools, the MCP
// server or an image build. The thin roche hands a command whose providers (names) are
// all roche-run's (catalog.Direct) to roche-run, found beside it or on PATH, which
// starts several times faster than roched, and any other, or that one when roche-run is
// not installed, to roched, the full binary. It returns only when it could not (see
// runFull), or with the exit status of that binary where a process cannot be replaced.
func (e *env) handoff(names ...string) error {
	if e.local == nil && len(names) > 0 && allDirect(names) {
		if run, ok := otherBinary(directName); ok {
			e.log.Debug("handing the command to roche-run", "roche-run", run)
			err := runFull(run, append([]string{e.argv0()}, e.args...))
			if !errors.As(err, new(handoffError)) {
				return err
			}
			e.log.Debug("roche-run did not start: handing the command to roched", "err", err)
		} else {
			e.log.Debug("roche-run is not beside roche or on PATH: handing the command to roched")
		}
	}
	full, err := fullBinary()
	if err != nil {
		return handoffError{err}
	}
	e.log.Debug("handing the command to the full binary", "roched", full)
	return runFull(full, append([]string{e.argv0()}, e.args...))
}

// argv0 is what a handoff names the command: roche (this program's own name when it
// is that, as the full binary runs as the CLI when so named).
func (e *env) argv0() string {
	name := "roche"
	if len(os.Args) > 0 && filepath.Base(os.Args[0]) == name {
		name = os.Args[0]
	}
	return name
}

// directName is roche-run's file name.
const directName = rocherun.Name

// allDirect reports whether every provider of names is roche-run's.
func allDirect(names []string) bool {
	for _, n := range names {
		if !slices.Contains(catalog.Direct, n) {
			return false
		}
	}
	return true
}

// fullBinary is roched, found as findRoched finds it, but never this executable itself
// (a roched that is a copy of the thin roche), which would hand the command to itself
// forever.
func fullBinary() (string, error) {
	if p, ok := otherBinary("roched"); ok {
		return p, nil
	}
	return "", errNoFullBinary
}

// otherBinary is the program name beside this executable (its symlinks resolved), else
// on PATH; never this executable itself.
func otherBinary(name string) (string, bool) {
	self := executable()
	for _, p := range candidates(self, name) {
		fi, err := os.Stat(p)
		if err != nil || fi.IsDir() {
			continue
		}
		if me, err := os.Stat(self); err == nil && os.SameFile(me, fi) {
			continue
		}
		return p, true
	}
	return "", false
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
func rochedCandidates(self string) []string { return candidates(self, "roched") }

// candidates are where the program name may be, in order: beside self, then on PATH.
func candidates(self, name string) []string {
	var out []string
	if self != "" {
		out = append(out, filepath.Join(filepath.Dir(self), name))
	}
	if p, err := exec.LookPath(name); err == nil {
		out = append(out, p)
	}
	return out
}
