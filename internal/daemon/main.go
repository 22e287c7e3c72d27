package daemon

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/internal/buildinfo"
	"github.com/roche-sandbox/roche/internal/catalog"
	"github.com/roche-sandbox/roche/internal/defaults"
	"github.com/roche-sandbox/roche/internal/inproc"
	"github.com/roche-sandbox/roche/internal/memlimit"
	"github.com/roche-sandbox/roche/internal/size"
	"github.com/roche-sandbox/roche/pool"
)

// softMemoryLimit is roched's heap target when GOMEMLIMIT does not set one.
const softMemoryLimit = 256 << 20

// DefaultMaxSandboxes is --max-sandboxes when neither a flag nor the config file sets it.
const DefaultMaxSandboxes = 100

// FileConfig is the --config file, JSON. Flags given on the command line win over it;
// its pools and the --pool flags are merged, a flag replacing a file pool of the same
// provider/image.
//
//	{
//	  "socket": "/run/roche/roched.sock",
//	  "listen": "tcp://127.0.0.1:7878",
//	  "token_file": "/etc/roche/token",
//	  "tokens_file": "/etc/roche/tokens.json",
//	  "tls_cert": "/etc/roche/tls/server.pem",
//	  "tls_key": "/etc/roche/tls/server-key.pem",
//	  "client_ca": "/etc/roche/tls/clients-ca.pem",
//	  "insecure": false,
//	  "allow_mount_roots": ["/srv/roche"],
//	  "allow_root_sandboxes": false,
//	  "state": "/var/lib/roche/roched.state.json",
//	  "max_sandboxes": 100,
//	  "max_commands": 64,
//	  "pool_concurrency": 2,
//	  "copy_max_bytes": "1g",
//	  "engine_timeout": "30s",
//	  "pools": ["docker/roche/python:local?min=2&max=5&total=20&idle_timeout=600"],
//	  "e2b_listen": "tcp://127.0.0.1:3000",
//	  "e2b": {"templates": {"base": {"image": "roche/python:local"}}},
//	  "ui": true
//	}
//
// A token is never in the file, so that it is not left lying in configuration: the file
// names a token file (mode 0600) instead, or ROCHE_TOKEN gives it.
type FileConfig struct {
	Socket             string   `json:"socket"`
	Listen             string   `json:"listen"`
	TokenFile          string   `json:"token_file"`
	TokensFile         string   `json:"tokens_file"`
	TLSCert            string   `json:"tls_cert"`
	TLSKey             string   `json:"tls_key"`
	ClientCA           string   `json:"client_ca"`
	Insecure           bool     `json:"insecure"`
	AllowMountRoots    []string `json:"allow_mount_roots"`
	AllowRootSandboxes bool     `json:"allow_root_sandboxes"`
	State              string   `json:"state"`
	MaxSandboxes       *int     `json:"max_sandboxes"`
	MaxCommands        int      `json:"max_commands"`
	PoolConcurrency    int      `json:"pool_concurrency"`
	Pools              []string `json:"pools"`
	CopyMaxBytes       string   `json:"copy_max_bytes"`

	// EngineTimeout is --engine-timeout, a duration such as "30s".
	EngineTimeout string `json:"engine_timeout"`

	// E2BListen is --e2b-listen; E2B the E2B listener's settings (its templates, see
	// docs/e2b.md), which its package reads.
	E2BListen string          `json:"e2b_listen"`
	E2B       json.RawMessage `json:"e2b,omitempty"`

	// UI is --ui: the web console at /ui/ on the listen address.
	UI bool `json:"ui"`
}

// LoadFileConfig reads a --config file, refusing unknown fields so that a typo is an
// error rather than a silently ignored setting.
func LoadFileConfig(path string) (FileConfig, error) {
	var fc FileConfig
	b, err := os.ReadFile(path)
	if err != nil {
		return fc, fmt.Errorf("%w: reading config: %v", roche.ErrInvalidConfig, err)
	}
	if err := decodeOne(b, &fc); err != nil {
		return fc, fmt.Errorf("%w: config %s: %v (see roched --help for the format)", roche.ErrInvalidConfig, path, err)
	}
	return fc, nil
}

