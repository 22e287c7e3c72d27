// Package kubernetes runs Roche sandboxes as Pods through the Kubernetes API (client-go),
// mapping roche.Config's secure defaults onto the Pod's spec. roche-agent runs as each
// Pod's PID 1, installed from a small agent image by an init container, and is reached
// through the API server only (one pods/exec of its multiplexing relay per sandbox; see
// package podlink), so the process using this provider needs no route into the Pod
// network.
package kubernetes

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/yamux"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/egress"
	"github.com/roche-sandbox/roche/internal/guest"
	"github.com/roche-sandbox/roche/internal/guest/guestbin"
	"github.com/roche-sandbox/roche/provider/internal/guestfwd"
	"github.com/roche-sandbox/roche/provider/internal/uidrange"
	"github.com/roche-sandbox/roche/provider/kit"
)

// Name is the provider's name, and the prefix of its sandbox ids ("kubernetes-...").
const Name = "kubernetes"

// DefaultNamespace is where sandboxes go when WithNamespace does not say.
const DefaultNamespace = "roche"

// The uid range (provider/internal/uidrange), as the Docker provider's and halved the same
// way: sandboxes with roche.UserAuto draw from the first half (1900000000-1900999999),
// workspaces from the second (1901000000-1901999999), above what distributions and
// systemd hand out and below 2^31.
const (
	DefaultUIDFirst = uidrange.KubernetesFirst
	DefaultUIDCount = uidrange.KubernetesCount
)

// DefaultCreateTimeout bounds a create: scheduling, the images (present on the node:
// there may be no registry), the init container and the agent's start.
const DefaultCreateTimeout = 2 * time.Minute

// controlTimeout bounds a call that needs one quick answer from the API server.
const controlTimeout = 15 * time.Second

var (
	_ roche.Provider         = (*Provider)(nil)
	_ kit.Creator            = (*Provider)(nil)
	_ roche.FileCopier       = (*Provider)(nil)
	_ roche.TarCopier        = (*Provider)(nil)
	_ roche.GarbageCollector = (*Provider)(nil)
	_ roche.FileSystem       = (*Provider)(nil)
	_ roche.BackgroundRunner = (*Provider)(nil)
)

// forwarder is embedded under another name so that Provider's own methods stay apart.
type forwarder = guestfwd.Forwarder

var _ roche.Terminal = (*Provider)(nil)

// Provider is the Kubernetes backend.
type Provider struct {
	forwarder
	rest         *rest.Config
	cs           kubernetes.Interface
	log          *slog.Logger
	kubeconfig   string
	namespace    string
	runtimeClass string
	// storageClass is the StorageClass of new workspaces' claims ("" the cluster's default).
	storageClass string
	agentImage   string
	// agentLocal: agentImage names the local roche-agent (no --agent-image), an image
	// only an import puts on a node: its Pods never pull it.
	agentLocal    bool
	seccomp       string
	createTimeout time.Duration
	// leaseGrace, when positive, replaces agentspec.LeaseGrace (WithLeaseGrace).
	leaseGrace time.Duration
	// qps and burst are the API client's rate limit (WithClientRate).
	qps      float32
	burst    int
	uidFirst int
	uidCount int
	// cgroupV2 says the nodes have the unified cgroup hierarchy (WithNodeCgroup).
	cgroupV2  bool
	cgroupSet bool
	// egress: this process serves the egress proxies of sandboxes with an allowlist
	// (egress.go).
	egress bool
	// where says which cluster, for errors: the kubeconfig's server.
	where string
	// noCluster and noAgent say why the provider cannot reach a cluster or has no agent
	// image (see Available).
	noCluster, noAgent error
	// sim places sandboxes on simulated nodes, for benchmarks (simulated.go);
	// wrapTransport wraps the transport to the API server; badOption is an option's error.
	sim           *simulation
	wrapTransport func(http.RoundTripper) http.RoundTripper
	badOption     error

	nsOnce sync.Mutex
	nsDone bool

	mu       sync.Mutex
	verified map[string]sandbox
	// leases are the exec streams holding the leases of the leased sandboxes this
	// provider made (lease.go).
	leases guestfwd.Leases
	// sessions are the sandboxes' relay sessions (conn.go), opened on first use.
	sessMu   sync.Mutex
	sessions map[string]*yamux.Session
	// proxies are the egress proxies of sandboxes with an allowlist, by id (egress.go).
	proxies map[string]*egress.Proxy
	// watched is what the latest Watch sees of the Pods (watched.go), nil with none.
	watched atomic.Pointer[watchedPods]
}

// sandbox is what the provider remembers about a Pod it has checked.
type sandbox struct {
	id      string
	expires time.Time
	// started is when the Pod started, from which the kubelet counts its deadline.
	started time.Time
	cfg     kit.Spec
	agent   *guest.Client
}

// Option configures a Provider.
type Option func(*Provider)

// WithLogger sets the logger; the default discards.
func WithLogger(l *slog.Logger) Option { return func(p *Provider) { p.log = l } }

// WithKubeconfig reads the cluster and credentials from this kubeconfig file instead of
// $KUBECONFIG (or, with neither, the in-cluster configuration of a Pod).
func WithKubeconfig(path string) Option { return func(p *Provider) { p.kubeconfig = path } }

// WithNamespace puts sandboxes in this namespace (DefaultNamespace), made when missing.
func WithNamespace(ns string) Option { return func(p *Provider) { p.namespace = ns } }

// WithRuntimeClass runs sandboxes under this RuntimeClass (gvisor, kata, ...): one the
// cluster defines.
func WithRuntimeClass(name string) Option { return func(p *Provider) { p.runtimeClass = name } }

