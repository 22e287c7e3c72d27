package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/client"
	"github.com/roche-sandbox/roche/internal/secretfile"
)

const secretHint = "the secret store is roched's: start it with roche daemon start"

// needsRoched refuses, in direct mode, what only roched can do: take a secret from its
// store, keep what a learn-mode sandbox needed.
func needsRoched(p roche.Provider, cfg roche.Config) error {
	if _, remote := p.(*client.Provider); remote {
		return nil
	}
	for _, s := range cfg.Secrets {
		if s.FromStore {
			return fmt.Errorf("%w: --secret %s takes the value from roched's secret store, and roched is not serving this create: start it (roche daemon start), or give --secret %s=@FILE",
				roche.ErrInvalidConfig, s.Name, s.Name)
		}
	}
	if cfg.EgressLearn {
		return fmt.Errorf("%w: --egress-learn needs roched, which keeps what the sandbox needed: start it (roche daemon start)", roche.ErrInvalidConfig)
	}
	return nil
}

func (e *env) secretCommand() *cobra.Command {
	c := &cobra.Command{
		Use:         "secret set|list|rm NAME",
		Annotations: noProviders,
		Short:       "Keep secrets in roched for sandboxes to use without seeing them",
		Long: `roched's secret store keeps credentials for your sandboxes' egress proxies to broker:
roche create --secret NAME --secret-host NAME=HOST takes NAME's value from it (the sandbox
sees only a placeholder). Values are read from standard input or a file, never from the
command line; roched holds them in memory only (never on disk, in its state file or in a
log), so a roched restarted has none: set them again. Each tenant has its own store.

Setting a stored secret again rotates it: every running sandbox that took it from the
store sends the new value from its next request on, without a restart. With --sandbox ID,
set replaces the value of that sandbox's secret only (from a file or the store), and
stores nothing. See docs/egress.md.`,
		Example: `  roche secret set API_TOKEN < token.txt
  roche secret set API_TOKEN --from-file token.txt
  roche secret set API_TOKEN --sandbox ID --from-file new-token.txt
  roche secret list
  roche secret list --json
  roche secret rm API_TOKEN`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return fmt.Errorf("give a subcommand: set, list or rm (see %s --help)", cmd.CommandPath())
		},
	}
	var fromFile, sandbox string
	set := &cobra.Command{
		Use:   "set NAME [--from-file FILE] [--sandbox ID]",
		Short: "Store a secret (or replace it, rotating it in the sandboxes that use it)",
		Long: `Store a secret's value under NAME, read from standard input (or --from-file FILE, a file
only you can read); a trailing newline is dropped. Replacing a value rotates it in every
running sandbox that took NAME from the store, and prints their ids. With --sandbox ID,
replace the value of that running sandbox's secret NAME only.`,
		Example: "  roche secret set API_TOKEN < token.txt\n  roche secret set API_TOKEN --from-file token.txt",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var b []byte
			var err error
			if fromFile != "" {
				if err := secretfile.CheckPrivate(fromFile, "--from-file"); err != nil {
					return err
				}
				b, err = os.ReadFile(fromFile)
			} else {
				b, err = io.ReadAll(io.LimitReader(e.stdin, 1<<20))
			}
			if err != nil {
				return fmt.Errorf("reading the value of secret %s: %w", args[0], err)
			}
			value := strings.TrimRight(string(b), "\r\n")
			c, err := e.requireDaemon(secretHint)
			if err != nil {
				return err
			}
			if sandbox != "" {
				if err := c.SetSandboxSecret(cmd.Context(), sandbox, args[0], value); err != nil {
					return friendly(err)
				}
				fmt.Fprintln(e.stdout, sandbox)
				return nil
			}
			rotated, err := c.SetSecret(cmd.Context(), args[0], value)
			if err != nil {
				return friendly(err)
			}
			for _, id := range rotated {
				fmt.Fprintln(e.stdout, id)
			}
			return nil
		},
	}
	set.Flags().StringVar(&fromFile, "from-file", "", "read the value from FILE (private to you) instead of standard input")
	set.Flags().StringVar(&sandbox, "sandbox", "", "replace the value of this running sandbox's secret only; store nothing")
	var asJSON bool
	list := &cobra.Command{
		Use:   "list [--json]",
		Short: "Name the stored secrets (never their values) and the sandboxes using each",
		Long: `Name your stored secrets, never their values: when each was last set, and the running
sandboxes that took it from the store (which a set rotates). --json prints a JSON array
of {"name", "updated" (RFC 3339), "sandboxes"}, for scripts and the SDKs.`,
		Example: "  roche secret list\n  roche secret list --json | jq -r '.[].name'",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := e.requireDaemon(secretHint)
			if err != nil {
				return err
			}
			ss, err := c.ListSecrets(cmd.Context())
			if err != nil {
				return friendly(err)
			}
			if asJSON {
				type stored struct {
					Name      string    `json:"name"`
					Updated   time.Time `json:"updated"`
					Sandboxes []string  `json:"sandboxes"`
				}
				out := make([]stored, 0, len(ss))
				for _, s := range ss {
					out = append(out, stored{Name: s.Name, Updated: s.Updated.UTC(), Sandboxes: append([]string{}, s.Sandboxes...)})
				}
				return json.NewEncoder(e.stdout).Encode(out)
			}
			tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tUPDATED\tSANDBOXES")
			for _, s := range ss {
				fmt.Fprintf(tw, "%s\t%s\t%s\n", s.Name, s.Updated.Local().Format("2006-01-02 15:04:05"), dashIfEmpty(strings.Join(s.Sandboxes, ",")))
			}
			return tw.Flush()
		},
	}
	list.Flags().BoolVar(&asJSON, "json", false, `print a JSON array of {"name", "updated", "sandboxes"}`)
	rm := &cobra.Command{
		Use:   "rm NAME",
		Short: "Take a secret out of the store (running sandboxes keep the value they have)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := e.requireDaemon(secretHint)
			if err != nil {
				return err
			}
			return friendly(c.RemoveSecret(cmd.Context(), args[0]))
		},
	}
	c.AddCommand(set, list, rm)
	return c
}
