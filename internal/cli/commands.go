package cli

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/internal/catalog"
	"github.com/roche-sandbox/roche/internal/cli/cliflag"
	"github.com/roche-sandbox/roche/internal/interrupt"
	"github.com/roche-sandbox/roche/internal/secretfile"
	"github.com/roche-sandbox/roche/internal/size"
	"github.com/roche-sandbox/roche/internal/wire"
	"github.com/roche-sandbox/roche/provider/kit"
)

// createFlags are the flags shared by create and run.
type createFlags struct {
	provider  string
	image     string
	memory    string
	disk      string
	wsSize    string
	cpus      float64
	timeout   int
	network   bool
	writable  bool
	env       []string
	mounts    []string
	pidsLimit int
	workdir   string
	user      string
	allowHost []string
	workspace string
	snapshot  string
	metadata  []string
	// secrets: NAME=@FILE; secretHosts: NAME=HOST[:PORT]; secretHeaders: NAME=HEADER
	secrets, secretHosts, secretHeaders []string
	egressLearn                         bool
}

func (e *env) addCreateFlags(fs *pflag.FlagSet, f *createFlags) {
	def := roche.DefaultConfig()
	defProvider := catalog.Default
	if v := e.getenv("ROCHE_PROVIDER"); v != "" {
		defProvider = v
	}
	defImage := def.Image
	if v := e.getenv("ROCHE_IMAGE"); v != "" {
		defImage = v
	}
	fs.StringVar(&f.provider, "provider", defProvider, "isolation backend: "+catalog.List()+" (env ROCHE_PROVIDER)")
	fs.StringVar(&f.image, "image", defImage, "image to run (env ROCHE_IMAGE)")
	fs.StringVar(&f.memory, "memory", def.Memory, "memory limit, no swap: e.g. 256m, 1g")
	fs.StringVar(&f.disk, "disk", def.Disk, "what a --writable root may hold, e.g. 100m, 10g; past it writes fail with ENOSPC (0: no limit)")
	fs.Float64Var(&f.cpus, "cpus", def.CPUs, "CPUs the sandbox may use, e.g. 0.5, 2")
	fs.IntVar(&f.timeout, "timeout", def.TimeoutSecs, "sandbox lifetime in seconds; it is destroyed after")
	fs.BoolVar(&f.network, "network", false, "give the sandbox a full network (off by default); on Docker it never reaches this host's\nown addresses or cloud metadata (host firewall rules, so it needs root)")
	fs.BoolVar(&f.writable, "writable", false, "make the root filesystem writable (read-only by default)")
	fs.StringArrayVar(&f.env, "env", nil, "set an environment variable, KEY=VALUE (repeatable)")
	fs.StringArrayVar(&f.metadata, "metadata", nil, "label the sandbox, KEY=VALUE (repeatable; list --metadata selects on it; keys: letters, digits, '_', '.', '-',\nnot starting with \"roche\")")
	fs.StringArrayVar(&f.mounts, "mount", nil, "bind a host path, HOST:SANDBOX[:ro|rw], read-only by default (repeatable)")
	fs.IntVar(&f.pidsLimit, "pids-limit", def.PidsLimit, "maximum number of processes")
	fs.StringVar(&f.workdir, "workdir", "", "working directory for commands (default: the image's)")
	fs.StringVar(&f.user, "user", def.User, "uid[:gid] commands run as; auto: a non-root uid of the sandbox's own (docker: 1900000000-1900999999,\nor the workspace's)")
	fs.StringVar(&f.snapshot, "from-snapshot", "", "create from the snapshot NAME's files instead of --image (roche snapshot create)")
	fs.StringVar(&f.workspace, "workspace", "", "mount the persistent workspace NAME at /workspace (made if new; outlives the sandbox)")
	fs.StringVar(&f.wsSize, "workspace-size", "", "size of a new --workspace, e.g. 5g (default "+roche.DefaultWorkspaceSize+"); fixed when it is made")
	fs.StringArrayVar(&f.allowHost, "allow-host", nil, "let the sandbox reach this host over HTTP(S) through a proxy, with no network otherwise:\nHOST, *.SUFFIX or HOST:PORT (repeatable; needs roched or roche run); a name resolving to a\nspecial-purpose, cloud metadata or this host's address is refused; \"[GET,...] https://HOST[:PORT][/PATH]\"\nends TLS with a CA made for the sandbox and allows only those methods under that path")
	fs.StringArrayVar(&f.secrets, "secret", nil, "broker a secret, NAME=@FILE (a file only you can read; never the value itself) or NAME (from\nroched's secret store: roche secret set NAME): the sandbox's variable NAME holds a placeholder,\nwhich the proxy replaces by the value in requests to NAME's --secret-host only (repeatable)")
	fs.BoolVar(&f.egressLearn, "egress-learn", false, "learn mode (needs roched): the egress proxy allows only --allow-host's entries (none without),\nand roched keeps every entry the refusals needed, which roche egress suggest ID prints")
	fs.StringArrayVar(&f.secretHosts, "secret-host", nil, "bind a --secret to a host, NAME=HOST[:PORT] (443 by default; repeatable): only requests to it get the value")
	fs.StringArrayVar(&f.secretHeaders, "secret-header", nil, "put a --secret's value in this request header only, NAME=HEADER (e.g. API_TOKEN=Authorization)")
}