// WithAgentImage names the image the init container installs roche-agent from (see
// WriteAgentImage). By default it is AgentImageRef of the local roche-agent ($ROCHE_AGENT,
// else beside the running executable), which the cluster's nodes must already have.
func WithAgentImage(ref string) Option { return func(p *Provider) { p.agentImage = ref } }

// WithSeccompProfile names the seccomp profile of the sandboxes' containers: a Localhost
// profile installed on every node, as a path relative to the kubelet's seccomp directory
// (DefaultSeccompProfile, Roche's, unless this says otherwise), or SeccompRuntimeDefault
// for the container runtime's own default.
func WithSeccompProfile(name string) Option { return func(p *Provider) { p.seccomp = name } }

// WithNodeCgroup says which cgroup hierarchy the cluster's nodes run, 1 or 2, for the
// mount that keeps a sandbox's pids cgroup from reading as a limit other than its own
// (pidsCgroupMask), whose target differs between them. By default it is the hierarchy
// of the machine the provider runs on: in the cluster, its own node's.
func WithNodeCgroup(version int) Option {
	return func(p *Provider) {
		switch version {
		case 1, 2:
			p.cgroupV2, p.cgroupSet = version == 2, true
		default:
			p.badOption = fmt.Errorf("%w: node cgroup version %d: give 1 or 2", roche.ErrInvalidConfig, version)
		}
	}
}

// WithCreateTimeout bounds a create (DefaultCreateTimeout).
func WithCreateTimeout(d time.Duration) Option { return func(p *Provider) { p.createTimeout = d } }

// Default API client rate: sandboxes are made, listed and destroyed in bursts (a pool, a
// gc), and client-go's own default of 5 requests a second would queue them.
const (
	DefaultClientQPS   = 50
	DefaultClientBurst = 100
)

// WithClientRate sets the API client's rate limit: qps requests a second on average, in
// bursts of up to burst (DefaultClientQPS, DefaultClientBurst; roched --kube-qps,
// --kube-burst). Zero keeps the default. A cluster that serves many sandboxes from few
// roched replicas wants more; an API server shared with other work, less.
func WithClientRate(qps float32, burst int) Option {
	return func(p *Provider) { p.qps, p.burst = qps, burst }
}

// WithUIDRange sets the range uids are drawn from (DefaultUIDFirst, DefaultUIDCount):
// count uids from first, the first half for sandboxes and the second for workspaces.
// Choose one no node user or other tool uses.
func WithUIDRange(first, count int) Option {
	return func(p *Provider) { p.uidFirst, p.uidCount = first, count }
}

// WithClientset uses an existing clientset and REST config (tests with a fake clientset
// pass a nil config: nothing can then reach an agent).
func WithClientset(cs kubernetes.Interface, cfg *rest.Config) Option {
	return func(p *Provider) { p.cs, p.rest = cs, cfg }
}

// New returns a Kubernetes provider. It reads the kubeconfig but does not contact the
// cluster: the first call that needs it reports ErrUnavailable when it does not answer.
func New(opts ...Option) (*Provider, error) {
	p := &Provider{
		log:           slog.New(slog.DiscardHandler),
		namespace:     DefaultNamespace,
		seccomp:       DefaultSeccompProfile,
		createTimeout: DefaultCreateTimeout,
		uidFirst:      DefaultUIDFirst,
		uidCount:      DefaultUIDCount,
		verified:      map[string]sandbox{},
		sessions:      map[string]*yamux.Session{},
		proxies:       map[string]*egress.Proxy{},
	}
	p.forwarder = guestfwd.Forwarder{Reach: p.reach}
	for _, o := range opts {
		o(p)
	}
	if p.badOption != nil {
		return nil, p.badOption
	}
	if !p.cgroupSet {
		p.cgroupV2 = localCgroupV2()
	}
	if p.sim != nil && p.agentImage == "" {
		p.agentImage = simulatedAgentImage
	}
	if errs := validation.IsDNS1123Label(p.namespace); len(errs) > 0 {
		return nil, fmt.Errorf("%w: namespace %q: %s", roche.ErrInvalidConfig, p.namespace, strings.Join(errs, "; "))
	}
	if p.runtimeClass != "" {
		if errs := validation.IsDNS1123Subdomain(p.runtimeClass); len(errs) > 0 {
			return nil, fmt.Errorf("%w: runtime class %q: %s", roche.ErrInvalidConfig, p.runtimeClass, strings.Join(errs, "; "))
		}
	}
	if p.seccomp == "" {
		p.seccomp = DefaultSeccompProfile
	}
	if p.seccomp != SeccompRuntimeDefault && (path.IsAbs(p.seccomp) || path.Clean(p.seccomp) != p.seccomp || strings.HasPrefix(p.seccomp, "..")) {
		return nil, fmt.Errorf("%w: seccomp profile %q: give a path relative to the kubelet's seccomp directory, such as %s, or %s", roche.ErrInvalidConfig, p.seccomp, DefaultSeccompProfile, SeccompRuntimeDefault)
	}
	if p.qps < 0 || p.burst < 0 {
		return nil, fmt.Errorf("%w: client rate %g/s, burst %d: give a positive rate and burst (0 keeps %d/s and %d)", roche.ErrInvalidConfig, p.qps, p.burst, DefaultClientQPS, DefaultClientBurst)
	}
	if p.qps == 0 {
		p.qps = DefaultClientQPS
	}
	if p.burst == 0 {
		p.burst = max(DefaultClientBurst, int(p.qps))
	}
	if p.createTimeout <= 0 {
		return nil, fmt.Errorf("%w: create timeout %v: give a positive duration such as 2m", roche.ErrInvalidConfig, p.createTimeout)
	}
	if p.storageClass != "" {
		if errs := validation.IsDNS1123Subdomain(p.storageClass); len(errs) > 0 {
			return nil, fmt.Errorf("%w: storage class %q: %s", roche.ErrInvalidConfig, p.storageClass, strings.Join(errs, "; "))
		}
	}
	if err := uidrange.Check(p.uidFirst, p.uidCount, 2); err != nil {
		return nil, err
	}
	// A missing cluster configuration or agent is not an error here, as a missing engine
	// is not for the other providers: every call that needs them says what to do.
	if p.agentImage == "" {
		if path := guestbin.Path(); path == "" {
			p.noAgent = fmt.Errorf("%w: no roche-agent to name the agent image by: pass --agent-image (kubernetes.WithAgentImage), or %s", roche.ErrUnavailable, guestbin.Install)
		} else if ref, err := AgentImageRef(path); err != nil {
			p.noAgent = fmt.Errorf("%w: %v", roche.ErrUnavailable, err)
		} else {
			// Named after the local binary, it is in no registry: the nodes must have
			// it imported, and the kubelet is never to look for it elsewhere.
			p.agentImage, p.agentLocal = ref, true
		}
	}
	if p.where == "" {
		p.where = "the cluster"
	}
	if p.cs == nil {
		cfg, where, err := restConfig(p.kubeconfig)
		if err != nil {
			p.noCluster = err
			return p, nil
		}
		cfg.QPS, cfg.Burst = p.qps, p.burst
		// Uncompressed answers: the API server gzips every answer over 128 KiB that a
		// client accepts gzipped, such as a list of a thousand sandboxes' Pods (the
		// reconciliations, every 3 s on each replica of a group), costing it CPU and
		// roched the inflating; between roched and its cluster the bytes are cheap and
		// the CPU is not (docs/roched-in-a-cluster.md, "API rate").
		cfg.DisableCompression = true
		// No ContentType: client-go's generated clients already speak protobuf for the
		// built-in types, every one this provider uses (TestProtobufOnTheWire), and a
		// config-wide one would also be sent to what has no protobuf form.
		if p.wrapTransport != nil {
			cfg.Wrap(p.wrapTransport)
		}
		cs, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			p.noCluster = fmt.Errorf("%w: configuring the Kubernetes client from %s: %v", roche.ErrUnavailable, where, err)
			return p, nil
		}
		p.cs, p.rest, p.where = cs, cfg, where
	}
	return p, nil
}

