// Command bench measures roched against baselines taken in the same run, on this
// machine: the seeds' raw `docker run` wrapper, and a bare Engine API create+start of
// the same container. It prints percentiles and ratios; it asserts nothing about speed.
// It fails (exit 1) only if an operation errs or a container is left behind.
//
//	make bench                    (or: go run ./bench/daemon)
//	go run ./bench/daemon -n 50 -duration 10s
//
// Every container it makes uses an image tag of its own (roche/python:bench-XXXX) so
// that the leak check at the end is exact whatever else runs on the engine.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/docker/docker/api/types/container"
	dockerclient "github.com/docker/docker/client"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/bench/internal/samples"
	"github.com/roche-sandbox/roche/client"
	"github.com/roche-sandbox/roche/internal/daemon"
	"github.com/roche-sandbox/roche/pool"
	"github.com/roche-sandbox/roche/provider/docker"
)

var (
	baseImage   = flag.String("image", "roche/python:local", "image to run (built by scripts/build-test-image.sh)")
	n           = flag.Int("n", 30, "samples per measurement")
	clients     = flag.Int("clients", 50, "concurrent clients in the load test (0 skips it)")
	duration    = flag.Duration("duration", 60*time.Second, "length of the load test")
	poolMin     = flag.Int("pool-min", 4, "idle sandboxes the pool keeps")
	poolMax     = flag.Int("pool-max", 8, "most idle sandboxes the pool keeps")
	concurrency = flag.Int("pool-concurrency", 0, "the pool's creations at once (0: roched's default, adaptive from the machine's cores)")
	poolQueue   = flag.Int("pool-queue", 64, "creates that may wait for the pool's next sandbox (0: a create that finds it empty makes its own)")
	poolWait    = flag.Duration("pool-wait", 2*time.Second, "longest expected wait in the pool's queue; a create expecting more is refused at once")
	verbose     = flag.Bool("v", false, "log the daemon at debug level to stderr")
	probe       = flag.Bool("probe", true, "check each pooled sandbox is alive before handing it out, as roched does (false measures without)")
	codePool    = flag.Bool("code-pool", true, "also keep a pool with code=python (on an image tag of its own) and measure run_code cycles from both pools")
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
	dc, err := samples.Engine(ctx)
	if err != nil {
		return err
	}
	defer dc.Close()
	img, untag, err := samples.PrivateTag(ctx, dc, *baseImage, "bench")
	if err != nil {
		return err
	}
	defer untag()
	codeImg, untagCode, err := samples.PrivateTag(ctx, dc, *baseImage, "bench-code")
	if err != nil {
		return err
	}
	defer untagCode()

	agentNote, cleanupAgent, err := samples.SetupAgent()
	if err != nil {
		return err
	}
	defer cleanupAgent()

	logLevel := slog.LevelWarn
	if *verbose {
		logLevel = slog.LevelDebug
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: logLevel}))
	dopts := []docker.Option{docker.WithLogger(log)}
	if strings.HasPrefix(agentNote, "transport docker-exec") {
		dopts = append(dopts, docker.WithTransport(docker.TransportDockerExec))
	}
	dp, err := docker.New(dopts...)
	if err != nil {
		return err
	}
	defer dp.Close()

	dir, err := os.MkdirTemp("", "rbench")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	socket := filepath.Join(dir, "roched.sock")
	spec, err := pool.ParseSpec(fmt.Sprintf("docker/%s?min=%d&max=%d&queue=%d&wait=%s", img, *poolMin, *poolMax, *poolQueue, *poolWait))
	if err != nil {
		return err
	}
	specs := []pool.Spec{spec}
	if *codePool {
		codeSpec, err := pool.ParseSpec(fmt.Sprintf("docker/%s?min=%d&max=%d&queue=%d&wait=%s&code=python", codeImg, *poolMin, *poolMax, *poolQueue, *poolWait))
		if err != nil {
			return err
		}
		specs = append(specs, codeSpec)
	}
	var daemonOpts []daemon.Option
	if !*probe {
		daemonOpts = append(daemonOpts, daemon.WithPoolOptions(pool.WithProbeTimeout(0)))
	}
	c, stop, err := samples.StartDaemon(ctx, daemon.Config{
		Socket: socket, Pools: specs, PoolConcurrency: *concurrency, MaxSandboxes: 4 * max(*clients, 25),
	}, map[string]roche.Provider{"docker": dp}, log, daemonOpts...)
	if err != nil {
		return err
	}
	defer stop()
	defer c.Close()
	p := c.Provider("docker")

	cfg := roche.DefaultConfig()
	cfg.Image = img
	codeCfg := cfg
	codeCfg.Image = codeImg
	conc := "adaptive"
	if *concurrency > 0 {
		conc = strconv.Itoa(*concurrency)
	}
	fmt.Printf("roche bench: %s (tag of %s), %d CPUs, %s, n=%d per row, pool min=%d max=%d queue=%d wait=%s concurrency=%s probe=%v\n",
		img, *baseImage, runtime.NumCPU(), agentNote, *n, *poolMin, *poolMax, *poolQueue, *poolWait, conc, *probe)
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	if _, err := c.PoolWarmup(wctx, "", 0); err != nil {
		cancel()
		return fmt.Errorf("warming the pool: %w", err)
	}
	cancel()
	// Warm every path once (connections, page cache) before measuring.
	if _, err := samples.RawDockerRun(ctx, img, "print('hello')", "hello\n"); err != nil {
		return err
	}
	if _, _, err := pooledCycle(ctx, c, p, cfg); err != nil {
		return err
	}

	var raw, cycle, hit, execOnly, cold, direct, bare, execSettled, codeCold, codeWarm []time.Duration
	var misses int
	for i := 0; i < *n; i++ {
		// Interleaved so that baseline and daemon share the machine's conditions.
		dur, err := samples.RawDockerRun(ctx, img, "print('hello')", "hello\n")
		if err != nil {
			return err
		}
		raw = append(raw, dur)

		if err := waitIdle(ctx, c); err != nil {
			return err
		}
		dur, pooled, err := pooledCycle(ctx, c, p, cfg)
		if err != nil {
			return err
		}
		if !pooled {
			misses++
		}
		cycle = append(cycle, dur)

		if *codePool {
			// run_code in a sandbox of the plain pool (its interpreter starts for the
			// cell), then in one of the code=python pool's (started while it was idle),
			// each on a settled engine: a cycle this short is otherwise mostly the wait
			// for the CPU that the previous cycle's refill and removal hold.
			// The exec cycle, settled too, for comparison.
			last := ""
			for _, pc := range []struct {
				cfg  roche.Config
				exec bool
				ds   *[]time.Duration
			}{{cfg, true, &execSettled}, {cfg, false, &codeCold}, {codeCfg, false, &codeWarm}} {
				if err := waitSettled(ctx, c, dc, last); err != nil {
					return err
				}
				dur, id, pooled, err := codeCycle(ctx, c, p, pc.cfg, pc.exec)
				if err != nil {
					return err
				}
				if !pooled {
					misses++
				}
				*pc.ds = append(*pc.ds, dur)
				last = id
			}
		}

		if err := waitIdle(ctx, c); err != nil {
			return err
		}
		start := time.Now()
		sb, pooled, err := c.Create(ctx, "docker", cfg)
		if err != nil {
			return err
		}
		hitDur := time.Since(start)
		if !pooled {
			misses++
		}
		hit = append(hit, hitDur)
		start = time.Now()
		res, err := p.Exec(ctx, sb.ID, roche.ExecRequest{Cmd: hello})
		if err != nil || res.Stdout != "hello\n" {
			return samples.DestroyAfter(ctx, p, sb.ID, fmt.Errorf("exec: %+v %v", res, err))
		}
		execOnly = append(execOnly, time.Since(start))
		if err := p.Destroy(context.WithoutCancel(ctx), sb.ID); err != nil {
			return err
		}

		// Cold creates are measured on a quiet engine: the pool settled, removals done.
		if err := waitSettled(ctx, c, dc, sb.ID); err != nil {
			return err
		}
		coldCfg := cfg
		coldCfg.Memory = "511m" // the pool serves 512m only: this one is made for the request
		start = time.Now()
		sb, pooled, err = c.Create(ctx, "docker", coldCfg)
		if err != nil {
			return err
		}
		if pooled {
			return samples.DestroyAfter(ctx, p, sb.ID, errors.New("a create with other memory was served from the pool"))
		}
		cold = append(cold, time.Since(start))
		if err := p.Destroy(context.WithoutCancel(ctx), sb.ID); err != nil {
			return err
		}

		if err := waitSettled(ctx, c, dc, sb.ID); err != nil {
			return err
		}
		// The same cold create with the provider in this process: the daemon's own share
		// of a cold create is the difference.
		start = time.Now()
		dsb, err := dp.Create(ctx, coldCfg)
		if err != nil {
			return err
		}
		direct = append(direct, time.Since(start))
		if err := dp.Destroy(context.WithoutCancel(ctx), dsb.ID); err != nil {
			return err
		}

		dur, err = bareCreateStart(ctx, dc, img)
		if err != nil {
			return err
		}
		bare = append(bare, dur)
	}

	fmt.Printf("\n%-76s %10s %10s %10s\n", "measurement", "p50", "p90", "max")
	row := func(name string, ds []time.Duration) {
		fmt.Printf("%-76s %10s %10s %10s\n", name, samples.Ms(samples.Percentile(ds, 50)), samples.Ms(samples.Percentile(ds, 90)), samples.Ms(samples.Percentile(ds, 100)))
	}
	row("raw `docker run --rm --network=none --read-only ...` wrapper (baseline)", raw)
	row("pooled create + exec print('hello') + destroy, Go client over the socket", cycle)
	if *codePool {
		row("the same on a settled engine (no refill or removal in flight)", execSettled)
		row("pooled create + run_code print('hello') + destroy, settled (interpreter starts)", codeCold)
		row("the same from the code=python pool (interpreter started while idle)", codeWarm)
	}
	row("pool hit: Create alone", hit)
	row("exec print('hello') in a warm sandbox, through roched", execOnly)
	row("cold create through roched", cold)
	row("cold create, Docker provider in-process (no daemon)", direct)
	row("bare Engine API create+start of the same container (baseline)", bare)
	fmt.Printf("\nratios of p50s (the issue's targets in brackets):\n")
	fmt.Printf("  raw docker run / pooled cycle    %6.1fx  [>= 8x, cycle <= 20 ms]\n", samples.Ratio(raw, cycle))
	if *codePool {
		fmt.Printf("  raw docker run / settled pooled cycle  %6.1fx\n", samples.Ratio(raw, execSettled))
		fmt.Printf("  raw docker run / code=python pooled run_code cycle %6.1fx  [issue 16: >= 40x]\n", samples.Ratio(raw, codeWarm))
	}
	fmt.Printf("  pool hit                         %7s  [<= 2 ms]\n", samples.Ms(samples.Percentile(hit, 50)))
	fmt.Printf("  cold create / bare create+start  %6.2fx  [<= 1.2x]\n", samples.Ratio(cold, bare))
	fmt.Printf("  cold create / in-process create  %6.2fx  (the daemon's share of a cold create)\n", samples.Ratio(cold, direct))
	if misses > 0 {
		fmt.Printf("  note: %d of the pooled creates missed the pool and went cold\n", misses)
	}

	var loadErr error
	if *clients > 0 {
		loadErr = loadTest(ctx, c, p, cfg)
	}
	if err := stop(); err != nil {
		return err
	}
	left, err := samples.ContainersOf(ctx, dc, img)
	if err != nil {
		return err
	}
	leftCode, err := samples.ContainersOf(ctx, dc, codeImg)
	if err != nil {
		return err
	}
	left = append(left, leftCode...)
	fmt.Printf("\nleft behind after roched's shutdown: %d containers\n", len(left))
	if len(left) > 0 {
		for _, id := range left {
			dc.ContainerRemove(context.Background(), id, container.RemoveOptions{Force: true})
		}
		return fmt.Errorf("%d containers were left behind", len(left))
	}
	return loadErr
}

