// Command files benchmarks the files API through roched against the same calls made to the
// sandbox's agent directly (the Docker provider in this process), in one run on one
// sandbox, taken in turns so that the machine's drift hits both alike:
//
//   - files.write and files.read of 100 MiB: the Go client through a real roched process
//     (docker only, started from this checkout's build), the Python SDK through the same
//     roched, and the provider in-process as the baseline; MiB/s medians, their ratio to
//     the baseline, and the peak resident memory of roched and of the Python process
//     over what it was before (a file's size must not decide either);
//   - watch event latency: from the start of a small file's write through the API to its
//     create event arriving, through roched and from the provider in-process.
//
// It asserts nothing about speed (the target, >= 500 MiB/s, is printed beside
// the figures) and fails only if a call errs, a figure is wrong, or a container is left.
//
//	make bench                 (or: go run ./bench/files)
//	go run ./bench/files -n 5 -size 100m -python python3
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/bench/internal/samples"
	"github.com/roche-sandbox/roche/client"
	sizes "github.com/roche-sandbox/roche/internal/size"
	"github.com/roche-sandbox/roche/internal/testenv"
	"github.com/roche-sandbox/roche/provider/docker"
)

var (
	image   = flag.String("image", "roche/python:local", "image to run (built by scripts/build-test-image.sh)")
	n       = flag.Int("n", 5, "transfers per side and direction")
	sizeArg = flag.String("size", "100m", "size of each transfer")
	watchN  = flag.Int("watch-n", 50, "watch events timed per side")
	python  = flag.String("python", "python3", "the Python to run the SDK with (3.10+); empty skips it")
)

func main() {
	flag.Parse()
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "bench/files: %v\n", err)
		os.Exit(1)
	}
}

// pattern is an endless reader of bytes that are not zeros (zeros could become holes).
type pattern struct{}

func (pattern) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = byte(i*7 + i>>11)
	}
	return len(p), nil
}

