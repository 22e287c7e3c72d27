// Command wasm measures the WebAssembly provider through roched against the seeds' raw
// `docker run --rm` wrapper, measured in the same run, interleaved (shared machines are
// noisy, so only same-run ratios mean anything). It prints percentiles and ratios; it
// asserts nothing about speed. It fails (exit 1) only if an operation errs or a sandbox
// is left behind.
//
//	make bench                    (or: go run ./bench/wasm)
//	go run ./bench/wasm -n 50
//
// roched runs in this process, as cmd/roched builds it (the wasm provider with warm
// start), on a unix socket of its own, with a pool 'wasm/python:3.12?min=...'; every
// measurement goes through the Go client over that socket. Before each pooled cycle the
// bench waits, untimed, until the pool is full and every pooled sandbox's interpreter
// has started, as bench/daemon waits for its pool: the figures are a client's latency
// on a pool that keeps up, not throughput.
//
// A code context's first cell in a new sandbox (its kernel started for it, then the
// cell run) is measured in-process, the kernel started from the pre-initialised
// interpreter against from scratch (wasm.WithoutPreinit), interleaved.
//
// It also reports the resident memory an idle pooled sandbox costs roched: the process's
// RSS with the pool warmed to -rss-count idle sandboxes against none, after a garbage
// collection each time.
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
	"runtime/debug"
	"runtime/pprof"
	"strconv"
	"strings"
	"time"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/bench/internal/samples"
	"github.com/roche-sandbox/roche/client"
	"github.com/roche-sandbox/roche/internal/daemon"
	"github.com/roche-sandbox/roche/pool"
	"github.com/roche-sandbox/roche/provider/wasm"
)

var (
	n         = flag.Int("n", 30, "samples per measurement")
	image     = flag.String("image", "roche/python:local", "image of the docker run baseline (built by scripts/build-test-image.sh)")
	withDock  = flag.Bool("docker", true, "measure the docker run baseline (needs Docker and -image)")
	withCode  = flag.Bool("code", true, "measure a code context's first cell (the slowest rows; -code=false for the exec rows alone)")
	poolMin   = flag.Int("pool-min", 2, "idle sandboxes the wasm pool keeps")
	rssCount  = flag.Int("rss-count", 10, "idle pooled sandboxes for the memory measurement")
	verbose   = flag.Bool("v", false, "log the daemon at debug level to stderr")
	cpuProf   = flag.String("cpuprofile", "", "after the measurements, run -n more pooled cycles alone and write a CPU profile of this process (roched, the provider, the client and the pool's refills) over them to `file`")
	poolImage = "python:3.12"
)

var hi = []string{"python3", "-c", "print('hi')"}

func main() {
	flag.Parse()
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "bench/wasm: %v\n", err)
		os.Exit(1)
	}
}