// decodeOne decodes b as one JSON object of v's fields and nothing after it: a second
// object appended by hand would otherwise be dropped without a word.
func decodeOne(b []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return errors.New("more follows the JSON object: the file holds one object")
	}
	return nil
}

// flags are roched's command-line settings.
type flags struct {
	socket, listen, token, state, config string
	tokenFile, tokensFile                string
	tlsCert, tlsKey, clientCA            string
	insecure                             bool
	allowMountRoots                      []string
	allowRoot                            bool
	logFormat, logLevel                  string
	copyMaxBytes                         string
	pools, providers                     []string
	maxSandboxes, poolConcurrency        int
	maxCommands                          int
	endedRetention                       time.Duration
	shutdownTimeout, engineTimeout       time.Duration
	// kubeconfig, namespace, runtimeClass: the kubernetes provider's (providers.Options).
	kubeconfig, namespace, runtimeClass, seccompProfile, agentImage string
	// storageClass: the StorageClass of the kubernetes provider's new workspaces.
	storageClass string
	// kubeQPS, kubeBurst: the kubernetes provider's API client rate (kubernetes.WithClientRate).
	kubeQPS   float32
	kubeBurst int
	// runtime: the docker provider's, ociRuntime the oci provider's (providers.Options).
	runtime, ociRuntime string
	// directOwner: Config.DirectOwner.
	directOwner string
	// e2bListen: Config.E2BListen; newFrontend serves it (cmd/roched passes internal/e2b's).
	e2bListen   string
	newFrontend NewFrontend
	// ui: Config.UI.
	ui bool
	// replicaGroup, replicaID, leaderLease: Config.ReplicaGroup, ReplicaID, LeaderLease.
	replicaGroup, replicaID string
	leaderLease             time.Duration
	// otlpEndpoint: Config.OTLPEndpoint (OTLPEndpoint adds the environment's).
	otlpEndpoint string
}

// Main runs roched with args (without the program name) and returns its exit status.
// frontend, when given, serves --e2b-listen.
func Main(args []string, stdout, stderr io.Writer, frontend ...NewFrontend) int {
	var f flags
	if len(frontend) > 0 {
		f.newFrontend = frontend[0]
	}
	cmd := command(&f, stderr)
	cmd.SetArgs(args)
	cmd.SetOut(stdout)
	cmd.SetErr(stderr)
	if err := cmd.Execute(); err != nil {
		fmt.Fprintf(stderr, "roched: %s\n", strings.Join(strings.Fields(err.Error()), " "))
		return 1
	}
	return 0
}

