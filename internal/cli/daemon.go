package cli

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/roche-sandbox/roche"
	rochev1 "github.com/roche-sandbox/roche/api/roche/v1"
	"github.com/roche-sandbox/roche/client"
	"github.com/roche-sandbox/roche/internal/catalog"
	"github.com/roche-sandbox/roche/internal/defaults"
)

// daemonLink is the CLI's connection to roched: made on first use, and only when a
// daemon answers on the socket; otherwise the CLI runs providers in-process.
type daemonLink struct {
	socket string
	direct bool
	// remote is roched over TCP (--address and its TLS settings, remote.go); when set,
	// every provider goes through it and nothing falls back to this process.
	remote remoteDaemon

	once      sync.Once
	c         *client.Client
	providers []string // the providers the daemon serves
}

// addDaemonFlags adds --socket and --direct to every command and routes providers the
// daemon serves through it.
func (e *env) addDaemonFlags(root *cobra.Command) {
	e.daemon = &daemonLink{}
	def := e.getenv("ROCHE_SOCKET")
	if def == "" {
		def = client.StandardSocket()
	}
	pf := root.PersistentFlags()
	pf.StringVar(&e.daemon.socket, "socket", def, "roched's unix socket (env ROCHE_SOCKET); used when it answers")
	pf.BoolVar(&e.daemon.direct, "direct", false, "never use roched: run the provider inside this process (the sandboxes it makes stay yours through roched too)")
	e.addRemoteFlags(pf)
	e.providers.remote = e.remoteProvider
	e.providers.remoteErr = e.daemon.remoteErr
	e.providers.guard = e.refuseManaged
}

// refuseManaged refuses to act in-process on a sandbox roched made while roched is not
// answering: it may depend on what only roched applies (the env and workdir of a pooled
// sandbox, an expiry earlier than the engine's), which acting directly would silently
// drop. --direct says to go ahead without them. The sandbox's own owner says whether a
// roched made it, so the guard holds whether or not roched's state file is where the
// socket says (roched --state), readable and whole.
func (e *env) refuseManaged(id string, p roche.Provider) error {
	if _, remote := p.(*client.Provider); remote || e.daemon.direct {
		return nil
	}
	if !client.DaemonManaged(e.daemon.socket, id) {
		owned, err := daemonOwned(p, id)
		if err != nil && !errors.Is(err, roche.ErrNotFound) {
			return err // the command's own call would fail the same way, after as long
		}
		if !owned {
			return nil
		}
	}
	return fmt.Errorf("%w: sandbox %s is managed by roched, which is not answering on %s: start it (roche daemon start) or pass --direct to act on it without its env and workdir",
		roche.ErrUnavailable, id, e.daemon.socket)
}

// daemonOwned reports whether sandbox id carries a roched's owner. For Docker the
// inspect is not an extra round trip: the provider keeps what it verified for the
// command's own lookup.
func daemonOwned(p roche.Provider, id string) (bool, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	sb, err := p.Inspect(ctx, id)
	return err == nil && strings.HasPrefix(sb.Owner, defaults.DaemonOwnerPrefix), err
}

