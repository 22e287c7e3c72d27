// Command exec benchmarks commands and files through roche-agent in a Docker sandbox,
// against baselines measured in the same run on the same machine (shared machines are
// noisy, so only same-run ratios mean anything):
//
//   - exec of `true` through the Go API, against `docker exec CONTAINER true` and against
//     the floor: this process forking and executing /bin/true on the host and waiting;
//   - exec of python3 -c 'print(1)' in the sandbox, against the same on the host;
//   - a 100 MiB file copied in and out, in MiB/s;
//   - a tree of 2,000 small files copied in and out, in files/s;
//   - the agent's resident memory in an idle sandbox.
//
// Run it with `make bench` (or go run ./bench/exec); it needs a Docker engine and the
// image roche/python:local, and builds roche-agent itself.
package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/docker/docker/client"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/bench/internal/samples"
	"github.com/roche-sandbox/roche/internal/testenv"
	"github.com/roche-sandbox/roche/provider/docker"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "bench/exec: %v\n", err)
		os.Exit(1)
	}
}

func run() error {
	n := flag.Int("n", 200, "iterations of the fast measurements")
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
	p, err := docker.New(docker.WithAgentPath(agentPath))
	if err != nil {
		return err
	}
	defer p.Close()
	cfg := roche.DefaultConfig()
	cfg.Image = testenv.Image()
	cfg.Writable = true // room for the 100 MiB file outside the 64 MiB /tmp
	sb, err := p.Create(ctx, cfg)
	if err != nil {
		return err
	}
	defer p.Destroy(context.WithoutCancel(ctx), sb.ID)
	if sb.Transport != docker.TransportAgent {
		return fmt.Errorf("sandbox transport is %s, not the agent", sb.Transport)
	}

	fmt.Printf("exec through roche-agent vs. baselines, same run (n=%d; docker CLI n=%d)\n\n", *n, *n/5)

	// Idle memory first, before any command has run in the sandbox.
	rss, err := agentRSS(ctx, sb.ID)
	if err != nil {
		return err
	}

	agentTrue, err := measure(ctx, *n, func() error { return execOK(ctx, p, sb.ID, "true") })
	if err != nil {
		return err
	}
	dockerTrue, err := measure(ctx, *n/5, func() error { return exec.CommandContext(ctx, "docker", "exec", sb.ID, "true").Run() })
	if err != nil {
		return fmt.Errorf("docker exec baseline: %w", err)
	}
	// The floor: what the agent does in the sandbox for one command, done here on the
	// host with nothing around it (no socket, no frames, no sandbox user).
	hostTrue, err := measure(ctx, *n, forkExecTrue)
	if err != nil {
		return fmt.Errorf("fork+exec baseline: %w", err)
	}
	report("exec true, Go API via agent", agentTrue)
	report("docker exec CTR true (baseline)", dockerTrue)
	report("fork+exec+wait true on the host (floor)", hostTrue)
	fmt.Printf("  -> agent exec p50 %s (targets <= 3 ms, <= 1.5 ms), %s over the host's fork+exec+wait; %.1fx faster than docker exec\n\n",
		samples.Ms(samples.Median(agentTrue)), samples.Ms(samples.Median(agentTrue)-samples.Median(hostTrue)), samples.Ratio(dockerTrue, agentTrue))

	py := []string{"python3", "-c", "print(1)"}
	inSandbox, err := measure(ctx, *n/2, func() error { return execOK(ctx, p, sb.ID, py...) })
	if err != nil {
		return err
	}
	// The system interpreter, not a version manager's shim script in front of one.
	hostPython := "/usr/bin/python3"
	if _, err := os.Stat(hostPython); err != nil {
		if hostPython, err = exec.LookPath("python3"); err != nil {
			return err
		}
	}
	onHost, err := measure(ctx, *n/2, func() error { return exec.CommandContext(ctx, hostPython, "-c", "print(1)").Run() })
	if err != nil {
		return err
	}
	report("python3 -c 'print(1)' in sandbox", inSandbox)
	report("python3 -c 'print(1)' on host ("+hostPython+")", onHost)
	fmt.Printf("  -> ratio sandbox/host p50 %.2f (target <= 1.5)\n\n", samples.Ratio(inSandbox, onHost))

	if err := copyBench(ctx, p, sb.ID, dir); err != nil {
		return err
	}
	if err := treeBench(ctx, p, sb.ID, dir); err != nil {
		return err
	}
	fmt.Printf("\nagent RSS in an idle sandbox: %.1f MiB (target <= 10 MiB)\n", float64(rss)/(1<<20))
	return nil
}

func execOK(ctx context.Context, p *docker.Provider, id string, cmd ...string) error {
	res, err := p.Exec(ctx, id, roche.ExecRequest{Cmd: cmd})
	if err == nil && res.ExitCode != 0 {
		err = fmt.Errorf("%v exited %d: %s", cmd, res.ExitCode, res.Stderr)
	}
	return err
}

// forkExecTrue runs /bin/true from this process the way the agent runs a command, by
// fork, exec and wait, without os/exec's path lookup and descriptor plumbing.
func forkExecTrue() error {
	pid, err := syscall.ForkExec("/bin/true", []string{"true"}, &syscall.ProcAttr{Env: []string{"PATH=/usr/bin:/bin"}})
	if err != nil {
		return err
	}
	var ws syscall.WaitStatus
	if _, err := syscall.Wait4(pid, &ws, 0, nil); err != nil {
		return err
	}
	if ws.ExitStatus() != 0 {
		return fmt.Errorf("/bin/true exited %d", ws.ExitStatus())
	}
	return nil
}