// pooledCycle times a pooled create + exec print('hello') + destroy, and says whether the
// create was served from the pool.
func pooledCycle(ctx context.Context, c *client.Client, p *client.Provider, cfg roche.Config) (time.Duration, bool, error) {
	d, _, pooled, err := codeCycle(ctx, c, p, cfg, true)
	return d, pooled, err
}

// codeCycle times a create + run_code print('hello') in the default context + destroy
// (with exec, the same print as an exec of python3 -c); it also returns the sandbox's id.
func codeCycle(ctx context.Context, c *client.Client, p *client.Provider, cfg roche.Config, exec bool) (time.Duration, string, bool, error) {
	start := time.Now()
	sb, pooled, err := c.Create(ctx, "docker", cfg)
	if err != nil {
		return 0, "", false, err
	}
	if exec {
		res, err := p.Exec(ctx, sb.ID, roche.ExecRequest{Cmd: hello})
		if err != nil || res.Stdout != "hello\n" {
			return 0, "", false, samples.DestroyAfter(ctx, p, sb.ID, fmt.Errorf("exec: %+v %v", res, err))
		}
	} else {
		ex, err := p.RunCode(ctx, sb.ID, roche.CodeRequest{Code: "print('hello')"})
		if err != nil || ex.Error != nil || strings.Join(ex.Logs.Stdout, "") != "hello\n" {
			return 0, "", false, samples.DestroyAfter(ctx, p, sb.ID, fmt.Errorf("run_code: %+v %v", ex, err))
		}
	}
	if err := p.Destroy(context.WithoutCancel(ctx), sb.ID); err != nil {
		return 0, "", false, err
	}
	return time.Since(start), sb.ID, pooled, nil
}

