// Command roche-run is the roche CLI with the providers a one-shot command runs in its
// own process (docker, oci, wasm: internal/inproc/direct) and nothing else: no client-go,
// no microVM SDK, no daemon, MCP server or image builder, so that it starts in a
// fraction of roched's time. The thin roche hands it a command that needs only those
// providers in-process (roche run with no roched, or --direct); it hands any other on to
// roched, as the thin roche does. Run by hand, it is roche: see roche --help.
package main

import (
	"context"
	"io"
	"os"
	"slices"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/internal/catalog"
	"github.com/roche-sandbox/roche/internal/cli"
	"github.com/roche-sandbox/roche/internal/guest/guestcmd"
	"github.com/roche-sandbox/roche/internal/initgc"
	"github.com/roche-sandbox/roche/internal/inproc/direct"
	// A one-shot oci run begins the kernel's wait for its cgroup moves as this package
	// initialises, before the rest of roche-run's (see cgroupwarm.For).
	_ "github.com/roche-sandbox/roche/internal/rocherun/ociwarm"
)

func main() {
	// The collector was off while the packages initialised (see initgc).
	initgc.Restore()
	// Started as roche-agent (ROCHE_AGENT may name this binary), it is the agent, as
	// roche and roched are.
	guestcmd.RunIfAsked()
	os.Exit(cli.Main(os.Args[1:], os.Stdin, os.Stdout, os.Stderr, local{}))
}

// local is roche-run's cli.Partial: the providers of catalog.Direct. The rest of
// cli.Local is roched's; cli hands the commands that need it there and never calls it
// here.
type local struct{}

var _ cli.Partial = local{}

func (local) Opens(name string) bool { return slices.Contains(catalog.Direct, name) }

func (local) Open(name string, o catalog.Options) (roche.Provider, error) {
	return direct.Open(name, o)
}

func (local) WriteAgentImage(io.Writer, string) (string, error) { return "", errRoched }

func (local) WriteRochedImage(io.Writer, string, string) (string, error) { return "", errRoched }

func (local) SeccompProfile() ([]byte, error) { return nil, errRoched }

func (local) NewMCP(cli.MCPConfig) (cli.MCPServer, error) { return nil, errRoched }

func (local) BuildImage(context.Context, cli.ImageBuild) error { return errRoched }

// errRoched is what roche-run would say if cli called what only roched has.
var errRoched = roche.ErrUnsupported