// connect probes the daemon once. A missing socket fails at once; a hung daemon gets a
// short wait before the CLI works without it.
func (d *daemonLink) connect(e *env) *client.Client {
	if d.direct {
		return nil
	}
	if d.remote.address != "" {
		return d.connectRemote(e)
	}
	d.once.Do(func() {
		// No socket, no roched: said before a client is made, which costs more than
		// the rest of the probe (its RPC methods' descriptors), in every process that
		// works directly (the thin roche, then roche-run).
		if _, err := os.Lstat(d.socket); errors.Is(err, fs.ErrNotExist) {
			e.log.Debug("roched not answering: working directly", "socket", d.socket, "err", err)
			return
		}
		c, err := client.New(client.WithSocket(d.socket))
		if err != nil {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		h, err := c.Health(ctx)
		if err != nil {
			e.log.Debug("roched not answering: working directly", "socket", d.socket, "err", err)
			c.Close()
			return
		}
		e.log.Debug("using roched", "socket", d.socket, "pid", h.PID, "providers", h.Providers)
		d.c, d.providers = c, h.Providers
	})
	return d.c
}

func (d *daemonLink) close() {
	if d != nil && d.c != nil {
		d.c.Close()
	}
}

// remoteProvider returns the daemon's view of the named provider when a daemon answers
// and serves it, else nil (the registry then opens the provider in-process).
func (e *env) remoteProvider(name string) roche.Provider {
	c := e.daemon.connect(e)
	if c == nil || !slices.Contains(e.daemon.providers, name) {
		return nil
	}
	return c.Provider(name)
}

// requireDaemon is for commands that only make sense with a daemon.
func (e *env) requireDaemon(hint string) (*client.Client, error) {
	if e.daemon.direct {
		return nil, errors.New("this command talks to roched: drop --direct")
	}
	if c := e.daemon.connect(e); c != nil {
		return c, nil
	}
	if err := e.daemon.remote.err; err != nil {
		return nil, err
	}
	return nil, fmt.Errorf("roched is not running on %s: %s", e.daemon.socket, hint)
}

func (e *env) daemonCommand() *cobra.Command {
	c := &cobra.Command{
		Use:   "daemon start|stop|status|client-cert",
		Short: "Start, stop or check roched, the daemon with warm pools",
		Long: `roched serves the Roche API on a unix socket, keeps warm pools so creates take
milliseconds, and destroys sandboxes at their expiry. While it answers on --socket,
every roche command goes through it (--direct skips it). The sandboxes you made in
direct mode, before it started or with --direct, stay yours through it: listed and
reachable as before (roched serves its own user's, on its socket; it never destroys one
unasked). One you made under another owner (ROCHE_OWNER) than roched's --direct-owner
is "not found" through it, and roche says to pass --direct.`,
		Example: `  roche daemon start --pool 'docker/roche/python:local?min=2&max=5'
  roche daemon status
  roche daemon stop`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return fmt.Errorf("give a subcommand: start, stop or status (see %s --help)", cmd.CommandPath())
		},
	}
	c.AddCommand(e.daemonStartCommand(), e.daemonStopCommand(), e.daemonStatusCommand(), e.daemonClientCertCommand())
	return c
}

