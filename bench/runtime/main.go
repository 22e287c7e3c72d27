// Command runtime benchmarks the Docker provider on gVisor (--runtime runsc) against
// runc, alternating the two in the same run (shared machines are noisy, so only same-run
// ratios mean anything):
//
//   - cold create: Create until roche-agent answers, no pool;
//   - exec of `true` and of python3 -c 'print(1)' through the agent;
//   - destroy.
//
// Run it with `make bench` (or go run ./bench/runtime); it needs a Docker engine with
// runsc registered (sudo bash scripts/runsc.sh) and the image roche/python:local, and
// builds roche-agent itself.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/bench/internal/samples"
	"github.com/roche-sandbox/roche/internal/testenv"
	"github.com/roche-sandbox/roche/provider/docker"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "bench/runtime: %v\n", err)
		os.Exit(1)
	}
}

// timings are one runtime's samples.
type timings struct {
	create, execTrue, execPy, destroy []time.Duration
}

func run() error {
	n := flag.Int("n", 15, "sandboxes created per runtime (each runs -execs execs of each kind)")
	execs := flag.Int("execs", 20, "execs of each kind per sandbox")
	flag.Parse()
	ctx, stopSignals := samples.Interruptible()
	defer stopSignals()

	dir, err := os.MkdirTemp("", "roche-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	agentPath, err := testenv.BuildAgent(dir)
	if err != nil {
		return err
	}
	runtimes := []string{docker.RuntimeRunc, docker.RuntimeGVisor}
	provs := map[string]*docker.Provider{}
	for _, rt := range runtimes {
		p, err := docker.New(docker.WithAgentPath(agentPath), docker.WithRuntime(rt))
		if err != nil {
			return err
		}
		defer p.Close()
		provs[rt] = p
	}
	cfg := roche.DefaultConfig()
	cfg.Image = testenv.Image()
	got := map[string]*timings{}
	for _, rt := range runtimes {
		got[rt] = &timings{}
		// A warm-up sandbox each, not counted: the first create pays for caches.
		if _, err := cycle(ctx, provs[rt], cfg, 1, &timings{}); err != nil {
			return fmt.Errorf("%s: %w", rt, err)
		}
	}
	for i := 0; i < *n; i++ {
		for _, rt := range runtimes {
			if _, err := cycle(ctx, provs[rt], cfg, *execs, got[rt]); err != nil {
				return fmt.Errorf("%s: %w", rt, err)
			}
		}
	}
	fmt.Printf("docker provider: runsc (gVisor) vs runc, alternating, same run (n=%d creates, %d execs of each kind per sandbox)\n\n", *n, *execs)
	fmt.Printf("  %-28s %20s %20s %8s\n", "", "runc p50 (p90)", "runsc p50 (p90)", "runsc/runc")
	row := func(name string, a, b []time.Duration) {
		fmt.Printf("  %-28s %9s (%8s) %9s (%8s) %7.2fx\n", name,
			samples.Ms(samples.Median(a)), samples.Ms(samples.Percentile(a, 90)),
			samples.Ms(samples.Median(b)), samples.Ms(samples.Percentile(b, 90)), samples.Ratio(b, a))
	}
	rc, rs := got[docker.RuntimeRunc], got[docker.RuntimeGVisor]
	row("cold create (agent ready)", rc.create, rs.create)
	row("exec true", rc.execTrue, rs.execTrue)
	row("exec python3 print(1)", rc.execPy, rs.execPy)
	row("destroy", rc.destroy, rs.destroy)
	return nil
}

// cycle creates a sandbox, runs execs of each kind in it and destroys it, adding each
// step's time to t.
func cycle(ctx context.Context, p *docker.Provider, cfg roche.Config, execs int, t *timings) (roche.SandboxInfo, error) {
	start := time.Now()
	sb, err := p.Create(ctx, cfg)
	if err != nil {
		return sb, err
	}
	t.create = append(t.create, time.Since(start))
	defer p.Destroy(context.WithoutCancel(ctx), sb.ID)
	for range execs {
		for _, c := range []struct {
			cmd []string
			to  *[]time.Duration
		}{
			{[]string{"true"}, &t.execTrue},
			{[]string{"python3", "-c", "print(1)"}, &t.execPy},
		} {
			start := time.Now()
			res, err := p.Exec(ctx, sb.ID, roche.ExecRequest{Cmd: c.cmd, Timeout: time.Minute})
			if err != nil {
				return sb, err
			}
			if res.ExitCode != 0 {
				return sb, fmt.Errorf("%v in sandbox %s: exit %d: %s", c.cmd, sb.ID, res.ExitCode, res.Stderr)
			}
			*c.to = append(*c.to, time.Since(start))
		}
	}
	start = time.Now()
	if err := p.Destroy(context.WithoutCancel(ctx), sb.ID); err != nil {
		return sb, err
	}
	t.destroy = append(t.destroy, time.Since(start))
	return sb, nil
}
