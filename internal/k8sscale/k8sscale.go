// Package k8sscale runs roched's Kubernetes control plane at scale on simulated nodes
// (kwok: a real API server, scheduler and controllers; nodes that run no container):
// a warm pool of N sandboxes filled by roched, claimed by concurrent clients through its
// API, listed, a batch reaped at its expiry, then roched killed with SIGKILL and started
// again on its state file, which must find its clients' sandboxes and destroy the idle
// pool's. Run checks each of those and measures it; its test runs it small, and
// bench/k8sscale at 1,000 sandboxes.
package k8sscale

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	k8s "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/client"
	"github.com/roche-sandbox/roche/provider/kubernetes"
)

// Image is the sandboxes' image: a simulated node pulls nothing, so any name does.
const Image = "roche/python:local"

// keepSecs is the lifetime of the claims that are kept (the pool's longest).
const keepSecs = 3600

// Params say how big a run is and where it goes.
type Params struct {
	// Sandboxes is the pool's size; every one is claimed.
	Sandboxes int
	// Expiring of the claims get a lifetime of ExpireAfter (whole seconds) and are
	// reaped; the rest are kept until the end.
	Expiring    int
	ExpireAfter time.Duration
	// Clients claim at once, each over its own connection.
	Clients int
	// PoolConcurrency is roched's --pool-concurrency.
	PoolConcurrency int
	// Replicas, when more than 1, runs that many roched of one replica group
	// (--replica-group): each fills a pool of its share of Sandboxes, the clients are
	// spread over them as a Service spreads connections and claim from each its share,
	// and the one killed and started again is the first.
	Replicas int
	// KubeQPS and KubeBurst are each roched's --kube-qps and --kube-burst (0: the
	// provider's defaults, 50 and 100).
	KubeQPS   float32
	KubeBurst int
	// Kubeconfig is the cluster's; Namespace, the run's own, is made by roched and not
	// deleted here; Selector picks the simulated nodes.
	Kubeconfig, Namespace, Selector string
	// Dir holds roched's socket and state file.
	Dir string
	// Progress hears a line per phase; nil discards.
	Progress io.Writer
	// CPUProfile, when set, is where each roched's Go CPU profile of the claim phase is
	// written: CPUProfile.0, .1, ... for the replicas.
	CPUProfile string
}

func (p Params) validate() error {
	var errs []error
	if p.Sandboxes < 2 || p.Expiring < 1 || p.Expiring >= p.Sandboxes {
		errs = append(errs, fmt.Errorf("sandboxes %d, expiring %d: want 2 or more sandboxes, of which at least 1 but not all expire", p.Sandboxes, p.Expiring))
	}
	if p.ExpireAfter < 5*time.Second || p.ExpireAfter%time.Second != 0 {
		errs = append(errs, fmt.Errorf("expire after %v: want whole seconds, 5 s or more", p.ExpireAfter))
	}
	if p.Clients < 1 || p.PoolConcurrency < 1 {
		errs = append(errs, fmt.Errorf("clients %d, pool concurrency %d: want 1 or more of each", p.Clients, p.PoolConcurrency))
	}
	if p.Replicas < 0 || p.Replicas > 1 && (p.Clients < p.Replicas || p.Sandboxes < 2*p.Replicas) {
		errs = append(errs, fmt.Errorf("%d replicas for %d clients and %d sandboxes: want at least a client and 2 sandboxes a replica", p.Replicas, p.Clients, p.Sandboxes))
	}
	if p.KubeQPS < 0 || p.KubeBurst < 0 {
		errs = append(errs, fmt.Errorf("kube qps %g, burst %d: want 0 (the default) or more", p.KubeQPS, p.KubeBurst))
	}
	if p.Kubeconfig == "" || p.Namespace == "" || p.Selector == "" || p.Dir == "" {
		errs = append(errs, errors.New("kubeconfig, namespace, selector and dir are all needed"))
	}
	return errors.Join(errs...)
}