// parseSecrets builds the config's secrets from --secret, --secret-host and
// --secret-header, reading each value from its file (private to its owner).
func (f *createFlags) parseSecrets() ([]roche.Secret, error) {
	var out []roche.Secret
	idx := map[string]int{}
	var errs []error
	for _, s := range f.secrets {
		name, file, ok := strings.Cut(s, "=")
		if !ok {
			// From roched's secret store, which fills the value in.
			idx[name] = len(out)
			out = append(out, roche.Secret{Name: name, FromStore: true})
			continue
		}
		if !strings.HasPrefix(file, "@") || len(file) < 2 {
			errs = append(errs, fmt.Errorf("%w: --secret %s: give NAME=@FILE, the value read from FILE (a value on the command line is visible to every user of this host), or NAME alone for roched's secret store", roche.ErrInvalidConfig, name))
			continue
		}
		file = file[1:]
		if err := secretfile.CheckPrivate(file, "--secret "+name); err != nil {
			errs = append(errs, err)
			continue
		}
		b, err := os.ReadFile(file)
		if err != nil {
			errs = append(errs, fmt.Errorf("%w: --secret %s: %v", roche.ErrInvalidConfig, name, err))
			continue
		}
		idx[name] = len(out)
		out = append(out, roche.Secret{Name: name, Value: strings.TrimRight(string(b), "\r\n")})
	}
	for _, flag := range []struct {
		name string
		vals []string
		set  func(*roche.Secret, string)
	}{
		{"--secret-host", f.secretHosts, func(s *roche.Secret, v string) { s.Hosts = append(s.Hosts, v) }},
		{"--secret-header", f.secretHeaders, func(s *roche.Secret, v string) { s.Header = v }},
	} {
		for _, v := range flag.vals {
			name, val, ok := strings.Cut(v, "=")
			i, known := idx[name]
			switch {
			case !ok || val == "":
				errs = append(errs, fmt.Errorf("%w: %s %q: give NAME=VALUE", roche.ErrInvalidConfig, flag.name, v))
			case !known:
				errs = append(errs, fmt.Errorf("%w: %s %s: no --secret %s is given: add --secret %s=@FILE, or --secret %s for the value in roched's secret store", roche.ErrInvalidConfig, flag.name, v, name, name, name))
			default:
				flag.set(&out[i], val)
			}
		}
	}
	return out, errors.Join(errs...)
}

// config builds and validates the sandbox config from the flags, reporting every
// problem at once.
func (f *createFlags) config() (roche.Config, error) {
	cfg := roche.DefaultConfig()
	cfg.Image = f.image
	cfg.Memory = f.memory
	cfg.Disk = f.disk
	cfg.WorkspaceSize = f.wsSize
	cfg.CPUs = f.cpus
	cfg.TimeoutSecs = f.timeout
	cfg.Network = f.network
	cfg.Writable = f.writable
	cfg.PidsLimit = f.pidsLimit
	cfg.Workdir = f.workdir
	cfg.User = f.user
	cfg.NetworkAllowlist = f.allowHost
	cfg.Workspace = f.workspace
	cfg.FromSnapshot = f.snapshot
	cfg.EgressLearn = f.egressLearn
	var errs []error
	env, err := cliflag.ParseEnv(f.env)
	errs = append(errs, err)
	cfg.Env = env
	cfg.Secrets, err = f.parseSecrets()
	errs = append(errs, err)
	md, err := cliflag.ParseMetadata(f.metadata)
	errs = append(errs, err)
	cfg.Metadata = md
	for _, m := range f.mounts {
		mt, err := cliflag.ParseMount(m)
		errs = append(errs, err)
		cfg.Mounts = append(cfg.Mounts, mt)
	}
	if err := errors.Join(errs...); err != nil {
		return cfg, err
	}
	return cfg, cfg.Validate()
}

// create makes a sandbox. Ctrl-C (or SIGTERM) ends it at once: the provider undoes what
// it had made, within a bound, so nothing half-made is left.
// With want.Leased (roche run, create --hold), the sandbox is tied to this process where the provider (or
// roched) has leases: killed outright, this process leaves a sandbox that goes within
// seconds, not at the end of its lifetime. want.OneShot (roche run) tells the provider
// the sandbox is for one command (kit.CreateOptions).
func (e *env) create(ctx context.Context, f *createFlags, want kit.CreateOptions) (roche.Provider, roche.SandboxInfo, error) {
	cfg, err := f.config()
	if err != nil {
		return nil, roche.SandboxInfo{}, friendly(err)
	}
	p, err := e.providers.get(f.provider)
	if err != nil {
		return nil, roche.SandboxInfo{}, err
	}
	if err := needsRoched(p, cfg); err != nil {
		return nil, roche.SandboxInfo{}, err
	}
	// Through roched, the daemon names the owner instead.
	opts := kit.CreateOptions{Owner: e.owner(), Leased: want.Leased && p.Capabilities().Leases, OneShot: want.OneShot}
	info, err := kit.Create(ctx, p, cfg, opts)
	if err != nil && ctx.Err() != nil {
		err = fmt.Errorf("creating the sandbox was interrupted: %w", err)
	}
	return p, info, friendly(err)
}

// interruptCode is the exit status of a command a signal stopped: 130 for SIGINT, 143
// for SIGTERM.
func interruptCode(ctx context.Context) exitCode {
	var sig interrupt.Signal
	if errors.As(context.Cause(ctx), &sig) {
		return exitCode(sig.ExitCode())
	}
	return exitCode(exitInterrupted)
}

