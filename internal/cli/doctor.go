package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/client"
	"github.com/roche-sandbox/roche/internal/buildinfo"
	"github.com/roche-sandbox/roche/internal/catalog"
	"github.com/roche-sandbox/roche/internal/doctor"
	"github.com/roche-sandbox/roche/provider/kit"
)

func (e *env) doctorCommand() *cobra.Command {
	var (
		asJSON   bool
		image    string
		provider string
		timeout  time.Duration
	)
	c := &cobra.Command{
		Use:   "doctor [--json]",
		Short: "Say which providers can run here and, for each that cannot, the fix",
		Long: `Check, for every provider (docker on runc and on runsc, oci on crun and on runc, wasm,
qemu, firecracker, kubernetes), whether it can run sandboxes on this host, with the
checks its create makes: the engine answering, the image present, the runtime
registered, KVM (or QEMU's TCG emulation only), python.wasm, the cluster reachable,
the agent binary. For one that cannot, it prints the one missing piece and the command
that fixes it. Then the host's facts (kernel, cgroup version and delegation, user
namespaces) and whether roched answers on --socket, and its version.

Each provider is checked at once, each within --timeout, so an engine that hangs costs
the report that long and no more. Nothing is created.

Exit status: 0 when the default provider (--provider, ROCHE_PROVIDER, else docker) can
run sandboxes here, 1 when it cannot; the others are reported and do not change it.
--json prints the report as one JSON object (docs/doctor.md has its schema).`,
		Example: `  roche doctor
  roche doctor --json | jq '.providers[] | select(.ok | not) | {name, missing, fix}'
  ROCHE_PROVIDER=wasm roche doctor && echo "wasm works here"`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if _, err := catalog.Lookup(provider); err != nil {
				return err
			}
			if timeout <= 0 {
				return fmt.Errorf("%w: --timeout %v: give a positive duration such as 4s", roche.ErrInvalidConfig, timeout)
			}
			open := func(string, catalog.Options) (roche.Provider, error) { return nil, errNoFullBinary }
			if !e.fullLocal() {
				// The providers are the full binary's; it runs this command as it is.
				if err := e.handoff(); !errors.As(err, new(handoffError)) {
					return err
				}
			} else {
				open = e.local.Open
			}
			settings := e.providers.options()
			settings.Log = slog.New(slog.DiscardHandler) // the report says what the log would
			r := doctor.Run(cmd.Context(), doctor.Options{
				Open: open, Settings: settings, Image: image, Default: provider, Timeout: timeout, Roched: e.rochedFinding,
			})
			if asJSON {
				if err := e.printJSON(r); err != nil {
					return err
				}
			} else {
				r.Text(e.stdout)
			}
			if !r.DefaultOK {
				return exitCode(exitError)
			}
			return nil
		},
	}
	defProvider := catalog.Default
	if v := e.getenv("ROCHE_PROVIDER"); v != "" {
		defProvider = v
	}
	c.Flags().BoolVar(&asJSON, "json", false, "print the report as a JSON object (schema: docs/doctor.md)")
	c.Flags().StringVar(&image, "image", kit.DiagnoseImage, "the image to look for, for the providers that run images")
	c.Flags().StringVar(&provider, "provider", defProvider, "the provider whose state sets the exit status (env ROCHE_PROVIDER)")
	c.Flags().DurationVar(&timeout, "timeout", doctor.DefaultTimeout, "how long each provider's checks may take")
	return c
}

// rochedFinding says whether roched answers on --socket, and whether it is this roche's
// version. roche works without it (in its own process), so its absence is optional.
func (e *env) rochedFinding(ctx context.Context) kit.Finding {
	var f kit.Finding
	c, err := client.New(client.WithSocket(e.daemon.socket))
	if err == nil {
		defer c.Close()
		var h client.Health
		h, err = c.Health(ctx)
		switch {
		case err != nil:
		case h.Version != buildinfo.Version():
			return kit.Lacks("roched", fmt.Errorf("%w: roched %s answers on %s (pid %d), and this roche is %s", roche.ErrUnavailable, h.Version, e.daemon.socket, h.PID, buildinfo.Version()),
				"roche daemon stop && roche daemon start", false)
		default:
			return kit.Found("roched", nil, fmt.Sprintf("roched %s on %s (pid %d, %s): providers %s", h.Version, e.daemon.socket, h.PID, h.Status, strings.Join(h.Providers, ", ")))
		}
	}
	f = kit.Lacks("roched", fmt.Errorf("%w: roched is not answering on %s: roche runs providers in its own process without it", roche.ErrUnavailable, e.daemon.socket),
		"roche daemon start", false)
	f.Optional = true
	return f
}