// command is roched's command line, its flags bound to f.
func command(f *flags, stderr io.Writer) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "roched [flags]",
		Short: "Roche's daemon: the sandbox API with warm pools, a reaper and crash recovery",
		Long: `roched serves roche.v1.SandboxService (gRPC, gRPC-Web and Connect's HTTP/JSON) on a
unix socket (mode 0600), and on TCP only when asked with --listen, then only with a
bearer token (or client certificates), and over TLS unless on a loopback address or told
--insecure. It keeps warm pools (--pool), destroys sandboxes at their expiry,
refuses creates beyond --max-sandboxes, and keeps its state in a file so that after a
crash the next roched keeps serving the sandboxes clients hold and destroys the rest.
It touches only the sandboxes it made, and those its own user made with roche in
direct mode (owner --direct-owner): those it serves to that user alone, on the unix
socket (the caller's uid, as the kernel gives it, must be roched's), as its own, never
destroying one unless asked (destroy, gc). Others on the engine are left alone.

Tokens never go on the command line (ps shows it to every user): --token-file FILE
(mode 0600) or ROCHE_TOKEN gives one token, for the tenant "default"; --tokens-file
FILE (mode 0600) lists tenants, each seeing only its own sandboxes, workspaces and
snapshots: {"tenants": [{"name": "acme", "token_sha256": "HEX", "max_sandboxes": 10,
"mount_roots": ["/srv/roche/acme"], "read_only_token_sha256": ["HEX"]}]}; a read-only
token sees what its tenant's token sees (sandboxes, pools, commands' output, egress and
audit logs) but may not create, run, open a terminal, copy or destroy. roched hash-token turns a token on stdin into
its token_sha256. The unix socket is the tenant "local". TCP tenants mount host paths
only at or below --allow-mount-root directories (or their mount_roots); sandboxes run
as root (uid or gid 0, or a user name) only with --allow-root-sandboxes. Every create,
exec, copy and destroy is logged ("audit") with tenant, sandbox id and argv or path.

Pools: PROVIDER/IMAGE?min=N&max=N&total=N&idle_timeout=SECS (also timeout=SECS, the
longest lifetime served from the pool, memory, cpus, pids_limit, and code=python, which
starts each pooled sandbox's python interpreter before it is ready). A create whose
config differs only in env and workdir, with a lifetime up to the pool's timeout, is
served from the pool; anything else (network, mounts, writable, user, other limits)
gets a sandbox made for it.

--config FILE is JSON: {"socket": "...", "listen": "tcp://...", "token_file": "...",
"tokens_file": "...", "tls_cert": "...", "tls_key": "...", "client_ca": "...",
"insecure": false, "allow_mount_roots": ["..."], "allow_root_sandboxes": false,
"state": "...", "max_sandboxes": 100, "pool_concurrency": 2, "copy_max_bytes": "1g",
"engine_timeout": "30s", "pools": ["docker/IMAGE?min=2"], "e2b_listen": "tcp://...",
"e2b": {"templates": {...}}, "ui": false}. Flags win over the file; it never holds a token
itself.

Every call to the Docker engine has a deadline (--engine-timeout for a create, 10 s
for a list or destroy). The engine is checked every 2 s: while it does not answer,
/healthz says "degraded", roche_engine_up{provider="docker"} is 0, creates are refused
at once with UNAVAILABLE, and its going down and coming back are logged.

Providers:
` + catalog.Help() + `

roched serves every provider it can set up and says in its log why it leaves one out;
a bad Docker setting stops it. kubernetes with no cluster configured (no --kubeconfig,
KUBECONFIG or in-cluster credentials) is left out, unless asked for (--providers, or one
of its flags), which stops roched. A provider's flag for a provider not served stops it. wasm without python.wasm (roche image build python --provider wasm)
is served, its creates failing with the command that fetches it; a microVM's missing
hypervisor shows on its first create.

Copies (CopyTo, CopyFrom) are relayed as they stream, never staged on this host; every
entry is checked and each copy capped at --copy-max-bytes (a request may ask for less).

TLS: --tls-cert FILE and --tls-key FILE (PEM) serve TCP over TLS: the API, /healthz and
/metrics alike. Plaintext TCP is refused on any address but a loopback one unless
--insecure says so. --client-ca FILE (PEM) makes TCP require a client certificate signed
by one of its CAs; the certificate's Common Name is the tenant (one of --tokens-file's,
"default", or a tenant known by its certificate alone). A bearer token may be sent too,
and must then name the same tenant. The three files are read again when they change (a
renewed certificate serves the next connection; open ones keep theirs); a new set that
does not load leaves the old one in use and the log says why. roche daemon start --tls
makes a local CA and a certificate signed by it.

GET /healthz answers without a token (?verbose, roche doctor's report of what it serves,
needs one); /metrics is Prometheus text.

--ui serves a web console at /ui/ on the --listen address: the tenant's sandboxes with
live CPU, memory and processes and why each ended, pools, background commands and their
output, the egress and audit logs, and a terminal (not for read-only tokens). roche ui
prints a one-time login URL (a code good for 2 minutes and one sign-in, which buys an
HttpOnly, SameSite=Strict session cookie); or the page is given a token, which it sends
as a bearer header, never in a URL or a cookie. Requests from pages of another origin
are refused (docs/console.md).

--e2b-listen tcp://127.0.0.1:3000 also serves the E2B API there, so that E2B's own SDKs
run unmodified against roched: roched prints the export lines they need (E2B_API_URL,
E2B_SANDBOX_URL and, when it made one, E2B_API_KEY), and roche e2b env prints them again.
TLS and --insecure work as for --listen; the config file's "e2b" section names templates
(docs/e2b.md).

Traces: with --otlp-endpoint URL (or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, or
OTEL_EXPORTER_OTLP_ENDPOINT with /v1/traces added) roched sends OpenTelemetry spans over
OTLP/HTTP: one per API call, a child of the caller's W3C traceparent header when sent,
with the pool claim, provider create, exec and run_code below it; attributes are the
tenant, sandbox id and provider, never a token, command, env value or file content.
Without one nothing is traced (docs/traces.md).`,
		Example: `  roched --pool 'docker/roche/python:local?min=2&max=5&total=20&idle_timeout=600'
  roched --pool 'wasm/python:3.12?min=2&max=5'
  roched --config /etc/roche/roched.json
  (umask 077; openssl rand -hex 16 > /etc/roche/token); roched --listen tcp://127.0.0.1:7878 --token-file /etc/roche/token
  roched --listen tcp://0.0.0.0:7878 --tls-cert /etc/roche/tls/server.pem --tls-key /etc/roche/tls/server-key.pem --token-file /etc/roche/token
  openssl rand -hex 16 | tee acme.token | roched hash-token   # token_sha256 for the tokens file`,
		Args:          cobra.NoArgs,
		SilenceErrors: true,
		SilenceUsage:  true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return run(cmd, f, stderr)
		},
	}
	cmd.Version = buildinfo.Version()
	cmd.SetVersionTemplate("roched {{.Version}}\n")
	fs := cmd.Flags()
	fs.StringVar(&f.socket, "socket", defaults.Socket(), "unix socket to listen on (env ROCHE_SOCKET)")
	fs.StringVar(&f.listen, "listen", "", "also listen on TCP, tcp://HOST:PORT; needs a token")
	fs.StringVar(&f.token, "token", "", "refused: a token on the command line is visible to every user; use --token-file")
	_ = fs.MarkHidden("token")
	fs.StringVar(&f.tokenFile, "token-file", "", "file (mode 0600) holding the bearer token TCP clients send, tenant \"default\" (or env ROCHE_TOKEN)")
	fs.StringVar(&f.tokensFile, "tokens-file", "", "JSON file (mode 0600) of tenants: names, token hashes, max_sandboxes, mount_roots (see above)")
	fs.StringVar(&f.tlsCert, "tls-cert", "", "PEM certificate (chain) TCP is served with; reloaded when the file changes")
	fs.StringVar(&f.tlsKey, "tls-key", "", "PEM private key of --tls-cert (not readable by others); reloaded when the file changes")
	fs.StringVar(&f.clientCA, "client-ca", "", "PEM CA certificates: TCP clients must present a certificate they signed; its Common Name is the tenant")
	fs.BoolVar(&f.insecure, "insecure", false, "allow plaintext TCP on an address that is not loopback (the token crosses the network readable)")
	fs.StringArrayVar(&f.allowMountRoots, "allow-mount-root", nil, "host directory TCP tenants may mount at or below (repeatable; none by default)")
	fs.BoolVar(&f.allowRoot, "allow-root-sandboxes", false, "let creates run commands as root (uid or gid 0, or a user name)")
	fs.StringVar(&f.state, "state", "", "state file (default: beside the socket, e.g. roched.state.json)")
	fs.StringVar(&f.config, "config", "", "JSON config file (see above)")
	fs.StringArrayVar(&f.pools, "pool", nil, "warm pool, PROVIDER/IMAGE?min=N&max=N&total=N&idle_timeout=SECS (repeatable)")
	fs.IntVar(&f.maxSandboxes, "max-sandboxes", DefaultMaxSandboxes, "most sandboxes handed to clients at once; 0 means no limit")
	fs.IntVar(&f.maxCommands, "max-commands", roche.MaxRunningCommands, fmt.Sprintf("most background commands running at once in one sandbox (1 to %d)", roche.MaxRunningCommands))
	fs.DurationVar(&f.endedRetention, "ended-retention", roche.DefaultEndedRetention, fmt.Sprintf("how long Inspect answers for a sandbox that ended, with why (at most %d remembered at once)", roche.MaxEndedKept))
	fs.IntVar(&f.poolConcurrency, "pool-concurrency", 0, "sandboxes the pools create at once; 0 adapts it: the machine's cores, up to four times as many while creations wait and the CPUs have room")
	fs.StringVar(&f.copyMaxBytes, "copy-max-bytes", "1g", "most file content one copy in or out moves (e.g. 512m, 4g); a request may ask for less")
	fs.DurationVar(&f.shutdownTimeout, "shutdown-timeout", 30*time.Second, "how long a shutdown waits for calls in progress")
	fs.DurationVar(&f.engineTimeout, "engine-timeout", defaults.EngineTimeout,
		"how long a create waits for the Docker engine before failing (lists and destroys wait 10 s); while it does not answer, creates are refused at once")
	fs.StringSliceVar(&f.providers, "providers", nil, "serve only these providers, comma-separated (default: every one; e.g. kubernetes for roched in a cluster)")
	fs.StringVar(&f.runtime, "runtime", "", "runtime of Docker sandboxes: runc (the default) or runsc (gVisor: no network but an allowlist; scripts/runsc.sh registers it)")
	fs.StringVar(&f.kubeconfig, "kubeconfig", "", "kubeconfig of the kubernetes provider's cluster (default: $KUBECONFIG, else the in-cluster configuration)")
	fs.StringVar(&f.namespace, "namespace", "", "namespace of the kubernetes provider's sandboxes (default: roche, made when missing)")
	fs.StringVar(&f.runtimeClass, "runtime-class", "", "RuntimeClass of the kubernetes provider's Pods (e.g. gvisor, kata)")
	fs.StringVar(&f.storageClass, "kube-storage-class", "", "StorageClass of the kubernetes provider's new workspaces (PersistentVolumeClaims; default: the cluster's default class)")
	fs.Float32Var(&f.kubeQPS, "kube-qps", 0, "the kubernetes provider's API requests a second on average (0: its default, 50)")
	fs.IntVar(&f.kubeBurst, "kube-burst", 0, "the kubernetes provider's API requests in a burst (0: its default, 100, or --kube-qps if more)")
	fs.StringVar(&f.ociRuntime, "oci-runtime", "", "the oci provider's OCI runtime: crun or runc (default: the fastest that works on this host; runsc is refused, see docs/providers/oci.md)")
	fs.StringVar(&f.agentImage, "agent-image", "", "the kubernetes provider's agent image as the nodes pull it (default: roche/agent:<digest of the local roche-agent>)")
	fs.StringVar(&f.seccompProfile, "seccomp-profile", "", "seccomp profile of the kubernetes provider's Pods: a Localhost profile on every node (default roche.json, Roche's: roche kubernetes seccomp-profile installs it), or RuntimeDefault for the runtime's own, weaker one")
	fs.StringVar(&f.directOwner, "direct-owner", defaults.DirectOwner(),
		"owner of the direct-mode sandboxes served to roched's own user on the unix socket: what roche gives them in roched's environment (ROCHE_OWNER, else cli:USER@HOST); \"\" serves none")
	fs.StringVar(&f.e2bListen, "e2b-listen", "", "also serve the E2B API (its SDKs, unmodified) on tcp://HOST:PORT, e.g. tcp://127.0.0.1:3000; TLS as --listen (docs/e2b.md)")
	fs.BoolVar(&f.ui, "ui", false, "serve the web console at /ui/ on the --listen address, behind its tokens (docs/console.md)")
	fs.StringVar(&f.replicaGroup, "replica-group", "", "run as one of the replicas of this group, which all serve the same sandboxes (kubernetes provider only; docs/roched-in-a-cluster.md#replicas)")
	fs.StringVar(&f.replicaID, "replica-id", "", "this replica's name in its group's leader election (default: the host name and the state file's instance)")
	fs.DurationVar(&f.leaderLease, "leader-lease", 0, "how long the group's leader keeps the lead without renewing it, so how soon a replica killed outright is replaced as the one that reaps (default 15s)")
	fs.StringVar(&f.otlpEndpoint, "otlp-endpoint", "", "send OpenTelemetry traces over OTLP/HTTP to this URL, e.g. http://127.0.0.1:4318/v1/traces (default: $OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, else $OTEL_EXPORTER_OTLP_ENDPOINT/v1/traces; neither: no tracing; docs/traces.md)")
	fs.StringVar(&f.logFormat, "log-format", "text", "log format: text or json")
	fs.StringVar(&f.logLevel, "log-level", "info", "log level: debug, info, warn or error")
	cmd.SetFlagErrorFunc(func(c *cobra.Command, err error) error {
		return fmt.Errorf("%v (see roched --help)", err)
	})
	cmd.AddCommand(hashTokenCommand())
	cmd.CompletionOptions.DisableDefaultCmd = true
	return cmd
}

