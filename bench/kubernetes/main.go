// Command kubernetes measures roched's kubernetes provider on the test cluster (started
// with make cluster) against a baseline taken in the same run: a bare Pod of the same image, made
// and watched until Running through the API server. It prints the medians and 99th
// percentiles of a create served by claiming a warm Pod (one patch of its labels), of a
// cold create (a Pod made for the request, its agent answering), of the bare Pod, and of
// an exec in a claimed sandbox, and their ratios. It asserts nothing about speed and
// fails (exit 1) only when an operation errs or a Pod is left behind.
//
//	make bench                      (or: go run ./bench/kubernetes)
//	go run ./bench/kubernetes -n 5
//
// Everything it makes lives in a namespace of its own, deleted at the end.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8s "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/bench/internal/samples"
	"github.com/roche-sandbox/roche/client"
	"github.com/roche-sandbox/roche/internal/daemon"
	"github.com/roche-sandbox/roche/internal/testcluster"
	"github.com/roche-sandbox/roche/pool"
	"github.com/roche-sandbox/roche/provider/kubernetes"
)

var (
	image   = flag.String("image", "roche/python:local", "image to run (make cluster imports roche/python:local into the node)")
	n       = flag.Int("n", 15, "samples per measurement")
	verbose = flag.Bool("v", false, "log the daemon at debug level to stderr")
)

func main() {
	flag.Parse()
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "bench: %v\n", err)
		os.Exit(1)
	}
}

var hello = []string{"python3", "-c", "print('hello')"}

func run() error {
	ctx, stopSignals := samples.Interruptible()
	defer stopSignals()
	if *n < 1 {
		return errors.New("-n must be at least 1")
	}
	cluster, err := testcluster.Up()
	if err != nil {
		return err
	}
	kc := cluster.Kubeconfig
	rc, err := clientcmd.BuildConfigFromFlags("", kc)
	if err != nil {
		return err
	}
	cs, err := k8s.NewForConfig(rc)
	if err != nil {
		return err
	}

	agentNote, cleanupAgent, err := samples.SetupAgent()
	if err != nil {
		return err
	}
	defer cleanupAgent()
	removeImage, err := importAgentImage(cluster, os.Getenv("ROCHE_AGENT"))
	if err != nil {
		return err
	}
	defer removeImage()

	var rnd [4]byte
	_, _ = rand.Read(rnd[:])
	ns := "roche-bench-" + hex.EncodeToString(rnd[:])
	defer deleteNamespace(cs, ns)

	logLevel := slog.LevelWarn
	if *verbose {
		logLevel = slog.LevelDebug
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: logLevel}))
	kp, err := kubernetes.New(kubernetes.WithKubeconfig(kc), kubernetes.WithNamespace(ns), kubernetes.WithLogger(log))
	if err != nil {
		return err
	}
	defer kp.Close()
	if err := kp.Available(); err != nil {
		return err
	}

	dir, err := os.MkdirTemp("", "rbench")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	spec, err := pool.ParseSpec(fmt.Sprintf("kubernetes/%s?min=2&max=2", *image))
	if err != nil {
		return err
	}
	c, stop, err := samples.StartDaemon(ctx, daemon.Config{
		Socket: filepath.Join(dir, "roched.sock"), Pools: []pool.Spec{spec}, PoolConcurrency: 2, MaxSandboxes: 50,
	}, map[string]roche.Provider{kubernetes.Name: kp}, log)
	if err != nil {
		return err
	}
	defer stop()
	defer c.Close()
	p := c.Provider(kubernetes.Name)

	cfg := roche.DefaultConfig()
	cfg.Image = *image
	fmt.Printf("roche bench kubernetes: %s on %s, namespace %s, %d CPUs, %s, n=%d per row, pool min=2\n",
		*image, rc.Host, ns, runtime.NumCPU(), agentNote, *n)
	wctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	_, err = c.PoolWarmup(wctx, "", 0)
	cancel()
	if err != nil {
		return fmt.Errorf("warming the pool: %w", err)
	}

	var claim, cold, bare, execs []time.Duration
	for i := range *n + 1 { // the first round warms every path and is not counted
		// Interleaved, so that the baseline and Roche share the machine's conditions.
		dur, err := barePod(ctx, cs, ns, *image)
		if err != nil {
			return err
		}
		if err := waitIdle(ctx, c); err != nil {
			return err
		}
		start := time.Now()
		sb, pooled, err := c.Create(ctx, kubernetes.Name, cfg)
		if err != nil {
			return err
		}
		claimDur := time.Since(start)
		if !pooled {
			return samples.DestroyAfter(ctx, p, sb.ID, errors.New("a create was made cold with the pool full"))
		}
		start = time.Now()
		res, err := p.Exec(ctx, sb.ID, roche.ExecRequest{Cmd: hello})
		if err != nil || res.Stdout != "hello\n" {
			return samples.DestroyAfter(ctx, p, sb.ID, fmt.Errorf("exec in %s: %+v %v", sb.ID, res, err))
		}
		execDur := time.Since(start)
		if err := p.Destroy(context.WithoutCancel(ctx), sb.ID); err != nil {
			return err
		}
		if err := waitIdle(ctx, c); err != nil {
			return err
		}
		coldCfg := cfg
		coldCfg.Memory = "511m" // the pool serves 512m only: this one is made for the request
		start = time.Now()
		sb, pooled, err = c.Create(ctx, kubernetes.Name, coldCfg)
		if err != nil {
			return err
		}
		coldDur := time.Since(start)
		if pooled {
			return samples.DestroyAfter(ctx, p, sb.ID, errors.New("a create with other memory was served from the pool"))
		}
		if err := p.Destroy(context.WithoutCancel(ctx), sb.ID); err != nil {
			return err
		}
		if i > 0 {
			bare, claim, execs, cold = append(bare, dur), append(claim, claimDur), append(execs, execDur), append(cold, coldDur)
		}
	}
	if err := stop(); err != nil {
		return fmt.Errorf("stopping roched: %w", err)
	}
	pods, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	if len(pods.Items) > 0 {
		return fmt.Errorf("%d Pods left in %s after roched stopped", len(pods.Items), ns)
	}

	row := func(name string, ds []time.Duration) {
		fmt.Printf("  %-46s p50 %9s   p99 %9s\n", name, samples.Ms(samples.Median(ds)), samples.Ms(samples.Percentile(ds, 99)))
	}
	row("bare Pod create -> Running (baseline)", bare)
	row("roched create, claimed from the pool", claim)
	row("roched create, cold (Pod + agent answering)", cold)
	row("exec print('hello') in a claimed sandbox", execs)
	fmt.Printf("  claim is %.0fx faster than a bare Pod start; cold create is %.2fx the bare Pod\n",
		samples.Ratio(bare, claim), samples.Ratio(cold, bare))
	return nil
}