// Available reports why the provider cannot work: no cluster configured (or a kubeconfig
// that cannot be read), or no agent image to run. It does not contact the cluster.
func (p *Provider) Available() error {
	if p.noCluster != nil {
		return p.noCluster
	}
	return p.noAgent
}

// restConfig loads the client configuration: the kubeconfig named, else $KUBECONFIG, else
// the in-cluster configuration. where names it for messages.
func restConfig(kubeconfig string) (*rest.Config, string, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	switch {
	case kubeconfig != "":
		rules.ExplicitPath = kubeconfig
	case os.Getenv(clientcmd.RecommendedConfigPathEnvVar) != "":
	default:
		cfg, err := rest.InClusterConfig()
		if err != nil {
			return nil, "", kit.NotConfigured(fmt.Errorf("%w: no Kubernetes cluster configured: pass --kubeconfig, set KUBECONFIG, or run inside a cluster", roche.ErrUnavailable))
		}
		return cfg, "the in-cluster configuration (" + cfg.Host + ")", nil
	}
	source := kubeconfig
	if source == "" {
		source = "$KUBECONFIG"
	}
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{}).ClientConfig()
	if err != nil {
		return nil, "", fmt.Errorf("%w: reading kubeconfig %s: %s", roche.ErrUnavailable, source, oneLine(err.Error()))
	}
	return cfg, cfg.Host, nil
}

// Close lets go of the leases this provider holds: its leased sandboxes stop within
// LeaseGrace.
func (p *Provider) Close() error {
	p.leases.DropAll()
	p.dropSessions()
	p.stopAllEgress()
	if p.cs != nil {
		// A process that opens the provider for one look (roche doctor) keeps no
		// connection to the API server, nor its reader, once done.
		if rc, ok := p.cs.Discovery().RESTClient().(*rest.RESTClient); ok && rc.Client != nil {
			utilnet.CloseIdleConnectionsFor(rc.Client.Transport) // through client-go's wrappers
		}
	}
	return nil
}

// Name implements roche.Provider.
func (p *Provider) Name() string { return Name }

// Namespace is where this provider's sandboxes live.
func (p *Provider) Namespace() string { return p.namespace }

// AgentImage is the image the init container installs roche-agent from.
func (p *Provider) AgentImage() string { return p.agentImage }

// Capabilities implements roche.Provider. Host mounts have no meaning on a cluster's
// nodes; pause and snapshots are not done here yet and are refused. An
// egress allowlist is served where this process outlives its sandboxes
// (WithEgressProxy).
func (p *Provider) Capabilities() roche.Capabilities {
	if p.sim != nil {
		return p.sim.capabilities()
	}
	caps := roche.Capabilities{
		Network: true, Egress: p.egress, Writable: true, Files: true, Stdin: true, Processes: true, Leases: true,
		Code: guestfwd.CodeLanguages, RichResults: true,
	}
	if p.gvisor() {
		// A cell past the memory limit ends the whole sandbox on gVisor (gvisor.go).
		caps.Code, caps.RichResults = nil, false
	}
	return caps
}

