// Command oci measures the oci provider (containers run directly by an OCI runtime,
// without dockerd) against the bare Engine API create+start of a container from the same
// image, measured in the same run, interleaved (shared machines are noisy, so only
// same-run ratios mean anything). It prints percentiles and ratios against the issue's
// targets; it asserts nothing about speed. It fails (exit 1) only if an operation errs or
// something is left behind.
//
//	make bench                    (or: sudo go run ./bench/oci)
//	go run ./bench/oci -n 50 -idle 20
//
// Rows: a cold create (nothing pooled: bundle, overlay, runtime, agent ready); the
// Engine API's ContainerCreate+ContainerStart of the image with the same security
// options Roche's docker provider sets (the baseline); a whole cycle, create + exec
// python3 -c "print('hello')" + destroy; and the host memory an idle sandbox costs: the
// proportional set size (PSS) of its processes (only roche-agent: the runtime exits once
// the sandbox runs, there is no shim), and its memory cgroup's charge (which also counts
// kernel memory and page cache the sandbox caused).
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/docker/docker/api/types/container"
	dockerclient "github.com/docker/docker/client"
	"golang.org/x/sys/unix"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/bench/internal/samples"
	"github.com/roche-sandbox/roche/internal/daemon"
	"github.com/roche-sandbox/roche/pool"
	"github.com/roche-sandbox/roche/provider/oci"
)

var (
	n       = flag.Int("n", 30, "samples per measurement")
	image   = flag.String("image", "roche/python:local", "image (built by scripts/build-test-image.sh)")
	idle    = flag.Int("idle", 10, "idle sandboxes for the memory measurement")
	rt      = flag.String("runtime", "", "OCI runtime (default: the fastest that works here)")
	verbose = flag.Bool("v", false, "log the provider at debug level to stderr")
	clients = flag.Int("clients", 50, "concurrent clients in the load through roched (0 skips it)")
	loadFor = flag.Duration("duration", 10*time.Second, "length of the load through roched")
	// wait is the latency bound the load is held to: a create expecting to wait longer is
	// refused at once. Fifty clients keep the queue at that bound (a refused one retries
	// when the refusal suggests), so a cycle takes about the bound plus its exec; the
	// throughput is the host's either way.
	poolArg  = flag.String("pool", "min=8&max=32&queue=64&wait=0.5", "the load's pool parameters (docs/pools.md)")
	poolConc = flag.Int("pool-concurrency", 0, "sandboxes roched's pools create at once in the load (0: roched's default, adaptive from the machine's cores)")
	cpuProf  = flag.String("cpuprofile", "", "write a CPU profile of this process (roched, its provider and the clients) during the load to `file`")
)

var hello = []string{"python3", "-c", "print('hello')"}

func main() {
	flag.Parse()
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "bench/oci: %v\n", err)
		os.Exit(1)
	}
}