func (e *env) createCommand() *cobra.Command {
	var f createFlags
	var asJSON, hold bool
	c := &cobra.Command{
		Use:   "create [flags]",
		Short: "Create a sandbox and print its id",
		Long: `Create a sandbox with secure defaults (override them with flags) and print its id.
It lives until destroyed or until --timeout seconds have passed.

With --hold, roche stays and the sandbox lives only as long as it does: roche prints the
id (with --json, the object on one line) as its first line, then holds the sandbox until
its standard input closes, and destroys it then (also on Ctrl-C or SIGTERM). Killed
outright, roche leaves a sandbox that goes within seconds where the provider has leases
(docker, and every provider through roched). A line "reset" (or "reset --wipe-workspace")
on standard input recreates the sandbox as roche reset does, held like the first, and
prints the new one as a line, or "roche: " and the error. This is how programs (the
Python SDK) tie a sandbox to their own process.`,
		Example: `  roche create --image roche/python:local
  roche create --image roche/python:local --memory 1g --cpus 2 --timeout 600 --json
  roche create --image roche/python:local --writable --disk 5g
  roche create --image roche/python:local --workspace proj --workspace-size 10g
  roche create --image roche/python:local --metadata user=alice --metadata job=42
  roche create --image roche/python:local --hold --json   # until stdin closes`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			p, info, err := e.create(cmd.Context(), &f, kit.CreateOptions{Leased: hold})
			if err != nil {
				return err
			}
			if cmd.Context().Err() != nil {
				e.destroyQuietly(cmd.Context(), p, info.ID)
				return cmd.Context().Err()
			}
			if hold {
				return e.holdSandbox(cmd.Context(), p, info, asJSON)
			}
			if asJSON {
				return e.printJSON(info)
			}
			fmt.Fprintln(e.stdout, info.ID)
			return nil
		},
	}
	e.addCreateFlags(c.Flags(), &f)
	c.Flags().BoolVar(&asJSON, "json", false, "print the sandbox as a JSON object")
	c.Flags().BoolVar(&hold, "hold", false, "keep the sandbox only while this process runs: destroy it when standard input closes (see above)")
	return c
}

// execFlags are the flags of one command run.
type execFlags struct {
	timeout     float64
	interactive bool
	env         []string
	workdir     string
	asJSON      bool
	// timeoutFlag is the name of the timeout flag, and lifetime run's sandbox's lifetime
	// in seconds (0 for exec, which does not know it): what a timeout report names.
	timeoutFlag string
	lifetime    int
	// key is exec's --idempotency-key (background.go).
	key string
}

// add registers the flags; prefix keeps run's per-command flags ("exec-timeout") apart
// from its create flags ("timeout", the sandbox's lifetime).
func (x *execFlags) add(fs *pflag.FlagSet, prefix, timeoutHelp string) {
	x.timeoutFlag = "--" + prefix + "timeout"
	fs.Float64Var(&x.timeout, prefix+"timeout", 0, timeoutHelp)
	fs.BoolVarP(&x.interactive, "interactive", "i", false, "pass standard input to the command")
	fs.StringArrayVar(&x.env, prefix+"env", nil, "set an environment variable for this command only, KEY=VALUE (repeatable)")
	fs.StringVar(&x.workdir, prefix+"workdir", "", "working directory for this command")
	fs.BoolVar(&x.asJSON, "json", false, "print the result as JSON (exit_code, stdout, stderr, timed_out, truncated, oom_killed, and its receipt: peak memory, CPU time, processes left running) instead of streaming")
}

// execute runs cmd in sandbox id, streaming output unless --json, and returns the exit
// status roche should exit with.
func (e *env) execute(ctx context.Context, p roche.Provider, id string, cmd []string, x *execFlags) error {
	if len(cmd) == 0 {
		return errors.New("no command given: put it after --, e.g. -- python3 -c \"print('hi')\"")
	}
	if x.timeout < 0 {
		return fmt.Errorf("timeout %v is negative: give seconds > 0, or 0 for the sandbox's lifetime", x.timeout)
	}
	env, err := cliflag.ParseEnv(x.env)
	if err != nil {
		return err
	}
	timeout, err := wire.ExecTimeout(x.timeout)
	if err != nil {
		return friendly(err)
	}
	req := roche.ExecRequest{Cmd: cmd, Env: env, Workdir: x.workdir, Timeout: timeout, IdempotencyKey: x.key}
	if x.interactive {
		req.Stdin = e.stdin
	}
	if !x.asJSON {
		req.Stdout, req.Stderr = e.stdout, e.stderr
	}
	res, err := p.Exec(ctx, id, req)
	if err != nil {
		if ctx.Err() != nil {
			return interruptCode(ctx)
		}
		return fmt.Errorf("%s", oneLine(friendly(e.directHint(err))))
	}
	if x.asJSON {
		if err := e.printJSON(res); err != nil {
			return err
		}
	} else {
		if res.Truncated {
			fmt.Fprintf(e.stderr, "roche: output truncated: a stream passed %d bytes\n", roche.DefaultOutputLimit)
		}
		if res.OOMKilled {
			fmt.Fprintln(e.stderr, "roche: the command was killed for exceeding the sandbox's memory limit (raise it with --memory)")
		}
		if res.TimedOut {
			fmt.Fprintf(e.stderr, "roche: %s\n", x.timedOut(res.Duration))
		}
	}
	switch {
	case res.TimedOut:
		return exitCode(exitCodeTimeout)
	case res.ExitCode != 0:
		return exitCode(res.ExitCode)
	}
	return nil
}