// waitIdle waits, untimed, until every pool has a sandbox ready.
func waitIdle(ctx context.Context, c *client.Client) error {
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		st, err := c.PoolStatus(ctx)
		if err != nil {
			return err
		}
		ready := true
		for _, s := range st {
			ready = ready && s.Idle > 0
		}
		if ready {
			return nil
		}
		time.Sleep(5 * time.Millisecond)
	}
	return errors.New("the pool did not refill within a minute")
}

// waitSettled waits, untimed, until the pool is full with nothing in flight and the
// sandbox destroyed last is gone from the engine, so that a measurement does not share
// the engine with background work.
func waitSettled(ctx context.Context, c *client.Client, dc *dockerclient.Client, destroyed string) error {
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		st, err := c.PoolStatus(ctx)
		if err != nil {
			return err
		}
		settled := true
		if destroyed != "" {
			_, ierr := dc.ContainerInspect(ctx, destroyed)
			settled = ierr != nil
		}
		for _, s := range st {
			settled = settled && int(s.Idle) >= *poolMin && s.Creating == 0
		}
		if settled {
			return nil
		}
		time.Sleep(5 * time.Millisecond)
	}
	return errors.New("the pool did not settle within a minute")
}

// bareCreateStart times a create+start straight on the Engine API with the settings
// the Docker provider uses (without its agent), then removes the container untimed.
func bareCreateStart(ctx context.Context, dc *dockerclient.Client, img string) (time.Duration, error) {
	initOn := true
	pids := int64(64)
	start := time.Now()
	resp, err := dc.ContainerCreate(ctx, &container.Config{
		Image: img, User: "65534:65534", Entrypoint: []string{"sleep"}, Cmd: []string{"300"},
		Labels: map[string]string{"roche.managed": "true", "roche.provider": "bench"},
	}, &container.HostConfig{
		NetworkMode: "none", ReadonlyRootfs: true, AutoRemove: true, Init: &initOn,
		Tmpfs:   map[string]string{"/tmp": "rw,nosuid,nodev,size=67108864,mode=1777"},
		CapDrop: []string{"ALL"}, SecurityOpt: []string{"no-new-privileges:true"},
		LogConfig: container.LogConfig{Type: "none"},
		Resources: container.Resources{Memory: 512 << 20, MemorySwap: 512 << 20, NanoCPUs: 1e9, PidsLimit: &pids},
	}, nil, nil, "")
	if err != nil {
		return 0, err
	}
	err = dc.ContainerStart(ctx, resp.ID, container.StartOptions{})
	d := time.Since(start)
	rmErr := dc.ContainerRemove(context.Background(), resp.ID, container.RemoveOptions{Force: true})
	if err != nil {
		return 0, err
	}
	if rmErr != nil && !strings.Contains(rmErr.Error(), "already in progress") {
		return 0, rmErr
	}
	return d, nil
}