// barePod makes a Pod of img that sleeps, times it until Running, and deletes it.
func barePod(ctx context.Context, cs k8s.Interface, ns, img string) (time.Duration, error) {
	var rnd [4]byte
	_, _ = rand.Read(rnd[:])
	name := "bare-" + hex.EncodeToString(rnd[:])
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PodSpec{
			RestartPolicy:                 corev1.RestartPolicyNever,
			AutomountServiceAccountToken:  new(bool),
			TerminationGracePeriodSeconds: new(int64),
			Containers: []corev1.Container{{
				Name: "c", Image: img, ImagePullPolicy: corev1.PullIfNotPresent,
				Command: []string{"sleep", "300"},
			}},
		},
	}
	start := time.Now()
	if _, err := cs.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		return 0, err
	}
	defer cs.CoreV1().Pods(ns).Delete(context.WithoutCancel(ctx), name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)})
	delay := 10 * time.Millisecond
	for deadline := time.Now().Add(2 * time.Minute); time.Now().Before(deadline); time.Sleep(delay) {
		got, err := cs.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return 0, err
		}
		if got.Status.Phase == corev1.PodRunning {
			return time.Since(start), nil
		}
		if got.Status.Phase == corev1.PodFailed {
			return 0, fmt.Errorf("bare Pod %s failed: %s", name, got.Status.Message)
		}
	}
	return 0, fmt.Errorf("bare Pod %s not running after 2 minutes", name)
}

// waitIdle waits, untimed, until the pool has an idle sandbox.
func waitIdle(ctx context.Context, c *client.Client) error {
	deadline := time.Now().Add(2 * time.Minute)
	for time.Now().Before(deadline) {
		st, err := c.PoolStatus(ctx)
		if err != nil {
			return err
		}
		if st[0].Idle > 0 {
			return nil
		}
		time.Sleep(10 * time.Millisecond)
	}
	return errors.New("the pool did not refill within 2 minutes")
}

// importAgentImage writes the agent image of roche-agent at path and imports it into
// the test cluster's node; remove takes it out again.
func importAgentImage(cluster *testcluster.Cluster, path string) (remove func(), err error) {
	dir, err := os.MkdirTemp("", "rbench-agent")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	f, err := os.Create(filepath.Join(dir, "agent.tar"))
	if err != nil {
		return nil, err
	}
	ref, err := kubernetes.WriteAgentImage(f, path)
	f.Close()
	if err != nil {
		return nil, err
	}
	if err := cluster.ImportTar(f.Name()); err != nil {
		return nil, err
	}
	return func() {
		if err := cluster.RemoveImage(ref); err != nil {
			fmt.Fprintf(os.Stderr, "bench: %v\n", err)
		}
	}, nil
}

// deleteNamespace deletes the bench's namespace and waits until it is gone.
func deleteNamespace(cs k8s.Interface, ns string) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	err := cs.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{})
	for err == nil {
		time.Sleep(250 * time.Millisecond)
		_, err = cs.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
	}
	if !apierrors.IsNotFound(err) {
		fmt.Fprintf(os.Stderr, "bench: deleting namespace %s: %v\n", ns, err)
	}
}