func run() error {
	ctx, stopSignals := samples.Interruptible()
	defer stopSignals()
	if *n < 1 || *poolMin < 1 || *rssCount < 1 {
		return errors.New("-n, -pool-min and -rss-count must be at least 1")
	}
	if *withDock {
		if _, err := samples.RawDockerRun(ctx, *image, "print('hi')", "hi\n"); err != nil {
			return fmt.Errorf("the docker run baseline failed (%v): start Docker and build %s (make test does both), or pass -docker=false", err, *image)
		}
	}
	dir, err := os.MkdirTemp("", "rbenchw")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	stateDir := filepath.Join(dir, "wasm")

	level := slog.LevelWarn
	if *verbose {
		level = slog.LevelDebug
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	wp, err := wasm.New(wasm.WithLogger(log), wasm.WithStateDir(stateDir), wasm.WithWarmStart())
	if err != nil {
		return err
	}
	defer wp.Close()
	if err := wp.Available(); err != nil {
		return err
	}
	start := time.Now()
	if err := wp.Prepare(ctx); err != nil {
		return err
	}
	prepared := time.Since(start)
	// The fresh-instance baseline: the same provider without warm start, every exec
	// instantiating python.wasm and initialising CPython, as before warm start.
	cold, err := wasm.New(wasm.WithLogger(log), wasm.WithStateDir(stateDir))
	if err != nil {
		return err
	}
	defer cold.Close()
	if err := cold.Prepare(ctx); err != nil {
		return err
	}
	// The code-context baseline: kernels started from scratch instead of from a copy.
	scratch, err := wasm.New(wasm.WithLogger(log), wasm.WithStateDir(stateDir), wasm.WithoutPreinit())
	if err != nil {
		return err
	}
	defer scratch.Close()
	if err := scratch.Prepare(ctx); err != nil {
		return err
	}

	maxIdle := max(*poolMin, *rssCount)
	spec, err := pool.ParseSpec(fmt.Sprintf("wasm/%s?min=%d&max=%d", poolImage, *poolMin, maxIdle))
	if err != nil {
		return err
	}
	socket := filepath.Join(dir, "roched.sock")
	c, stop, err := samples.StartDaemon(ctx, daemon.Config{Socket: socket, Pools: []pool.Spec{spec}}, map[string]roche.Provider{"wasm": wp}, log)
	if err != nil {
		return err
	}
	defer stop()
	defer c.Close()
	p := c.Provider("wasm")
	cfg := roche.DefaultConfig()
	cfg.Image = poolImage

	fmt.Printf("roche wasm bench: %d CPUs, n=%d per row, pool %s (min=%d), python.wasm ready in %v (compiled, or loaded from the disk cache)\n",
		runtime.NumCPU(), *n, spec.Key, *poolMin, prepared.Round(time.Millisecond))

	// Warm every path once (connections, page cache) before measuring.
	if err := settle(ctx, c, wp); err != nil {
		return err
	}
	if _, _, err := cycle(ctx, c, p, cfg); err != nil {
		return err
	}
	for _, cp := range []*wasm.Provider{cold, scratch} { // the first makes the kernel's copy
		if !*withCode {
			break
		}
		if _, err := firstCell(ctx, cp, cfg); err != nil {
			return err
		}
	}

	var raw, pooled, execOnly, fresh, coldCycle, cellPre, cellScratch []time.Duration
	misses := 0
	served0 := wp.WarmStats().Served
	for i := 0; i < *n; i++ {
		if *withDock {
			dur, err := samples.RawDockerRun(ctx, *image, "print('hi')", "hi\n")
			if err != nil {
				return err
			}
			raw = append(raw, dur)
		}

		if err := settle(ctx, c, wp); err != nil {
			return err
		}
		dur, hit, err := cycle(ctx, c, p, cfg)
		if err != nil {
			return err
		}
		if !hit {
			misses++
		}
		pooled = append(pooled, dur)

		if err := settle(ctx, c, wp); err != nil {
			return err
		}
		sb, hit, err := c.Create(ctx, "wasm", cfg)
		if err != nil {
			return err
		}
		if !hit {
			misses++
		}
		t := time.Now()
		if err := execHi(ctx, p, sb.ID); err != nil {
			return samples.DestroyAfter(ctx, p, sb.ID, err)
		}
		execOnly = append(execOnly, time.Since(t))
		if err := p.Destroy(context.WithoutCancel(ctx), sb.ID); err != nil {
			return err
		}

		// A create the pool cannot serve: the sandbox is made for it, and its exec
		// takes the interpreter started at the create, still initialising.
		if err := settle(ctx, c, wp); err != nil {
			return err
		}
		other := cfg
		other.Memory = "511m"
		t = time.Now()
		sb, hit, err = c.Create(ctx, "wasm", other)
		if err != nil {
			return err
		}
		if hit {
			return samples.DestroyAfter(ctx, p, sb.ID, errors.New("a create with other memory was served from the pool"))
		}
		if err := execHi(ctx, p, sb.ID); err != nil {
			return samples.DestroyAfter(ctx, p, sb.ID, err)
		}
		if err := p.Destroy(context.WithoutCancel(ctx), sb.ID); err != nil {
			return err
		}
		coldCycle = append(coldCycle, time.Since(t))

		if err := settle(ctx, c, wp); err != nil {
			return err
		}
		dur, err = freshExec(ctx, cold, cfg)
		if err != nil {
			return err
		}
		fresh = append(fresh, dur)

		for _, m := range []struct {
			p  *wasm.Provider
			to *[]time.Duration
		}{{cold, &cellPre}, {scratch, &cellScratch}} {
			if !*withCode {
				break
			}
			if err := settle(ctx, c, wp); err != nil {
				return err
			}
			dur, err := firstCell(ctx, m.p, cfg)
			if err != nil {
				return err
			}
			*m.to = append(*m.to, dur)
		}
	}
	served := wp.WarmStats().Served - served0
	if *cpuProf != "" {
		if err := profileCycles(ctx, c, wp, p, cfg, *cpuProf); err != nil {
			return err
		}
	}

	fmt.Printf("\n%-82s %9s %9s %9s\n", "measurement", "p50", "p90", "max")
	row := func(name string, ds []time.Duration) {
		if len(ds) > 0 {
			fmt.Printf("%-82s %9s %9s %9s\n", name, samples.Ms(samples.Percentile(ds, 50)), samples.Ms(samples.Percentile(ds, 90)), samples.Ms(samples.Percentile(ds, 100)))
		}
	}
	row("raw `docker run --rm --network=none --read-only ...` wrapper (baseline)", raw)
	row("pooled wasm create + exec print('hi') + destroy, Go client over roched's socket", pooled)
	row("exec print('hi') in a pooled wasm sandbox, through roched", execOnly)
	row("unpooled wasm create + exec print('hi') + destroy, through roched", coldCycle)
	row("exec print('hi') on a fresh instance, provider in-process, no warm start (baseline)", fresh)
	row("code context's first cell 1+1 in a new sandbox, kernel from the copy, in-process", cellPre)
	row("the same, kernel started from scratch (WithoutPreinit, baseline)", cellScratch)
	fmt.Printf("\nratios of p50s (the issue's targets in brackets):\n")
	if len(raw) > 0 {
		fmt.Printf("  raw docker run / pooled wasm cycle   %6.1fx  [>= 4x, cycle <= 40 ms: %s]\n", samples.Ratio(raw, pooled), samples.Ms(samples.Percentile(pooled, 50)))
	} else {
		fmt.Printf("  raw docker run / pooled wasm cycle   not measured (-docker=false)  [cycle <= 40 ms: %s]\n", samples.Ms(samples.Percentile(pooled, 50)))
	}
	fmt.Printf("  fresh instance / pooled exec          %6.1fx  (what warm start saves an exec)\n", samples.Ratio(fresh, execOnly))
	if *withCode {
		fmt.Printf("  scratch / copy, a context's first cell %6.1fx  (what the pre-initialised interpreter saves a new context)\n", samples.Ratio(cellScratch, cellPre))
	}
	fmt.Printf("  execs served by a warm interpreter: %d of %d through roched\n", served, 3**n)
	if misses > 0 {
		fmt.Printf("  note: %d of the pooled creates missed the pool\n", misses)
	}

	perSandbox, hwm, err := idleRSS(ctx, c, wp)
	if err != nil {
		return err
	}
	fmt.Printf("\nresident memory per idle pooled wasm sandbox (its warm interpreter included): %.1f MiB\n", perSandbox)
	fmt.Printf("  (roched's RSS with %d idle pooled sandboxes against none, after a GC each time; peak RSS of the process %.0f MiB)\n", *rssCount, hwm)

	if err := stop(); err != nil {
		return err
	}
	left, err := os.ReadDir(stateDir)
	if err != nil {
		return err
	}
	var ids []string
	for _, e := range left {
		if strings.HasPrefix(e.Name(), "wasm-") {
			ids = append(ids, e.Name())
		}
	}
	fmt.Printf("\nleft behind after roched's shutdown: %d wasm sandboxes\n", len(ids))
	if len(ids) > 0 {
		return fmt.Errorf("wasm sandboxes left behind: %v", ids)
	}
	return nil
}

// cycle is one client request: create (from the pool), exec, destroy.
func cycle(ctx context.Context, c *client.Client, p *client.Provider, cfg roche.Config) (time.Duration, bool, error) {
	start := time.Now()
	sb, hit, err := c.Create(ctx, "wasm", cfg)
	if err != nil {
		return 0, false, err
	}
	if err := execHi(ctx, p, sb.ID); err != nil {
		return 0, false, samples.DestroyAfter(ctx, p, sb.ID, err)
	}
	if err := p.Destroy(context.WithoutCancel(ctx), sb.ID); err != nil {
		return 0, false, err
	}
	return time.Since(start), hit, nil
}

func execHi(ctx context.Context, p roche.Provider, id string) error {
	res, err := p.Exec(ctx, id, roche.ExecRequest{Cmd: hi})
	if err != nil {
		return err
	}
	if res.ExitCode != 0 || res.Stdout != "hi\n" {
		return fmt.Errorf("exec: %+v", res)
	}
	return nil
}

// freshExec times an exec in a sandbox of a provider without warm start.
func freshExec(ctx context.Context, p *wasm.Provider, cfg roche.Config) (time.Duration, error) {
	sb, err := p.Create(ctx, cfg)
	if err != nil {
		return 0, err
	}
	defer p.Destroy(context.WithoutCancel(ctx), sb.ID)
	start := time.Now()
	if err := execHi(ctx, p, sb.ID); err != nil {
		return 0, err
	}
	return time.Since(start), nil
}

// firstCell times a code context's first cell in a new sandbox of p: the default
// context's kernel starts for it. The sandbox is created and destroyed untimed.
func firstCell(ctx context.Context, p *wasm.Provider, cfg roche.Config) (time.Duration, error) {
	sb, err := p.Create(ctx, cfg)
	if err != nil {
		return 0, err
	}
	defer p.Destroy(context.WithoutCancel(ctx), sb.ID)
	start := time.Now()
	ex, err := p.RunCode(ctx, sb.ID, roche.CodeRequest{Code: "1+1"})
	if err != nil {
		return 0, err
	}
	if ex.Error != nil || ex.Text() != "2" {
		return 0, fmt.Errorf("a context's first cell 1+1: text %q, error %+v", ex.Text(), ex.Error)
	}
	return time.Since(start), nil
}

// profileCycles runs -n pooled cycles, each on a settled pool, under a CPU profile
// written to file. The profile counts what the cycles cost this process in all: the
// refill each claim sets off runs while the next cycle waits for the pool to settle.
func profileCycles(ctx context.Context, c *client.Client, wp *wasm.Provider, p *client.Provider, cfg roche.Config, file string) error {
	f, err := os.Create(file)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := pprof.StartCPUProfile(f); err != nil {
		return err
	}
	for range *n {
		if err := settle(ctx, c, wp); err != nil {
			pprof.StopCPUProfile()
			return err
		}
		if _, _, err := cycle(ctx, c, p, cfg); err != nil {
			pprof.StopCPUProfile()
			return err
		}
	}
	if err := settle(ctx, c, wp); err != nil {
		pprof.StopCPUProfile()
		return err
	}
	pprof.StopCPUProfile()
	fmt.Printf("\nCPU profile of %d pooled cycles and their refills: %s\n", *n, file)
	return f.Close()
}

// settle waits, untimed, until the pool is full with nothing being created and every
// warm interpreter has started, so that a measurement does not share the CPUs with
// background work.
func settle(ctx context.Context, c *client.Client, wp *wasm.Provider) error {
	deadline := time.Now().Add(2 * time.Minute)
	for time.Now().Before(deadline) {
		st, err := c.PoolStatus(ctx)
		if err != nil {
			return err
		}
		ws := wp.WarmStats()
		if int(st[0].Idle) >= *poolMin && st[0].Creating == 0 && ws.Starting == 0 && ws.Ready >= *poolMin {
			return nil
		}
		time.Sleep(5 * time.Millisecond)
	}
	return errors.New("the wasm pool did not settle within two minutes")
}

// idleRSS measures the process's resident memory with the pool drained and with it
// warmed to -rss-count idle sandboxes, each with its interpreter started, and returns
// the growth per sandbox and the process's peak RSS, in MiB.
func idleRSS(ctx context.Context, c *client.Client, wp *wasm.Provider) (perSandbox, peak float64, err error) {
	key := "wasm/" + poolImage
	if _, _, err := c.PoolDrain(ctx, key); err != nil {
		return 0, 0, err
	}
	if err := waitWarm(wp, func(st wasm.WarmStats) bool { return st.Ready+st.Starting == 0 }); err != nil {
		return 0, 0, err
	}
	before, _, err := rss()
	if err != nil {
		return 0, 0, err
	}
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if _, err := c.PoolWarmup(wctx, key, *rssCount); err != nil {
		return 0, 0, err
	}
	if err := waitWarm(wp, func(st wasm.WarmStats) bool { return st.Ready >= *rssCount && st.Starting == 0 }); err != nil {
		return 0, 0, err
	}
	after, hwm, err := rss()
	if err != nil {
		return 0, 0, err
	}
	return (after - before) / float64(*rssCount), hwm, nil
}

// waitWarm waits, untimed, until the provider's warm interpreters satisfy cond.
func waitWarm(wp *wasm.Provider, cond func(wasm.WarmStats) bool) error {
	deadline := time.Now().Add(2 * time.Minute)
	for !cond(wp.WarmStats()) {
		if time.Now().After(deadline) {
			return fmt.Errorf("warm interpreters did not settle within two minutes: %+v", wp.WarmStats())
		}
		time.Sleep(10 * time.Millisecond)
	}
	return nil
}

// rss reads the process's resident and peak resident memory in MiB after a GC that
// returns freed memory to the OS.
func rss() (cur, hwm float64, err error) {
	runtime.GC()
	debug.FreeOSMemory()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, 0, fmt.Errorf("reading resident memory: %w (the memory figure needs Linux)", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		name, val, ok := strings.Cut(line, ":")
		if !ok || (name != "VmRSS" && name != "VmHWM") {
			continue
		}
		kb, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(val), " kB"), 64)
		if err != nil {
			return 0, 0, fmt.Errorf("parsing %s: %w", line, err)
		}
		if name == "VmRSS" {
			cur = kb / 1024
		} else {
			hwm = kb / 1024
		}
	}
	return cur, hwm, nil
}
