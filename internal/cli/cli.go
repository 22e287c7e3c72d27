// Package cli wires the roche command line: flags and subcommands on top of the core
// library and the providers, with one rule for failures: one line on stderr that says
// what to do, and a non-zero exit.
package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"

	"github.com/spf13/cobra"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/internal/buildinfo"
	"github.com/roche-sandbox/roche/internal/catalog"
	"github.com/roche-sandbox/roche/internal/defaults"
	"github.com/roche-sandbox/roche/internal/interrupt"
	"github.com/roche-sandbox/roche/internal/remedy"
	"github.com/roche-sandbox/roche/internal/wire"
)

// Exit codes besides the command's own.
const (
	exitError       = 1   // roche itself failed
	exitRocheFailed = 125 // exec/run: roche failed, the command may not have run (as docker run)
	exitCodeTimeout = 124 // exec/run/code: the command timed out, as timeout(1) says
	exitInterrupted = 130 // Ctrl-C (SIGINT); SIGTERM exits 143, 128 + the signal, as shells report
)

// exitCode carries a process exit status through cobra's error return.
type exitCode int

func (e exitCode) Error() string { return fmt.Sprintf("exit status %d", int(e)) }

// env holds the process's streams and environment, so tests can run the CLI in-process.
type env struct {
	args           []string // as Main got them, for a handoff
	stdin          io.Reader
	stdout, stderr io.Writer
	getenv         func(string) string
	log            *slog.Logger
	providers      *registry
	daemon         *daemonLink // roched, used when it answers (daemon.go)
	// owner is the Config.Owner of the sandboxes made in-process (owner.go), looked up
	// on first use: a command through roched never needs it.
	owner func() string
	// local is what this binary does in-process; nil in the thin roche (local.go).
	local Local
}

// Main runs the roche command with args (without the program name) and returns the
// process exit status. local opens providers in this process (roched's, run as roche);
// with none (the thin roche binary), a command that needs one is handed to roched.
func Main(args []string, stdin io.Reader, stdout, stderr io.Writer, local Local) int {
	e := &env{args: args, stdin: stdin, stdout: stdout, stderr: stderr, getenv: os.Getenv, local: local}
	e.owner = sync.OnceValue(defaults.DirectOwner)
	level := slog.LevelWarn
	if os.Getenv("ROCHE_DEBUG") != "" {
		level = slog.LevelDebug
	}
	e.log = slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	e.providers = newRegistry(e.log, local, e.handoff)
	defer e.providers.close()

	ctx, stop := interrupt.Context(stderr, "roche")
	defer stop()
	ctx = withTraceparent(ctx, e.getenv, e.log)

	root := e.rootCommand()
	defer e.daemon.close()
	root.SetArgs(args)
	root.SetIn(stdin)
	root.SetOut(stdout)
	root.SetErr(stderr)
	cmd, err := root.ExecuteContextC(ctx)
	if err == nil {
		return 0
	}
	var code exitCode
	if errors.As(err, &code) {
		return int(code)
	}
	err = e.directHint(unknownCommand(cmd, err))
	asked, _ := cmd.Flags().GetBool("json")
	status, msg := exitError, oneLine(err)
	if asked {
		// A program (an SDK) reads the fix as a setting, not a flag (roche.Remedy).
		msg = strings.Join(strings.Fields(remedy.Advise(err, remedy.ForClient)), " ")
	}
	if partial(err) {
		status = exitIncomplete
	}
	var sig interrupt.Signal
	if errors.As(context.Cause(ctx), &sig) {
		status, msg = sig.ExitCode(), fmt.Sprintf("interrupted (%s): %s", sig, msg)
	}
	if asked {
		// What asked for JSON gets its error as JSON too: programs (the SDKs) read the
		// reason instead of matching English.
		body := jsonErrorBody{Reason: wire.Reason(err), Message: msg, Skipped: skippedOf(err)}
		if body.Skipped != nil {
			body.Reason = "incomplete"
		}
		if after, ok := roche.RetryDelay(err); ok {
			body.RetryAfterMs = max(after.Milliseconds(), 1)
		}
		b, _ := json.Marshal(jsonError{Error: body})
		fmt.Fprintf(stderr, "%s\n", b)
		return status
	}
	fmt.Fprintf(stderr, "roche: %s\n", msg)
	return status
}

// jsonError is how a command given --json reports its failure on stderr, one line:
// {"error": {"reason": "not_found", "message": "..."}}. reason is one of the core's
// sentinels as internal/wire.Reason spells them, or "" when none applies;
// retry_after_ms, when present, is how long a refusal that passes (a pool's full
// queue) suggests waiting before asking again.
type jsonError struct {
	Error jsonErrorBody `json:"error"`
}

type jsonErrorBody struct {
	Reason       string `json:"reason"`
	Message      string `json:"message"`
	RetryAfterMs int64  `json:"retry_after_ms,omitempty"`
	// Skipped, with reason "incomplete", are the providers a list or count skipped
	// (exit status 3): what it printed lacks their part.
	Skipped []skippedJSON `json:"skipped,omitempty"`
}

// oneLine keeps an error to a single line, a fix it carries worded for the command line
// (roche.Remedy).
func oneLine(err error) string {
	return strings.Join(strings.Fields(remedy.Advise(err, remedy.ForCLI)), " ")
}

