// Command oneshot measures the one-shot path, `roche run` with no roched (each command a
// process of its own that makes, uses and destroys one sandbox: scripts, CI jobs, the
// SDKs' CLI transport), against the seeds' raw `docker run --rm` wrapper measured in the
// same run, interleaved (shared machines are noisy, so only same-run ratios mean
// anything). It prints medians and ratios against the targets of issue 40; it asserts
// nothing about speed. It fails (exit 1) only if a run errs, prints the wrong thing, or a
// sandbox is left behind.
//
//	make bench                  (or: go run ./bench/oneshot; root for the oci rows)
//	go run ./bench/oneshot -n 30 -compare /tmp/old   (DIR with an earlier roche, roched, roche-run and roche-agent)
//
// Rows: `roche run --provider oci -- true` and `roche run --provider wasm -- python3 -c
// "print('hello')"`, the thin roche handing each to roche-run (roched as the full CLI
// in a build without roche-run), as a user runs them; `roche --version`, the thin CLI's
// start alone; and the wrapper. No roched answers: ROCHE_SOCKET names a socket in an
// empty directory of the run's own. The providers use their default directories, as a
// user's roche run does, so what one run keeps for the next (the oci runtime's probe,
// crun's compiled seccomp filter, the unpacked image, the compiled python.wasm) is there
// after the first, untimed, run.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/roche-sandbox/roche/bench/internal/samples"
	"github.com/roche-sandbox/roche/internal/testenv"
	"github.com/roche-sandbox/roche/provider/wasm"
)

var (
	n       = flag.Int("n", 20, "samples per row")
	image   = flag.String("image", "roche/python:local", "image of the oci rows and the docker run baseline (scripts/build-test-image.sh)")
	binDir  = flag.String("bin", "", "directory with the roche, roched, roche-run and roche-agent to measure (default: built from this tree)")
	compare = flag.String("compare", "", "directory with an earlier build's roche, roched (and roche-run) and roche-agent, measured alongside (a before/after in the same run)")
	withOCI = flag.Bool("oci", true, "measure the oci rows (root, crun or runc)")
	withWM  = flag.Bool("wasm", true, "measure the wasm rows (python.wasm: roche image build python --provider wasm)")
)

const hello = "print('hello')"

func main() {
	flag.Parse()
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "bench/oneshot: %v\n", err)
		os.Exit(1)
	}
}

// build is one build of the three binaries.
type build struct{ name, dir string }

func (b build) roche() string { return filepath.Join(b.dir, "roche") }

// row is one measured command, with its wall time and the CPU time of its process tree
// (what it waited for: roche-run or roched, crun; the sandbox's own processes only where
// the runtime waits for them, as it does for a one-shot oci sandbox run in the
// foreground, and not where it leaves them to others, as a detached run does).
type row struct {
	name      string
	wall, cpu []time.Duration
	cmd       func(context.Context) (time.Duration, time.Duration, error)
}