func (e *env) daemonStartCommand() *cobra.Command {
	var pools, mountRoots []string
	var config, roched, logFile, listen, tokenFile, tokensFile string
	var tlsCert, tlsKey, clientCA string
	var makeTLS, insecure bool
	var maxSandboxes int
	c := &cobra.Command{
		Use:   "start [flags] [-- ROCHED_FLAGS...]",
		Short: "Start roched in the background",
		Long: `Start roched in the background on --socket and wait until it answers. Its log goes
to --log. Flags after -- are passed to roched as they are (see roched --help), and so
are the providers' flags given to roche (--runtime, --oci-runtime, --kubeconfig, ...).
roched is looked for beside this roche binary, then on PATH (--roched overrides).
With --listen, clients on TCP need a token: roched reads it from --token-file (mode
0600) or ROCHE_TOKEN, never from its command line, where every local user could read it.
TCP on an address that is not loopback needs TLS (--tls-cert and --tls-key) or
--insecure. --tls makes a local CA and a certificate it signs for the --listen host
(and this host's names and loopback), under roched's state directory (keys mode 0600),
the CA kept across starts and the certificate renewed when it nears its end; it prints
what clients set: ROCHE_ADDRESS and ROCHE_CA_FILE (roche --ca, Roche(ca=...)).`,
		Example: `  roche daemon start --pool 'docker/roche/python:local?min=2&max=5&total=20&idle_timeout=600'
  roche daemon start --config /etc/roche/roched.json
  roche daemon start --listen tcp://127.0.0.1:7878 --token-file ~/.roche/token
  roche daemon start --listen tcp://0.0.0.0:7878 --tls --token-file ~/.roche/token
  roche daemon start -- --log-level debug --pool-concurrency 4`,
		RunE: func(cmd *cobra.Command, extra []string) error {
			sock := e.daemon.socket
			probe, _ := client.New(client.WithSocket(sock))
			defer probe.Close()
			if h, err := probe.Health(cmd.Context()); err == nil {
				fmt.Fprintf(e.stdout, "roched is already running on %s (pid %d)\n", sock, h.PID)
				return nil
			}
			bin, err := findRoched(roched)
			if err != nil {
				return err
			}
			args := []string{"--socket", sock}
			for _, p := range pools {
				args = append(args, "--pool", p)
			}
			if config != "" {
				args = append(args, "--config", config)
			}
			if cmd.Flags().Changed("max-sandboxes") {
				args = append(args, "--max-sandboxes", fmt.Sprint(maxSandboxes))
			}
			var tlsNote string
			if makeTLS {
				if tlsCert != "" || tlsKey != "" {
					return errors.New("--tls makes its own certificate: give either --tls or --tls-cert and --tls-key")
				}
				ca, note, err := localTLS(listen, filepath.Dir(client.StateFile(sock)))
				if err != nil {
					return err
				}
				tlsCert, tlsKey, tlsNote = ca.Cert, ca.Key, note
			}
			for _, f := range [][2]string{{"--listen", listen}, {"--token-file", tokenFile}, {"--tokens-file", tokensFile},
				{"--tls-cert", tlsCert}, {"--tls-key", tlsKey}, {"--client-ca", clientCA}} {
				if f[1] != "" {
					args = append(args, f[0], f[1])
				}
			}
			if insecure {
				args = append(args, "--insecure")
			}
			for _, r := range mountRoots {
				args = append(args, "--allow-mount-root", r)
			}
			// The providers' flags given to roche are roched's to use.
			for _, f := range catalog.Given(e.providers.options()) {
				if f.Name == "transport" {
					return fmt.Errorf("%w: %v: roched's Docker sandboxes always run commands through roche-agent; leave it out", roche.ErrInvalidConfig, f)
				}
				args = append(args, "--"+f.Name, f.Value)
			}
			if cmd.Flags().Changed("engine-timeout") {
				args = append(args, "--engine-timeout", e.providers.engineTimeout.String())
			}
			args = append(args, extra...)
			if logFile == "" {
				logFile = filepath.Join(filepath.Dir(sock), "roched.log")
			}
			if err := os.MkdirAll(filepath.Dir(logFile), 0o700); err != nil {
				return fmt.Errorf("creating the log's directory: %w", err)
			}
			lf, err := os.OpenFile(logFile, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
			if err != nil {
				return fmt.Errorf("opening the log: %w (pass --log FILE)", err)
			}
			defer lf.Close()
			proc := exec.Command(bin, args...)
			proc.Stdout, proc.Stderr = lf, lf
			proc.SysProcAttr = detached()
			if err := proc.Start(); err != nil {
				return fmt.Errorf("starting %s: %w", bin, err)
			}
			exited := make(chan error, 1)
			go func() { exited <- proc.Wait() }()
			deadline := time.After(60 * time.Second)
			for {
				ctx, cancel := context.WithTimeout(cmd.Context(), time.Second)
				h, err := probe.Health(ctx)
				cancel()
				if err == nil && h.PID == proc.Process.Pid {
					fmt.Fprintf(e.stdout, "roched started on %s (pid %d, log %s)\n", sock, h.PID, logFile)
					if tlsNote != "" {
						fmt.Fprint(e.stdout, tlsNote)
					}
					return nil
				}
				select {
				case <-exited:
					return fmt.Errorf("roched exited at start: %s (log: %s)", lastLine(logFile), logFile)
				case <-deadline:
					_ = proc.Process.Kill()
					return fmt.Errorf("roched did not answer on %s within 60 s; see %s", sock, logFile)
				case <-cmd.Context().Done():
					_ = proc.Process.Kill()
					return cmd.Context().Err()
				case <-time.After(50 * time.Millisecond):
				}
			}
		},
	}
	c.Flags().StringArrayVar(&pools, "pool", nil, "warm pool, PROVIDER/IMAGE?min=N&max=N&total=N&idle_timeout=SECS (repeatable)")
	c.Flags().StringVar(&config, "config", "", "roched's JSON config file")
	c.Flags().IntVar(&maxSandboxes, "max-sandboxes", 100, "most sandboxes handed out at once; 0 means no limit")
	c.Flags().StringVar(&roched, "roched", "", "path of the roched binary")
	c.Flags().StringVar(&logFile, "log", "", "roched's log file (default: roched.log beside the socket)")
	c.Flags().StringVar(&listen, "listen", "", "also serve TCP, tcp://HOST:PORT (needs a token)")
	c.Flags().StringVar(&tokenFile, "token-file", "", "file (mode 0600) with the TCP clients' bearer token (or env ROCHE_TOKEN)")
	c.Flags().StringVar(&tokensFile, "tokens-file", "", "JSON file (mode 0600) of tenants and their token hashes (see roched --help)")
	c.Flags().StringArrayVar(&mountRoots, "allow-mount-root", nil, "host directory TCP tenants may mount at or below (repeatable)")
	c.Flags().BoolVar(&makeTLS, "tls", false, "serve --listen over TLS with a local CA and certificate made under roched's state directory")
	c.Flags().StringVar(&tlsCert, "tls-cert", "", "PEM certificate to serve --listen with (reloaded when it changes)")
	c.Flags().StringVar(&tlsKey, "tls-key", "", "PEM key of --tls-cert")
	c.Flags().StringVar(&clientCA, "client-ca", "", "PEM CA: TCP clients must present a certificate it signed (its Common Name is the tenant)")
	c.Flags().BoolVar(&insecure, "insecure", false, "allow plaintext TCP on an address that is not loopback")
	return c
}

// findRoched locates the daemon binary: the flag, then beside this executable (its
// symlinks resolved), then PATH.
func findRoched(flag string) (string, error) {
	if flag != "" {
		return flag, nil
	}
	for _, p := range rochedCandidates(executable()) {
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() {
			return p, nil
		}
	}
	return "", errors.New("cannot find roched beside roche or on PATH: pass --roched PATH, or " + installBoth)
}

// lastLine returns a log file's last non-empty line, which says why a start failed.
func lastLine(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return "no log"
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return lines[len(lines)-1]
}

func (e *env) daemonStopCommand() *cobra.Command {
	var timeout time.Duration
	c := &cobra.Command{
		Use:         "stop",
		Annotations: noProviders,
		Short:       "Stop roched gracefully",
		Long: `Ask roched to stop (SIGTERM) and wait until it has: it finishes calls in progress,
destroys its idle pooled sandboxes and saves its state. Sandboxes handed to clients keep
running; the next roched adopts them.`,
		Example: "  roche daemon stop",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := client.New(client.WithSocket(e.daemon.socket))
			if err != nil {
				return err
			}
			defer c.Close()
			h, err := c.Health(cmd.Context())
			if err != nil {
				fmt.Fprintf(e.stdout, "roched is not running on %s\n", e.daemon.socket)
				return nil
			}
			proc, err := os.FindProcess(h.PID)
			if err == nil {
				err = proc.Signal(syscall.SIGTERM)
			}
			if err != nil {
				return fmt.Errorf("signalling roched (pid %d): %w", h.PID, err)
			}
			deadline := time.Now().Add(timeout)
			for time.Now().Before(deadline) {
				ctx, cancel := context.WithTimeout(cmd.Context(), time.Second)
				_, err := c.Health(ctx)
				cancel()
				c.Close() // a fresh connection each time, so a closed socket shows
				if err != nil && !processAlive(h.PID) {
					fmt.Fprintf(e.stdout, "roched stopped (pid %d)\n", h.PID)
					return nil
				}
				time.Sleep(100 * time.Millisecond)
			}
			return fmt.Errorf("roched (pid %d) is still running after %v: see its log, or kill -9 %d (the next start cleans up)", h.PID, timeout, h.PID)
		},
	}
	// roched waits up to its --shutdown-timeout (30 s) for calls, then drains its pools.
	c.Flags().DurationVar(&timeout, "timeout", 2*time.Minute, "give up waiting after this long")
	return c
}