// unsupported refuses what this provider cannot honour, naming the field.
func (p *Provider) unsupported(cfg roche.Config) error {
	var why []string
	if len(cfg.NetworkAllowlist) > 0 && !p.egress {
		why = append(why, "network_allowlist: needs a host process that outlives the sandbox to run its egress proxy: use roched (roche daemon start) or roche run")
	}
	if len(cfg.Mounts) > 0 {
		why = append(why, "mounts: host paths have no meaning on a cluster's nodes")
	}
	if cfg.FromSnapshot != "" {
		why = append(why, "from_snapshot: snapshots are not done yet")
	}
	if cfg.Writable && cfg.DiskBytes() > 0 {
		why = append(why, "disk with writable: the kubelet enforces ephemeral storage by evicting the Pod, not with ENOSPC; pass disk=0 for a writable root bounded only by the node")
	}
	if len(why) == 0 {
		return nil
	}
	return fmt.Errorf("%w by the kubernetes provider: %s", roche.ErrUnsupported, strings.Join(why, "; "))
}

// apiErr wraps an API error with context and the matching sentinel.
func (p *Provider) apiErr(what string, err error) error {
	var ne net.Error
	var oe *net.OpError
	switch {
	case err == nil:
		return nil
	case errors.Is(err, context.Canceled):
		return fmt.Errorf("%s: %w", what, context.Canceled)
	case apierrors.IsNotFound(err):
		return fmt.Errorf("%s: %w: %s", what, roche.ErrNotFound, oneLine(err.Error()))
	case apierrors.IsForbidden(err) || apierrors.IsUnauthorized(err):
		return fmt.Errorf("%w: %s: the cluster refused: %s (check the kubeconfig's credentials and their RBAC in namespace %s)",
			roche.ErrUnavailable, what, oneLine(err.Error()), p.namespace)
	case apierrors.IsInvalid(err) || apierrors.IsBadRequest(err):
		return fmt.Errorf("%s: %w: %s", what, roche.ErrInvalidConfig, oneLine(err.Error()))
	case errors.Is(err, context.DeadlineExceeded) || apierrors.IsTimeout(err) || apierrors.IsServerTimeout(err):
		return fmt.Errorf("%s: %w: the API server at %s did not answer in time", what, roche.ErrTimeout, p.where)
	case errors.As(err, &oe) || errors.As(err, &ne):
		return fmt.Errorf("%w: %s: the API server at %s is not reachable: %s", roche.ErrUnavailable, what, p.where, oneLine(err.Error()))
	}
	return fmt.Errorf("%s: %w", what, err)
}

// ensureNamespace makes the namespace when it is missing, once per provider.
func (p *Provider) ensureNamespace(ctx context.Context) error {
	if p.noCluster != nil {
		return p.noCluster
	}
	p.nsOnce.Lock()
	defer p.nsOnce.Unlock()
	if p.nsDone {
		return nil
	}
	_, err := p.cs.CoreV1().Namespaces().Get(ctx, p.namespace, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		_, err = p.cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{
			Name: p.namespace, Labels: map[string]string{LabelManaged: "true"},
		}}, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			err = nil
		}
		if err != nil {
			return fmt.Errorf("namespace %s does not exist and could not be made (create it, or pass --namespace): %w", p.namespace, p.apiErr("creating it", err))
		}
	} else if err != nil && !apierrors.IsForbidden(err) {
		// Forbidden: credentials scoped to the namespace may not read Namespace objects;
		// the create below then says whether the namespace is usable.
		return p.apiErr("reading namespace "+p.namespace, err)
	}
	p.nsDone = true
	return nil
}

// namespaceRemade marks a create's context once it has made the namespace again.
type namespaceRemade struct{}

// namespaceGone reports whether err says that the namespace itself is missing (deleted
// under this provider, or a cluster whose store was reset) and the create should make it
// again and start over, once: the namespace is then looked for anew.
func (p *Provider) namespaceGone(ctx context.Context, err error) bool {
	var st apierrors.APIStatus
	if !apierrors.IsNotFound(err) || !errors.As(err, &st) || st.Status().Details == nil || st.Status().Details.Kind != "namespaces" {
		return false
	}
	if ctx.Value(namespaceRemade{}) != nil {
		return false
	}
	p.nsOnce.Lock()
	p.nsDone = false
	p.nsOnce.Unlock()
	p.log.Warn("the sandboxes' namespace is gone: making it again", "namespace", p.namespace)
	return true
}

// Create implements roche.Provider: CreateFor with no owner, not leased.
func (p *Provider) Create(ctx context.Context, cfg roche.Config) (roche.SandboxInfo, error) {
	return p.CreateFor(ctx, cfg, kit.CreateOptions{})
}

// CreateFor implements kit.Creator: a deny-all NetworkPolicy (network off), then the
// Pod; it waits until the agent answers. On error nothing is left behind.
func (p *Provider) CreateFor(ctx context.Context, cfg roche.Config, opts kit.CreateOptions) (roche.SandboxInfo, error) {
	return p.create(ctx, kit.Spec{Config: cfg, CreateOptions: opts})
}

