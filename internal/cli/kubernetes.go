package cli

import (
	"cmp"
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/provider/kubernetes"
)

// kubernetesCommand holds what an operator of the Kubernetes provider needs besides
// sandboxes: the agent image, which the nodes must have (there may be no registry).
func (e *env) kubernetesCommand() *cobra.Command {
	c := &cobra.Command{
		Use:   "kubernetes",
		Short: "Set up the Kubernetes provider (the agent image)",
	}
	var output, agentPath string
	image := &cobra.Command{
		Use:   "agent-image --output FILE",
		Short: "Write the agent image, as a tarball, and print its reference",
		Long: `Build the image the kubernetes provider installs roche-agent from (one layer holding
the static roche-agent, tagged with the binary's digest) and write it to FILE as an image
tarball. Import it into every node's container runtime (ctr -n k8s.io images import FILE),
or push it to the cluster's registry with a registry tool (crane push FILE REPO:TAG) and
pass that reference as the provider's agent image.`,
		Example: `  roche kubernetes agent-image --output roche-agent.tar`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if output == "" {
				return fmt.Errorf("%w: --output FILE is required: where to write the image tarball", roche.ErrInvalidConfig)
			}
			src := cmp.Or(agentPath, kubernetes.DefaultAgentPath())
			if src == "" {
				return fmt.Errorf("%w: no roche-agent found: build it (make build), or pass --agent PATH", roche.ErrInvalidConfig)
			}
			f, err := os.Create(output)
			if err != nil {
				return fmt.Errorf("writing the agent image: %w", err)
			}
			ref, err := kubernetes.WriteAgentImage(f, src)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				os.Remove(output)
				return err
			}
			fmt.Fprintln(e.stdout, ref)
			return nil
		},
	}
	image.Flags().StringVarP(&output, "output", "o", "", "file to write the image tarball to")
	image.Flags().StringVar(&agentPath, "agent", "", "roche-agent binary (default: $ROCHE_AGENT, else beside roche)")
	c.AddCommand(image)
	return c
}
