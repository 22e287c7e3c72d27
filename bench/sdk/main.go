// Command sdk measures what the Python SDK adds to an exec over roched, side by side
// with the Go client on the same sandbox: both run `true` in batches taken in turns, so
// that the machine's drift hits both alike. It prints percentiles and the difference of
// the p50s (the target: at most 2 ms); it asserts nothing about speed and fails
// only if an operation errs or a container is left behind.
//
//	make bench                  (or: go run ./bench/sdk)
//	go run ./bench/sdk -n 1000
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"time"

	"github.com/docker/docker/api/types/container"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/bench/internal/samples"
	"github.com/roche-sandbox/roche/internal/daemon"
	"github.com/roche-sandbox/roche/internal/testenv"
	"github.com/roche-sandbox/roche/provider/docker"
)

var (
	baseImage = flag.String("image", "roche/python:local", "image to run (built by scripts/build-test-image.sh)")
	n         = flag.Int("n", 500, "execs per side")
	batch     = flag.Int("batch", 50, "execs per turn")
	cliN      = flag.Int("cli-n", 30, "execs through the SDK's CLI transport (0 skips it)")
	python    = flag.String("python", "python3", "the Python to run the SDK with (3.10+)")
)

func main() {
	flag.Parse()
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "bench/sdk: %v\n", err)
		os.Exit(1)
	}
}

// repo is the checkout's root, for the SDK's source and the Python side of the bench.
func repo() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

func run() error {
	ctx, stopSignals := samples.Interruptible()
	defer stopSignals()
	if *n < 1 || *batch < 1 {
		return errors.New("-n and -batch must be at least 1")
	}
	dc, err := samples.Engine(ctx)
	if err != nil {
		return err
	}
	defer dc.Close()
	img, untag, err := samples.PrivateTag(ctx, dc, *baseImage, "bench-sdk")
	if err != nil {
		return err
	}
	defer untag()

	dir, err := os.MkdirTemp("", "rbench-sdk")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	// roche-agent runs every command in the sandbox, as in production; the roche CLI is
	// for the SDK's CLI transport, and runs --direct calls through the roched beside it.
	if _, err := testenv.BuildAgent(dir); err != nil {
		return err
	}
	os.Setenv("ROCHE_AGENT", filepath.Join(dir, "roche-agent"))
	cli := filepath.Join(dir, "roche")
	build := exec.Command("go", "build", "-o", dir+string(filepath.Separator), "./cmd/roche", "./cmd/roched", "./cmd/roche-run")
	build.Dir = repo()
	if out, err := build.CombinedOutput(); err != nil {
		return fmt.Errorf("building roche and roched: %v\n%s", err, out)
	}

	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	dp, err := docker.New(docker.WithLogger(log))
	if err != nil {
		return err
	}
	defer dp.Close()
	socket := filepath.Join(dir, "roched.sock")
	c, stop, err := samples.StartDaemon(ctx, daemon.Config{Socket: socket}, map[string]roche.Provider{"docker": dp}, log)
	if err != nil {
		return err
	}
	defer stop()
	defer c.Close()
	p := c.Provider("docker")
	cfg := roche.DefaultConfig()
	cfg.Image = img
	sb, err := p.Create(ctx, cfg)
	if err != nil {
		return err
	}
	defer p.Destroy(context.Background(), sb.ID)

	py, err := startPython(dir, socket, sb.ID, sb.Owner, cli)
	if err != nil {
		return err
	}
	defer py.close()

	goExec := func() (time.Duration, error) {
		start := time.Now()
		_, err := p.Exec(ctx, sb.ID, roche.ExecRequest{Cmd: []string{"true"}})
		return time.Since(start), err
	}
	// Warm both sides up: connections, caches, the agent.
	for range 20 {
		if _, err := goExec(); err != nil {
			return err
		}
	}
	if _, err := py.times("sync", 20); err != nil {
		return err
	}
	if _, err := py.times("async", 20); err != nil {
		return err
	}

	var goT, syncT, asyncT []time.Duration
	for len(goT) < *n {
		k := min(*batch, *n-len(goT))
		for range k {
			d, err := goExec()
			if err != nil {
				return err
			}
			goT = append(goT, d)
		}
		s, err := py.times("sync", k)
		if err != nil {
			return err
		}
		syncT = append(syncT, s...)
		a, err := py.times("async", k)
		if err != nil {
			return err
		}
		asyncT = append(asyncT, a...)
	}
	var cliT []time.Duration
	if *cliN > 0 {
		if cliT, err = py.times("cli", *cliN); err != nil {
			return err
		}
	}

	fmt.Printf("exec `true` in one warm sandbox through roched (in-process, unix socket), %d per side in turns of %d\n\n", *n, *batch)
	fmt.Printf("%-52s %9s %9s %9s\n", "", "p50", "p90", "p99")
	row := func(name string, ds []time.Duration) {
		fmt.Printf("%-52s %9s %9s %9s\n", name, samples.Ms(samples.Percentile(ds, 50)), samples.Ms(samples.Percentile(ds, 90)), samples.Ms(samples.Percentile(ds, 99)))
	}
	row("Go client (client.Provider.Exec)", goT)
	row("Python SDK, Roche (sync), daemon transport", syncT)
	row("Python SDK, AsyncRoche, daemon transport", asyncT)
	if len(cliT) > 0 {
		row("Python SDK, Roche (sync), CLI transport (context)", cliT)
	}
	target := 2 * time.Millisecond
	verdict := func(d time.Duration) string {
		if d <= target {
			return "within"
		}
		return "OVER"
	}
	dSync, dAsync := samples.Percentile(syncT, 50)-samples.Percentile(goT, 50), samples.Percentile(asyncT, 50)-samples.Percentile(goT, 50)
	fmt.Printf("\nSDK overhead per exec over the Go client, difference of p50s [target <= 2 ms]:\n")
	fmt.Printf("  Roche (sync)   %8s  %s\n", samples.Ms(dSync), verdict(dSync))
	fmt.Printf("  AsyncRoche     %8s  %s\n", samples.Ms(dAsync), verdict(dAsync))

	if err := p.Destroy(context.WithoutCancel(ctx), sb.ID); err != nil {
		return err
	}
	if err := stop(); err != nil {
		return err
	}
	left, err := samples.ContainersOf(ctx, dc, img)
	if err != nil {
		return err
	}
	fmt.Printf("\nleft behind: %d containers\n", len(left))
	if len(left) > 0 {
		for _, id := range left {
			dc.ContainerRemove(context.Background(), id, container.RemoveOptions{Force: true})
		}
		return fmt.Errorf("%d containers were left behind", len(left))
	}
	return nil
}

