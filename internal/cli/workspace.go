package cli

import (
	"fmt"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/internal/size"
)

func (e *env) workspaceCommand() *cobra.Command {
	var provider string
	c := &cobra.Command{
		Use:   "workspace list | rm NAME...",
		Short: "List or remove persistent workspaces",
		Long: `A workspace (create --workspace NAME) is mounted read-write at /workspace, even on a
read-only root, and outlives its sandbox: a later sandbox with the same name sees its
files. It holds at most its size (--workspace-size when it is made, default ` + roche.DefaultWorkspaceSize + `;
past it writes fail with ENOSPC), which stays fixed: a create asking for another size is
refused. A workspace in use by a sandbox cannot be removed; removing one frees its disk.`,
		Example: `  roche run --image roche/python:local --workspace proj -- sh -c 'echo hi > /workspace/a'
  roche workspace list
  roche workspace rm proj`,
	}
	c.PersistentFlags().StringVar(&provider, "provider", "", "provider whose workspaces to manage (default: every one that has them)")
	list := &cobra.Command{
		Use:     "list [--json]",
		Short:   "List workspaces and the sandboxes using them",
		Example: "  roche workspace list --json",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ws := []roche.Workspace{}
			err := eachKeeper(cmd.Context(), e.providers, provider, "persistent workspaces", func(wm roche.WorkspaceManager) error {
				list, err := wm.Workspaces(cmd.Context())
				ws = append(ws, list...)
				return err
			})
			if err != nil && !partial(err) {
				return err
			}
			if asJSON, _ := cmd.Flags().GetBool("json"); asJSON {
				return e.printListJSON("workspaces", ws, err)
			}
			tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tPROVIDER\tSIZE\tCREATED\tIN USE BY")
			for _, w := range ws {
				shown := "-" // made by an older Roche, without a size
				if w.SizeBytes > 0 {
					shown = size.String(w.SizeBytes)
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", w.Name, w.Provider, shown, w.CreatedAt.Format("2006-01-02 15:04"), strings.Join(w.InUseBy, ","))
			}
			if ferr := tw.Flush(); ferr != nil {
				return ferr
			}
			return err // incomplete: exit 3, saying which providers were skipped
		},
	}
	list.Flags().Bool("json", false, `print a JSON array; when a provider was skipped (exit 3), {"workspaces": [...], "skipped": [...]}`)
	rm := &cobra.Command{
		Use:     "rm NAME...",
		Short:   "Remove workspaces and their files",
		Example: "  roche workspace rm proj scratch",
		Args:    cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, names []string) error {
			for _, n := range names {
				err := removeKept(cmd.Context(), e.providers, provider, "persistent workspaces", n, func(wm roche.WorkspaceManager) error {
					return wm.RemoveWorkspace(cmd.Context(), n)
				})
				if err != nil {
					return err
				}
				fmt.Fprintln(e.stdout, n)
			}
			return nil
		},
	}
	c.AddCommand(list, rm)
	return c
}

func (e *env) resetCommand() *cobra.Command {
	var wipe, asJSON bool
	c := &cobra.Command{
		Use:   "reset ID [--wipe-workspace]",
		Short: "Recreate a sandbox from its image, discarding every change",
		Long: `Destroy a sandbox and make it again from the same image and settings, with the
lifetime it had left: changes to its filesystem and its processes are gone. Its
workspace is kept unless --wipe-workspace. Prints the new sandbox's id.`,
		Example: `  id=$(roche reset "$id")
  roche reset --wipe-workspace "$id"`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			p, err := e.providers.forID(args[0])
			if err != nil {
				return err
			}
			r, ok := p.(roche.Resetter)
			if !ok {
				return fmt.Errorf("%w: the %s provider cannot reset sandboxes", roche.ErrUnsupported, p.Name())
			}
			info, err := r.Reset(cmd.Context(), args[0], !wipe)
			if err != nil {
				return err
			}
			if asJSON {
				return e.printJSON(info)
			}
			fmt.Fprintln(e.stdout, info.ID)
			return nil
		},
	}
	c.Flags().BoolVar(&wipe, "wipe-workspace", false, "empty the sandbox's workspace too")
	c.Flags().BoolVar(&asJSON, "json", false, "print the new sandbox as a JSON object")
	return c
}
