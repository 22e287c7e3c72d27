// Command soak runs create, exec and destroy through roched a thousand times (leased, as
// roche run and the SDKs' context managers do, served from a warm pool) and reports the
// daemon's resident memory, open descriptors and goroutines after a warm-up and at the
// end, and how long the cycles took. roched runs in this process, so those figures are
// its own. It asserts nothing about speed or size; it fails (exit 1) only if a cycle errs
// or a sandbox is left behind.
//
//	make bench                    (or: go run ./bench/soak -n 1000)
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
	"time"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/bench/internal/samples"
	"github.com/roche-sandbox/roche/internal/daemon"
	"github.com/roche-sandbox/roche/pool"
	"github.com/roche-sandbox/roche/provider/docker"
	"github.com/roche-sandbox/roche/provider/kit"
)

var (
	baseImage = flag.String("image", "roche/python:local", "image to run (built by scripts/build-test-image.sh)")
	cycles    = flag.Int("n", 1000, "create/exec/destroy cycles")
	warmup    = flag.Int("warmup", 20, "cycles before the first measurement")
)

func main() {
	flag.Parse()
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "soak: %v\n", err)
		os.Exit(1)
	}
}

// usage is what the process holds at one moment.
type usage struct {
	rssKiB, fds, goroutines int
}

func measure() usage {
	runtime.GC()
	u := usage{goroutines: runtime.NumGoroutine()}
	if b, err := os.ReadFile("/proc/self/status"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
				u.rssKiB, _ = strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(rest), " kB"))
			}
		}
	}
	if fds, err := os.ReadDir("/proc/self/fd"); err == nil {
		u.fds = len(fds)
	}
	return u
}

func run() error {
	ctx, stopSignals := samples.Interruptible()
	defer stopSignals()
	if *cycles < 1 || *warmup < 0 {
		return errors.New("-n must be at least 1 and -warmup at least 0")
	}
	dc, err := samples.Engine(ctx)
	if err != nil {
		return err
	}
	defer dc.Close()
	img, untag, err := samples.PrivateTag(ctx, dc, *baseImage, "soak")
	if err != nil {
		return err
	}
	defer untag()
	agentNote, cleanupAgent, err := samples.SetupAgent()
	if err != nil {
		return err
	}
	defer cleanupAgent()
	if !strings.HasPrefix(agentNote, "transport agent") {
		return fmt.Errorf("the soak needs roche-agent (%s): leases are held through it", agentNote)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	dp, err := docker.New(docker.WithLogger(log))
	if err != nil {
		return err
	}
	defer dp.Close()
	dir, err := os.MkdirTemp("", "rsoak")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	spec, err := pool.ParseSpec("docker/" + img + "?min=2&max=4")
	if err != nil {
		return err
	}
	c, stop, err := samples.StartDaemon(ctx, daemon.Config{
		Socket: filepath.Join(dir, "roched.sock"), Pools: []pool.Spec{spec},
	}, map[string]roche.Provider{"docker": dp}, log)
	if err != nil {
		return err
	}
	p := c.Provider("docker")
	cfg := roche.DefaultConfig()
	cfg.Image = img
	cycle := func() (bool, error) {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		defer cancel()
		sb, pooled, err := c.CreateFor(cctx, "docker", cfg, kit.CreateOptions{Leased: true})
		if err != nil {
			return false, err
		}
		res, err := p.Exec(cctx, sb.ID, roche.ExecRequest{Cmd: []string{"python3", "-c", "print('hello')"}})
		// Destroy it whatever the exec did, on a context that neither Ctrl-C (which
		// cancels ctx, and so the exec) nor cctx's timeout cancels.
		err = errors.Join(err, p.Destroy(context.WithoutCancel(ctx), sb.ID))
		if err == nil && res.Stdout != "hello\n" {
			err = fmt.Errorf("exec printed %q", res.Stdout)
		}
		return pooled, err
	}

	fmt.Printf("roche soak: %d leased create+exec+destroy cycles through roched (in this process), pool min=2 max=4, image %s, %d CPUs\n",
		*cycles, img, runtime.NumCPU())
	for i := range *warmup {
		if _, err := cycle(); err != nil {
			return fmt.Errorf("warm-up cycle %d: %w", i, err)
		}
	}
	before := measure()
	start := time.Now()
	hits := 0
	for i := range *cycles {
		pooled, err := cycle()
		if err != nil {
			return fmt.Errorf("cycle %d: %w", i, err)
		}
		if pooled {
			hits++
		}
		if (i+1)%100 == 0 {
			fmt.Fprintf(os.Stderr, "soak: %d cycles\n", i+1)
		}
	}
	elapsed := time.Since(start)
	// Let the background removals finish before the last look.
	time.Sleep(5 * time.Second)
	after := measure()

	fmt.Printf("%-22s %12s %12s %12s\n", "", "after warm-up", "at the end", "change")
	fmt.Printf("%-22s %12d %12d %+12d\n", "resident memory (KiB)", before.rssKiB, after.rssKiB, after.rssKiB-before.rssKiB)
	fmt.Printf("%-22s %12d %12d %+12d\n", "open descriptors", before.fds, after.fds, after.fds-before.fds)
	fmt.Printf("%-22s %12d %12d %+12d\n", "goroutines", before.goroutines, after.goroutines, after.goroutines-before.goroutines)
	fmt.Printf("%d cycles in %v (%.1f cycles/s), %d served from the pool\n",
		*cycles, elapsed.Round(time.Second), float64(*cycles)/elapsed.Seconds(), hits)

	c.Close()
	if err := stop(); err != nil {
		return err
	}
	left, err := samples.ContainersOf(ctx, dc, img)
	if err != nil {
		return err
	}
	if len(left) > 0 {
		return fmt.Errorf("%d sandboxes survived the soak: %v", len(left), left)
	}
	fmt.Println("no sandbox left behind")
	return nil
}