// Phases of a run, the keys of Result.Requests.
const (
	PhaseFill    = "fill"    // the pool made every sandbox
	PhaseClaim   = "claim"   // clients claimed every one
	PhaseList    = "list"    // roched listed them (Result.Lists times)
	PhaseReap    = "reap"    // the expired batch was destroyed and the pool refilled as many
	PhaseRestart = "restart" // the new roched reconciled, destroyed the leftovers, refilled
	PhaseDestroy = "destroy" // roched drained its pool, clients destroyed theirs
)

// Result is what a run measured.
type Result struct {
	Params
	// Fill is from roched's start to its pool's last sandbox ready.
	Fill time.Duration
	// Claims are each claim's latency, ClaimWall first start to last end.
	Claims    []time.Duration
	ClaimWall time.Duration
	// BaselineGets are GETs of a claimed sandbox's Pod by a client of the run's own.
	BaselineGets []time.Duration
	// Lists are roched's lists of all the claimed sandboxes.
	Lists []time.Duration
	// Reaps are, for each expired sandbox, from its expiry to its Pod's deletion.
	Reaps []time.Duration
	// After the SIGKILL, the new roched: Ready from its start to answering (its
	// reconciliation comes first), Clean to the last idle leftover's Pod deleted; Kept
	// client sandboxes found, Leftovers destroyed.
	RestartReady, RestartClean time.Duration
	Kept, Leftovers            int
	// Destroy is from draining the pool to every Pod deleted and roched stopped.
	Destroy time.Duration
	// RSSFullKiB is roched's resident set holding every sandbox, PeakKiB its peak
	// (with replicas, the sum of theirs; ReplicaRSSKiB and ReplicaPeakKiB are each's).
	RSSFullKiB, PeakKiB           int
	ReplicaRSSKiB, ReplicaPeakKiB []int
	// Requests are roched's requests to the API server in each phase.
	Requests map[string]Counts
	// Where the claims' time went: ClaimPatches are roched's PATCHes of the claimed
	// Pods, each from its transport to the answer's headers (the API server and the
	// wire, not client-go's rate limiter); ClaimAPI the API server's account of the
	// phase's requests (its metrics); ClaimCPU the CPU each process spent in it.
	ClaimPatches []time.Duration
	ClaimAPI     map[string]APIStat
	ClaimCPU     CPUCost
	// ListCPU is the CPU each process spent in the list phase (Lists).
	ListCPU CPUCost
	// Gzipped is how many answers of the API server's to roched came gzipped, up to
	// the list phase (roched asks for them plain).
	Gzipped int
}