// timedOut says which limit killed a command, as it was asked for, and how long the
// command ran (measured in the sandbox from its start to its end).
func (x *execFlags) timedOut(ran time.Duration) string {
	ranFor := ran.Round(time.Millisecond)
	switch {
	case x.timeout > 0:
		return fmt.Sprintf("the command timed out: %s %gs killed it after it ran %s", x.timeoutFlag, x.timeout, ranFor)
	case x.lifetime > 0:
		return fmt.Sprintf("the command was killed when the sandbox's lifetime ended (--timeout %ds, counted from its create; the command ran %s; %s bounds the command alone)",
			x.lifetime, ranFor, x.timeoutFlag)
	}
	return fmt.Sprintf("the command was killed when the sandbox's lifetime ended (it ran %s; %s bounds the command alone)", ranFor, x.timeoutFlag)
}

// rocheFailed marks errors of roche itself in exec and run, so they exit 125 and are not
// mistaken for the command's own exit status.
func (e *env) rocheFailed(err error) error {
	var code exitCode
	if err == nil || errors.As(err, &code) {
		return err
	}
	fmt.Fprintf(e.stderr, "roche: %s\n", oneLine(e.directHint(err)))
	return exitCode(exitRocheFailed)
}

func (e *env) execCommand() *cobra.Command {
	var id string
	var x execFlags
	var b backgroundFlags
	c := &cobra.Command{
		Use:   "exec --sandbox ID [flags] -- CMD [ARGS...]",
		Short: "Run a command in a sandbox",
		Long: `Run a command in an existing sandbox. Output streams to the terminal as it is
produced; roche exits with the command's exit status, 124 when it timed out, and 125
when roche itself failed. Ctrl-C kills the command (and everything it started).

With --background (-d) the command is started and roche prints its pid at once: the
command belongs to the sandbox, not to this roche, and runs on until it ends, is killed
or its sandbox ends (--timeout still bounds it). Its output is kept (the last 16 MiB of
each stream, --window) for roche commands connect, which replays it from byte offsets
and follows it; roche commands also lists, feeds, signals and kills it.

With --idempotency-key KEY the command, in the foreground too, belongs to the sandbox:
when this roche's connection drops (roched restarted, Ctrl-C) it runs on, and roche
exec again with the same key joins it instead of starting another: its output from the
start and its real exit status.`,
		Example: `  roche exec --sandbox "$id" -- python3 -c "print('hello')"
  echo 'print(input())' | roche exec -i --sandbox "$id" --timeout 10 -- python3 -c "exec(input())"
  pid=$(roche exec --sandbox "$id" -d --tag server -- python3 -m http.server 8000)
  roche exec --sandbox "$id" --idempotency-key build-42 -- make -C /workspace`,
		RunE: func(cmd *cobra.Command, args []string) error {
			if id == "" {
				return e.rocheFailed(errors.New("no sandbox given: pass --sandbox ID (roche list shows them)"))
			}
			if !b.background && (b.tag != "" || b.keepStdin || b.window != "") {
				return e.rocheFailed(errors.New("--tag, --keep-stdin and --window are for a command started with --background (-d)"))
			}
			if b.background {
				return e.startBackground(cmd.Context(), id, args, &x, &b)
			}
			p, err := e.providers.forID(id)
			if err != nil {
				return e.rocheFailed(err)
			}
			x.key = b.key
			return e.rocheFailed(e.execute(cmd.Context(), p, id, args, &x))
		},
	}
	c.Flags().StringVar(&id, "sandbox", "", "id of the sandbox to run in (required)")
	x.add(c.Flags(), "", "kill the command after this many seconds (default: the sandbox's remaining lifetime)")
	b.add(c.Flags())
	return c
}

func (e *env) runCommand() *cobra.Command {
	var f createFlags
	var x execFlags
	c := &cobra.Command{
		Use:   "run [create flags] -- CMD [ARGS...]",
		Short: "Create a sandbox, run one command in it, destroy it",
		Long: `Create a sandbox, run one command in it and destroy it: also on error and on
Ctrl-C or SIGTERM, which stop even a create waiting on an engine at once (a second one
exits without waiting for the destroy). Exits with the command's exit status, 124 when it
timed out (--timeout, the sandbox's lifetime, or --exec-timeout), 125 when roche itself
failed, 130 on Ctrl-C and 143 on SIGTERM.`,
		Example: `  roche run --image roche/python:local -- python3 -c "print('hello')"
  roche run --provider wasm -- python3 -c "print(2 + 2)"
  roche run --image roche/python:local --memory 1g --timeout 60 --mount "$PWD:/src" -- python3 /src/main.py
  roche run --image roche/python:local --allow-host pypi.org --allow-host files.pythonhosted.org -- pip download requests`,
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			if len(args) == 0 {
				return e.rocheFailed(errors.New("no command given: put it after --, e.g. roche run -- python3 -c \"print('hi')\""))
			}
			// run outlives its sandbox, so in direct mode it can serve the egress proxy.
			e.providers.outlives = true
			p, info, err := e.create(ctx, &f, kit.CreateOptions{Leased: true, OneShot: true})
			if err != nil {
				if ctx.Err() != nil {
					fmt.Fprintf(e.stderr, "roche: %s\n", oneLine(err))
					return interruptCode(ctx)
				}
				return e.rocheFailed(err)
			}
			defer e.destroyQuietly(ctx, p, info.ID)
			if ctx.Err() != nil {
				return interruptCode(ctx)
			}
			x.lifetime = f.timeout
			return e.rocheFailed(e.execute(ctx, p, info.ID, args, &x))
		},
	}
	e.addCreateFlags(c.Flags(), &f)
	x.add(c.Flags(), "exec-", "kill the command after this many seconds (default: the sandbox's lifetime)")
	return c
}

