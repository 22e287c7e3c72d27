package cli

import (
	"fmt"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/roche-sandbox/roche"
)

// snapshotter opens the provider that keeps snapshots; like workspaces they live in the
// engine, so this is the provider in-process even when roched runs.
func (e *env) snapshotter(name string) (roche.Snapshotter, error) {
	p, err := e.providers.direct(name)
	if err != nil {
		return nil, err
	}
	s, ok := p.(roche.Snapshotter)
	if !ok {
		return nil, fmt.Errorf("%w: the %s provider has no snapshots", roche.ErrUnsupported, name)
	}
	return s, nil
}

func (e *env) snapshotCommand() *cobra.Command {
	var provider string
	c := &cobra.Command{
		Use:   "snapshot create ID NAME | list | rm NAME...",
		Short: "Save a sandbox's files, to create sandboxes from later",
		Long: `A snapshot keeps a sandbox's files: its root filesystem's changes (with --writable) and
its /tmp. Process memory is not kept: a sandbox made from a snapshot (create or run
--from-snapshot NAME) starts with no processes. A workspace is not part of a snapshot;
it persists on its own.`,
		Example: `  roche snapshot create "$id" deps-installed
  roche run --from-snapshot deps-installed -- python3 /tmp/main.py
  roche snapshot list
  roche snapshot rm deps-installed`,
	}
	c.PersistentFlags().StringVar(&provider, "provider", "docker", "provider whose snapshots to manage")
	create := &cobra.Command{
		Use:     "create ID NAME",
		Short:   "Snapshot a sandbox's files under NAME",
		Example: `  roche snapshot create "$id" clean-env`,
		Args:    cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			s, err := e.snapshotter(provider)
			if err != nil {
				return err
			}
			snap, err := s.Snapshot(cmd.Context(), args[0], args[1])
			if err != nil {
				return err
			}
			fmt.Fprintln(e.stdout, snap.Name)
			return nil
		},
	}
	list := &cobra.Command{
		Use:     "list [--json]",
		Short:   "List snapshots",
		Example: "  roche snapshot list --json",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			s, err := e.snapshotter(provider)
			if err != nil {
				return err
			}
			snaps, err := s.Snapshots(cmd.Context())
			if err != nil {
				return err
			}
			if asJSON, _ := cmd.Flags().GetBool("json"); asJSON {
				return e.printJSON(snaps)
			}
			tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tPROVIDER\tFROM IMAGE\tCREATED")
			for _, sn := range snaps {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", sn.Name, sn.Provider, sn.Image, sn.CreatedAt.Format("2006-01-02 15:04"))
			}
			return tw.Flush()
		},
	}
	list.Flags().Bool("json", false, "print a JSON array")
	rm := &cobra.Command{
		Use:     "rm NAME...",
		Short:   "Remove snapshots",
		Example: "  roche snapshot rm clean-env",
		Args:    cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, names []string) error {
			s, err := e.snapshotter(provider)
			if err != nil {
				return err
			}
			for _, n := range names {
				if err := s.RemoveSnapshot(cmd.Context(), n); err != nil {
					return err
				}
				fmt.Fprintln(e.stdout, n)
			}
			return nil
		},
	}
	c.AddCommand(create, list, rm)
	return c
}
