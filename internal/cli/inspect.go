package cli

import (
	"errors"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/client"
)

func (e *env) inspectCommand() *cobra.Command {
	var asJSON bool
	c := &cobra.Command{
		Use:   "inspect ID [--json]",
		Short: "Describe a sandbox, and why it ended if it did",
		Long: `Describe one of your sandboxes: its provider, image, state, lifetime and owner. Of a
sandbox that ended within roched's --ended-retention (1 h by default), roched answers
with why it ended, a typed reason and its evidence:

  oom              killed for exceeding its memory limit (the cgroup's memory.events)
  pids             its pids limit was reached (a command's receipt only: a
                   command failed at RLIMIT_NPROC, counted in /proc)
  lifetime         its lifetime was reached
  command_timeout  a command's timeout ended it
  output_cap       a command's output passed the cap that ends it
  lease_lost       it was leased and its holder went away
  destroyed        a caller destroyed it ("by" names which tenant, or owner)
  engine_gone      its engine or node went away
  agent_exited     its main process (roche-agent) exited or was killed
  unknown          it ended and nobody could tell why; the detail says why not

In direct mode (no roched) nothing remembers a sandbox once it is gone: a
destroyed one is "not found". See docs/ended.md.`,
		Example: "  roche inspect 3f2a9c...\n  roche inspect --json 3f2a9c... | jq .end",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			p, err := e.providers.forID(args[0])
			if err != nil {
				return err
			}
			inspect := p.Inspect
			if ei, ok := p.(roche.EndInspector); ok {
				inspect = ei.InspectEnded // through roched: ended ones too
			}
			sb, err := inspect(cmd.Context(), args[0])
			if err != nil {
				if _, remote := p.(*client.Provider); !remote && errors.Is(err, roche.ErrNotFound) {
					return fmt.Errorf("%w (in direct mode nothing remembers why a sandbox ended once it is gone: create sandboxes through roched, roche daemon start, to have it kept for --ended-retention)", err)
				}
				return err
			}
			if asJSON {
				return e.printJSON(sb)
			}
			tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
			row := func(k, v string) {
				if v != "" {
					fmt.Fprintf(tw, "%s\t%s\n", k, v)
				}
			}
			row("id:", sb.ID)
			row("provider:", sb.Provider)
			row("image:", sb.Image)
			row("state:", string(sb.State))
			row("created:", stamp(sb.CreatedAt))
			row("expires:", stamp(sb.ExpiresAt))
			row("owner:", sb.Owner)
			row("transport:", sb.Transport)
			if end := sb.End; end != nil {
				row("ended:", string(end.Kind)+" at "+stamp(end.At))
				row("why:", end.Detail)
				row("evidence:", end.Evidence)
				row("by:", end.By)
				if end.ExitKnown {
					row("exit:", fmt.Sprint(end.ExitCode))
				}
			} else if sb.State == roche.StateExited {
				row("ended:", "why is not known: its provider keeps no reason")
			}
			return tw.Flush()
		},
	}
	c.Flags().BoolVar(&asJSON, "json", false, "print the sandbox as JSON (its end under \"end\")")
	return c
}

// stamp is a time in local RFC 3339 to the second, "" for the zero time.
func stamp(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.Local().Format(time.RFC3339)
}
