package cli

import (
	"cmp"
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/internal/guest/guestbin"
)

// kubernetesCommand holds what an operator of the Kubernetes provider needs besides
// sandboxes: the agent image, which the nodes must have (there may be no registry), the
// image that runs roched in the cluster, and Roche's seccomp profile. They are the
// provider's own code, which the thin roche does not link: it hands them to roched.
func (e *env) kubernetesCommand() *cobra.Command {
	c := &cobra.Command{
		Use:   "kubernetes",
		Short: "Set up the Kubernetes provider (the agent image, roched's image, the seccomp profile)",
		PersistentPreRunE: func(*cobra.Command, []string) error {
			if !e.fullLocal() {
				return e.handoff()
			}
			return nil
		},
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
			src := cmp.Or(agentPath, guestbin.Path())
			if src == "" {
				return fmt.Errorf("%w: no roche-agent found: pass --agent PATH, or %s", roche.ErrInvalidConfig, guestbin.Install)
			}
			f, err := os.Create(output)
			if err != nil {
				return fmt.Errorf("writing the agent image: %w", err)
			}
			ref, err := e.local.WriteAgentImage(f, src)
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
	var rochedOut, rochedPath, rochedAgent string
	rochedImage := &cobra.Command{
		Use:   "roched-image --output FILE",
		Short: "Write the image that runs roched in a cluster, as a tarball, and print its reference",
		Long: `Build the image deploy/kubernetes runs roched from (one layer holding the static roched
and roche-agent beside it, run as uid 65532, tagged with the start of the image's
digest) and write it to FILE as an image tarball. roched in it names the agent image
after that roche-agent: the one roche kubernetes agent-image writes from the same
roche-agent, which the nodes must have too. Import both into every node's container
runtime (ctr -n k8s.io images import FILE), or push both to a registry (crane push FILE
REPO:TAG) and set the images in the kustomization (docs/roched-in-a-cluster.md).`,
		Example: `  roche kubernetes roched-image --output roched.tar    # prints roche/roched:<digest>`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if rochedOut == "" {
				return fmt.Errorf("%w: --output FILE is required: where to write the image tarball", roche.ErrInvalidConfig)
			}
			daemon, err := findRoched(rochedPath)
			if err != nil {
				return fmt.Errorf("%w: %v", roche.ErrInvalidConfig, err)
			}
			src := cmp.Or(rochedAgent, guestbin.Path())
			if src == "" {
				return fmt.Errorf("%w: no roche-agent found: pass --agent PATH, or %s", roche.ErrInvalidConfig, guestbin.Install)
			}
			f, err := os.Create(rochedOut)
			if err != nil {
				return fmt.Errorf("writing the roched image: %w", err)
			}
			ref, err := e.local.WriteRochedImage(f, daemon, src)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				os.Remove(rochedOut)
				return err
			}
			fmt.Fprintln(e.stdout, ref)
			return nil
		},
	}
	rochedImage.Flags().StringVarP(&rochedOut, "output", "o", "", "file to write the image tarball to")
	rochedImage.Flags().StringVar(&rochedPath, "roched", "", "roched binary (default: beside roche, else on PATH)")
	rochedImage.Flags().StringVar(&rochedAgent, "agent", "", "roche-agent binary (default: $ROCHE_AGENT, else beside roche)")
	var profileOut string
	profile := &cobra.Command{
		Use:   "seccomp-profile --output FILE",
		Short: "Write Roche's seccomp profile for the nodes (a Localhost profile)",
		Long: `Write Roche's seccomp profile (Docker's default without io_uring, ptrace and a few more)
as the filter a node's container runtime loads for a Localhost profile. Install it on every
node in the kubelet's seccomp directory (/var/lib/kubelet/seccomp/roche.json): the
kubernetes provider's sandboxes run under it, and a create on a node without it fails
saying so. --seccomp-profile RuntimeDefault runs them under the runtime's default profile
instead, which on containerd before 2.0 allows io_uring and ptrace. Make it on a machine
whose kernel and architecture are the nodes'.`,
		Example: `  roche kubernetes seccomp-profile --output /var/lib/kubelet/seccomp/roche.json`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if profileOut == "" {
				return fmt.Errorf("%w: --output FILE is required: where to write the profile", roche.ErrInvalidConfig)
			}
			b, err := e.local.SeccompProfile()
			if err != nil {
				return err
			}
			if err := os.WriteFile(profileOut, append(b, '\n'), 0o644); err != nil {
				return fmt.Errorf("writing the seccomp profile: %w", err)
			}
			return nil
		},
	}
	profile.Flags().StringVarP(&profileOut, "output", "o", "", "file to write the profile to")
	c.AddCommand(image, rochedImage, profile)
	return c
}