func (p *Provider) create(ctx context.Context, cfg kit.Spec) (_ roche.SandboxInfo, err error) {
	// joined: the Pod is an earlier create's (an idempotency key's), never removed here.
	joined := false
	if err := cfg.Validate(); err != nil {
		return roche.SandboxInfo{}, err
	}
	if err := errors.Join(p.unsupported(cfg.Config), p.sim.refuse(cfg)); err != nil {
		return roche.SandboxInfo{}, err
	}
	if len(cfg.NetworkAllowlist) > 0 {
		if _, err := egress.ParsePolicy(cfg.NetworkAllowlist); err != nil {
			return roche.SandboxInfo{}, fmt.Errorf("%w: %v", roche.ErrInvalidConfig, err)
		}
	}
	if err := p.Available(); err != nil {
		return roche.SandboxInfo{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, p.createTimeout)
	defer cancel()
	if err := p.ensureNamespace(ctx); err != nil {
		return roche.SandboxInfo{}, err
	}
	id := Name + "-" + randomHex(8)
	if cfg.IdempotencyKey != "" {
		id = keyedName(cfg.Owner, cfg.IdempotencyKey)
	}
	expires := time.Now().Add(time.Duration(cfg.TimeoutSecs) * time.Second)
	pp := podParams{
		id: id, namespace: p.namespace, agentImage: p.agentImage, agentLocal: p.agentLocal, runtimeClass: p.runtimeClass,
		expires: expires, seccomp: p.seccomp, user: cfg.User, uid: kit.UID(cfg.Config), cgroupV2: p.cgroupV2,
		leaseGrace: p.leaseGrace, gvisor: p.gvisor(),
	}
	// A workspace first: its uid is its sandboxes' (workspace.go). One this create made
	// goes again if the create fails.
	var claim *corev1.PersistentVolumeClaim
	if cfg.Workspace != "" {
		var made bool
		if claim, made, err = p.ensureWorkspace(ctx, cfg.Workspace, cfg.WorkspaceBytes()); err != nil {
			return roche.SandboxInfo{}, err
		}
		if made {
			defer func() {
				if err != nil && !joined {
					p.deleteClaim(ctx, claim.Name)
				}
			}()
		}
		pp.claim = claim.Name
	}
	drawn := false
	switch {
	case cfg.User == roche.UserAuto && claim != nil:
		uid := workspaceUID(claim)
		pp.user, pp.uid = fmt.Sprintf("%d:%d", uid, uid), uid
	case cfg.User == roche.UserAuto:
		uid, err := p.drawUID(ctx)
		if err != nil {
			return roche.SandboxInfo{}, err
		}
		pp.user, pp.uid, drawn = fmt.Sprintf("%d:%d", uid, uid), uid, true
	}
	if cfg.Leased {
		pp.lease = p.createTimeout
	}
	// The egress proxy first: its CA and the secrets' placeholders go into the Pod. It
	// is this sandbox's from when the Pod is made (keepEgress), closed if never.
	var px *egress.Proxy
	var trust egress.TrustPEM
	if len(cfg.NetworkAllowlist) > 0 && p.egress {
		if px, trust, err = p.newEgressProxy(id, cfg.Config, nil); err != nil {
			return roche.SandboxInfo{}, err
		}
		defer func() {
			if px != nil {
				px.Close()
			}
		}()
		pp.trustEnv = trust.Env
	}
	pod, err := podFor(cfg, pp)
	if err != nil {
		return roche.SandboxInfo{}, err
	}
	if trust.CACert != nil {
		trustVolume(pod, id)
	}
	p.sim.place(pod)
	// From here, whatever fails removes what was made, even when ctx has ended.
	defer func() {
		if err != nil && !joined {
			p.remove(context.WithoutCancel(ctx), id)
		}
	}()
	if !cfg.Network {
		// A keyed create's policy may be an earlier create's: its Pod is what says so.
		if _, err := p.cs.NetworkingV1().NetworkPolicies(p.namespace).Create(ctx, networkPolicyFor(id, p.namespace), metav1.CreateOptions{}); err != nil &&
			!(cfg.IdempotencyKey != "" && apierrors.IsAlreadyExists(err)) {
			if p.namespaceGone(ctx, err) {
				return p.create(context.WithValue(ctx, namespaceRemade{}, true), cfg)
			}
			return roche.SandboxInfo{}, p.apiErr("creating the deny-all NetworkPolicy of sandbox "+id, err)
		}
	}
	if trust.CACert != nil {
		if _, err := p.cs.CoreV1().ConfigMaps(p.namespace).Create(ctx, trustConfigMap(id, p.namespace, trust), metav1.CreateOptions{}); err != nil &&
			!(cfg.IdempotencyKey != "" && apierrors.IsAlreadyExists(err)) {
			return roche.SandboxInfo{}, p.apiErr("creating the ConfigMap of sandbox "+id+"'s egress CA", err)
		}
	}
	made, err := p.cs.CoreV1().Pods(p.namespace).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil && cfg.IdempotencyKey != "" && apierrors.IsAlreadyExists(err) {
		joined = true
		info, err := p.joinKeyed(ctx, id, cfg)
		if errors.Is(err, errKeyedGone) {
			// The earlier create of this key failed (its replica stopped or died
			// mid-create) and what it made is going: once all of it is gone, this
			// create makes the sandbox afresh.
			if err := p.awaitRemoved(ctx, id); err != nil {
				return roche.SandboxInfo{}, err
			}
			return p.create(ctx, cfg)
		}
		return info, err
	}
	if err != nil {
		if p.namespaceGone(ctx, err) {
			return p.create(context.WithValue(ctx, namespaceRemade{}, true), cfg)
		}
		if refused := p.runtimeClassRefused(err); refused != nil {
			return roche.SandboxInfo{}, refused
		}
		return roche.SandboxInfo{}, p.apiErr("creating the Pod of sandbox "+id, err)
	}
	if err := checkPosture(pod, made); err != nil {
		return roche.SandboxInfo{}, err
	}
	if px != nil {
		p.keepEgress(id, px)
		px = nil
	}
	if trust.CACert != nil {
		patch := fmt.Sprintf(`{"metadata":{"ownerReferences":[{"apiVersion":"v1","kind":"Pod","name":%q,"uid":%q}]}}`, id, made.UID)
		if _, err := p.cs.CoreV1().ConfigMaps(p.namespace).Patch(ctx, id, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			return roche.SandboxInfo{}, p.apiErr("tying the egress CA's ConfigMap of sandbox "+id+" to its Pod", err)
		}
	}
	if !cfg.Network {
		// The policy goes with its Pod, whoever deletes the Pod.
		patch := fmt.Sprintf(`{"metadata":{"ownerReferences":[{"apiVersion":"v1","kind":"Pod","name":%q,"uid":%q}]}}`, id, made.UID)
		if _, err := p.cs.NetworkingV1().NetworkPolicies(p.namespace).Patch(ctx, id, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			return roche.SandboxInfo{}, p.apiErr("tying the NetworkPolicy of sandbox "+id+" to its Pod", err)
		}
	}
	if drawn {
		// Two creates that drew the same uid at once: each labelled its Pod before
		// looking, so at least one sees the other and starts again.
		if taken, err := p.uidTakenElsewhere(ctx, pp.uid, id); err != nil {
			return roche.SandboxInfo{}, err
		} else if taken {
			p.remove(context.WithoutCancel(ctx), id)
			return p.create(ctx, cfg)
		}
	}
	sb := sandbox{id: id, expires: expires, cfg: cfg, agent: p.agentClient(id)}
	running, err := p.waitRunning(ctx, id)
	if err != nil {
		return roche.SandboxInfo{}, err
	}
	// A simulated node runs nothing: its Pod's Running phase is all there is.
	if p.sim == nil {
		if err := p.waitAgent(ctx, sb); err != nil {
			return roche.SandboxInfo{}, err
		}
	}
	sb.started = startOf(running)
	if !cfg.Network && cfg.IdempotencyKey != "" {
		if err := p.ensurePolicy(ctx, id, made.UID); err != nil {
			return roche.SandboxInfo{}, err
		}
	}
	if cfg.Leased {
		if err := p.leases.Take(ctx, sb.id, sb.agent); err != nil {
			return roche.SandboxInfo{}, err
		}
	}
	p.remember(sb)
	return p.info(running), nil
}

// waitRunning polls the Pod until it runs, fails, or ctx ends.
func (p *Provider) waitRunning(ctx context.Context, id string) (*corev1.Pod, error) {
	delay := 50 * time.Millisecond
	var last string
	var failures sandboxFailures
	var provisioning claimFailures
	for {
		pod, err := p.cs.CoreV1().Pods(p.namespace).Get(ctx, id, metav1.GetOptions{})
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			return nil, p.apiErr("waiting for the Pod of sandbox "+id, err)
		}
		switch pod.Status.Phase {
		case corev1.PodRunning:
			return pod, nil
		case corev1.PodFailed, corev1.PodSucceeded:
			_, msg := describeWaiting(pod)
			return nil, fmt.Errorf("the Pod of sandbox %s stopped before it served: %s %s", id, pod.Status.Reason, msg)
		}
		reason, msg := describeWaiting(pod)
		last = msg
		switch reason {
		case corev1.PodReasonUnschedulable:
			// Waiting for a workspace's volume: why its provisioning fails, if it does.
			if claim := claimOf(pod); claim != "" {
				if why := provisioning.check(ctx, p, claim); why != "" {
					last = msg + "; its workspace's PersistentVolumeClaim " + claim + ": " + why
					// A StorageClass that does not exist: nothing will ever make the volume
					// (the provider's Role cannot read StorageClasses to say so sooner).
					if strings.Contains(why, `storageclass.storage.k8s.io "`) && strings.Contains(why, `" not found`) {
						return nil, fmt.Errorf("%w: workspace %s: %s: pass --kube-storage-class with a StorageClass the cluster has (kubectl get storageclass lists them), or leave it out for the default",
							roche.ErrInvalidConfig, configOf(pod).Workspace, why)
					}
				}
			}
		case "ErrImageNeverPull", "ErrImagePull", "ImagePullBackOff", "InvalidImageName":
			if strings.HasPrefix(msg, "container "+containerInstall+" ") {
				return nil, fmt.Errorf("%w: %s: the node lacks the agent image %s, which is in no registry: import it into every node's containerd: "+
					"roche kubernetes agent-image --output roche-agent.tar && ctr -n k8s.io images import roche-agent.tar (the project's test cluster: make cluster does it)",
					roche.ErrImageNotFound, msg, p.agentImage)
			}
			return nil, fmt.Errorf("%w: %s: the node has no such image and could not pull it: import it into every node's containerd "+
				"(docker save IMAGE | ctr -n k8s.io images import -), or push it to a registry the cluster pulls from",
				roche.ErrImageNotFound, msg)
		case "CreateContainerConfigError", "CreateContainerError", "RunContainerError", "Terminated":
			if err := p.seccompMissing(id, oneLine(msg)); err != nil {
				return nil, err
			}
			return nil, fmt.Errorf("the Pod of sandbox %s cannot start: %s", id, msg)
		case "":
			// The Pod's sandbox failing leaves the Pod Pending with no reason in its status.
			if fail := failures.check(ctx, p, pod); fail != "" {
				last = "the kubelet could not make the Pod's sandbox: " + fail
				if p.runtimeClass != "" && runtimeHandlerMissing(fail) {
					return nil, fmt.Errorf("%w: the Pod of sandbox %s cannot start under runtime class %q: its node cannot run that RuntimeClass's handler (kubectl get runtimeclass %s shows it; the node's runtime must have it configured): %s",
						roche.ErrUnavailable, id, p.runtimeClass, p.runtimeClass, fail)
				}
				if p.gvisor() && gvisorHintsUnplaced(fail) {
					return nil, fmt.Errorf("%w: the Pod of sandbox %s cannot start: gVisor's shim on its node cannot find the volumes its mount hints name, which it looks for under the kubelet's default root (/var/lib/kubelet/pods; docs/providers/kubernetes.md, gVisor Pods): %s",
						roche.ErrUnavailable, id, fail)
				}
			}
		}
		select {
		case <-ctx.Done():
		case <-time.After(delay):
			delay = min(delay*2, 500*time.Millisecond)
			continue
		}
		break
	}
	if last == "" {
		last = "still pending"
	}
	return nil, fmt.Errorf("%w: the Pod of sandbox %s did not start within %s: %s", roche.ErrTimeout, id, p.createTimeout, last)
}