// destroyQuietly destroys a sandbox on a context of its own (the caller's may be
// cancelled by Ctrl-C) and reports only failures. It is bounded, more tightly after a
// signal, so that nothing on the way out can hang: a sandbox it could not destroy still
// ends at its lifetime.
func (e *env) destroyQuietly(ctx context.Context, p roche.Provider, id string) {
	limit := destroyTimeout
	if ctx.Err() != nil {
		limit = destroyInterruptedTimeout
	}
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), limit)
	defer cancel()
	if err := p.Destroy(dctx, id); err != nil {
		fmt.Fprintf(e.stderr, "roche: destroying sandbox %s: %s (roche destroy %s removes it; its lifetime ends it anyway)\n", id, oneLine(err), id)
	}
}

// How long roche run waits to destroy its sandbox on the way out: normally as long as a
// destroy may take; after a signal, less (a second signal exits at once).
const (
	destroyTimeout            = 15 * time.Second
	destroyInterruptedTimeout = 5 * time.Second
)

func (e *env) destroyCommand() *cobra.Command {
	var all, anyOwner bool
	var provider string
	c := &cobra.Command{
		Use:   "destroy ID... | --all",
		Short: "Destroy sandboxes",
		Long: `Destroy the sandboxes named, or with --all every sandbox of yours: made by you on this
host (direct mode), or your tenant's (through roched; on its socket, as roched's own
user, also those you made in direct mode). --any-owner --direct takes every Roche
sandbox on the engine, other users' and daemons' too.`,
		Example: `  roche destroy 3f2a9c...
  roche destroy --all`,
		RunE: func(cmd *cobra.Command, ids []string) error {
			ctx := cmd.Context()
			if all == (len(ids) > 0) {
				return errors.New("give sandbox ids or --all, not both or neither")
			}
			if err := e.checkAnyOwner(anyOwner); err != nil {
				return err
			}
			if all {
				return e.providers.each(ctx, provider, func(p roche.Provider) error {
					list, err := p.List(ctx)
					if err != nil {
						return err
					}
					owner := e.ownerFilter(p, anyOwner)
					for _, sb := range list {
						if owner != "" && sb.Owner != owner {
							continue
						}
						if err := p.Destroy(ctx, sb.ID); err != nil {
							return err
						}
						fmt.Fprintln(e.stdout, sb.ID)
					}
					return nil
				})
			}
			owners := make([]string, len(ids))
			for i, id := range ids {
				owners[i] = catalog.OfID(id)
			}
			if err := e.providers.prepare(owners...); err != nil {
				return err
			}
			var errs []error
			for _, id := range ids {
				p, err := e.providers.forID(id)
				if err == nil {
					// Destroy is idempotent; Inspect says whether the id meant anything.
					if _, err = p.Inspect(ctx, id); err == nil {
						err = p.Destroy(ctx, id)
					}
				}
				if err != nil {
					errs = append(errs, err)
					continue
				}
				fmt.Fprintln(e.stdout, id)
			}
			return errors.Join(errs...)
		},
	}
	c.Flags().BoolVar(&all, "all", false, "destroy every sandbox of yours")
	c.Flags().BoolVar(&anyOwner, "any-owner", false, "with --all and --direct, every Roche sandbox on the engine, whoever made it")
	c.Flags().StringVar(&provider, "provider", "", "with --all, only this provider's sandboxes")
	return c
}