func run() error {
	ctx, stopSignals := samples.Interruptible()
	defer stopSignals()
	if *n < 1 || *idle < 1 {
		return errors.New("-n and -idle must be at least 1")
	}
	if os.Geteuid() != 0 {
		return errors.New("the oci provider needs root: run it as root (make bench does, in the test container)")
	}
	transport, cleanAgent, err := samples.SetupAgent()
	if err != nil {
		return err
	}
	defer cleanAgent()
	if !strings.HasPrefix(transport, "transport agent") {
		return fmt.Errorf("roche-agent could not be built: %s", transport)
	}
	dc, err := samples.Engine(ctx)
	if err != nil {
		return err
	}
	defer dc.Close()

	// A state directory of this run's own, so that what it leaves is plain to see; the
	// image cache is the default one, shared with roche.
	state := filepath.Join("/run/roche-bench", "oci-"+strconv.Itoa(os.Getpid()))
	defer func() {
		// The provider's tmpfs there, where /run is not one, is this run's too.
		if err := unix.Unmount(state, 0); err != nil && !errors.Is(err, unix.EINVAL) {
			fmt.Fprintf(os.Stderr, "bench/oci: unmounting %s: %v\n", state, err)
		}
		os.RemoveAll(state)
	}()
	level := slog.LevelWarn
	if *verbose {
		level = slog.LevelDebug
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	p, err := oci.New(oci.WithLogger(log), oci.WithStateDir(state), oci.WithRuntime(*rt))
	if err != nil {
		return err
	}
	defer p.Close()
	cfg := roche.DefaultConfig()
	cfg.Image = *image

	// The first create picks the runtime (a probe sandbox) and unpacks the image into
	// the cache: reported, not counted.
	start := time.Now()
	if err := cycle(ctx, p, cfg); err != nil {
		return err
	}
	first := time.Since(start)
	name, err := p.Runtime(ctx)
	if err != nil {
		return err
	}
	fmt.Printf("roche oci bench: %d CPUs, n=%d per row, image %s, runtime %s, first create (runtime probe, image unpack if not cached) %v\n",
		runtime.NumCPU(), *n, *image, name, first.Round(time.Millisecond))
	// Warm the baseline's path once too.
	if _, err := engineCreateStart(ctx, dc, *image); err != nil {
		return fmt.Errorf("the Engine API baseline failed: %v", err)
	}

	var cold, engine, cycles []time.Duration
	for i := 0; i < *n; i++ {
		d, err := coldCreate(ctx, p, cfg)
		if err != nil {
			return err
		}
		cold = append(cold, d)
		if d, err = engineCreateStart(ctx, dc, *image); err != nil {
			return err
		}
		engine = append(engine, d)
		start := time.Now()
		if err := cycle(ctx, p, cfg); err != nil {
			return err
		}
		cycles = append(cycles, time.Since(start))
	}
	row := func(what string, ds []time.Duration) {
		fmt.Printf("  %-58s p50 %10s  p90 %10s  p99 %10s\n", what, samples.Ms(samples.Median(ds)), samples.Ms(samples.Percentile(ds, 90)), samples.Ms(samples.Percentile(ds, 99)))
	}
	row("oci cold create (until the agent answers)", cold)
	row("Engine API ContainerCreate+ContainerStart (baseline)", engine)
	row("oci create + exec print('hello') + destroy", cycles)
	ratio := samples.Ratio(engine, cold)
	fmt.Printf("  cold create is %.1fx faster than the Engine API create+start (target >= 5x); p50 %s (target <= 100 ms)\n",
		ratio, samples.Ms(samples.Median(cold)))

	pss, charged, err := idleMemory(ctx, p, cfg, state)
	if err != nil {
		return err
	}
	fmt.Printf("  host memory per idle sandbox (%d idle): PSS of its processes %.2f MiB (target <= 6 MiB), memory cgroup charge %.2f MiB\n",
		*idle, pss, charged)
	if *clients > 0 {
		if err := load(ctx, p, log); err != nil {
			return err
		}
	}
	return leftovers(ctx, p, state)
}

// load runs roched in this process with the oci provider and a pool, and *clients
// clients each doing create + exec print('hello') + destroy through its API for
// *loadFor. A create the pool refuses at once (RESOURCE_EXHAUSTED: its queue is full or
// the wait would be too long) is counted apart and the client backs off for the wait
// the refusal suggests (samples.BackOff); any other error fails the run.
func load(ctx context.Context, p *oci.Provider, log *slog.Logger) error {
	dir, err := os.MkdirTemp("", "rbench-oci")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	spec, err := pool.ParseSpec("oci/" + *image + "?" + *poolArg)
	if err != nil {
		return err
	}
	c, stop, err := samples.StartDaemon(ctx, daemon.Config{
		Socket: filepath.Join(dir, "roched.sock"), Pools: []pool.Spec{spec}, MaxSandboxes: 4 * max(*clients, 25), PoolConcurrency: *poolConc,
	}, map[string]roche.Provider{"oci": p}, log)
	if err != nil {
		return err
	}
	defer c.Close()
	defer stop()
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	_, err = c.PoolWarmup(wctx, "", 0)
	cancel()
	if err != nil {
		return fmt.Errorf("warming the oci pool: %w", err)
	}
	rp := c.Provider("oci")
	cfg := roche.DefaultConfig()
	cfg.Image = *image
	fmt.Printf("\nload: %d concurrent clients, create + exec print('hello') + destroy through roched (oci, pool %s) for %v ...\n", *clients, *poolArg, *loadFor)
	var mu sync.Mutex
	var lat, creates, execs []time.Duration
	var errs []error
	var refused, pooled atomic.Int64
	if *cpuProf != "" {
		f, err := os.Create(*cpuProf)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
	}
	end := time.Now().Add(*loadFor)
	busy := samples.HostBusy()
	var wg sync.WaitGroup
	for range *clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil && time.Now().Before(end) {
				start := time.Now()
				sb, hit, err := c.Create(ctx, "oci", cfg)
				if errors.Is(err, roche.ErrExhausted) {
					refused.Add(1)
					time.Sleep(samples.BackOff(err, 50*time.Millisecond))
					continue
				}
				created := time.Now()
				var execd time.Time
				if err == nil {
					var res roche.ExecResult
					res, err = rp.Exec(ctx, sb.ID, roche.ExecRequest{Cmd: hello})
					execd = time.Now()
					if err == nil && res.Stdout != "hello\n" {
						err = fmt.Errorf("exec printed %q, exit %d: %s", res.Stdout, res.ExitCode, res.Stderr)
					}
					if derr := rp.Destroy(context.WithoutCancel(ctx), sb.ID); err == nil {
						err = derr
					}
				}
				mu.Lock()
				if err != nil {
					errs = append(errs, err)
				} else {
					lat = append(lat, time.Since(start))
					creates, execs = append(creates, created.Sub(start)), append(execs, execd.Sub(created))
					if hit {
						pooled.Add(1)
					}
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	busy = samples.HostBusy() - busy
	if *cpuProf != "" {
		pprof.StopCPUProfile()
	}
	fmt.Printf("  %d cycles (%d from the pool), %.1f cycles/s (target >= 40), p50 %s, p99 %s (target <= 1 s), errors %d, refused at once (RESOURCE_EXHAUSTED) %d\n",
		len(lat)+len(errs), pooled.Load(), float64(len(lat))/loadFor.Seconds(), samples.Ms(samples.Percentile(lat, 50)),
		samples.Ms(samples.Percentile(lat, 99)), len(errs), refused.Load())
	fmt.Printf("  of which create (the pool's queue): p50 %s, p99 %s; exec: p50 %s, p99 %s; the rest is destroy\n",
		samples.Ms(samples.Percentile(creates, 50)), samples.Ms(samples.Percentile(creates, 99)),
		samples.Ms(samples.Percentile(execs, 50)), samples.Ms(samples.Percentile(execs, 99)))
	if len(lat) > 0 && busy > 0 {
		// The throughput is the host's CPU divided by this (the load keeps it busy).
		fmt.Printf("  host CPU per cycle (everything the host did during the load, /proc/stat): %s\n", samples.Ms(busy/time.Duration(len(lat))))
	}
	if len(errs) > 0 {
		return fmt.Errorf("%d cycles failed under load, the first: %v", len(errs), errs[0])
	}
	return stop()
}

// coldCreate times a create and destroys the sandbox, untimed.
func coldCreate(ctx context.Context, p *oci.Provider, cfg roche.Config) (time.Duration, error) {
	start := time.Now()
	info, err := p.Create(ctx, cfg)
	d := time.Since(start)
	if err != nil {
		return 0, err
	}
	return d, p.Destroy(context.WithoutCancel(ctx), info.ID)
}

func cycle(ctx context.Context, p *oci.Provider, cfg roche.Config) error {
	info, err := p.Create(ctx, cfg)
	if err != nil {
		return err
	}
	res, err := p.Exec(ctx, info.ID, roche.ExecRequest{Cmd: hello})
	derr := p.Destroy(context.WithoutCancel(ctx), info.ID)
	if err != nil {
		return err
	}
	if res.ExitCode != 0 || res.Stdout != "hello\n" {
		return fmt.Errorf("exec print('hello'): %+v", res)
	}
	return derr
}

// engineCreateStart times ContainerCreate+ContainerStart of img through the Engine API,
// with the options Roche's docker provider sets that cost time (no network, read-only
// root, a /tmp tmpfs, limits, no log), and removes the container, untimed.
func engineCreateStart(ctx context.Context, dc *dockerclient.Client, img string) (time.Duration, error) {
	pids := int64(256)
	start := time.Now()
	c, err := dc.ContainerCreate(ctx, &container.Config{
		Image: img, Entrypoint: []string{"sleep"}, Cmd: []string{"300"},
		Labels: map[string]string{"roche.managed": "true", "roche.bench": "oci"},
	}, &container.HostConfig{
		NetworkMode: "none", ReadonlyRootfs: true, Tmpfs: map[string]string{"/tmp": "rw,nosuid,nodev,size=64m"},
		CapDrop: []string{"ALL"}, SecurityOpt: []string{"no-new-privileges:true"}, LogConfig: container.LogConfig{Type: "none"},
		Resources: container.Resources{Memory: 512 << 20, MemorySwap: 512 << 20, NanoCPUs: 1e9, PidsLimit: &pids},
	}, nil, nil, "")
	if err != nil {
		return 0, err
	}
	err = dc.ContainerStart(ctx, c.ID, container.StartOptions{})
	d := time.Since(start)
	if rerr := dc.ContainerRemove(context.WithoutCancel(ctx), c.ID, container.RemoveOptions{Force: true}); err == nil {
		err = rerr
	}
	return d, err
}

// idleMemory makes -idle sandboxes, lets them settle, and returns the mean PSS of their
// processes and their memory cgroups' mean charge, in MiB.
func idleMemory(ctx context.Context, p *oci.Provider, cfg roche.Config, state string) (pss, charged float64, err error) {
	var ids []string
	defer func() {
		for _, id := range ids {
			if derr := p.Destroy(context.WithoutCancel(ctx), id); derr != nil && err == nil {
				err = derr
			}
		}
	}()
	for range *idle {
		info, err := p.Create(ctx, cfg)
		if err != nil {
			return 0, 0, err
		}
		ids = append(ids, info.ID)
	}
	time.Sleep(2 * time.Second)
	var kib, bytes int64
	for _, id := range ids {
		b, err := os.ReadFile(filepath.Join(state, id, "pid"))
		if err != nil {
			return 0, 0, fmt.Errorf("reading the pid of %s: %v", id, err)
		}
		pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
		for _, proc := range treeOf(pid) {
			kib += pssKiB(proc)
		}
		bytes += cgroupCharge(id)
	}
	return float64(kib) / 1024 / float64(len(ids)), float64(bytes) / (1 << 20) / float64(len(ids)), nil
}

// treeOf is pid and its descendants.
func treeOf(pid int) []int {
	out := []int{pid}
	for i := 0; i < len(out); i++ {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", out[i], out[i]))
		if err != nil {
			continue
		}
		for _, f := range strings.Fields(string(b)) {
			if c, err := strconv.Atoi(f); err == nil {
				out = append(out, c)
			}
		}
	}
	return out
}

func pssKiB(pid int) int64 {
	f, err := os.Open(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "Pss:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb
		}
	}
	return 0
}

// cgroupCharge is what the sandbox's memory cgroup is charged (v1, else v2).
func cgroupCharge(id string) int64 {
	for _, f := range []string{"/sys/fs/cgroup/memory/roche-" + id + "/memory.usage_in_bytes", "/sys/fs/cgroup/roche-" + id + "/memory.current"} {
		if b, err := os.ReadFile(f); err == nil {
			v, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
			return v
		}
	}
	return 0
}

// leftovers fails when a sandbox, or its directory, outlived the run.
func leftovers(ctx context.Context, p *oci.Provider, state string) error {
	list, err := p.List(ctx)
	if err != nil {
		return err
	}
	if len(list) > 0 {
		return fmt.Errorf("%d sandboxes left behind", len(list))
	}
	entries, _ := os.ReadDir(state)
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), oci.Name+"-") {
			return fmt.Errorf("sandbox directory %s left behind", e.Name())
		}
	}
	return nil
}