// hashTokenCommand prints the token_sha256 of a token read from stdin, for the tokens
// file, so that the token itself is written nowhere but where its tenant keeps it.
func hashTokenCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "hash-token",
		Short: "Read a token on stdin and print its token_sha256 for --tokens-file",
		Long: `Read a token on stdin (its first line, surrounding whitespace trimmed) and print the hex
SHA-256 that --tokens-file lists as the tenant's token_sha256. roched keeps only the hash.`,
		Example:       `  openssl rand -hex 16 | tee acme.token | roched hash-token`,
		Args:          cobra.NoArgs,
		SilenceErrors: true,
		SilenceUsage:  true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			line, err := bufio.NewReader(cmd.InOrStdin()).ReadString('\n')
			if err != nil && !errors.Is(err, io.EOF) {
				return fmt.Errorf("reading the token from stdin: %w", err)
			}
			tok := strings.TrimSpace(line)
			if err := checkToken(tok, "stdin"); err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), HashToken(tok))
			return nil
		},
	}
}

// buildConfig merges the config file and the flags into a Config, reading the tokens
// from their files (or ROCHE_TOKEN, which it then removes from the environment, so that
// no process roched starts inherits it).
func buildConfig(cmd *cobra.Command, f *flags) (Config, error) {
	changed := cmd.Flags().Changed
	if changed("token") {
		return Config{}, fmt.Errorf("%w: --token puts the token on the command line, where every local user can read it (ps, /proc/PID/cmdline): write it to a file only roched's user can read and pass --token-file FILE, or set ROCHE_TOKEN",
			roche.ErrInvalidConfig)
	}
	cfg := Config{
		Socket: f.socket, Listen: f.listen, StateFile: f.state,
		MaxSandboxes: f.maxSandboxes, PoolConcurrency: f.poolConcurrency, MaxCommands: f.maxCommands,
		EndedRetention:  f.endedRetention,
		AllowMountRoots: f.allowMountRoots, AllowRootSandboxes: f.allowRoot,
		TLSCert: f.tlsCert, TLSKey: f.tlsKey, ClientCA: f.clientCA, Insecure: f.insecure,
		DirectOwner: f.directOwner, E2BListen: f.e2bListen, UI: f.ui,
		ReplicaGroup: f.replicaGroup, ReplicaID: f.replicaID, LeaderLease: f.leaderLease,
		OTLPEndpoint: OTLPEndpoint(f.otlpEndpoint),
	}
	if cfg.OTLPEndpoint != "" {
		if err := checkOTLPEndpoint(cfg.OTLPEndpoint); err != nil {
			return cfg, err
		}
	}
	tokenFile, tokensFile := f.tokenFile, f.tokensFile
	var specs []string
	if f.config != "" {
		fc, err := LoadFileConfig(f.config)
		if err != nil {
			return cfg, err
		}
		if fc.Socket != "" && !changed("socket") {
			cfg.Socket = fc.Socket
		}
		if fc.Listen != "" && !changed("listen") {
			cfg.Listen = fc.Listen
		}
		if fc.State != "" && !changed("state") {
			cfg.StateFile = fc.State
		}
		if fc.MaxSandboxes != nil && !changed("max-sandboxes") {
			cfg.MaxSandboxes = *fc.MaxSandboxes
		}
		if fc.MaxCommands != 0 && !changed("max-commands") {
			cfg.MaxCommands = fc.MaxCommands
		}
		if fc.PoolConcurrency != 0 && !changed("pool-concurrency") {
			cfg.PoolConcurrency = fc.PoolConcurrency
		}
		if fc.CopyMaxBytes != "" && !changed("copy-max-bytes") {
			f.copyMaxBytes = fc.CopyMaxBytes
		}
		if fc.TokenFile != "" && !changed("token-file") {
			tokenFile = fc.TokenFile
		}
		if fc.TokensFile != "" && !changed("tokens-file") {
			tokensFile = fc.TokensFile
		}
		for _, s := range []struct {
			flag     string
			dst      *string
			fromFile string
		}{{"tls-cert", &cfg.TLSCert, fc.TLSCert}, {"tls-key", &cfg.TLSKey, fc.TLSKey}, {"client-ca", &cfg.ClientCA, fc.ClientCA}} {
			if s.fromFile != "" && !changed(s.flag) {
				*s.dst = s.fromFile
			}
		}
		if fc.Insecure && !changed("insecure") {
			cfg.Insecure = true
		}
		if !changed("allow-mount-root") {
			cfg.AllowMountRoots = fc.AllowMountRoots
		}
		if !changed("allow-root-sandboxes") {
			cfg.AllowRootSandboxes = fc.AllowRootSandboxes
		}
		if fc.EngineTimeout != "" && !changed("engine-timeout") {
			d, err := time.ParseDuration(fc.EngineTimeout)
			if err != nil {
				return cfg, fmt.Errorf("%w: config %s: engine_timeout %q: give a duration such as \"30s\"", roche.ErrInvalidConfig, f.config, fc.EngineTimeout)
			}
			f.engineTimeout = d
		}
		if fc.E2BListen != "" && !changed("e2b-listen") {
			cfg.E2BListen = fc.E2BListen
		}
		if fc.UI && !changed("ui") {
			cfg.UI = true
		}
		cfg.E2B = fc.E2B
		specs = fc.Pools
	}
	var errs []error
	if tokenFile != "" {
		tok, err := ReadTokenFile(tokenFile)
		errs = append(errs, err)
		cfg.Token = tok
	} else if tok := os.Getenv("ROCHE_TOKEN"); tok != "" {
		errs = append(errs, checkToken(tok, "ROCHE_TOKEN"))
		cfg.Token = tok
		os.Unsetenv("ROCHE_TOKEN")
	}
	if tokensFile != "" {
		tenants, err := LoadTokensFile(tokensFile)
		errs = append(errs, err)
		cfg.Tenants = tenants
	}
	specs = append(specs, f.pools...)
	index := map[pool.Key]int{}
	for _, s := range specs {
		spec, err := pool.ParseSpec(s)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if i, dup := index[spec.Key]; dup {
			cfg.Pools[i] = spec // a later one (a flag) replaces an earlier one (the file)
			continue
		}
		index[spec.Key] = len(cfg.Pools)
		cfg.Pools = append(cfg.Pools, spec)
	}
	if n, err := size.Parse(f.copyMaxBytes); err != nil || n == 0 {
		if err == nil {
			err = errors.New("0 copies nothing: give a size such as 4g")
		}
		errs = append(errs, fmt.Errorf("--copy-max-bytes: %w: %v", roche.ErrInvalidConfig, err))
	} else {
		cfg.CopyMaxBytes = n
	}
	if cfg.PoolConcurrency < 0 {
		errs = append(errs, fmt.Errorf("%w: --pool-concurrency %d: give 1 or more, or 0 to let it adapt", roche.ErrInvalidConfig, cfg.PoolConcurrency))
	}
	if f.engineTimeout <= 0 {
		errs = append(errs, fmt.Errorf("%w: --engine-timeout %v: give a positive duration such as 30s", roche.ErrInvalidConfig, f.engineTimeout))
	}
	return cfg, errors.Join(errs...)
}

