package cli

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/roche-sandbox/roche/client"
	"github.com/roche-sandbox/roche/egress"
)

const egressHint = "a sandbox's egress proxy runs in roched: start it with roche daemon start, then create the sandbox with --allow-host"

func (e *env) egressCommand() *cobra.Command {
	c := &cobra.Command{
		Use:         "egress log|suggest|allow|deny ID ...",
		Annotations: noProviders,
		Short:       "Read and change the egress allowlist of a running sandbox",
		Long: `A sandbox made with --allow-host reaches the network only through an HTTP proxy that
roched runs for it, which allows the hosts listed and refuses everything else. Every
connection and plain HTTP request it decides on is kept in the sandbox's decision log (the
newest ` + strconv.Itoa(egress.DefaultLogSize) + `), written to roched's audit log and counted in its metrics.
Its allowlist can be changed while it runs, effective from the next connection.
See docs/egress.md.`,
		Example: `  roche egress log ID
  roche egress log ID --json | jq 'select(.allowed == false)'
  roche egress suggest ID
  roche egress allow ID pypi.org files.pythonhosted.org
  roche egress deny ID pypi.org`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return fmt.Errorf("give a subcommand: log, suggest, allow or deny (see %s --help)", cmd.CommandPath())
		},
	}
	var asJSON, follow bool
	logCmd := &cobra.Command{
		Use:   "log ID [--json] [--follow]",
		Short: "Show every connection a sandbox's egress proxy allowed or refused, and why",
		Long: `Show the sandbox's egress decisions, oldest first: time, method, host:port, the
address resolved, the path of a plain HTTP request, the decision and the rule or reason,
and the bytes relayed each way (filled in when an allowed connection ends). HTTPS is
one CONNECT decision per connection. With --json, one JSON object a decision, a line
each: seq, time, sandbox, tenant, host, port, addr, method, path, rule, allowed, reason,
bytes_out, bytes_in, done. With --follow, print each decision as it becomes final (a
refusal at once, an allowed connection when it ends), until Ctrl-C or the sandbox ends.`,
		Example: "  roche egress log ID\n  roche egress log ID --json\n  roche egress log ID --follow --json",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := e.requireDaemon(egressHint)
			if err != nil {
				return err
			}
			if follow {
				return e.followEgress(cmd, c, args[0], asJSON)
			}
			log, err := c.EgressLog(cmd.Context(), args[0], 0)
			if err != nil {
				return err
			}
			if asJSON {
				enc := json.NewEncoder(e.stdout)
				for _, d := range log.Decisions {
					if err := enc.Encode(d); err != nil {
						return err
					}
				}
				return nil
			}
			if log.Dropped > 0 {
				fmt.Fprintf(e.stdout, "(%d older decisions dropped)\n", log.Dropped)
			}
			tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "TIME\tMETHOD\tTARGET\tADDRESS\tPATH\tDECISION\tRULE/REASON\tOUT\tIN")
			for _, d := range log.Decisions {
				fmt.Fprintln(tw, decisionRow(d))
			}
			return tw.Flush()
		},
	}
	logCmd.Flags().BoolVar(&asJSON, "json", false, "print one JSON object a decision, a line each")
	logCmd.Flags().BoolVar(&follow, "follow", false, "print each decision as it becomes final, until Ctrl-C or the sandbox ends")
	suggest := &cobra.Command{
		Use:   "suggest ID",
		Short: "Print the allowlist entries the sandbox's refused connections needed",
		Long: `Print, one a line, the minimal allowlist entries that would have allowed every refusal
in the sandbox's decision log that an entry can allow (not one refused for its address
or its Host header): give them to --allow-host, or to roche egress allow.`,
		Example: `  roche egress suggest ID
  roche egress allow ID $(roche egress suggest ID)`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := e.requireDaemon(egressHint)
			if err != nil {
				return err
			}
			log, err := c.EgressLog(cmd.Context(), args[0], 0)
			if err != nil {
				return err
			}
			for _, r := range log.Suggested {
				fmt.Fprintln(e.stdout, r)
			}
			return nil
		},
	}
	change := func(use, short string, add bool) *cobra.Command {
		return &cobra.Command{
			Use:   use + " ID HOST[:PORT]...",
			Short: short,
			Long: short + `, effective from its next connection (connections open stay open),
and print the allowlist then in force. Entries are spelled as --allow-host takes them
(HOST, *.SUFFIX, an IP, each with an optional :PORT); a bad entry, or one to deny that the
allowlist does not have, changes nothing.`,
			Example: "  roche egress " + use + " ID pypi.org files.pythonhosted.org:443",
			Args:    cobra.MinimumNArgs(2),
			RunE: func(cmd *cobra.Command, args []string) error {
				c, err := e.requireDaemon(egressHint)
				if err != nil {
					return err
				}
				var allow, remove []string
				if add {
					allow = args[1:]
				} else {
					remove = args[1:]
				}
				rules, err := c.EgressPolicy(cmd.Context(), args[0], allow, remove)
				if err != nil {
					return friendly(err)
				}
				for _, r := range rules {
					fmt.Fprintln(e.stdout, r)
				}
				return nil
			},
		}
	}
	c.AddCommand(logCmd, suggest,
		change("allow", "Add entries to a running sandbox's allowlist", true),
		change("deny", "Take entries out of a running sandbox's allowlist", false))
	return c
}

// decisionRow is a decision as egress log's table shows it, tab-separated.
func decisionRow(d egress.Decision) string {
	verdict, why := "refused", d.Reason
	if d.Allowed {
		verdict, why = "allowed", d.Rule
	}
	out, in := "-", "-"
	if d.Done {
		out, in = strconv.FormatInt(d.BytesOut, 10), strconv.FormatInt(d.BytesIn, 10)
	}
	return fmt.Sprintf("%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s", d.Time.Local().Format("15:04:05.000"), dashIfEmpty(d.Method),
		dashIfEmpty(d.Target()), dashIfEmpty(d.Addr), dashIfEmpty(d.Path), verdict, why, out, in)
}

// followEgress prints a sandbox's decisions as they become final (EgressEvents).
func (e *env) followEgress(cmd *cobra.Command, c *client.Client, id string, asJSON bool) error {
	enc := json.NewEncoder(e.stdout)
	return c.EgressEvents(cmd.Context(), id, 0, func(d egress.Decision, missed uint64) error {
		if missed > 0 {
			fmt.Fprintf(e.stderr, "(%d decisions missed: this reader was too slow)\n", missed)
		}
		if asJSON {
			return enc.Encode(d)
		}
		_, err := fmt.Fprintln(e.stdout, strings.ReplaceAll(decisionRow(d), "\t", "  "))
		return err
	})
}
