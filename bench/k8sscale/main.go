// Command k8sscale measures roched's Kubernetes control plane with 1,000 sandboxes on the
// test cluster's simulated nodes (kwok: the real API server, scheduler and controllers;
// nodes that run no container), through roched's API: its pool fills, concurrent clients
// claim every sandbox, roched lists them, a batch is reaped at its expiry, then roched is
// killed with SIGKILL and started again on its state file (internal/k8sscale). It prints
// claims per second, claim latency against a bare GET of a Pod measured in the same run,
// roched's RSS and its requests to the API server per sandbox. It asserts nothing about
// speed; it fails (exit 1) when a step does not do what it should (a claim not served
// from the pool, a list short, a sandbox not reaped, found or destroyed) or leaves a Pod.
//
//	make bench                    (or: go run ./bench/k8sscale)
//	go run ./bench/k8sscale -n 200 -expiring 20
//	go run ./bench/k8sscale -replicas 3 -kube-qps 100
//
// With -replicas N, N roched of one replica group run, each filling a pool of its share
// and claimed from by its share of the clients; the first is the one killed.
//
// It brings the test cluster up with kwok (scripts/k8s/cluster.sh up --kwok 4) and works
// in a namespace of its own, deleted at the end.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"os"
	"runtime"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8s "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/roche-sandbox/roche/bench/internal/samples"
	"github.com/roche-sandbox/roche/internal/k8sscale"
	"github.com/roche-sandbox/roche/internal/testcluster"
)

var (
	sandboxes   = flag.Int("n", 1000, "sandboxes: the pool's size, every one claimed")
	expiring    = flag.Int("expiring", 100, "of the claims, how many expire and are reaped")
	expireAfter = flag.Duration("expire-after", 20*time.Second, "their lifetime (whole seconds)")
	clients     = flag.Int("clients", 16, "clients claiming at once")
	concurrency = flag.Int("pool-concurrency", 16, "roched's --pool-concurrency: the pool's creations at once")
	kwokNodes   = flag.Int("kwok-nodes", 4, "simulated nodes (each takes up to 1,000 Pods, 640 at a sandbox's CPU request)")
	replicas    = flag.Int("replicas", 1, "roched replicas of one group (--replica-group), each with its share of the pool and of the clients")
	kubeQPS     = flag.Float64("kube-qps", 0, "each roched's --kube-qps (0: the provider's default, 50)")
	kubeBurst   = flag.Int("kube-burst", 0, "each roched's --kube-burst (0: the provider's default, 100, or the rate if more)")
	cpuProfile  = flag.String("cpuprofile", "", "write each roched's Go CPU profile of the claims to FILE.0, FILE.1, ...")
)

func main() {
	k8sscale.RunIfChild() // this program is also the run's roched
	flag.Parse()
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "k8sscale: %v\n", err)
		os.Exit(1)
	}
}

func run() error {
	cluster, err := testcluster.StartKwok(*kwokNodes)
	if err != nil {
		return err
	}
	b := make([]byte, 4)
	rand.Read(b)
	ns := "roche-scale-bench-" + hex.EncodeToString(b)
	defer deleteNamespace(cluster.Kubeconfig, ns)
	dir, err := os.MkdirTemp("", "rk8s")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)

	fmt.Printf("roche k8sscale: %d sandboxes (%d expire after %v), %d clients, pool concurrency %d, %d roched, kube-qps %g, kube-burst %d, %d kwok nodes, %d CPUs\n",
		*sandboxes, *expiring, *expireAfter, *clients, *concurrency, max(1, *replicas), *kubeQPS, *kubeBurst, *kwokNodes, runtime.NumCPU())
	base, stopSignals := samples.Interruptible()
	defer stopSignals()
	ctx, cancel := context.WithTimeout(base, 30*time.Minute)
	defer cancel()
	res, err := k8sscale.Run(ctx, k8sscale.Params{
		Sandboxes: *sandboxes, Expiring: *expiring, ExpireAfter: *expireAfter,
		Clients: *clients, PoolConcurrency: *concurrency,
		Replicas: *replicas, KubeQPS: float32(*kubeQPS), KubeBurst: *kubeBurst,
		Kubeconfig: cluster.Kubeconfig, Namespace: ns, Selector: testcluster.KwokSelector,
		Dir: dir, Progress: os.Stderr, CPUProfile: *cpuProfile,
	})
	if err != nil {
		return err
	}
	report(res)
	return nil
}

