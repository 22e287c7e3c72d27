// Command cli benchmarks what the roche CLI costs a caller that runs it once per command
// (the Python and TypeScript SDKs' CLI transport): `roche exec -- true` on a sandbox
// through roched, against /bin/true started the same way, alternating in the same run,
// and `roche --version` for the start-up alone. Its target: the CLI's exec costs at most
// 10 ms p50 over /bin/true.
//
// Run it with `make bench` (or go run ./bench/cli); it needs a Docker engine and the
// image roche/python:local, and builds roche and roche-agent itself (roche alone: the
// thin binary, which through roched never needs roched's). -roche BINARY measures a
// given build instead.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/bench/internal/samples"
	"github.com/roche-sandbox/roche/internal/daemon"
	"github.com/roche-sandbox/roche/internal/testenv"
	"github.com/roche-sandbox/roche/provider/docker"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "bench/cli: %v\n", err)
		os.Exit(1)
	}
}

func run() error {
	n := flag.Int("n", 100, "runs of each command")
	bin := flag.String("roche", "", "the roche binary to measure (default: built from this tree)")
	other := flag.String("compare", "", "another roche binary (an earlier build) measured alongside, for a before/after in the same run")
	flag.Parse()
	ctx, stopSignals := samples.Interruptible()
	defer stopSignals()

	dir, err := os.MkdirTemp("", "roche-bench-cli-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	if *bin == "" {
		*bin = filepath.Join(dir, "roche")
		build := exec.Command("go", "build", "-o", *bin, "./cmd/roche")
		build.Env = append(os.Environ(), "CGO_ENABLED=0")
		build.Stderr = os.Stderr
		if err := build.Run(); err != nil {
			return fmt.Errorf("building roche: %w", err)
		}
	}
	agentPath, err := testenv.BuildAgent(dir)
	if err != nil {
		return err
	}
	dp, err := docker.New(docker.WithAgentPath(agentPath))
	if err != nil {
		return err
	}
	defer dp.Close()
	socket := filepath.Join(dir, "roched.sock")
	c, stop, err := samples.StartDaemon(ctx, daemon.Config{Socket: socket},
		map[string]roche.Provider{"docker": dp}, slog.New(slog.DiscardHandler))
	if err != nil {
		return err
	}
	defer stop()
	defer c.Close()
	cfg := roche.DefaultConfig()
	cfg.Image = testenv.Image()
	p := c.Provider("docker")
	sb, err := p.Create(ctx, cfg)
	if err != nil {
		return err
	}
	defer p.Destroy(context.WithoutCancel(ctx), sb.ID)

	cmds := []struct {
		name string
		argv []string
		got  []time.Duration
	}{
		{name: "/bin/true", argv: []string{"/bin/true"}},
		{name: "roche --version", argv: []string{*bin, "--version"}},
		{name: "roche exec -- true (via roched)", argv: []string{*bin, "--socket", socket, "exec", "--sandbox", sb.ID, "--", "true"}},
	}
	if *other != "" {
		cmds = append(cmds, struct {
			name string
			argv []string
			got  []time.Duration
		}{name: "-compare: roche exec -- true", argv: []string{*other, "--socket", socket, "exec", "--sandbox", sb.ID, "--", "true"}})
	}
	for i := -1; i < *n; i++ { // a warm-up round, not counted
		for j := range cmds {
			d, err := timed(cmds[j].argv)
			if err != nil {
				return err
			}
			if i >= 0 {
				cmds[j].got = append(cmds[j].got, d)
			}
		}
	}
	fmt.Printf("the roche CLI, started per command, alternating, same run (n=%d)\n\n", *n)
	for _, c := range cmds {
		fmt.Printf("  %-34s p50 %9s  p90 %9s\n", c.name, samples.Ms(samples.Median(c.got)), samples.Ms(samples.Percentile(c.got, 90)))
	}
	over := samples.Median(cmds[2].got) - samples.Median(cmds[0].got)
	verdict := "meets"
	if over > 10*time.Millisecond {
		verdict = "misses"
	}
	fmt.Printf("\n  roche exec -- true minus /bin/true, p50: %s (%s the 10 ms target)\n", samples.Ms(over), verdict)
	fmt.Printf("  roche --version minus /bin/true, p50:    %s (start-up alone)\n", samples.Ms(samples.Median(cmds[1].got)-samples.Median(cmds[0].got)))
	if *other != "" {
		fmt.Printf("  -compare's exec minus /bin/true, p50:    %s\n", samples.Ms(samples.Median(cmds[3].got)-samples.Median(cmds[0].got)))
	}
	return nil
}

// timed runs argv to its end and returns how long that took; a failure is an error.
func timed(argv []string) (time.Duration, error) {
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = io.Discard, io.Discard
	start := time.Now()
	err := cmd.Run()
	d := time.Since(start)
	if err != nil {
		return 0, fmt.Errorf("%v: %w", argv, err)
	}
	return d, nil
}
