// Package full is what the full roche CLI does in its own process and the thin one
// cannot: open providers (internal/inproc), the kubernetes provider's tools, and the MCP
// server. roched links it and passes it to cli.Main when started as roche; the thin
// roche binary links none of it (its package initialisation alone costs some 12 ms)
// and hands such commands to roched.
package full

import (
	"context"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/internal/catalog"
	"github.com/roche-sandbox/roche/internal/cli"
	"github.com/roche-sandbox/roche/internal/imagebuild"
	"github.com/roche-sandbox/roche/internal/inproc"
	"github.com/roche-sandbox/roche/internal/mcp"
	"github.com/roche-sandbox/roche/internal/secretfile"
	"github.com/roche-sandbox/roche/provider/kubernetes"
	"github.com/roche-sandbox/roche/provider/wasm"
)

// Local is the full CLI's cli.Local.
type Local struct{}

var _ cli.Local = Local{}

// Open opens the named provider in this process (inproc.Open).
func (Local) Open(name string, o catalog.Options) (roche.Provider, error) {
	return inproc.Open(name, o)
}

// WriteAgentImage is kubernetes.WriteAgentImage.
func (Local) WriteAgentImage(w io.Writer, agentPath string) (string, error) {
	return kubernetes.WriteAgentImage(w, agentPath)
}

// WriteRochedImage is kubernetes.WriteRochedImage.
func (Local) WriteRochedImage(w io.Writer, rochedPath, agentPath string) (string, error) {
	return kubernetes.WriteRochedImage(w, rochedPath, agentPath)
}

// SeccompProfile is kubernetes.SeccompProfile.
func (Local) SeccompProfile() ([]byte, error) { return kubernetes.SeccompProfile() }

// NewMCP checks where the MCP server is to listen (c.HTTP) and its token (c.Token,
// else the file c.TokenFile, private to its owner as roched's token file must be), and
// makes it.
func (Local) NewMCP(c cli.MCPConfig) (cli.MCPServer, error) {
	if c.TokenFile != "" {
		tok, err := secretfile.ReadToken(c.TokenFile, "--token-file")
		if err != nil {
			return nil, err
		}
		c.Token = tok
	}
	if c.HTTP != "" {
		if err := mcp.CheckListen(c.HTTP, c.Token); err != nil {
			return nil, err
		}
	}
	return mcpServer{mcp.New(c.Providers, mcp.Config{
		DefaultProvider: c.DefaultProvider, DefaultImage: c.DefaultImage, AllowNetwork: c.AllowNetwork, Owner: c.Owner,
	}, mcp.WithLogger(c.Log)), c.Token}, nil
}

// mcpServer serves HTTP behind the token NewMCP checked.
type mcpServer struct {
	*mcp.Server
	token string
}

func (s mcpServer) ServeHTTP(ctx context.Context, l net.Listener, grace time.Duration) error {
	return s.Server.ServeHTTP(ctx, l, s.token, grace)
}

// BuildImage makes the provider's image (roche image build python): python.wasm for
// wasm, else the Docker image from Debian packages.
func (Local) BuildImage(ctx context.Context, b cli.ImageBuild) error {
	if b.Provider == "wasm" {
		_, _, err := wasm.InstallPython(ctx, b.Log)
		return err
	}
	built, err := imagebuild.Build(ctx, imagebuild.Options{
		Tag: b.Tag, Suite: b.Suite, Mirror: b.Mirror, CacheDir: b.CacheDir, Force: b.Force, Log: b.Log,
	})
	if err == nil && built && b.Provider == "kubernetes" {
		fmt.Fprintf(b.Log, "the cluster's nodes run it once imported into their containerd: docker save %s | ctr -n k8s.io images import - (on each node)\n", b.Tag)
	}
	return err
}