func (e *env) daemonStatusCommand() *cobra.Command {
	var asJSON bool
	c := &cobra.Command{
		Use:         "status [--json]",
		Annotations: noProviders,
		Short:       "Show whether roched is running, and its pools",
		Long:        "Show whether roched answers on --socket, and its pools. Exits 1 when it is not running.",
		Example:     "  roche daemon status\n  roche daemon status --json",
		Args:        cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := client.New(client.WithSocket(e.daemon.socket))
			if err != nil {
				return err
			}
			defer c.Close()
			h, err := c.Health(cmd.Context())
			if err != nil {
				return fmt.Errorf("roched is not running on %s: start it with roche daemon start", e.daemon.socket)
			}
			pools, err := c.PoolStatus(cmd.Context())
			if err != nil {
				return err
			}
			if asJSON {
				return e.printJSON(struct {
					Socket string `json:"socket"`
					client.Health
					Pools []*rochev1.Pool `json:"pools"`
				}{e.daemon.socket, h, pools})
			}
			fmt.Fprintf(e.stdout, "roched %s running on %s (%s): pid %d, up %s, providers %s, %d sandboxes handed out\n",
				h.Version, e.daemon.socket, h.Status, h.PID, time.Since(h.StartedAt).Round(time.Second), strings.Join(h.Providers, ", "), h.Sandboxes)
			for _, name := range slices.Sorted(maps.Keys(h.Engines)) {
				if eh := h.Engines[name]; !eh.Up {
					fmt.Fprintf(e.stdout, "%s: engine not answering since %s, creates refused: %s\n", name, eh.Since.Format(time.TimeOnly), eh.Error)
				}
			}
			for _, name := range slices.Sorted(maps.Keys(h.Unavailable)) {
				fmt.Fprintf(e.stdout, "%s: cannot make sandboxes: %s\n", name, h.Unavailable[name])
			}
			if len(pools) > 0 {
				return e.printPools(pools)
			}
			return nil
		},
	}
	c.Flags().BoolVar(&asJSON, "json", false, "print a JSON object")
	return c
}