func report(r *k8sscale.Result) {
	n := r.Sandboxes
	pct := func(ds []time.Duration, p int) string { return samples.Ms(samples.Percentile(ds, p)) }
	fmt.Printf("\n%-58s %10s %10s %10s\n", "measurement", "p50", "p99", "max")
	row := func(name string, ds []time.Duration) {
		fmt.Printf("%-58s %10s %10s %10s\n", name, pct(ds, 50), pct(ds, 99), pct(ds, 100))
	}
	row(fmt.Sprintf("claim from the pool (%d clients at once)", r.Clients), r.Claims)
	row("baseline: GET of a sandbox's Pod (client-go, same run)", r.BaselineGets)
	row(fmt.Sprintf("roched list of %d sandboxes", n), r.Lists)
	row(fmt.Sprintf("reap: expiry to Pod deleted (%d sandboxes)", len(r.Reaps)), r.Reaps)

	fmt.Printf("\n%-58s %10s\n", "throughput and totals", "")
	fmt.Printf("%-58s %10.1f\n", "claims per second", float64(n)/r.ClaimWall.Seconds())
	fmt.Printf("%-58s %10.1f\n", fmt.Sprintf("pool fill: sandboxes ready per second (%d in %s)", n, secs(r.Fill)), float64(n)/r.Fill.Seconds())
	fmt.Printf("%-58s %10s\n", fmt.Sprintf("restart after SIGKILL: answering (reconciled, %d kept)", r.Kept), secs(r.RestartReady))
	fmt.Printf("%-58s %10s\n", fmt.Sprintf("restart after SIGKILL: %d idle leftovers deleted", r.Leftovers), secs(r.RestartClean))
	fmt.Printf("%-58s %10s\n", "destroy all, roched drained and stopped, no Pod left", secs(r.Destroy))
	fmt.Printf("%-58s %10.1f\n", "roched RSS holding every sandbox (MiB)", float64(r.RSSFullKiB)/1024)
	fmt.Printf("%-58s %10.1f\n", "roched peak RSS before the kill (MiB)", float64(r.PeakKiB)/1024)
	if len(r.ReplicaRSSKiB) > 1 {
		for i := range r.ReplicaRSSKiB {
			fmt.Printf("%-58s %10s\n", fmt.Sprintf("  replica %d: RSS holding its share / peak (MiB)", i),
				fmt.Sprintf("%.1f / %.1f", float64(r.ReplicaRSSKiB[i])/1024, float64(r.ReplicaPeakKiB[i])/1024))
		}
	}
	fmt.Printf("%-58s %10.2fx\n", "claim p50 / baseline GET p50", samples.Ratio(r.Claims, r.BaselineGets))

	claimCost(r)

	fmt.Printf("\nroched's requests to the API server (counted in its transport; %d answers came gzipped):\n", r.Gzipped)
	per := []struct {
		phase, what string
		by          int
	}{
		{k8sscale.PhaseFill, "per sandbox made", n},
		{k8sscale.PhaseClaim, "per claim", n},
		{k8sscale.PhaseList, "per list (3 lists)", 3},
		{k8sscale.PhaseReap, "per sandbox reaped, its refill included", r.Expiring},
		{k8sscale.PhaseRestart, fmt.Sprintf("per sandbox (%d leftovers destroyed, %d made)", r.Leftovers, r.Leftovers), n},
		{k8sscale.PhaseDestroy, "per sandbox destroyed (drain, DestroyAll)", n},
	}
	total := 0
	for _, p := range per {
		c := r.Requests[p.phase]
		total += c.Total()
		fmt.Printf("  %-8s %6d  %6.2f %-40s %s\n", p.phase, c.Total(), float64(c.Total())/float64(p.by), p.what, shorten(c.String()))
	}
	// Sandboxes made: the fill, the refill after the reap, the refill after the restart.
	made := n + r.Expiring + r.Leftovers
	fmt.Printf("  %-8s %6d  %6.2f per sandbox made over the run (%d made)\n", "all", total, float64(total)/float64(made), made)
}

// claimCost says where the claims' time went: roched's PATCH as its transport saw it,
// the API server's and etcd's account of it, and the CPU of each process meanwhile.
func claimCost(r *k8sscale.Result) {
	n := len(r.Claims)
	fmt.Printf("\nwhere the claims' time went (%s of claims):\n", secs(r.ClaimWall))
	pct := func(ds []time.Duration, p int) string { return samples.Ms(samples.Percentile(ds, p)) }
	fmt.Printf("  %-56s %10s %10s\n", "roched's PATCH of the Pod, transport to answer", pct(r.ClaimPatches, 50), pct(r.ClaimPatches, 99))
	for _, k := range []string{"apiserver PATCH pods", "etcd get pods", "etcd update pods"} {
		st := r.ClaimAPI[k]
		fmt.Printf("  %-56s %10s  (mean of %d, the API server's metrics)\n", k, samples.Ms(st.Mean()), st.Count)
	}
	c := r.ClaimCPU
	cpus := float64(c.Busy+c.Idle+c.Steal) / float64(c.Wall)
	fmt.Printf("  machine: busy %.0f%%, idle %.0f%%, stolen %.0f%% of %.1f CPUs\n",
		100*float64(c.Busy)/float64(c.Wall)/cpus, 100*float64(c.Idle)/float64(c.Wall)/cpus, 100*float64(c.Steal)/float64(c.Wall)/cpus, cpus)
	var parts []string
	for _, name := range c.Names() {
		parts = append(parts, fmt.Sprintf("%s %.2f", name, ms(c.Procs[name])/float64(n)))
	}
	parts = append(parts, fmt.Sprintf("the rest %.2f", ms(c.Other())/float64(n)))
	fmt.Printf("  CPU ms per claim (%.2f in all): %s\n", ms(c.Busy)/float64(n), strings.Join(parts, ", "))
	l := r.ListCPU
	fmt.Printf("  for scale, a list of all %d sandboxes through roched (%d lists): %.1f ms of the API server's CPU, %.1f of roched's\n",
		r.Sandboxes, len(r.Lists), ms(l.Procs["kube-apiserver"])/float64(len(r.Lists)), ms(l.Procs["roched"])/float64(len(r.Lists)))
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func secs(d time.Duration) string { return fmt.Sprintf("%.1f s", d.Seconds()) }

func shorten(s string) string {
	if len(s) > 110 {
		return s[:107] + "..."
	}
	return s
}

func deleteNamespace(kubeconfig, ns string) {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		fmt.Fprintf(os.Stderr, "k8sscale: deleting namespace %s: %v\n", ns, err)
		return
	}
	cs, err := k8s.NewForConfig(cfg)
	if err != nil {
		fmt.Fprintf(os.Stderr, "k8sscale: deleting namespace %s: %v\n", ns, err)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := cs.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{}); err != nil && !strings.Contains(err.Error(), "not found") {
		fmt.Fprintf(os.Stderr, "k8sscale: deleting namespace %s: %v\n", ns, err)
	}
}
