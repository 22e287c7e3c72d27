// Command e2b measures a sandbox's create + run + kill through E2B's official Python SDK
// against roched's E2B listener, side by side with the same cycle through Roche's own
// Python SDK against roched's unix socket: one roched, one pool (docker), both sides from
// one Python process, in turns, each cycle after the pool has refilled, so that both take
// a warm sandbox. It prints percentiles and the ratio of the medians; it asserts nothing
// about speed and fails only if an operation errs or a container is left behind.
//
//	make bench                  (or: go run ./bench/e2b)
//	go run ./bench/e2b -n 50
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/docker/docker/api/types/container"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/bench/internal/samples"
	"github.com/roche-sandbox/roche/client"
	"github.com/roche-sandbox/roche/internal/daemon"
	"github.com/roche-sandbox/roche/internal/e2b"
	"github.com/roche-sandbox/roche/internal/interrupt"
	"github.com/roche-sandbox/roche/internal/testenv"
	"github.com/roche-sandbox/roche/pool"
	"github.com/roche-sandbox/roche/provider/docker"
)

var (
	baseImage = flag.String("image", "roche/python:local", "image to run (built by scripts/build-test-image.sh)")
	n         = flag.Int("n", 30, "cycles per side")
	batch     = flag.Int("batch", 5, "cycles per turn")
	poolMin   = flag.Int("pool-min", 2, "idle sandboxes the pool keeps")
)

func main() {
	flag.Parse()
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "bench/e2b: %v\n", err)
		os.Exit(1)
	}
}

// repo is the checkout's root.
func repo() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

func run() error {
	// SIGINT and SIGTERM, not SIGPIPE as the other benches: the E2B listener runs in
	// this process, and a write to a connection an SDK closed raises SIGPIPE.
	ctx, stopSignals := interrupt.Context(os.Stderr, "bench/e2b")
	defer stopSignals()
	if *n < 1 || *batch < 1 || *poolMin < 1 {
		return errors.New("-n, -batch and -pool-min must be at least 1")
	}
	// E2B's SDK, pinned (the newest of the tested range), in its venv.
	sdks := exec.Command("bash", filepath.Join(repo(), "scripts", "e2b-sdks.sh"))
	sdks.Stderr = os.Stderr
	out, err := sdks.Output()
	if err != nil {
		return fmt.Errorf("scripts/e2b-sdks.sh: %w", err)
	}
	var python string
	for _, line := range strings.Split(string(out), "\n") {
		if v, ok := strings.CutPrefix(line, "E2B_PYTHON="); ok {
			python = v
		}
	}
	if python == "" {
		return fmt.Errorf("scripts/e2b-sdks.sh named no E2B_PYTHON: %q", out)
	}

	dc, err := samples.Engine(ctx)
	if err != nil {
		return err
	}
	defer dc.Close()
	img, untag, err := samples.PrivateTag(ctx, dc, *baseImage, "bench-e2b")
	if err != nil {
		return err
	}
	defer untag()
	dir, err := os.MkdirTemp("", "rbench-e2b")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	if _, err := testenv.BuildAgent(dir); err != nil {
		return err
	}
	os.Setenv("ROCHE_AGENT", filepath.Join(dir, "roche-agent"))

	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	dp, err := docker.New(docker.WithLogger(log))
	if err != nil {
		return err
	}
	defer dp.Close()
	spec, err := pool.ParseSpec(fmt.Sprintf("docker/%s?min=%d&max=%d", img, *poolMin, *poolMin))
	if err != nil {
		return err
	}
	// The template is read-only, as the pool's sandboxes are (a writable root is made per
	// create), so that E2B's creates are served from the pool as Roche's are.
	settings, _ := json.Marshal(map[string]any{"templates": map[string]any{
		"base": map[string]any{"image": img, "provider": "docker", "read_only": true}}})
	var printed strings.Builder
	socket := filepath.Join(dir, "roched.sock")
	c, stop, err := samples.StartDaemon(ctx, daemon.Config{
		Socket: socket, StateFile: filepath.Join(dir, "state.json"), Pools: []pool.Spec{spec},
		E2BListen: "tcp://127.0.0.1:0", E2B: settings,
	},
		map[string]roche.Provider{"docker": dp}, log, daemon.WithFrontend(e2b.New, &printed))
	if err != nil {
		return err
	}
	defer stop()
	defer c.Close()
	env := []string{"PYTHONPATH=" + filepath.Join(repo(), "sdk", "python", "src"), "PYTHONDONTWRITEBYTECODE=1"}
	for _, line := range strings.Split(printed.String(), "\n") {
		if kv, ok := strings.CutPrefix(line, "export "); ok {
			env = append(env, kv)
		}
	}
	if !strings.Contains(printed.String(), "E2B_API_KEY=") {
		return fmt.Errorf("roched printed no E2B_API_KEY: %q", printed.String())
	}
	py, err := startPython(python, env, socket, img)
	if err != nil {
		return err
	}
	defer py.close()

	// Warm both sides up: connections, imports, the pool.
	for _, side := range []string{"e2b", "roche"} {
		if err := waitIdle(ctx, c); err != nil {
			return err
		}
		if _, err := py.times(side, 1); err != nil {
			return err
		}
	}
	before, err := poolHits(ctx, c)
	if err != nil {
		return err
	}
	var e2bT, rocheT []time.Duration
	for len(e2bT) < *n {
		k := min(*batch, *n-len(e2bT))
		for _, side := range []struct {
			name string
			to   *[]time.Duration
		}{{"e2b", &e2bT}, {"roche", &rocheT}} {
			for range k {
				if err := waitIdle(ctx, c); err != nil {
					return err
				}
				d, err := py.times(side.name, 1)
				if err != nil {
					return err
				}
				*side.to = append(*side.to, d...)
			}
		}
	}
	after, err := poolHits(ctx, c)
	if err != nil {
		return err
	}

	fmt.Printf("create + run `true` + kill through roched (docker, pool min=%d), Python, %d per side in turns of %d, %d CPUs\n\n", *poolMin, *n, *batch, runtime.NumCPU())
	fmt.Printf("%-64s %9s %9s %9s\n", "", "p50", "p90", "p99")
	row := func(name string, ds []time.Duration) {
		fmt.Printf("%-64s %9s %9s %9s\n", name, samples.Ms(samples.Percentile(ds, 50)), samples.Ms(samples.Percentile(ds, 90)), samples.Ms(samples.Percentile(ds, 99)))
	}
	row("E2B SDK (e2b, Sandbox.create + commands.run + kill), E2B listener", e2bT)
	row("Roche SDK (Roche.create + exec bash -l -c + destroy), unix socket", rocheT)
	fmt.Printf("\nE2B SDK / Roche SDK, ratio of p50s: %.2fx\n", float64(samples.Percentile(e2bT, 50))/float64(samples.Percentile(rocheT, 50)))
	fmt.Printf("pool hits during the measured cycles: %d of %d\n", after.hits-before.hits, 2**n)

	py.close()
	if err := stop(); err != nil {
		return err
	}
	left, err := samples.ContainersOf(ctx, dc, img)
	if err != nil {
		return err
	}
	fmt.Printf("left behind: %d containers\n", len(left))
	if len(left) > 0 {
		for _, id := range left {
			dc.ContainerRemove(context.Background(), id, container.RemoveOptions{Force: true})
		}
		return fmt.Errorf("%d containers were left behind", len(left))
	}
	return nil
}