// printPools prints pools as a table.
func (e *env) printPools(pools []*rochev1.Pool) error {
	tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "POOL\tIDLE\tTARGET\tCREATING\tWAITING\tIN USE\tHITS\tMISSES\tMIN\tMAX\tTOTAL\tIDLE TIMEOUT\tSTATE")
	for _, p := range pools {
		state := "ready"
		switch {
		case p.Drained:
			state = "drained"
		case p.LastError != "":
			state = "failing: " + p.LastError
		}
		total := "-"
		if p.MaxTotal > 0 {
			total = fmt.Sprint(p.MaxTotal)
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%s\t%s\t%s\n", p.Key, p.Idle, p.Target, p.Creating, p.Waiting, p.InUse, p.Hits, p.Misses,
			p.MinIdle, p.MaxIdle, total, p.IdleTimeout.AsDuration(), state)
	}
	return tw.Flush()
}

const poolHint = "start it with roche daemon start --pool 'docker/roche/python:local?min=2'"

func (e *env) poolCommand() *cobra.Command {
	c := &cobra.Command{
		Use:         "pool status|warmup|drain",
		Annotations: noProviders,
		Short:       "Inspect and manage roched's warm pools",
		Long: `roched keeps warm pools of idle sandboxes per provider/image, so a create whose config
matches (env and workdir may differ) takes milliseconds. Pools are set when roched starts
(--pool or its config file).`,
		Example: `  roche pool status
  roche pool warmup docker/roche/python:local --count 5
  roche pool drain`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return fmt.Errorf("give a subcommand: status, warmup or drain (see %s --help)", cmd.CommandPath())
		},
	}
	var asJSON bool
	status := &cobra.Command{
		Use:     "status [--json]",
		Short:   "Show each pool's idle, creating and handed-out sandboxes, hits and misses",
		Example: "  roche pool status\n  roche pool status --json",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := e.requireDaemon(poolHint)
			if err != nil {
				return err
			}
			pools, err := c.PoolStatus(cmd.Context())
			if err != nil {
				return err
			}
			if asJSON {
				if pools == nil {
					pools = []*rochev1.Pool{}
				}
				return e.printJSON(pools)
			}
			if len(pools) == 0 {
				fmt.Fprintln(e.stdout, "roched has no pools: give them when starting it, e.g. --pool 'docker/roche/python:local?min=2'")
				return nil
			}
			return e.printPools(pools)
		},
	}
	status.Flags().BoolVar(&asJSON, "json", false, "print a JSON array")

	var count int
	var timeout time.Duration
	warmup := &cobra.Command{
		Use:   "warmup [PROVIDER/IMAGE] [--count N]",
		Short: "Fill pools now and wait until they are ready",
		Long: `Fill a pool (every pool without an argument) to --count idle sandboxes, at most its
max (default: its min), and wait. A drained pool resumes refilling.`,
		Example: "  roche pool warmup\n  roche pool warmup docker/roche/python:local --count 5",
		Args:    cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := e.requireDaemon(poolHint)
			if err != nil {
				return err
			}
			if count < 0 {
				return fmt.Errorf("--count %d is negative: give how many idle sandboxes to have ready", count)
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			pools, err := c.PoolWarmup(ctx, firstArg(args), count)
			if err != nil {
				return err
			}
			return e.printPools(pools)
		},
	}
	warmup.Flags().IntVar(&count, "count", 0, "idle sandboxes to have ready (default: the pool's min)")
	warmup.Flags().DurationVar(&timeout, "timeout", 5*time.Minute, "give up waiting after this long")

	drain := &cobra.Command{
		Use:   "drain [PROVIDER/IMAGE]",
		Short: "Destroy idle pooled sandboxes and stop refilling until the next warmup",
		Long: `Destroy a pool's idle sandboxes (every pool's without an argument) and stop refilling
it until roche pool warmup. Sandboxes already handed out are not touched.`,
		Example: "  roche pool drain\n  roche pool drain docker/roche/python:local",
		Args:    cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := e.requireDaemon(poolHint)
			if err != nil {
				return err
			}
			n, _, err := c.PoolDrain(cmd.Context(), firstArg(args))
			if err != nil {
				return err
			}
			fmt.Fprintf(e.stdout, "destroyed %d idle sandboxes\n", n)
			return nil
		},
	}
	c.AddCommand(status, warmup, drain)
	return c
}

func firstArg(args []string) string {
	if len(args) == 0 {
		return ""
	}
	return args[0]
}