func run() error {
	size, err := sizes.Parse(*sizeArg)
	if err != nil {
		return fmt.Errorf("-size: %w", err)
	}
	ctx, stop := samples.Interruptible()
	defer stop()
	dir, err := os.MkdirTemp("", "roche-bench-files-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	_, rochedPath, err := testenv.BuildCLI(dir)
	if err != nil {
		return err
	}
	agent, err := testenv.BuildAgent(filepath.Dir(rochedPath))
	if err != nil {
		return err
	}
	p, err := docker.New(docker.WithAgentPath(agent))
	if err != nil {
		return err
	}
	defer p.Close()

	// roched as users run it, a process of its own, serving the provider this one reaches.
	sock := filepath.Join(dir, "roched.sock")
	d := exec.Command(rochedPath, "--socket", sock, "--state", filepath.Join(dir, "state.json"), "--providers", "docker",
		"--copy-max-bytes", strconv.FormatInt(2*size, 10), "--log-level", "warn")
	d.Env = append(os.Environ(), "ROCHE_AGENT="+agent)
	d.Stderr = os.Stderr
	if err := d.Start(); err != nil {
		return err
	}
	defer func() {
		d.Process.Signal(os.Interrupt)
		d.Wait()
	}()
	c, err := client.New(client.WithSocket(sock))
	if err != nil {
		return err
	}
	defer c.Close()
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(50 * time.Millisecond) {
		if _, err := c.Health(ctx); err == nil {
			break
		} else if time.Now().After(deadline) {
			return fmt.Errorf("roched did not start: %w", err)
		}
	}
	dc, err := samples.Engine(ctx)
	if err != nil {
		return err
	}
	defer dc.Close()
	img, untag, err := samples.PrivateTag(ctx, dc, *image, "bench-files")
	if err != nil {
		return err
	}
	defer untag()
	cp := c.Provider("docker")
	cfg := roche.DefaultConfig()
	cfg.Image, cfg.Writable, cfg.Disk = img, true, fmt.Sprintf("%dm", 4*size>>20+64)
	sb, err := cp.Create(ctx, cfg)
	if err != nil {
		return err
	}
	err = measure(ctx, p, cp, sb.ID, size, d.Process.Pid, sock)
	if derr := cp.Destroy(context.WithoutCancel(ctx), sb.ID); err == nil {
		err = derr
	}
	// roched removes a destroyed sandbox's container in the background: a moment's grace.
	for deadline := time.Now().Add(30 * time.Second); err == nil; time.Sleep(200 * time.Millisecond) {
		left, lerr := samples.ContainersOf(context.WithoutCancel(ctx), dc, img)
		if lerr == nil && len(left) == 0 {
			break
		}
		if time.Now().After(deadline) {
			err = fmt.Errorf("containers left behind: %v %v", left, lerr)
		}
	}
	return err
}

func measure(ctx context.Context, p *docker.Provider, cp *client.Provider, id string, size int64, pid int, sock string) error {
	sb := roche.SandboxInfo{ID: id}
	fmt.Printf("files API, %s per transfer, median of %d; the baseline is the provider in this process (the agent, directly)\n",
		sizes.String(size), *n)

	var direct, daemonW, daemonR, directR []time.Duration
	var peak int64
	for i := 0; i < *n; i++ {
		t, err := timed(func() error {
			return p.WriteFile(ctx, sb.ID, "/var/tmp/direct.bin", io.LimitReader(pattern{}, size), 0o644)
		})
		if err != nil {
			return fmt.Errorf("baseline write: %w", err)
		}
		direct = append(direct, t)
		t, err = timed(func() error { return p.ReadFile(ctx, sb.ID, "/var/tmp/direct.bin", io.Discard) })
		if err != nil {
			return fmt.Errorf("baseline read: %w", err)
		}
		directR = append(directR, t)
		before := resetPeak(pid)
		t, err = timed(func() error {
			fi, err := cp.WriteFileLimit(ctx, sb.ID, "/var/tmp/daemon.bin", io.LimitReader(pattern{}, size), 0o644, 0)
			if err == nil && fi.Size != size {
				err = fmt.Errorf("wrote %d bytes, want %d", fi.Size, size)
			}
			return err
		})
		if err != nil {
			return fmt.Errorf("write through roched: %w", err)
		}
		daemonW = append(daemonW, t)
		var got countingWriter
		t, err = timed(func() error { return cp.ReadFile(ctx, sb.ID, "/var/tmp/daemon.bin", &got) })
		if err == nil && int64(got) != size {
			err = fmt.Errorf("read %d bytes, want %d", got, size)
		}
		if err != nil {
			return fmt.Errorf("read through roched: %w", err)
		}
		daemonR = append(daemonR, t)
		peak = max(peak, procKiB(pid, "VmHWM")-before)
	}
	rate := func(ds []time.Duration) float64 { return float64(size) / (1 << 20) / samples.Median(ds).Seconds() }
	fmt.Printf("  %-40s %8s %8s   (target >= 500 MiB/s each way)\n", "", "write", "read")
	fmt.Printf("  %-40s %8.0f %8.0f MiB/s\n", "provider in-process (baseline)", rate(direct), rate(directR))
	fmt.Printf("  %-40s %8.0f %8.0f MiB/s   %.2fx / %.2fx the baseline's time\n", "Go client through roched",
		rate(daemonW), rate(daemonR), samples.Median(daemonW).Seconds()/samples.Median(direct).Seconds(),
		samples.Median(daemonR).Seconds()/samples.Median(directR).Seconds())
	if *python != "" {
		if err := pythonBench(ctx, sock, sb.ID, size, pid); err != nil {
			return err
		}
	}
	fmt.Printf("  roched's resident memory rose at most %d MiB over a transfer (peak over what it held before)\n", peak>>10)

	return watchBench(ctx, p, cp, sb.ID)
}

// pythonBench runs the SDK's side in a python3 process, which reports its own times and
// memory; roched's peak is read here.
func pythonBench(ctx context.Context, sock, id string, size int64, pid int) error {
	src := filepath.Join(repoRoot(), "sdk", "python", "src")
	script := filepath.Join(repoRoot(), "bench", "files", "python_files.py")
	cmd := exec.CommandContext(ctx, *python, script, sock, id, strconv.FormatInt(size, 10), strconv.Itoa(*n))
	cmd.Env = append(os.Environ(), "PYTHONPATH="+src)
	cmd.Stderr = os.Stderr
	before := resetPeak(pid)
	out, err := cmd.Output()
	if err != nil {
		return fmt.Errorf("the Python side: %w", err)
	}
	var r struct {
		Write, Read []float64
		RSSGrew     int64 `json:"rss_grew"`
	}
	if err := json.Unmarshal(bytes.TrimSpace(out), &r); err != nil {
		return fmt.Errorf("the Python side printed %q: %w", out, err)
	}
	med := func(xs []float64) float64 {
		ds := make([]time.Duration, len(xs))
		for i, x := range xs {
			ds[i] = time.Duration(x * float64(time.Second))
		}
		return samples.Median(ds).Seconds()
	}
	mib := float64(size) / (1 << 20)
	fmt.Printf("  %-40s %8.0f %8.0f MiB/s   the SDK process's memory rose at most %d MiB; roched's %d MiB\n",
		"Python SDK (sync) through roched", mib/med(r.Write), mib/med(r.Read), r.RSSGrew>>20, (procKiB(pid, "VmHWM")-before)>>10)
	return nil
}

func repoRoot() string {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "."
	}
	return filepath.Dir(strings.TrimSpace(string(out)))
}