// Run runs the scale scenario (see the package comment), checking each step; an error
// says which check failed. roched is stopped, or killed, before it returns; the
// namespace is left to the caller, with nothing in it when Run succeeds.
func Run(ctx context.Context, p Params) (*Result, error) {
	if err := p.validate(); err != nil {
		return nil, err
	}
	progress := p.Progress
	if progress == nil {
		progress = io.Discard
	}
	say := func(format string, args ...any) { fmt.Fprintf(progress, "k8sscale: "+format+"\n", args...) }
	cs, err := adminClient(p.Kubeconfig)
	if err != nil {
		return nil, err
	}
	w, err := watchPods(ctx, cs, p.Namespace)
	if err != nil {
		return nil, err
	}
	defer w.stop()

	res := &Result{Params: p, Requests: map[string]Counts{}}
	n := p.Sandboxes
	nr := max(1, p.Replicas)
	// Sandbox i is claimed from replica i%nr: share[r] are replica r's.
	share, expShare := make([]int, nr), make([]int, nr)
	for i := range n {
		share[i%nr]++
		if i >= n-p.Expiring {
			expShare[i%nr]++
		}
	}
	dcfgs := make([]DaemonConfig, nr)
	for i := range dcfgs {
		dcfgs[i] = DaemonConfig{
			Dir: p.Dir, Kubeconfig: p.Kubeconfig, Namespace: p.Namespace, Selector: p.Selector,
			Pool:         fmt.Sprintf("%s/%s?min=%d&max=%d&total=%d&timeout=%d&idle_timeout=%d", kubernetes.Name, Image, share[i], share[i], share[i], keepSecs, keepSecs),
			MaxSandboxes: n, PoolConcurrency: p.PoolConcurrency, KubeQPS: p.KubeQPS, KubeBurst: p.KubeBurst,
		}
		if nr > 1 {
			dcfgs[i].Dir = filepath.Join(p.Dir, strconv.Itoa(i))
			dcfgs[i].ReplicaGroup, dcfgs[i].ReplicaID = "scale", "scale-"+strconv.Itoa(i)
			if err := os.MkdirAll(dcfgs[i].Dir, 0o700); err != nil {
				return nil, err
			}
		}
	}
	rs := make([]*Roched, nr)
	defer func() {
		for _, r := range rs {
			if r != nil {
				r.Kill()
			}
		}
	}()
	logs := func() string {
		var b strings.Builder
		for i, r := range rs {
			if r != nil {
				fmt.Fprintf(&b, "\nroched %d's log ends:\n%s", i, r.Log())
			}
		}
		return b.String()
	}
	fail := func(err error) (*Result, error) { return res, fmt.Errorf("%w%s", err, logs()) }
	for i := range rs {
		r, err := StartRoched(ctx, dcfgs[i])
		if err != nil {
			return fail(err)
		}
		rs[i] = r
	}
	r := rs[0]

	// Fill: each pool makes its share.
	say("filling %d pools with %d sandboxes (pool concurrency %d, %d roched)", nr, n, p.PoolConcurrency, nr)
	for i, r := range rs {
		if err := waitPool(ctx, r.Client, share[i], 0, 10*time.Minute); err != nil {
			return fail(fmt.Errorf("fill: roched %d: %w", i, err))
		}
	}
	res.Fill = time.Since(r.Started)
	before := make([]Counts, nr)
	mark := func(phase string) error {
		total := Counts{}
		for i, r := range rs {
			c, err := r.Requests(ctx)
			if err != nil {
				return err
			}
			total.Add(c.Sub(before[i]))
			before[i] = c
		}
		res.Requests[phase] = total
		return nil
	}
	memory := func(peak bool) (sum int, each []int) {
		for _, r := range rs {
			rss, hwm, _ := r.Memory()
			if peak {
				rss = hwm
			}
			sum += rss
			each = append(each, rss)
		}
		return sum, each
	}
	if err := mark(PhaseFill); err != nil {
		return fail(err)
	}
	if got := w.live(); got != n {
		return fail(fmt.Errorf("fill: %d Pods in namespace %s, want %d", got, p.Namespace, n))
	}

	// Claims, the expiring batch last.
	say("%d clients claiming %d sandboxes (%d of them for %v)", p.Clients, n, p.Expiring, p.ExpireAfter)
	api0, err := apiMetrics(ctx, cs)
	if err != nil {
		return fail(err)
	}
	if p.CPUProfile != "" {
		for i, r := range rs {
			if err := r.StartProfile(ctx); err != nil {
				return fail(fmt.Errorf("profiling roched %d: %w", i, err))
			}
		}
	}
	cpu0 := sampleCPU(rs)
	claims, err := claimAll(ctx, rs, p)
	if err != nil {
		return fail(fmt.Errorf("claim: %w", err))
	}
	res.ClaimCPU = cpu0.to(sampleCPU(rs))
	if p.CPUProfile != "" {
		for i, r := range rs {
			b, err := r.StopProfile(ctx)
			if err == nil {
				err = os.WriteFile(fmt.Sprintf("%s.%d", p.CPUProfile, i), b, 0o644)
			}
			if err != nil {
				return fail(fmt.Errorf("profiling roched %d: %w", i, err))
			}
		}
	}
	api1, err := apiMetrics(ctx, cs)
	if err != nil {
		return fail(err)
	}
	res.ClaimAPI = subAPI(api1, api0)
	for i, r := range rs {
		rtt, err := r.RoundTrips(ctx, "patch pods", before[i]["patch pods"])
		if err != nil {
			return fail(err)
		}
		res.ClaimPatches = append(res.ClaimPatches, rtt...)
	}
	res.ClaimWall = claims.wall
	for _, c := range claims.all {
		res.Claims = append(res.Claims, c.took)
	}
	if err := mark(PhaseClaim); err != nil {
		return fail(err)
	}
	res.RSSFullKiB, res.ReplicaRSSKiB = memory(false)
	// The baseline: a GET of a sandbox's Pod straight from the API server (a client of
	// our own), the least a request of roched's can take on this cluster.
	// Each claimed Pod is also checked to carry no field ownership records: the claim's
	// patch clears them, and the API server then keeps none (kubernetes.Claim).
	for i := range min(200, n) {
		start := time.Now()
		pod, err := cs.CoreV1().Pods(p.Namespace).Get(ctx, claims.all[i].info.ID, metav1.GetOptions{})
		if err != nil {
			return fail(fmt.Errorf("baseline: %w", err))
		}
		res.BaselineGets = append(res.BaselineGets, time.Since(start))
		if mf := pod.ManagedFields; len(mf) > 0 {
			return fail(fmt.Errorf("claimed sandbox %s: its Pod still has %d managedFields entries (first %s), want none after the claim", pod.Name, len(mf), mf[0].Manager))
		}
	}

	// List: roched lists every claimed sandbox (each replica in turn lists them all).
	say("listing")
	cpu0 = sampleCPU(rs)
	for i := range 3 {
		start := time.Now()
		list, err := rs[i%nr].Client.Provider(kubernetes.Name).List(ctx)
		if err != nil {
			return fail(fmt.Errorf("list: %w", err))
		}
		res.Lists = append(res.Lists, time.Since(start))
		if err := sameIDs(list, claims.all); err != nil {
			return fail(fmt.Errorf("list through roched %d: %w", i%nr, err))
		}
	}
	res.ListCPU = cpu0.to(sampleCPU(rs))
	for i, r := range rs {
		g, err := r.Gzipped(ctx)
		if err != nil {
			return fail(fmt.Errorf("roched %d: %w", i, err))
		}
		res.Gzipped += g
	}
	if err := mark(PhaseList); err != nil {
		return fail(err)
	}

	// Reap: the expiring batch goes at its expiry, the kept ones stay; each pool makes
	// as many idle ones again as it lost (its total allows).
	say("waiting for %d sandboxes to expire and be reaped", p.Expiring)
	expiring, kept := claims.all[n-p.Expiring:], claims.all[:n-p.Expiring]
	last := slices.MaxFunc(expiring, func(a, b claim) int { return a.info.ExpiresAt.Compare(b.info.ExpiresAt) }).info.ExpiresAt
	gone, err := w.waitDeleted(ctx, ids(expiring), time.Until(last)+2*time.Minute)
	if err != nil {
		return fail(fmt.Errorf("reap: %w", err))
	}
	for _, c := range expiring {
		res.Reaps = append(res.Reaps, gone[c.info.ID].Sub(c.info.ExpiresAt))
	}
	if err := w.noneDeleted(ids(kept)); err != nil {
		return fail(fmt.Errorf("reap: %w", err))
	}
	for i, r := range rs {
		if err := waitPool(ctx, r.Client, expShare[i], share[i]-expShare[i], 5*time.Minute); err != nil {
			return fail(fmt.Errorf("refill after the reap: roched %d: %w", i, err))
		}
	}
	if err := mark(PhaseReap); err != nil {
		return fail(err)
	}
	res.PeakKiB, res.ReplicaPeakKiB = memory(true)

	// kill -9 of the first roched, and roched again on the same state file: its idle
	// sandboxes go, the others' stay.
	idle := w.liveExcept(ids(kept))
	if len(idle) != p.Expiring {
		return fail(fmt.Errorf("before the kill: %d idle Pods, want %d", len(idle), p.Expiring))
	}
	say("killing roched (SIGKILL) holding %d client sandboxes and %d idle; starting it again", len(kept), expShare[0])
	r.Kill()
	rs[0] = nil
	r, err = StartRoched(ctx, dcfgs[0])
	if err != nil {
		return fail(fmt.Errorf("restart: %w", err))
	}
	rs[0] = r
	before[0] = Counts{}
	res.RestartReady = r.Ready.Sub(r.Started)
	gone, err = w.waitDeletedOf(ctx, idle, expShare[0], 5*time.Minute)
	if err != nil {
		return fail(fmt.Errorf("restart: the dead roched's idle sandboxes: %w", err))
	}
	for _, t := range gone {
		res.RestartClean = max(res.RestartClean, t.Sub(r.Started))
	}
	res.Leftovers = len(gone)
	if err := w.noneDeleted(ids(kept)); err != nil {
		return fail(fmt.Errorf("restart: %w", err))
	}
	list, err := r.Client.Provider(kubernetes.Name).List(ctx)
	if err != nil {
		return fail(fmt.Errorf("restart: list: %w", err))
	}
	if err := sameIDs(list, kept); err != nil {
		return fail(fmt.Errorf("restart: list: %w", err))
	}
	want := map[string]time.Time{}
	for _, c := range kept {
		want[c.info.ID] = c.info.ExpiresAt
	}
	for _, sb := range list {
		if d := sb.ExpiresAt.Sub(want[sb.ID]); d > time.Second || d < -time.Second {
			return fail(fmt.Errorf("restart: sandbox %s expires at %v, was %v", sb.ID, sb.ExpiresAt, want[sb.ID]))
		}
	}
	res.Kept = len(list)
	if err := waitPool(ctx, r.Client, expShare[0], share[0]-expShare[0], 5*time.Minute); err != nil {
		return fail(fmt.Errorf("restart: refill: %w", err))
	}
	if got := w.live(); got != n {
		return fail(fmt.Errorf("restart: %d Pods, want %d (the kept and refilled pools)", got, n))
	}
	if got := w.deletedOf(idle); got != expShare[0] {
		// Only the killed roched's idle sandboxes went: the others' pools are whole.
		return fail(fmt.Errorf("restart: %d idle Pods deleted, want the killed roched's %d", got, expShare[0]))
	}
	if err := mark(PhaseRestart); err != nil {
		return fail(err)
	}

	// Destroy: the pool drained first (else it would refill as the clients' go), then
	// the clients' by DestroyAll, then roched stopped.
	say("destroying everything")
	start := time.Now()
	drained, destroyed := 0, map[string]bool{}
	for i, r := range rs {
		d, _, err := r.Client.PoolDrain(ctx, kubernetes.Name+"/"+Image)
		if err != nil {
			return fail(fmt.Errorf("drain: roched %d: %w", i, err))
		}
		drained += d
	}
	if drained != p.Expiring {
		return fail(fmt.Errorf("drain: roched destroyed %d idle sandboxes, want %d", drained, p.Expiring))
	}
	// Through one roched: with replicas, its group's clients' sandboxes are every one's.
	all, err := r.Client.DestroyAll(ctx, kubernetes.Name)
	if err != nil {
		return fail(fmt.Errorf("destroy: %w", err))
	}
	for _, id := range all {
		destroyed[id] = true
	}
	if len(destroyed) != len(kept) {
		return fail(fmt.Errorf("destroy: roched destroyed %d sandboxes, want %d", len(destroyed), len(kept)))
	}
	// roched answers once they are marked; their Pods go in the background.
	if _, err := w.waitDeleted(ctx, ids(kept), 5*time.Minute); err != nil {
		return fail(fmt.Errorf("destroy: %w", err))
	}
	if err := mark(PhaseDestroy); err != nil {
		return fail(err)
	}
	for i, r := range rs {
		err := r.Stop()
		rs[i] = nil
		if err != nil {
			return res, err
		}
	}
	if err := w.waitEmpty(ctx, 2*time.Minute); err != nil {
		return res, fmt.Errorf("destroy: %w", err)
	}
	res.Destroy = time.Since(start)
	if err := leftBehind(ctx, cs, p.Namespace); err != nil {
		return res, err
	}
	return res, nil
}