func (e *env) listCommand() *cobra.Command {
	var asJSON, anyOwner bool
	var provider, state string
	var metadata []string
	c := &cobra.Command{
		Use:   "list [--metadata KEY=VALUE]... [--state STATE] [--json]",
		Short: "List your sandboxes",
		Long: `List your sandboxes: those you made on this host (direct mode), or your tenant's
(through roched). On roched's socket, as the user roched runs as, that is both: the
sandboxes roched made for you and those you made in direct mode, before it started or
with --direct (owner "cli:USER@HOST", or ROCHE_OWNER: what roched --direct-owner names).
--any-owner --direct lists every Roche sandbox on the engine, with its owner:
"cli:USER@HOST" for the CLI, "roched:..." for a daemon.

--metadata KEY=VALUE (repeatable) keeps the sandboxes created with every pair given
(create --metadata), --state those running, paused, exited or created.`,
		Example: "  roche list\n  roche list --json --provider docker\n  roche list --metadata user=alice --state running\n  roche list --direct --any-owner",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			if err := e.checkAnyOwner(anyOwner); err != nil {
				return err
			}
			md, err := cliflag.ParseMetadata(metadata)
			if err != nil {
				return err
			}
			filter := roche.ListFilter{Metadata: md, State: roche.SandboxState(state)}
			if err := filter.Validate(); err != nil {
				return friendly(err)
			}
			all := []roche.SandboxInfo{}
			err = e.providers.each(ctx, provider, func(p roche.Provider) error {
				list, err := listFiltered(ctx, p, filter)
				owner := e.ownerFilter(p, anyOwner)
				for _, sb := range list {
					if owner == "" || sb.Owner == owner {
						all = append(all, sb)
					}
				}
				return err
			})
			if err != nil && !partial(err) {
				return err
			}
			if asJSON {
				return e.printListJSON("sandboxes", all, err)
			}
			tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
			if anyOwner {
				fmt.Fprintln(tw, "ID\tPROVIDER\tIMAGE\tSTATE\tEXPIRES IN\tOWNER")
			} else {
				fmt.Fprintln(tw, "ID\tPROVIDER\tIMAGE\tSTATE\tEXPIRES IN")
			}
			for _, sb := range all {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s", sb.ID, sb.Provider, sb.Image, sb.State, expiresIn(sb))
				if anyOwner {
					fmt.Fprintf(tw, "\t%s", cmp.Or(sb.Owner, "-"))
				}
				fmt.Fprintln(tw)
			}
			if ferr := tw.Flush(); ferr != nil {
				return ferr
			}
			return err // incomplete: exit 3, saying which providers were skipped
		},
	}
	c.Flags().BoolVar(&asJSON, "json", false, `print a JSON array; when a provider was skipped (exit 3), {"sandboxes": [...], "skipped": [...]}`)
	c.Flags().BoolVar(&anyOwner, "any-owner", false, "with --direct, every Roche sandbox on the engine, whoever made it")
	c.Flags().StringVar(&provider, "provider", "", "only this provider's sandboxes")
	c.Flags().StringArrayVar(&metadata, "metadata", nil, "only sandboxes created with this KEY=VALUE (repeatable: every pair must match)")
	c.Flags().StringVar(&state, "state", "", "only sandboxes in this state: running, paused, exited or created")
	return c
}

// listFiltered lists p's sandboxes that filter keeps: roched filters them itself (the
// Go client's ListFiltered); a provider in this process lists them all, filtered here.
func listFiltered(ctx context.Context, p roche.Provider, filter roche.ListFilter) ([]roche.SandboxInfo, error) {
	if fl, ok := p.(interface {
		ListFiltered(context.Context, roche.ListFilter) ([]roche.SandboxInfo, error)
	}); ok {
		return fl.ListFiltered(ctx, filter)
	}
	list, err := p.List(ctx)
	return filter.Filter(list), err
}

// setTimeoutCommand changes a sandbox's lifetime (roche.LifetimeSetter).
func (e *env) setTimeoutCommand() *cobra.Command {
	var asJSON bool
	c := &cobra.Command{
		Use:   "set-timeout ID DURATION",
		Short: "End a sandbox DURATION from now, sooner or later than it was to",
		Long: `End the sandbox DURATION from now (90s, 10m, 2h, or a number of seconds) instead of
when it was to end: sooner or later, at least 1 s, at most 24 h (and, through roched,
at most the tenant's max_timeout_secs). The new end is what ends the sandbox and what
list shows. A kubernetes sandbox can be given less time, or more up to the end it was
created with: a Pod's deadline can only shrink.`,
		Example: "  roche set-timeout \"$id\" 10m\n  roche set-timeout \"$id\" 30 --json",
		Args:    cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			d, err := parseLifetime(args[1])
			if err != nil {
				return err
			}
			p, err := e.providers.forID(args[0])
			if err != nil {
				return err
			}
			ls, ok := p.(roche.LifetimeSetter)
			if !ok {
				return fmt.Errorf("%w: the %s provider cannot change a sandbox's lifetime", roche.ErrUnsupported, p.Name())
			}
			info, err := ls.SetTimeout(cmd.Context(), args[0], d)
			if err != nil {
				return friendly(err)
			}
			if asJSON {
				return e.printJSON(info)
			}
			fmt.Fprintf(e.stdout, "%s ends at %s (in %s)\n", info.ID, info.ExpiresAt.Local().Format(time.RFC3339), expiresIn(info))
			return nil
		},
	}
	c.Flags().BoolVar(&asJSON, "json", false, "print the sandbox, with its new expires_at, as a JSON object")
	return c
}

// parseLifetime reads set-timeout's DURATION: a Go duration (90s, 10m, 1h30m) or a
// whole number of seconds.
func parseLifetime(s string) (time.Duration, error) {
	d, err := time.ParseDuration(s)
	if err != nil {
		n, nerr := strconv.Atoi(s)
		if nerr != nil {
			return 0, fmt.Errorf("%w: duration %q: give seconds (90) or a duration such as 90s, 10m or 2h", roche.ErrInvalidConfig, s)
		}
		d = time.Duration(n) * time.Second
	}
	return d, friendly(roche.ValidTimeout(d))
}

func expiresIn(sb roche.SandboxInfo) string {
	if sb.ExpiresAt.IsZero() {
		return "-"
	}
	d := time.Until(sb.ExpiresAt).Round(time.Second)
	if d <= 0 {
		return "expired"
	}
	return d.String()
}

