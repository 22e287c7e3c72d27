package cli

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"time"

	"github.com/spf13/cobra"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/internal/catalog"
)

func (e *env) mcpCommand() *cobra.Command {
	var httpAddr, token, tokenFile, provider, image string
	var allowNetwork bool
	c := &cobra.Command{
		Use:   "mcp [--http ADDR]",
		Short: "Serve Roche to MCP clients (Claude, Cursor, VS Code, ...) over stdio or HTTP",
		Long: `Serve Roche as a Model Context Protocol server, with tools to create a sandbox, run
commands or code in it (stdout, stderr, exit code; run_code also in a sandbox of its own),
write and read its files, list sandboxes and destroy them. It speaks MCP on stdin/stdout (the MCP client starts it), or streamable
HTTP with --http. Sandboxes go through roched when it answers, as every roche command.

Sandboxes keep the secure defaults; clients cannot mount host paths, and cannot turn the
network on unless --allow-network is given. Each session lists, runs in, reads, writes and
destroys only the sandboxes it created; any other id is "not found". Sandboxes the server
created are destroyed when it stops.

Over HTTP it serves a loopback address only: it speaks plain HTTP, so a token and the
code sent would cross a network unencrypted. Clients elsewhere come through an SSH
tunnel (ssh -L 8765:127.0.0.1:8765 HOST) or a TLS-terminating proxy on this host. With
a token, clients must send "Authorization: Bearer TOKEN": give it in a file only you can
read (--token-file, mode 0600) or in ROCHE_MCP_TOKEN, never on the command line (ps
shows it to every user), and make it at least 16 random characters, as roched's.`,
		Example: `  roche mcp                                  # stdio: what an MCP client's config starts
  roche mcp --http 127.0.0.1:8765            # streamable HTTP at http://127.0.0.1:8765/
  (umask 077; openssl rand -hex 16 > ~/.roche-mcp-token); roche mcp --http 127.0.0.1:8765 --token-file ~/.roche-mcp-token`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if token != "" {
				return fmt.Errorf("%w: --token: a token on the command line is visible to every user of this host (ps): put it in a file only you can read and pass --token-file FILE, or set ROCHE_MCP_TOKEN",
					roche.ErrInvalidConfig)
			}
			if tokenFile == "" {
				token = e.getenv("ROCHE_MCP_TOKEN")
			}
			// The MCP server is not in the thin roche.
			if !e.fullLocal() {
				return e.handoff()
			}
			srv, err := e.local.NewMCP(MCPConfig{
				Providers: registryProviders{e}, DefaultProvider: provider, DefaultImage: image, AllowNetwork: allowNetwork,
				Owner: e.owner(), HTTP: httpAddr, Token: token, TokenFile: tokenFile, Log: e.log,
			})
			if err != nil {
				return err
			}
			defer func() {
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				if err := srv.Close(ctx); err != nil {
					fmt.Fprintf(e.stderr, "roche: %s (roche gc --all removes leftovers)\n", oneLine(err))
				}
			}()
			ctx := cmd.Context()
			if httpAddr == "" {
				return srv.ServeStdio(ctx, e.stdin, e.stdout)
			}
			l, err := net.Listen("tcp", httpAddr)
			if err != nil {
				return fmt.Errorf("listening on %s: %w", httpAddr, err)
			}
			fmt.Fprintf(e.stderr, "roche mcp: serving streamable HTTP on http://%s/\n", l.Addr())
			return srv.ServeHTTP(ctx, l, 10*time.Second)
		},
	}
	defProvider, defImage := catalog.Default, roche.DefaultImage
	if v := e.getenv("ROCHE_PROVIDER"); v != "" {
		defProvider = v
	}
	if v := e.getenv("ROCHE_IMAGE"); v != "" {
		defImage = v
	}
	c.Flags().StringVar(&httpAddr, "http", "", "serve streamable HTTP on HOST:PORT instead of stdio")
	c.Flags().StringVar(&tokenFile, "token-file", "", "file (mode 0600) holding the bearer token HTTP clients must send (or env ROCHE_MCP_TOKEN); at least 16 characters")
	c.Flags().StringVar(&token, "token", "", "refused: a token on the command line is visible to every user; use --token-file")
	_ = c.Flags().MarkHidden("token")
	c.Flags().StringVar(&provider, "provider", defProvider, "provider of sandboxes whose create names none (env ROCHE_PROVIDER)")
	c.Flags().StringVar(&image, "image", defImage, "image of sandboxes whose create names none (env ROCHE_IMAGE)")
	c.Flags().BoolVar(&allowNetwork, "allow-network", false, "let clients create sandboxes with a network")
	return c
}

// MCPConfig is what roche mcp's server is made with (Local.NewMCP): its flags, and the
// CLI's providers.
type MCPConfig struct {
	Providers                     MCPProviders
	DefaultProvider, DefaultImage string
	AllowNetwork                  bool
	// Owner is the Config.Owner of the sandboxes it makes in this process.
	Owner string
	// HTTP is where it is to serve streamable HTTP (empty: stdio), and Token what HTTP
	// clients must send, or TokenFile the file that holds it; all are checked first.
	HTTP, Token, TokenFile string
	Log                    *slog.Logger
}

// MCPProviders are the providers the MCP server uses: those of the CLI.
type MCPProviders interface {
	// Get opens the named provider.
	Get(name string) (roche.Provider, error)
	// List lists the sandboxes of the named provider, or of every available one when
	// name is empty.
	List(ctx context.Context, name string) ([]roche.SandboxInfo, error)
}

// MCPServer is roche mcp's server (internal/mcp's).
type MCPServer interface {
	ServeStdio(ctx context.Context, r io.Reader, w io.Writer) error
	// ServeHTTP serves l behind the token the server was made with, if any.
	ServeHTTP(ctx context.Context, l net.Listener, grace time.Duration) error
	// Close destroys the sandboxes the server made.
	Close(ctx context.Context) error
}

// registryProviders gives the MCP server the CLI's providers: roched's when it answers,
// else in-process.
type registryProviders struct{ e *env }

func (r registryProviders) Get(name string) (roche.Provider, error) { return r.e.providers.get(name) }

func (r registryProviders) List(ctx context.Context, name string) ([]roche.SandboxInfo, error) {
	all := []roche.SandboxInfo{}
	err := r.e.providers.each(ctx, name, func(p roche.Provider) error {
		list, err := p.List(ctx)
		all = append(all, list...)
		return err
	})
	return all, err
}
