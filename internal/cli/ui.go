package cli

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"time"

	"github.com/spf13/cobra"

	"github.com/roche-sandbox/roche"
)

// uiCommand prints a one-time login URL of roched's console, as Jupyter does.
func (e *env) uiCommand() *cobra.Command {
	var open bool
	c := &cobra.Command{
		Use:   "ui [--open]",
		Short: "Print a one-time login URL of roched's web console",
		Long: `Ask the roched that --address names (with the token of ROCHE_TOKEN_FILE or ROCHE_TOKEN)
for a one-time login URL of its web console (roched --ui, docs/console.md) and print it.
Opened within 2 minutes, the URL signs that browser in, once, as the token's tenant with
the token's role (a read-only token makes a read-only session); the browser keeps a
session cookie for 12 hours, and the code cannot be used again. The token itself is
never in the URL.

--open also opens the URL in a browser ($BROWSER, else xdg-open); without it nothing is
opened, so it does no harm on a host without a display.

The console serves tenants known by their tokens, so this needs --address: roched's unix
socket has none.`,
		Example: `  ROCHE_ADDRESS=http://127.0.0.1:7878 ROCHE_TOKEN_FILE=~/.roche/token roche ui
  roche ui --address https://roched.example:7878 --ca ca.pem --open`,
		Args:        cobra.NoArgs,
		Annotations: noProviders,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if e.daemon.direct {
				return fmt.Errorf("%w: roche ui asks roched for a login URL: drop --direct", roche.ErrInvalidConfig)
			}
			if e.daemon.remote.address == "" {
				return fmt.Errorf("%w: roche ui needs roched's TCP address and a tenant's token: set ROCHE_ADDRESS (or --address) to roched's --listen address, e.g. http://127.0.0.1:7878, and ROCHE_TOKEN_FILE (or ROCHE_TOKEN)",
					roche.ErrInvalidConfig)
			}
			c := e.daemon.connect(e)
			if c == nil {
				if err := e.daemon.remote.err; err != nil {
					return err
				}
				return fmt.Errorf("%w: roched at %s is not answering", roche.ErrUnavailable, e.daemon.remote.address)
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), remoteProbeTimeout)
			defer cancel()
			l, err := c.ConsoleLogin(ctx)
			if err != nil {
				return err
			}
			fmt.Fprintln(e.stdout, l.URL)
			fmt.Fprintf(e.stderr, "roche: open it before %s (once: the login code is then spent)\n", l.Expires.Local().Format(time.TimeOnly))
			if open {
				if err := openBrowser(e.getenv("BROWSER"), l.URL); err != nil {
					return fmt.Errorf("opening a browser: %w (open the URL above by hand)", err)
				}
			}
			return nil
		},
	}
	c.Flags().BoolVar(&open, "open", false, "also open the URL in a browser ($BROWSER, else xdg-open)")
	return c
}

// openBrowser starts browser (else xdg-open) on url without waiting for it to end.
func openBrowser(browser, url string) error {
	if browser == "" {
		browser = "xdg-open"
	}
	path, err := exec.LookPath(browser)
	if err != nil {
		return errors.New(browser + " is not on PATH: set BROWSER to a browser's command")
	}
	cmd := exec.Command(path, url)
	if err := cmd.Start(); err != nil {
		return err
	}
	go func() { _ = cmd.Wait() }()
	return nil
}