func newLogger(w io.Writer, format, level string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level %q: use debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: lv}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("--log-format %q: use text or json", format)
}

func run(cmd *cobra.Command, f *flags, stderr io.Writer) error {
	log, err := newLogger(stderr, f.logFormat, f.logLevel)
	if err != nil {
		return err
	}
	// A soft memory limit makes the collector return what bursts of output leave behind
	// (the output itself is bounded, see output.go) instead of letting the heap double;
	// GOMEMLIMIT overrides it.
	if os.Getenv("GOMEMLIMIT") == "" {
		memlimit.Set(softMemoryLimit) // kept past initgc's window
	}
	cfg, err := buildConfig(cmd, f)
	if err != nil {
		return err
	}
	// Settings are checked before the providers are set up, whose warnings would only
	// bury the reason roched refuses to start.
	served := catalog.Names()
	if len(f.providers) > 0 {
		if err := catalog.Check(f.providers); err != nil {
			return fmt.Errorf("--providers: %w", err)
		}
		served = f.providers
	}
	if err := cfg.Validate(served); err != nil {
		return err
	}
	set, leftOut, err := inproc.Serve(catalog.Options{
		Only: f.providers,
		Log:  log, EngineTimeout: f.engineTimeout, Transport: defaults.Transport,
		Kubeconfig: f.kubeconfig, Namespace: f.namespace, RuntimeClass: f.runtimeClass, KubeQPS: f.kubeQPS, KubeBurst: f.kubeBurst,
		StorageClass:   f.storageClass,
		SeccompProfile: f.seccompProfile, AgentImage: f.agentImage, Runtime: f.runtime, OCIRuntime: f.ociRuntime,
		// roched outlives its sandboxes, so it can run their egress proxies.
		Outlives: true,
		// TCP tenants may mount below some roots: bind what was checked, not a path
		// that a sandbox could redirect in between (the Docker provider's WithPinnedMounts).
		PinnedMounts: cfg.remoteMounts(),
		// python.wasm compiled in the background and kept in memory, each sandbox's
		// interpreter started ahead of its next exec.
		WarmStart: true,
		// A replica's leased sandboxes wait for a Hold moving from a replica that died.
		LeaseGrace: replicaGrace(cfg.ReplicaGroup),
	})
	if err != nil {
		return err
	}
	defer set.Close()
	cfg.Asked, cfg.LeftOut = f.providers, leftOut

	d, err := New(cfg, set, WithLogger(log), WithFrontend(f.newFrontend, cmd.OutOrStdout()))
	if err != nil {
		return err
	}
	return d.ServeUntilSignal(f.shutdownTimeout)
}

// replicaGrace is the lease grace of a replica's providers (none without a group).
func replicaGrace(group string) time.Duration {
	if group == "" {
		return 0
	}
	return ReplicaLeaseGrace
}