func (e *env) gcCommand() *cobra.Command {
	var dryRun, all, anyOwner bool
	var provider string
	c := &cobra.Command{
		Use:   "gc [--dry-run] [--all]",
		Short: "Remove expired sandboxes left behind",
		Long: `Remove your sandboxes past their lifetime (or stopped), e.g. left by a crashed caller;
with --all, every sandbox of yours. Yours: made by you on this host (direct mode), or
your tenant's (through roched; on its socket, as roched's own user, also those you made
in direct mode). --any-owner --direct also takes other users' and daemons' sandboxes on
the engine (a daemon's own are best left to it).`,
		Example: `  roche gc --dry-run
  roche gc --all
  roche gc --direct --any-owner --dry-run`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			if err := e.checkAnyOwner(anyOwner); err != nil {
				return err
			}
			return e.providers.each(ctx, provider, func(p roche.Provider) error {
				gc, ok := p.(roche.GarbageCollector)
				if !ok {
					return nil
				}
				removed, err := gc.GC(ctx, roche.GCOptions{All: all, DryRun: dryRun, Owner: e.ownerFilter(p, anyOwner)})
				verb := "removed"
				if dryRun {
					verb = "would remove"
				}
				for _, sb := range removed {
					fmt.Fprintf(e.stdout, "%s %s\n", verb, sb.ID)
				}
				return err
			})
		},
	}
	c.Flags().BoolVar(&dryRun, "dry-run", false, "only print what would be removed")
	c.Flags().BoolVar(&all, "all", false, "remove every sandbox of yours, expired or not")
	c.Flags().BoolVar(&anyOwner, "any-owner", false, "with --direct, whoever made the sandboxes")
	c.Flags().StringVar(&provider, "provider", "", "only this provider's sandboxes")
	return c
}

func (e *env) cpCommand() *cobra.Command {
	var preserveLinks, asJSON, noTargetDir bool
	var maxBytes string
	c := &cobra.Command{
		Use:   "cp [--preserve-links] [--max-bytes SIZE] [-T] SRC DST",
		Short: "Copy files between the host and a sandbox",
		Long: `Copy a file or directory into a sandbox (DST is ID:/path) or out of one (SRC is ID:/path).
ID:/path must be absolute. As with cp and docker cp, on either side: when DST is a
directory that exists, or ends with / (a directory, made when missing), SRC goes inside
it under its own name (roche cp f ID:/tmp makes /tmp/f); otherwise DST is the new name,
its parent directories made when missing. -T (--no-target-directory) makes DST the new
name always. A symlink at DST on the host is not followed: it is replaced, as below.

Copying out never writes outside DST. Nothing at or below DST is followed if it is a
symlink (one already there is replaced), and the sandbox's symlinks are left out, with a
note on stderr saying how many and why, unless --preserve-links is given; even then only
links whose target is relative and stays inside DST are made. Devices, fifos, sockets
and hard links are never copied. Runs of zeros become holes: sparse files stay sparse.

Copying in never reads outside SRC: nothing below it is followed (symlinks are copied as
symlinks), even while the sandbox changes it through a read-write mount.

One copy moves at most --max-bytes of file content (default 1g): the file that would
pass the cap is refused before any of it is written. Through roched, its own cap
(roched --copy-max-bytes) applies too.`,
		Example: `  roche cp ./data.csv "$id":/tmp            # /tmp/data.csv
  roche cp ./data.csv "$id":/tmp/in/        # /tmp/in/data.csv, /tmp/in made
  roche cp "$id":/tmp/results ./results
  roche cp --preserve-links --max-bytes 4g "$id":/workspace/repo ./repo`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			srcID, srcPath, srcIn := splitSandboxPath(args[0])
			dstID, dstPath, dstIn := splitSandboxPath(args[1])
			if srcIn == dstIn {
				// ID:relative looks like a host path to the split: say what it lacks.
				for _, a := range args {
					if id, rel, ok := strings.Cut(a, ":"); ok && id != "" && !strings.ContainsAny(id, "/\\") && !strings.HasPrefix(rel, "/") {
						return fmt.Errorf("%q: a path in a sandbox must be absolute: %s:/%s (sandboxes have no working directory to resolve it against)", a, id, rel)
					}
				}
				return errors.New("exactly one of SRC and DST must be ID:/path in a sandbox")
			}
			opts := roche.CopyOptions{PreserveLinks: preserveLinks}
			if cmd.Flags().Changed("max-bytes") {
				n, err := size.Parse(maxBytes)
				if err == nil && n == 0 {
					err = errors.New("0 copies nothing: give a size such as 4g")
				}
				if err != nil {
					return fmt.Errorf("--max-bytes: %w: %v", roche.ErrInvalidConfig, err)
				}
				opts.MaxBytes = n
			}
			id := srcID
			if dstIn {
				id = dstID
			}
			p, err := e.providers.forID(id)
			if err != nil {
				return err
			}
			tc, ok := p.(roche.TarCopier)
			if !ok {
				return fmt.Errorf("%w: the %s provider cannot copy files", roche.ErrUnsupported, p.Name())
			}
			var rep roche.CopyReport
			if dstIn {
				if _, err := os.Lstat(srcPath); err != nil {
					return fmt.Errorf("%w: host path %s does not exist", roche.ErrNotFound, srcPath)
				}
				if !noTargetDir {
					if dstPath, err = intoSandboxDir(ctx, p, tc, id, srcPath, dstPath); err != nil {
						return err
					}
				}
				rep, err = roche.CopyIn(ctx, tc, id, srcPath, dstPath, opts)
			} else {
				if !noTargetDir {
					dstPath = intoHostDir(srcPath, dstPath)
				}
				rep, err = roche.CopyOut(ctx, tc, id, srcPath, dstPath, opts)
			}
			if err != nil {
				return err
			}
			if note := rep.Note(); note != "" {
				fmt.Fprintf(e.stderr, "roche: %s\n", note)
			}
			if asJSON {
				return e.printJSON(rep)
			}
			return nil
		},
	}
	c.Flags().BoolVar(&preserveLinks, "preserve-links", false, "copying out, make the sandbox's symlinks that point inside DST (others are still left out)")
	c.Flags().StringVar(&maxBytes, "max-bytes", "1g", "most file content the copy may move, e.g. 512m or 4g")
	c.Flags().BoolVar(&asJSON, "json", false, "print what was copied and left out as JSON (files, dirs, links, bytes, skipped, ...)")
	c.Flags().BoolVarP(&noTargetDir, "no-target-directory", "T", false, "DST is the new name even when it is a directory or ends with / (as cp -T)")
	return c
}