// claim is one claim's answer and how long it took.
type claim struct {
	info roche.SandboxInfo
	took time.Duration
}

type claimed struct {
	all  []claim // in the order given out: kept ones first, then the expiring batch
	wall time.Duration
}

// claimAll has p.Clients clients claim every sandbox, each over its own connection to
// one of the roched (spread over them in turn, as a Service spreads connections);
// sandbox i is claimed from roched i%len(rs), and every claim must be served from its
// pool.
func claimAll(ctx context.Context, rs []*Roched, p Params) (claimed, error) {
	n := p.Sandboxes
	out := make([]claim, n)
	jobs := make([]chan int, len(rs))
	for i := range jobs {
		jobs[i] = make(chan int, n)
	}
	for i := range n {
		jobs[i%len(rs)] <- i
	}
	for _, j := range jobs {
		close(j)
	}
	errs := make(chan error, p.Clients)
	var wg sync.WaitGroup
	var stop atomic.Bool
	start := time.Now()
	for k := range p.Clients {
		r := rs[k%len(rs)]
		c, err := client.New(client.WithSocket(r.cfg.socket()))
		if err != nil {
			return claimed{}, err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer c.Close()
			for i := range jobs[k%len(rs)] {
				if stop.Load() {
					return
				}
				cfg := roche.DefaultConfig()
				cfg.Image = Image
				cfg.TimeoutSecs = keepSecs
				if i >= n-p.Expiring {
					cfg.TimeoutSecs = int(p.ExpireAfter / time.Second)
				}
				t0 := time.Now()
				sb, pooled, err := c.Create(ctx, kubernetes.Name, cfg)
				took := time.Since(t0)
				if err == nil && !pooled {
					err = fmt.Errorf("claim %d was not served from the pool (sandbox %s made for it)", i, sb.ID)
				}
				if err != nil {
					stop.Store(true)
					errs <- err
					return
				}
				out[i] = claim{info: sb, took: took}
			}
		}()
	}
	wg.Wait()
	wall := time.Since(start)
	select {
	case err := <-errs:
		return claimed{all: out, wall: wall}, err
	default:
	}
	return claimed{all: out, wall: wall}, nil
}