// waitAgent waits until the agent answers through its relay. An agent that exits once
// started (it refuses what it was started into: another kernel than gVisor's, scratch
// mounts without their bounds) ends its Pod: that is told, in its own words, as soon as
// the kubelet reports it, not waited out.
func (p *Provider) waitAgent(ctx context.Context, sb sandbox) error {
	delay := 50 * time.Millisecond
	var looked time.Time
	for {
		_, err := sb.agent.Health(ctx)
		if err == nil {
			return nil
		}
		if time.Since(looked) >= time.Second {
			looked = time.Now()
			if pod, gerr := p.get(ctx, sb.id); gerr == nil && podEnded(pod) {
				if _, msg := describeWaiting(pod); msg != "" {
					return fmt.Errorf("the Pod of sandbox %s cannot start: %s", sb.id, msg)
				}
				return fmt.Errorf("the Pod of sandbox %s ended before its agent answered (phase %s): %s", sb.id, pod.Status.Phase, oneLine(err.Error()))
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w: the agent of sandbox %s did not answer within %s: %s", roche.ErrTimeout, sb.id, p.createTimeout, oneLine(err.Error()))
		case <-time.After(delay):
			delay = min(delay*2, 500*time.Millisecond)
		}
	}
}

func (p *Provider) agentClient(id string) *guest.Client {
	return guest.NewClientWithDialer(id, func(ctx context.Context) (net.Conn, error) { return p.dialAgent(ctx, id) })
}

// drawUID picks a uid from the first half of the range that no other sandbox of the
// namespace carries.
func (p *Provider) drawUID(ctx context.Context) (int, error) {
	for range 8 {
		uid := uidrange.Draw(p.uidFirst, p.uidCount/2)
		taken, err := p.uidTakenElsewhere(ctx, uid, "")
		if err != nil {
			return 0, err
		}
		if !taken {
			return uid, nil
		}
	}
	return 0, fmt.Errorf("%w: no free uid after 8 draws from %d-%d: widen the range (WithUIDRange)", roche.ErrExhausted, p.uidFirst, p.uidFirst+p.uidCount/2-1)
}

// uidTakenElsewhere reports whether a sandbox other than id carries uid.
func (p *Provider) uidTakenElsewhere(ctx context.Context, uid int, id string) (bool, error) {
	pods, err := p.cs.CoreV1().Pods(p.namespace).List(ctx, metav1.ListOptions{LabelSelector: labels.SelectorFromSet(labels.Set{
		LabelManaged: "true", LabelProvider: Name, LabelUID: strconv.Itoa(uid),
	}).String()})
	if err != nil {
		return false, p.apiErr("listing the sandboxes' uids", err)
	}
	for _, pod := range pods.Items {
		if pod.Name != id {
			return true, nil
		}
	}
	return false, nil
}

// remove deletes the Pod, NetworkPolicy and egress CA's ConfigMap of sandbox id, at once (grace 0); what is
// already gone is not an error.
func (p *Provider) remove(ctx context.Context, id string) error {
	ctx, cancel := context.WithTimeout(ctx, controlTimeout)
	defer cancel()
	p.forget(id)
	defer p.dropSession(id, nil)
	defer p.leases.Drop(id)
	defer p.stopEgress(id)
	del := metav1.DeleteOptions{GracePeriodSeconds: ptr(int64(0))}
	var errs []error
	if err := p.cs.CoreV1().Pods(p.namespace).Delete(ctx, id, del); err != nil && !apierrors.IsNotFound(err) {
		errs = append(errs, p.apiErr("deleting the Pod of sandbox "+id, err))
	} else {
		p.watchRemoved(id)
	}
	if err := p.cs.NetworkingV1().NetworkPolicies(p.namespace).Delete(ctx, id, del); err != nil && !apierrors.IsNotFound(err) {
		errs = append(errs, p.apiErr("deleting the NetworkPolicy of sandbox "+id, err))
	}
	if p.egress {
		if err := p.cs.CoreV1().ConfigMaps(p.namespace).Delete(ctx, id, del); err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, p.apiErr("deleting the egress CA's ConfigMap of sandbox "+id, err))
		}
	}
	return errors.Join(errs...)
}