type counts struct{ hits, misses uint64 }

func poolHits(ctx context.Context, c *client.Client) (counts, error) {
	st, err := c.PoolStatus(ctx)
	if err != nil {
		return counts{}, err
	}
	var n counts
	for _, p := range st {
		n.hits += p.Hits
		n.misses += p.Misses
	}
	return n, nil
}

// waitIdle waits, untimed, until the pool has a sandbox to hand out.
func waitIdle(ctx context.Context, c *client.Client) error {
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		st, err := c.PoolStatus(ctx)
		if err != nil {
			return err
		}
		ready := len(st) > 0
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

// pythonSide is bench/e2b/cycle.py.
type pythonSide struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Scanner
}

func startPython(python string, env []string, socket, img string) (*pythonSide, error) {
	cmd := exec.Command(python, filepath.Join(repo(), "bench", "e2b", "cycle.py"), socket, img)
	cmd.Env = append(os.Environ(), env...)
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
		return nil, fmt.Errorf("starting %s: %w", python, err)
	}
	s := &pythonSide{cmd: cmd, in: in, out: bufio.NewScanner(out)}
	if !s.out.Scan() || s.out.Text() != "ready" {
		s.close()
		return nil, errors.New("the Python side did not start (see its error above)")
	}
	return s, nil
}

// times asks the Python side for k cycles of one side and returns their durations.
func (s *pythonSide) times(side string, k int) ([]time.Duration, error) {
	return samples.PythonTimes(s.in, s.out, side, k)
}

func (s *pythonSide) close() {
	if s.cmd.Process == nil || s.cmd.ProcessState != nil {
		return
	}
	s.in.Close()
	_ = s.cmd.Wait()
}
