package cli

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/roche-sandbox/roche"
)

// e2bCommand is roche e2b: what E2B's SDKs need to reach roched's E2B listener.
func (e *env) e2bCommand() *cobra.Command {
	root := &cobra.Command{
		Use:   "e2b",
		Short: "E2B's SDKs against roched (roched --e2b-listen; docs/e2b.md)",
		Args:  cobra.NoArgs,
	}
	root.Annotations = noProviders
	envCmd := &cobra.Command{
		Use:   "env",
		Short: "Print the export lines E2B's SDKs need to reach the running roched",
		Long: `Print, as roched printed them at start, the lines that point E2B's SDKs at roched's
E2B listener: export E2B_API_URL=..., export E2B_SANDBOX_URL=... and, when roched made
a key of its own, export E2B_API_KEY=.... Asks the roched on --socket, which must
have been started with --e2b-listen.`,
		Example:     `  eval "$(roche e2b env)" && python3 -c 'from e2b import Sandbox; print(Sandbox.create().commands.run("id").stdout)'`,
		Args:        cobra.NoArgs,
		Annotations: noProviders,
		RunE: func(cmd *cobra.Command, _ []string) error {
			sock := e.daemon.socket
			hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				var d net.Dialer
				return d.DialContext(ctx, "unix", sock)
			}}, Timeout: 10 * time.Second}
			resp, err := hc.Get("http://roched/e2b/env")
			if err != nil {
				return fmt.Errorf("%w: roched is not running on %s: start it with --e2b-listen tcp://127.0.0.1:3000", roche.ErrUnavailable, sock)
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
			if resp.StatusCode != http.StatusOK {
				return fmt.Errorf("%w: %s", roche.ErrUnavailable, strings.TrimSpace(string(b)))
			}
			_, err = cmd.OutOrStdout().Write(b)
			return err
		},
	}
	root.AddCommand(envCmd)
	return root
}