func (p *Provider) remember(s sandbox) {
	p.mu.Lock()
	p.verified[s.id] = s
	p.mu.Unlock()
}

func (p *Provider) forget(id string) {
	p.mu.Lock()
	delete(p.verified, id)
	p.mu.Unlock()
}

// get returns the Pod of a Roche sandbox, ErrNotFound for anything else.
func (p *Provider) get(ctx context.Context, id string) (*corev1.Pod, error) {
	if p.noCluster != nil {
		return nil, p.noCluster
	}
	if !strings.HasPrefix(id, Name+"-") || len(validation.IsDNS1123Label(id)) > 0 {
		return nil, fmt.Errorf("%w: no sandbox %s (listing your sandboxes shows the live ones)", roche.ErrNotFound, id)
	}
	ctx, cancel := context.WithTimeout(ctx, controlTimeout)
	defer cancel()
	pod, err := p.cs.CoreV1().Pods(p.namespace).Get(ctx, id, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("%w: no sandbox %s (listing your sandboxes shows the live ones)", roche.ErrNotFound, id)
	}
	if err != nil {
		return nil, p.apiErr("inspecting sandbox "+id, err)
	}
	if !isOurs(pod) {
		return nil, fmt.Errorf("%w: %s is not a Roche sandbox", roche.ErrNotFound, id)
	}
	return pod, nil
}