// watchBench times a small write's create event, through roched and in-process.
func watchBench(ctx context.Context, direct roche.DirWatcher, viaDaemon *client.Provider, id string) error {
	lat := func(dw roche.DirWatcher, fsys roche.FileSystem, dir string) ([]time.Duration, error) {
		if err := fsys.Mkdir(ctx, id, dir); err != nil {
			return nil, err
		}
		wctx, cancel := context.WithCancel(ctx)
		defer cancel()
		events := make(chan roche.FileEvent, 1024)
		started := make(chan struct{})
		done := make(chan error, 1)
		go func() {
			done <- dw.WatchDir(wctx, id, dir, roche.WatchOptions{Started: func() { close(started) }}, func(ev roche.FileEvent) error {
				events <- ev
				return nil
			})
		}()
		select {
		case <-started:
		case err := <-done:
			return nil, err
		}
		var out []time.Duration
		for i := 0; i < *watchN; i++ {
			name := fmt.Sprintf("f%d", i)
			// The clock starts with the write: its event can arrive before the call returns.
			start := time.Now()
			if err := fsys.WriteFile(ctx, id, dir+"/"+name, strings.NewReader("x"), 0o644); err != nil {
				return nil, err
			}
			for {
				select {
				case ev := <-events:
					if ev.Name == name && ev.Op == roche.FileCreate {
						out = append(out, time.Since(start))
						goto next
					}
				case err := <-done:
					return nil, fmt.Errorf("the watch ended: %v", err)
				case <-time.After(30 * time.Second):
					return nil, fmt.Errorf("no event for %s within 30 s", name)
				}
			}
		next:
		}
		return out, nil
	}
	dfs := direct.(roche.FileSystem)
	in, err := lat(direct, dfs, "/tmp/watch-direct")
	if err != nil {
		return fmt.Errorf("watch in-process: %w", err)
	}
	via, err := lat(viaDaemon, viaDaemon, "/tmp/watch-daemon")
	if err != nil {
		return fmt.Errorf("watch through roched: %w", err)
	}
	fmt.Printf("watch event latency, from a small file's write (through the same way) to its create event (n=%d)\n", *watchN)
	fmt.Printf("  %-40s p50 %v  p90 %v\n", "provider in-process (baseline)", samples.Median(in).Round(time.Microsecond), pct(in, 90))
	fmt.Printf("  %-40s p50 %v  p90 %v\n", "through roched", samples.Median(via).Round(time.Microsecond), pct(via, 90))
	return nil
}

func pct(ds []time.Duration, p int) time.Duration {
	return samples.Percentile(ds, p).Round(time.Microsecond)
}

type countingWriter int64

func (c *countingWriter) Write(p []byte) (int, error) {
	*c += countingWriter(len(p))
	return len(p), nil
}

func timed(fn func() error) (time.Duration, error) {
	start := time.Now()
	err := fn()
	return time.Since(start), err
}

// resetPeak starts pid's peak resident memory afresh (clear_refs 5) and returns what it
// holds now, in KiB.
func resetPeak(pid int) int64 {
	_ = os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", pid), []byte("5"), 0)
	return procKiB(pid, "VmRSS")
}

func procKiB(pid int, field string) int64 {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), field+":"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb
		}
	}
	return 0
}