// loadTest runs create/exec/destroy from many clients at once for a while and reports
// throughput, latency and errors.
func loadTest(ctx context.Context, c *client.Client, p *client.Provider, cfg roche.Config) error {
	fmt.Printf("\nload: %d concurrent clients doing create + exec print('hello') + destroy for %v ...\n", *clients, *duration)
	var mu sync.Mutex
	var lat []time.Duration
	var errs []error
	var pooled, refused atomic.Int64
	end := time.Now().Add(*duration)
	var wg sync.WaitGroup
	for i := 0; i < *clients; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil && time.Now().Before(end) {
				d, hit, err := pooledCycle(ctx, c, p, cfg)
				if errors.Is(err, roche.ErrExhausted) {
					// Refused at once (the pool's queue is full): a client backs off for
					// the wait the refusal suggests.
					refused.Add(1)
					time.Sleep(samples.BackOff(err, 100*time.Millisecond))
					continue
				}
				mu.Lock()
				if err != nil {
					errs = append(errs, err)
				} else {
					lat = append(lat, d)
				}
				mu.Unlock()
				if hit {
					pooled.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	total := len(lat) + len(errs)
	fmt.Printf("  %d cycles (%d from the pool), %.1f cycles/s, p50 %s, p99 %s, errors %d, refused at once (RESOURCE_EXHAUSTED) %d\n",
		total, pooled.Load(), float64(len(lat))/duration.Seconds(), samples.Ms(samples.Percentile(lat, 50)), samples.Ms(samples.Percentile(lat, 99)),
		len(errs), refused.Load())
	if len(errs) > 0 {
		return fmt.Errorf("%d cycles failed under load, the first: %v", len(errs), errs[0])
	}
	return nil
}