// reach implements guestfwd.Forwarder.Reach.
func (p *Provider) reach(ctx context.Context, id string) (guestfwd.Target, error) {
	if p.sim != nil {
		return guestfwd.Target{}, p.sim.unreachable(id)
	}
	p.mu.Lock()
	s, ok := p.verified[id]
	p.mu.Unlock()
	if !ok {
		pod, err := p.get(ctx, id)
		if err != nil {
			return guestfwd.Target{}, err
		}
		if stateOf(pod) != roche.StateRunning {
			return guestfwd.Target{}, fmt.Errorf("%w: sandbox %s is not running (its Pod is %s)", roche.ErrNotFound, id, pod.Status.Phase)
		}
		s = sandbox{id: id, expires: expiresOf(pod.Labels), cfg: configOf(pod), started: startOf(pod), agent: p.agentClient(id)}
		p.remember(s)
	}
	var end *roche.EndReason
	return guestfwd.Target{
		ID: id, Agent: s.agent, Expires: s.expires, Workdir: s.cfg.Workdir,
		Gone: func() bool {
			gone, why := p.awaitEnd(id)
			if gone {
				p.forget(id)
				end = why
			}
			return gone
		},
		Ended: func() *roche.EndReason { return end },
	}, nil
}

// info describes a sandbox's Pod.
func (p *Provider) info(pod *corev1.Pod) roche.SandboxInfo {
	cfg := configOf(pod)
	img := cfg.Image
	if img == "" && len(pod.Spec.Containers) > 0 {
		img = pod.Spec.Containers[0].Image
	}
	return roche.SandboxInfo{
		ID: pod.Name, Provider: Name, Image: img, State: stateOf(pod),
		CreatedAt: pod.CreationTimestamp.Time, ExpiresAt: expiresOf(pod.Labels),
		Transport: "agent", Owner: pod.Annotations[AnnotationOwner], Metadata: cfg.Metadata,
	}
}

// Inspect implements roche.Provider.
func (p *Provider) Inspect(ctx context.Context, id string) (roche.SandboxInfo, error) {
	pod, err := p.get(ctx, id)
	if err != nil {
		return roche.SandboxInfo{}, err
	}
	return p.info(pod), nil
}

// Destroy implements roche.Provider: it deletes the Pod (grace 0) and its NetworkPolicy;
// a sandbox already gone is not an error.
func (p *Provider) Destroy(ctx context.Context, id string) error {
	if _, err := p.get(ctx, id); err != nil {
		if errors.Is(err, roche.ErrNotFound) {
			p.forget(id)
			return nil
		}
		return err
	}
	return p.remove(ctx, id)
}

// List implements roche.Provider: the Pods labelled as this provider's sandboxes.
func (p *Provider) List(ctx context.Context) ([]roche.SandboxInfo, error) {
	if p.noCluster != nil {
		return nil, p.noCluster
	}
	ctx, cancel := context.WithTimeout(ctx, controlTimeout)
	defer cancel()
	pods, err := p.cs.CoreV1().Pods(p.namespace).List(ctx, metav1.ListOptions{LabelSelector: labels.SelectorFromSet(labels.Set{
		LabelManaged: "true", LabelProvider: Name,
	}).String()})
	if err != nil {
		return nil, p.apiErr("listing sandboxes", err)
	}
	out := make([]roche.SandboxInfo, 0, len(pods.Items))
	for i := range pods.Items {
		out = append(out, p.info(&pods.Items[i]))
	}
	return out, nil
}

// GC implements roche.GarbageCollector: it removes expired sandboxes (by their label)
// and stopped ones (a Pod past its activeDeadlineSeconds is Failed and stays until
// deleted), every one with opts.All. NetworkPolicies whose Pod is gone go too.
func (p *Provider) GC(ctx context.Context, opts roche.GCOptions) ([]roche.SandboxInfo, error) {
	list, err := p.List(ctx)
	if err != nil {
		return nil, err
	}
	// A Pod still pending long after a create would have given up is a leftover.
	kit.MarkUnstarted(list, 2*p.createTimeout)
	removed, err := kit.Collect(ctx, list, opts, p.remove)
	if !opts.DryRun {
		err = errors.Join(err, p.sweepPolicies(ctx))
		if p.egress {
			err = errors.Join(err, p.sweepTrust(ctx))
		}
	}
	return removed, err
}

// sweepPolicies deletes the NetworkPolicies of sandboxes whose Pod is gone (a create cut
// short between the two; the owner reference covers the rest).
func (p *Provider) sweepPolicies(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, controlTimeout)
	defer cancel()
	sel := labels.SelectorFromSet(labels.Set{LabelManaged: "true", LabelProvider: Name}).String()
	pols, err := p.cs.NetworkingV1().NetworkPolicies(p.namespace).List(ctx, metav1.ListOptions{LabelSelector: sel})
	if err != nil {
		return p.apiErr("listing the sandboxes' NetworkPolicies", err)
	}
	for _, pol := range pols.Items {
		if time.Since(pol.CreationTimestamp.Time) < 2*p.createTimeout {
			continue // its create may still be under way
		}
		if _, err := p.cs.CoreV1().Pods(p.namespace).Get(ctx, pol.Name, metav1.GetOptions{}); apierrors.IsNotFound(err) {
			_ = p.cs.NetworkingV1().NetworkPolicies(p.namespace).Delete(ctx, pol.Name, metav1.DeleteOptions{})
		}
	}
	return nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	return s
}

// oneLine joins a multi-line message (client-go's kubeconfig errors) into one line.
func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}