// waitPool waits until roched's pool has idle sandboxes ready and inUse handed out,
// with nothing being made.
func waitPool(ctx context.Context, c *client.Client, idle, inUse int, within time.Duration) error {
	deadline := time.Now().Add(within)
	var last string
	for {
		pools, err := c.PoolStatus(ctx)
		if err != nil {
			return err
		}
		if len(pools) != 1 {
			return fmt.Errorf("%d pools, want 1", len(pools))
		}
		pl := pools[0]
		if int(pl.Idle) == idle && int(pl.InUse) == inUse && pl.Creating == 0 {
			return nil
		}
		last = fmt.Sprintf("idle %d, creating %d, in use %d, last error %q", pl.Idle, pl.Creating, pl.InUse, pl.LastError)
		if time.Now().After(deadline) {
			return fmt.Errorf("the pool did not reach %d idle and %d in use within %v: %s", idle, inUse, within, last)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// sameIDs checks that list holds exactly the claimed sandboxes.
func sameIDs(list []roche.SandboxInfo, want []claim) error {
	got := map[string]bool{}
	for _, sb := range list {
		got[sb.ID] = true
	}
	missing := 0
	for _, c := range want {
		if !got[c.info.ID] {
			missing++
		}
	}
	if len(list) != len(want) || missing > 0 {
		return fmt.Errorf("%d sandboxes listed, want %d (%d of those missing)", len(list), len(want), missing)
	}
	return nil
}

func ids(cs []claim) []string {
	out := make([]string, len(cs))
	for i, c := range cs {
		out[i] = c.info.ID
	}
	return out
}

func adminClient(kubeconfig string) (k8s.Interface, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("reading kubeconfig %s: %w", kubeconfig, err)
	}
	cfg.QPS, cfg.Burst = 50, 100
	return k8s.NewForConfig(cfg)
}

// leftBehind fails when a Pod or NetworkPolicy of the run remains in its namespace.
func leftBehind(ctx context.Context, cs k8s.Interface, ns string) error {
	pods, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	pols, err := cs.NetworkingV1().NetworkPolicies(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	if len(pods.Items)+len(pols.Items) > 0 {
		return fmt.Errorf("left behind in namespace %s: %d Pods, %d NetworkPolicies", ns, len(pods.Items), len(pols.Items))
	}
	return nil
}

// podWatch follows the namespace's Pods from outside roched (an informer of its own,
// whose requests are not roched's), recording when each was deleted.
type podWatch struct {
	stopCh  chan struct{}
	mu      sync.Mutex
	present map[string]bool
	deleted map[string]time.Time
	changed chan struct{}
}

func watchPods(ctx context.Context, cs k8s.Interface, ns string) (*podWatch, error) {
	w := &podWatch{stopCh: make(chan struct{}), present: map[string]bool{}, deleted: map[string]time.Time{}, changed: make(chan struct{})}
	f := informers.NewSharedInformerFactoryWithOptions(cs, 0, informers.WithNamespace(ns))
	inf := f.Core().V1().Pods().Informer()
	_, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			if pod, ok := obj.(*corev1.Pod); ok {
				w.update(pod.Name, true)
			}
		},
		DeleteFunc: func(obj any) {
			if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			if pod, ok := obj.(*corev1.Pod); ok {
				w.update(pod.Name, false)
			}
		},
	})
	if err != nil {
		return nil, err
	}
	f.Start(w.stopCh)
	sctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if !cache.WaitForCacheSync(sctx.Done(), inf.HasSynced) {
		close(w.stopCh)
		return nil, fmt.Errorf("watching the Pods of namespace %s: no answer within a minute", ns)
	}
	return w, nil
}