func run() error {
	ctx, stopSignals := samples.Interruptible()
	defer stopSignals()
	if *n < 1 {
		return errors.New("-n must be at least 1")
	}
	if *withOCI && os.Geteuid() != 0 {
		return errors.New("the oci rows need root: run as root or pass -oci=false")
	}
	tmp, err := os.MkdirTemp("", "roche-bench-oneshot-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	// No roched: a socket nothing listens on, in a directory of this run's own.
	os.Setenv("ROCHE_SOCKET", filepath.Join(tmp, "no-roched", "roched.sock"))
	os.Unsetenv("ROCHE_PROVIDER")

	this := build{"this build", *binDir}
	if this.dir == "" {
		this.dir = filepath.Join(tmp, "bin")
		if _, _, err := testenv.BuildCLI(this.dir); err != nil {
			return err
		}
		if _, err := testenv.BuildAgent(this.dir); err != nil {
			return err
		}
	}
	builds := []build{this}
	if *compare != "" {
		builds = append(builds, build{"compared build", *compare})
	}
	for i := range builds {
		// Absolute: roche-agent's path goes into each sandbox's bundle as a mount source.
		if builds[i].dir, err = filepath.Abs(builds[i].dir); err != nil {
			return err
		}
	}
	if *withWM {
		w, err := wasm.New()
		if err != nil {
			return err
		}
		err = w.Available()
		w.Close()
		if err != nil {
			return fmt.Errorf("%v (or pass -wasm=false)", err)
		}
	}

	var rows []*row
	wrapper := &row{name: "raw `docker run --rm --network=none ...` wrapper, python3 -c print('hello')", cmd: func(ctx context.Context) (time.Duration, time.Duration, error) {
		d, err := samples.RawDockerRun(ctx, *image, hello, "hello\n")
		return d, 0, err
	}}
	rows = append(rows, wrapper)
	ociRows, wasmRows := map[string]*row{}, map[string]*row{}
	for _, b := range builds {
		rows = append(rows, &row{name: "roche --version (" + b.name + ")", cmd: command(b, "", "--version")})
		if *withOCI {
			r := &row{name: "roche run --provider oci -- true (" + b.name + ")", cmd: command(b, "", "run", "--provider", "oci", "--image", *image, "--", "true")}
			ociRows[b.name] = r
			rows = append(rows, r)
		}
		if *withWM {
			r := &row{name: "roche run --provider wasm -- python3 -c print('hello') (" + b.name + ")", cmd: command(b, "hello\n", "run", "--provider", "wasm", "--", "python3", "-c", hello)}
			wasmRows[b.name] = r
			rows = append(rows, r)
		}
	}

	before, err := sandboxDirs()
	if err != nil {
		return err
	}
	// One untimed run of each: the oci runtime's probe, the image's unpack, crun's
	// seccomp compilation and python.wasm's compilation into the cache are a first
	// run's, not a one-shot's.
	for _, r := range rows {
		if _, _, err := r.cmd(ctx); err != nil {
			return fmt.Errorf("%s: %w", r.name, err)
		}
	}
	for range *n {
		for _, r := range rows {
			wall, cpu, err := r.cmd(ctx)
			if err != nil {
				return fmt.Errorf("%s: %w", r.name, err)
			}
			r.wall, r.cpu = append(r.wall, wall), append(r.cpu, cpu)
		}
	}
	after, err := sandboxDirs()
	if err != nil {
		return err
	}
	var left []string
	for d := range after {
		if !before[d] {
			left = append(left, d)
		}
	}

	fmt.Printf("roche one-shot bench: %d CPUs, n=%d per row, interleaved, no roched; load average %s\n", runtime.NumCPU(), *n, loadAverage())
	fmt.Printf("  %-78s %10s %10s %10s\n", "", "p50", "p90", "CPU p50")
	for _, r := range rows {
		cpu := "-"
		if r.cpu[0] > 0 {
			cpu = samples.Ms(samples.Median(r.cpu))
		}
		fmt.Printf("  %-78s %10s %10s %10s\n", r.name, samples.Ms(samples.Median(r.wall)), samples.Ms(samples.Percentile(r.wall, 90)), cpu)
	}
	fmt.Println("  (CPU: user and system time of roche and what it waited for: roche-run or roched as the full CLI, the OCI runtime, and the")
	fmt.Println("   sandbox's agent and command where the runtime waits for them: a one-shot oci sandbox's, run in the foreground, not a detached one's)")
	for _, b := range builds {
		if r := ociRows[b.name]; r != nil {
			fmt.Printf("  oci one-shot / wrapper (%s): %.2f, p50 %s  [target: <= 0.2, <= 35 ms]\n", b.name,
				1/samples.Ratio(wrapper.wall, r.wall), samples.Ms(samples.Median(r.wall)))
		}
		if r := wasmRows[b.name]; r != nil {
			fmt.Printf("  wasm one-shot / wrapper (%s): %.2f, p50 %s  [target: <= 0.6, <= 150 ms]\n", b.name,
				1/samples.Ratio(wrapper.wall, r.wall), samples.Ms(samples.Median(r.wall)))
		}
	}
	if len(left) > 0 {
		return fmt.Errorf("sandboxes left behind: %s", strings.Join(left, " "))
	}
	return nil
}

// command runs b's roche with args, checking that it exits 0 and prints want (when
// given), and returns its wall time and the CPU time of it and its waited-for children.
func command(b build, want string, args ...string) func(context.Context) (time.Duration, time.Duration, error) {
	return func(ctx context.Context) (time.Duration, time.Duration, error) {
		cmd := exec.CommandContext(ctx, b.roche(), args...)
		if agent := filepath.Join(b.dir, "roche-agent"); fileExists(agent) {
			cmd.Env = append(os.Environ(), "ROCHE_AGENT="+agent)
		}
		var out, stderr strings.Builder
		cmd.Stdout, cmd.Stderr = &out, &stderr
		start := time.Now()
		err := cmd.Run()
		wall := time.Since(start)
		if err != nil {
			return 0, 0, fmt.Errorf("%v: %s", err, strings.TrimSpace(stderr.String()))
		}
		if want != "" && out.String() != want {
			return 0, 0, fmt.Errorf("printed %q, want %q (stderr %q)", out.String(), want, stderr.String())
		}
		var cpu time.Duration
		if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
			cpu = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
		}
		return wall, cpu, nil
	}
}

// sandboxDirs lists the sandboxes the one-shot runs' providers keep on disk in their
// default directories: a one-shot run that leaves one behind shows as one more.
func sandboxDirs() (map[string]bool, error) {
	out := map[string]bool{}
	wasmState := filepath.Join(os.TempDir(), fmt.Sprintf("roche-wasm-%d", os.Getuid()))
	if d := os.Getenv("XDG_RUNTIME_DIR"); d != "" && filepath.IsAbs(d) {
		wasmState = filepath.Join(d, "roche", "wasm")
	}
	for _, pattern := range []string{"/run/roche/oci/oci-*", filepath.Join(wasmState, "wasm-*")} {
		m, err := filepath.Glob(pattern)
		if err != nil {
			return nil, err
		}
		for _, d := range m {
			out[d] = true
		}
	}
	return out, nil
}

func fileExists(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode().IsRegular()
}

func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}