// pythonSide is bench/sdk/python_exec.py, running the SDK from this checkout.
type pythonSide struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Scanner
}

func startPython(dir, socket, id, owner, cli string) (*pythonSide, error) {
	cmd := exec.Command(*python, filepath.Join(repo(), "bench", "sdk", "python_exec.py"), socket, id, cli)
	// ROCHE_OWNER: the CLI's --direct calls keep to their owner's sandboxes, and this one
	// was made through roched.
	cmd.Env = append(os.Environ(), "PYTHONPATH="+filepath.Join(repo(), "sdk", "python", "src"), "PYTHONDONTWRITEBYTECODE=1",
		"ROCHE_OWNER="+owner)
	cmd.Dir = dir
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w (-python names another)", *python, err)
	}
	s := &pythonSide{cmd: cmd, in: in, out: bufio.NewScanner(out)}
	s.out.Buffer(make([]byte, 1<<20), 16<<20)
	if !s.out.Scan() || s.out.Text() != "ready" {
		s.close()
		return nil, errors.New("the Python side did not start (see its error above)")
	}
	return s, nil
}

// times asks the Python side for k execs of one kind and returns their durations.
func (s *pythonSide) times(kind string, k int) ([]time.Duration, error) {
	return samples.PythonTimes(s.in, s.out, kind, k)
}

func (s *pythonSide) close() {
	fmt.Fprintln(s.in, "quit")
	s.in.Close()
	done := make(chan struct{})
	go func() { s.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		s.cmd.Process.Kill()
		<-done
	}
}