func (w *podWatch) stop() { close(w.stopCh) }

func (w *podWatch) update(name string, present bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if present {
		w.present[name] = true
	} else {
		delete(w.present, name)
		w.deleted[name] = time.Now()
	}
	close(w.changed)
	w.changed = make(chan struct{})
}

func (w *podWatch) live() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.present)
}

// liveExcept lists the Pods present but for those named.
func (w *podWatch) liveExcept(names []string) []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	skip := map[string]bool{}
	for _, n := range names {
		skip[n] = true
	}
	var out []string
	for n := range w.present {
		if !skip[n] {
			out = append(out, n)
		}
	}
	return out
}

// noneDeleted fails when one of the named Pods has been deleted.
func (w *podWatch) noneDeleted(names []string) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, n := range names {
		if _, gone := w.deleted[n]; gone || !w.present[n] {
			return fmt.Errorf("the Pod of kept sandbox %s is gone", n)
		}
	}
	return nil
}

// waitDeleted waits until every named Pod is deleted and returns when each was.
func (w *podWatch) waitDeleted(ctx context.Context, names []string, within time.Duration) (map[string]time.Time, error) {
	return w.wait(ctx, within, func() (bool, string) {
		left := 0
		for _, n := range names {
			if _, gone := w.deleted[n]; !gone {
				left++
			}
		}
		return left == 0, fmt.Sprintf("%d of %d Pods still there", left, len(names))
	}, names)
}