func (e *env) rootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:   "roche",
		Short: "Run untrusted code in sandboxes with secure defaults",
		Long: `roche runs untrusted, LLM-written code in isolated sandboxes with secure defaults:
no network, read-only root (1 GiB of disk when --writable), a 64 MiB /tmp, 512 MiB
memory without swap, 1 CPU, 64 processes, a 300 s lifetime, no-new-privileges, every
capability dropped, Roche's seccomp profile and a non-root uid of the sandbox's own.
Every default can be overridden.

Providers (--provider, or ROCHE_PROVIDER for the default):
` + catalog.Help(),
		Example: `  roche run --image roche/python:local -- python3 -c "print('hello')"
  id=$(roche create --image roche/python:local) && roche exec --sandbox "$id" -- ls / && roche destroy "$id"`,
		SilenceErrors: true,
		SilenceUsage:  true,
	}
	root.Version = buildinfo.Version()
	root.SetVersionTemplate("roche {{.Version}}\n")
	root.SetFlagErrorFunc(flagError)
	root.AddCommand(
		e.createCommand(), e.execCommand(), e.runCommand(), e.destroyCommand(),
		e.listCommand(), e.gcCommand(), e.cpCommand(), e.pauseCommand(true), e.pauseCommand(false), e.resumeCommand(), e.forkCommand(),
		e.daemonCommand(), e.poolCommand(), e.mcpCommand(), e.workspaceCommand(), e.resetCommand(),
		e.snapshotCommand(), e.kubernetesCommand(), e.codeCommand(), e.contextCommand(), e.shellCommand(),
		e.imageCommand(), e.filesCommand(), e.commandsCommand(), e.setTimeoutCommand(), e.egressCommand(), e.secretCommand(), e.e2bCommand(),
		e.doctorCommand(), e.uiCommand(),
		e.inspectCommand(),
	)
	friendlyArgs(root)
	e.addDaemonFlags(root)
	pf := root.PersistentFlags()
	pf.DurationVar(&e.providers.engineTimeout, "engine-timeout", defaults.EngineTimeout,
		"how long a create waits for the engine (Docker) before failing; lists and destroys wait 10 s (in this process; roched has its own)")
	pf.StringVar(&e.providers.transport, "transport", defaults.Transport,
		"how commands reach Docker sandboxes made here: agent (roche-agent inside), or docker-exec (Docker's exec API: slower, no files API)")
	pf.StringVar(&e.providers.runtime, "runtime", "", "runtime of Docker sandboxes made here: runc (the default) or runsc (gVisor: no network but an allowlist; scripts/runsc.sh registers it)")
	pf.StringVar(&e.providers.kubeconfig, "kubeconfig", "", "kubeconfig of the kubernetes provider's cluster (default: $KUBECONFIG, else the in-cluster configuration)")
	pf.StringVar(&e.providers.namespace, "namespace", "", "namespace of the kubernetes provider's sandboxes (default: roche, made when missing)")
	pf.StringVar(&e.providers.runtimeClass, "runtime-class", "", "RuntimeClass of the kubernetes provider's Pods (e.g. gvisor, kata: one the cluster defines)")
	pf.StringVar(&e.providers.storageClass, "kube-storage-class", "", "StorageClass of the kubernetes provider's new workspaces (PersistentVolumeClaims; default: the cluster's default class)")
	pf.StringVar(&e.providers.agentImage, "agent-image", "", "the kubernetes provider's agent image as the nodes pull it (default: roche/agent:<digest of the local roche-agent>; see roche kubernetes agent-image)")
	pf.StringVar(&e.providers.seccompProfile, "seccomp-profile", "", "seccomp profile of the kubernetes provider's Pods: a Localhost profile on every node (default roche.json, Roche's: roche kubernetes seccomp-profile installs it), or RuntimeDefault for the runtime's own, weaker one")
	pf.StringVar(&e.providers.ociRuntime, "oci-runtime", "", "the oci provider's OCI runtime: crun or runc (default: the fastest that works on this host; runsc is refused, see docs/providers/oci.md)")
	root.CompletionOptions.DisableDefaultCmd = true
	root.PersistentPreRunE = func(cmd *cobra.Command, _ []string) error { return e.refuseProviderFlags(cmd) }
	return root
}

// noProviders marks a command that opens no provider (roched's pools, its start and
// stop), where a provider's flag would do nothing: refuseProviderFlags says so.
var noProviders = map[string]string{"roche.providers": "none"}

// refuseProviderFlags refuses a provider's flag given to a command that opens none, as
// a flag that silently does nothing: roche pool warmup --runtime runsc would warm
// roched's pools on roched's runtime.
func (e *env) refuseProviderFlags(cmd *cobra.Command) error {
	for c := cmd; c != nil; c = c.Parent() {
		if c.Annotations["roche.providers"] == "none" {
			if given := catalog.Given(e.providers.options()); len(given) > 0 {
				return fmt.Errorf("%w: %v is the %s provider's, and %s opens no provider: roched's sandboxes and pools run on roched's own settings (roched --help); leave it out",
					roche.ErrInvalidConfig, given[0], given[0].Provider, cmd.CommandPath())
			}
			return nil
		}
	}
	return nil
}

// printJSON writes v as indented JSON.
func (e *env) printJSON(v any) error {
	enc := json.NewEncoder(e.stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// friendly rewrites core errors whose text alone would not say what to do.
func friendly(err error) error {
	if errors.Is(err, roche.ErrInvalidConfig) {
		return fmt.Errorf("%w (see --help)", err)
	}
	return err
}
