package cli

import (
	"fmt"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/roche-sandbox/roche"
)

func (e *env) snapshotCommand() *cobra.Command {
	var provider string
	c := &cobra.Command{
		Use:   "snapshot create ID NAME | list | rm NAME...",
		Short: "Save a sandbox's files, to create sandboxes from later",
		Long: `A snapshot keeps a sandbox's files: its root filesystem's changes (with --writable) and
its /tmp. Process memory is not kept: a sandbox made from a snapshot (create or run
--from-snapshot NAME) starts with no processes. A workspace is not part of a snapshot;
it persists on its own. For memory and processes (qemu), use roche pause --to-disk ID,
then roche resume ID or roche fork ID -n N: there is no snapshot create --memory.`,
		Example: `  roche snapshot create "$id" deps-installed
  roche run --from-snapshot deps-installed -- python3 /tmp/main.py
  roche snapshot list
  roche snapshot rm deps-installed`,
	}
	create := &cobra.Command{
		Use:     "create ID NAME [--json]",
		Short:   "Snapshot a sandbox's files under NAME",
		Example: `  roche snapshot create "$id" clean-env`,
		Args:    cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			p, err := e.providers.forID(args[0])
			if err == nil && provider != "" && provider != p.Name() {
				err = fmt.Errorf("%w: sandbox %s belongs to the %s provider, not %s: drop --provider", roche.ErrInvalidConfig, args[0], p.Name(), provider)
			}
			if err != nil {
				return err
			}
			s, ok := p.(roche.Snapshotter)
			if !ok {
				return fmt.Errorf("%w: the %s provider has no snapshots", roche.ErrUnsupported, p.Name())
			}
			snap, err := s.Snapshot(cmd.Context(), args[0], args[1])
			if err != nil {
				return err
			}
			if asJSON, _ := cmd.Flags().GetBool("json"); asJSON {
				return e.printJSON(snap)
			}
			fmt.Fprintln(e.stdout, snap.Name)
			return nil
		},
	}
	create.Flags().Bool("json", false, "print the snapshot as a JSON object")
	list := &cobra.Command{
		Use:     "list [--json]",
		Short:   "List snapshots",
		Example: "  roche snapshot list --json",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			snaps := []roche.Snapshot{}
			err := eachKeeper(cmd.Context(), e.providers, provider, "snapshots", func(s roche.Snapshotter) error {
				list, err := s.Snapshots(cmd.Context())
				snaps = append(snaps, list...)
				return err
			})
			if err != nil && !partial(err) {
				return err
			}
			if asJSON, _ := cmd.Flags().GetBool("json"); asJSON {
				return e.printListJSON("snapshots", snaps, err)
			}
			tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tPROVIDER\tFROM IMAGE\tCREATED")
			for _, sn := range snaps {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", sn.Name, sn.Provider, sn.Image, sn.CreatedAt.Format("2006-01-02 15:04"))
			}
			if ferr := tw.Flush(); ferr != nil {
				return ferr
			}
			return err // incomplete: exit 3, saying which providers were skipped
		},
	}
	list.Flags().Bool("json", false, `print a JSON array; when a provider was skipped (exit 3), {"snapshots": [...], "skipped": [...]}`)
	rm := &cobra.Command{
		Use:     "rm NAME...",
		Short:   "Remove snapshots",
		Example: "  roche snapshot rm clean-env",
		Args:    cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, names []string) error {
			for _, n := range names {
				err := removeKept(cmd.Context(), e.providers, provider, "snapshots", n, func(s roche.Snapshotter) error {
					return s.RemoveSnapshot(cmd.Context(), n)
				})
				if err != nil {
					return err
				}
				fmt.Fprintln(e.stdout, n)
			}
			return nil
		},
	}
	// A snapshot is taken by the provider of its sandbox, which the id names.
	create.Flags().StringVar(&provider, "provider", "", "provider of the sandbox (default: the one its id names)")
	for _, sub := range []*cobra.Command{list, rm} {
		sub.Flags().StringVar(&provider, "provider", "", "provider whose snapshots to list or remove (default: every one that has them)")
	}
	c.AddCommand(create, list, rm)
	return c
}