func copyBench(ctx context.Context, p *docker.Provider, id, dir string) error {
	const size = 100 << 20
	data := make([]byte, size)
	if _, err := rand.Read(data); err != nil {
		return err
	}
	src := filepath.Join(dir, "in.bin")
	if err := os.WriteFile(src, data, 0o644); err != nil {
		return err
	}
	var in, out, wr, rd []time.Duration
	for i := 0; i < 5; i++ {
		d, err := timed(func() error { return p.CopyTo(ctx, id, src, "/var/tmp/in.bin") })
		if err != nil {
			return err
		}
		in = append(in, d)
		d, err = timed(func() error { return p.CopyFrom(ctx, id, "/var/tmp/in.bin", filepath.Join(dir, "out.bin")) })
		if err != nil {
			return err
		}
		out = append(out, d)
		d, err = timed(func() error { return p.WriteFile(ctx, id, "/var/tmp/w.bin", bytes.NewReader(data), 0o644) })
		if err != nil {
			return err
		}
		wr = append(wr, d)
		d, err = timed(func() error { return p.ReadFile(ctx, id, "/var/tmp/w.bin", io.Discard) })
		if err != nil {
			return err
		}
		rd = append(rd, d)
	}
	rate := func(ds []time.Duration) float64 { return float64(size) / (1 << 20) / samples.Median(ds).Seconds() }
	fmt.Printf("100 MiB (median of 5; target >= 200 MiB/s each way)\n")
	fmt.Printf("  cp in  (tar, host file -> sandbox)  %7.0f MiB/s\n", rate(in))
	fmt.Printf("  cp out (tar, sandbox -> host file)  %7.0f MiB/s\n", rate(out))
	fmt.Printf("  WriteFile (files API)               %7.0f MiB/s\n", rate(wr))
	fmt.Printf("  ReadFile  (files API)               %7.0f MiB/s\n", rate(rd))
	return nil
}

// treeBench copies a tree of many small files in and out: what a copy costs per entry
// (names checked, directories walked, files created) rather than per byte.
func treeBench(ctx context.Context, p *docker.Provider, id, dir string) error {
	const dirs, perDir, size = 20, 100, 4096
	src := filepath.Join(dir, "tree")
	data := make([]byte, size)
	for d := range dirs {
		sub := filepath.Join(src, "d"+strconv.Itoa(d))
		if err := os.MkdirAll(sub, 0o755); err != nil {
			return err
		}
		for f := range perDir {
			data[0] = byte(f) // not all zeros: kept as data, not holes
			if err := os.WriteFile(filepath.Join(sub, "f"+strconv.Itoa(f)), data, 0o644); err != nil {
				return err
			}
		}
	}
	var in, out []time.Duration
	for i := range 5 {
		name := "/var/tmp/tree" + strconv.Itoa(i)
		d, err := timed(func() error { return p.CopyTo(ctx, id, src, name) })
		if err != nil {
			return err
		}
		in = append(in, d)
		d, err = timed(func() error { return p.CopyFrom(ctx, id, name, filepath.Join(dir, "out-tree"+strconv.Itoa(i))) })
		if err != nil {
			return err
		}
		out = append(out, d)
	}
	const files = dirs * perDir
	rate := func(ds []time.Duration) float64 { return files / samples.Median(ds).Seconds() }
	fmt.Printf("a tree of %d files of %d KiB in %d directories (median of 5)\n", files, size>>10, dirs)
	fmt.Printf("  cp in  (tar, host tree -> sandbox)  %7.0f files/s\n", rate(in))
	fmt.Printf("  cp out (tar, sandbox -> host tree)  %7.0f files/s\n", rate(out))
	return nil
}

// agentRSS reads the resident memory of the sandbox's PID 1 (the agent) from the host.
func agentRSS(ctx context.Context, id string) (int64, error) {
	c, err := client.NewClientWithOpts(client.FromEnv, client.WithAPIVersionNegotiation())
	if err != nil {
		return 0, err
	}
	defer c.Close()
	ins, err := c.ContainerInspect(ctx, id)
	if err != nil {
		return 0, err
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", ins.State.Pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("no VmRSS for pid %d", ins.State.Pid)
}

func timed(fn func() error) (time.Duration, error) {
	start := time.Now()
	err := fn()
	return time.Since(start), err
}

// measure times n runs of fn after one to warm up; it stops at ctx's end (Ctrl-C), as
// not every fn watches ctx.
func measure(ctx context.Context, n int, fn func() error) ([]time.Duration, error) {
	if n < 3 {
		n = 3
	}
	if err := fn(); err != nil { // warm-up
		return nil, err
	}
	out := make([]time.Duration, 0, n)
	for i := 0; i < n; i++ {
		if ctx.Err() != nil {
			return nil, context.Cause(ctx)
		}
		d, err := timed(fn)
		if err != nil && ctx.Err() != nil {
			return nil, context.Cause(ctx) // the command was killed for it
		}
		if err != nil {
			return nil, err
		}
		out = append(out, d)
	}
	return out, nil
}

func report(name string, ds []time.Duration) {
	fmt.Printf("  %-42s p50 %9s  p90 %9s\n", name, samples.Ms(samples.Median(ds)), samples.Ms(samples.Percentile(ds, 90)))
}