// splitSandboxPath splits "ID:/path"; host paths (even with a colon) do not start an id
// followed by ":/".
func splitSandboxPath(s string) (id, path string, inSandbox bool) {
	i := strings.Index(s, ":/")
	if i <= 0 || strings.ContainsAny(s[:i], "/\\") {
		return "", s, false
	}
	return s[:i], s[i+1:], true
}

func (e *env) pauseCommand(pause bool) *cobra.Command {
	verb := "unpause"
	short := "Resume a paused sandbox's processes"
	example := "  roche unpause \"$id\""
	if pause {
		verb = "pause"
		short = "Freeze every process in a sandbox, or with --to-disk save it whole and stop it"
		example = "  roche pause \"$id\"\n  roche pause --to-disk \"$id\"   # vm (qemu) only; roche resume \"$id\" brings it back"
	}
	var toDisk bool
	c := &cobra.Command{
		Use:     verb + " ID",
		Short:   short,
		Example: example,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			p, err := e.providers.forID(args[0])
			if err != nil {
				return err
			}
			if toDisk {
				ms, err := memorySnapshotter(p, "pause sandboxes to disk")
				if err != nil {
					return err
				}
				return ms.PauseToDisk(cmd.Context(), args[0])
			}
			pz, ok := p.(roche.Pauser)
			if !ok {
				return fmt.Errorf("%w: the %s provider cannot pause sandboxes", roche.ErrUnsupported, p.Name())
			}
			if pause {
				return pz.Pause(cmd.Context(), args[0])
			}
			return pz.Unpause(cmd.Context(), args[0])
		},
	}
	if pause {
		c.Flags().BoolVar(&toDisk, "to-disk", false, "save memory and processes to disk and stop the sandbox: it holds no memory or CPU and its lifetime pauses until roche resume (vm provider, qemu)")
	}
	return c
}

// memorySnapshotter is p as a roche.MemorySnapshotter, or the one-line refusal of a
// provider without memory snapshots.
func memorySnapshotter(p roche.Provider, doing string) (roche.MemorySnapshotter, error) {
	ms, ok := p.(roche.MemorySnapshotter)
	if !ok {
		return nil, fmt.Errorf("%w: the %s provider cannot %s: memory snapshots are the vm provider's (qemu) only", roche.ErrUnsupported, p.Name(), doing)
	}
	return ms, nil
}

func (e *env) resumeCommand() *cobra.Command {
	return &cobra.Command{
		Use:     "resume ID",
		Short:   "Bring back a sandbox paused with pause --to-disk, where it was",
		Example: "  roche resume \"$id\"",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			p, err := e.providers.forID(args[0])
			if err != nil {
				return err
			}
			ms, err := memorySnapshotter(p, "resume sandboxes from disk")
			if err != nil {
				return err
			}
			_, err = ms.Resume(cmd.Context(), args[0])
			return err
		},
	}
}

func (e *env) forkCommand() *cobra.Command {
	var n int
	c := &cobra.Command{
		Use:   "fork ID [-n N]",
		Short: "Copy a running or paused-to-disk sandbox, memory and processes included, printing each new id on a line",
		Long: `Fork makes N new sandboxes, each a copy of sandbox ID at this moment: its processes,
code contexts and open files, each with its own id, lifetime and randomness. ID goes on
as it was. The vm provider (qemu) only. Destroy the forks as any sandbox.`,
		Example: "  roche fork \"$id\" -n 3",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if n < 1 || n > roche.MaxForks {
				return fmt.Errorf("%w: -n %d: give 1 to %d forks", roche.ErrInvalidConfig, n, roche.MaxForks)
			}
			p, err := e.providers.forID(args[0])
			if err != nil {
				return err
			}
			ms, err := memorySnapshotter(p, "fork sandboxes")
			if err != nil {
				return err
			}
			forks, err := ms.Fork(cmd.Context(), args[0], n)
			if err != nil {
				return err
			}
			for _, sb := range forks {
				fmt.Fprintln(e.stdout, sb.ID)
			}
			return nil
		},
	}
	c.Flags().IntVarP(&n, "count", "n", 1, "how many forks to make, 1 to 64")
	return c
}