// waitDeletedOf waits until k of the named Pods are deleted and returns when each was.
func (w *podWatch) waitDeletedOf(ctx context.Context, names []string, k int, within time.Duration) (map[string]time.Time, error) {
	var at map[string]time.Time
	_, err := w.wait(ctx, within, func() (bool, string) {
		at = map[string]time.Time{}
		for _, n := range names {
			if t, gone := w.deleted[n]; gone {
				at[n] = t
			}
		}
		return len(at) >= k, fmt.Sprintf("%d of %d Pods deleted, want %d", len(at), len(names), k)
	}, nil)
	return at, err
}

// deletedOf is how many of the named Pods have been deleted.
func (w *podWatch) deletedOf(names []string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	k := 0
	for _, n := range names {
		if _, gone := w.deleted[n]; gone {
			k++
		}
	}
	return k
}

// waitEmpty waits until the namespace has no Pod.
func (w *podWatch) waitEmpty(ctx context.Context, within time.Duration) error {
	_, err := w.wait(ctx, within, func() (bool, string) {
		return len(w.present) == 0, fmt.Sprintf("%d Pods left", len(w.present))
	}, nil)
	return err
}

func (w *podWatch) wait(ctx context.Context, within time.Duration, done func() (bool, string), names []string) (map[string]time.Time, error) {
	timeout := time.After(within)
	for {
		w.mu.Lock()
		ok, why := done()
		changed := w.changed
		var at map[string]time.Time
		if ok {
			at = make(map[string]time.Time, len(names))
			for _, n := range names {
				at[n] = w.deleted[n]
			}
		}
		w.mu.Unlock()
		if ok {
			return at, nil
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-timeout:
			return nil, fmt.Errorf("after %v: %s", within, why)
		case <-changed:
		}
	}
}
