//go:build linux

// Command snapshots benchmarks qemu memory snapshots against cold boots, in one run: a
// cold Create (boot to agent ready) and a cold Create with its first Python cell, against
// PauseToDisk, Resume and Fork of a VM whose Python context is warm, and the first cell
// in a fork. It also reports the host memory (PSS) of each fork's QEMU, which shares the
// snapshot's unchanged pages with its siblings.
//
// Run it with `go run ./bench/snapshots` as root; it needs what bench/vm needs (QEMU, a
// Debian kernel, the image roche/python:local) and builds roche-agent itself.
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/bench/internal/samples"
	"github.com/roche-sandbox/roche/internal/testenv"
	"github.com/roche-sandbox/roche/pool"
	"github.com/roche-sandbox/roche/provider/vm"
	"github.com/roche-sandbox/roche/provider/vm/supervisor"
)

func main() {
	// The provider runs each VM's supervisor as this program.
	supervisor.RunIfAsked()
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "bench/snapshots: %v\n", err)
		os.Exit(1)
	}
}

func run() error {
	n := flag.Int("n", 5, "samples of each measurement")
	forks := flag.Int("forks", 4, "forks made at once for the memory measurement")
	part := flag.String("part", "all", "what to measure, a comma-separated list: all, snapshots, pool (a pool's refill, booting and from a snapshot) or context (a code context's fork)")
	poolSize := flag.Int("pool", 4, "sandboxes a pool refills, for -part pool")
	flag.Parse()
	ctx, stopSignals := samples.Interruptible()
	defer stopSignals()

	dir, err := os.MkdirTemp("", "roche-bench-snapshots-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	agentPath, err := testenv.BuildAgent(dir)
	if err != nil {
		return err
	}
	p, err := vm.NewQEMU(vm.WithAgentPath(agentPath), vm.WithStateDir(filepath.Join(dir, "state")), vm.WithMemoryDir(filepath.Join(dir, "mem")))
	if err != nil {
		return err
	}
	defer p.Close()
	cfg := roche.DefaultConfig()
	cfg.Image = testenv.Image()
	mode, _, err := p.Acceleration(ctx)
	if err != nil {
		return err
	}
	fmt.Printf("qemu microVMs (image %s, %s, 1 vCPU, %s)\n\n", cfg.Image, mode, cfg.Memory)

	var made []string
	defer func() {
		for _, id := range made {
			_ = p.Destroy(context.WithoutCancel(ctx), id)
		}
	}()
	cellIn := func(id, code string) error {
		ex, err := p.RunCode(ctx, id, roche.CodeRequest{Code: code})
		if err == nil && ex.Error != nil {
			err = fmt.Errorf("%s: %s", ex.Error.Name, ex.Error.Value)
		}
		return err
	}

	// The first VM may build the caches; not measured.
	first, err := p.Create(ctx, cfg)
	if err != nil {
		return err
	}
	if err := p.Destroy(ctx, first.ID); err != nil {
		return err
	}
	parts := strings.Split(*part, ",")
	if slices.Contains(parts, "pool") || *part == "all" {
		if err := poolRefill(ctx, p, cfg.Image, *poolSize); err != nil {
			return err
		}
	}
	if slices.Contains(parts, "context") || *part == "all" {
		if err := contextFork(ctx, p, cfg, *n); err != nil {
			return err
		}
	}
	if !slices.Contains(parts, "snapshots") && *part != "all" {
		return nil
	}

	var cold, coldCell []time.Duration
	for range *n {
		t0 := time.Now()
		sb, err := p.Create(ctx, cfg)
		if err != nil {
			return err
		}
		t1 := time.Now()
		if err := cellIn(sb.ID, "x = 1"); err != nil {
			return errors.Join(err, p.Destroy(ctx, sb.ID))
		}
		t2 := time.Now()
		if err := p.Destroy(ctx, sb.ID); err != nil {
			return err
		}
		cold, coldCell = append(cold, t1.Sub(t0)), append(coldCell, t2.Sub(t0))
	}

	origin, err := p.Create(ctx, cfg)
	if err != nil {
		return err
	}
	made = append(made, origin.ID)
	if err := cellIn(origin.ID, "x = 1"); err != nil {
		return err
	}
	var pause, resume, fork, forkCell []time.Duration
	for range *n {
		t0 := time.Now()
		if err := p.PauseToDisk(ctx, origin.ID); err != nil {
			return err
		}
		t1 := time.Now()
		if _, err := p.Resume(ctx, origin.ID); err != nil {
			return err
		}
		pause, resume = append(pause, t1.Sub(t0)), append(resume, time.Since(t1))
	}
	for range *n {
		t0 := time.Now()
		fs, err := p.Fork(ctx, origin.ID, 1)
		if err != nil {
			return err
		}
		t1 := time.Now()
		made = append(made, fs[0].ID)
		if err := cellIn(fs[0].ID, "x + 1"); err != nil {
			return err
		}
		fork, forkCell = append(fork, t1.Sub(t0)), append(forkCell, time.Since(t0))
		if err := p.Destroy(ctx, fs[0].ID); err != nil {
			return err
		}
	}

	// Memory: forks of the VM paused to disk, made at once, each having run a cell:
	// they map its saved RAM privately and share what none of them wrote.
	if err := p.PauseToDisk(ctx, origin.ID); err != nil {
		return err
	}
	fs, err := p.Fork(ctx, origin.ID, *forks)
	if err != nil {
		return err
	}
	var pss, rss []int64
	for _, f := range fs {
		made = append(made, f.ID)
		if err := cellIn(f.ID, "x + 1"); err != nil {
			return err
		}
	}
	for _, f := range fs {
		ps, rs := qemuMemory(filepath.Join(dir, "state", f.ID))
		pss, rss = append(pss, ps), append(rss, rs)
	}

	row := func(what string, d []time.Duration, note string) {
		fmt.Printf("%-44s p50 %9s  max %9s  %s\n", what, samples.Ms(samples.Median(d)), samples.Ms(samples.Percentile(d, 100)), note)
	}
	row("cold Create (boot to agent ready)", cold, fmt.Sprintf("n=%d", len(cold)))
	row("cold Create + first cell", coldCell, "")
	row("PauseToDisk", pause, "")
	row("Resume (to agent ready)", resume, fmt.Sprintf("%.2f of a cold Create", ratio(resume, cold)))
	row("Fork of a running, resumed VM (to ready)", fork, fmt.Sprintf("%.2f of a cold Create", ratio(fork, cold)))
	row("Fork + first cell (interpreter warm)", forkCell, fmt.Sprintf("%.2f of a cold Create + first cell", ratio(forkCell, coldCell)))
	fmt.Printf("%-44s PSS %v MiB, RSS %v MiB (%d forks of one snapshot)\n", "QEMU memory per fork of a paused VM", pss, rss, len(fs))
	return nil
}

func ratio(a, b []time.Duration) float64 {
	return float64(samples.Median(a)) / float64(samples.Median(b))
}

// qemuMemory is the PSS and RSS, in MiB, of the hypervisor of the VM in dir.
func qemuMemory(dir string) (pss, rss int64) {
	pid, _ := supervisor.ReadHypervisor(dir)
	if pid <= 0 {
		return -1, -1
	}
	roll, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/smaps_rollup")
	if err != nil {
		return -1, -1
	}
	field := func(name string) int64 {
		for _, line := range bytes.Split(roll, []byte("\n")) {
			if f := strings.Fields(string(line)); len(f) >= 2 && f[0] == name+":" {
				kb, _ := strconv.ParseInt(f[1], 10, 64)
				return kb >> 10
			}
		}
		return -1
	}
	return field("Pss"), field("Rss")
}

// poolRefill measures how fast a code=python pool of the qemu provider refills size
// members, booting each (snapshot=false) and restoring its memory snapshot: the time to
// fill it from empty (the snapshot's pool making its template first), then, once its
// members were taken, to refill it.
func poolRefill(ctx context.Context, p *vm.Provider, image string, size int) error {
	for _, snap := range []bool{false, true} {
		spec, err := pool.ParseSpec(fmt.Sprintf("qemu/%s?min=0&max=%d&code=python&snapshot=%v", image, size, snap))
		if err != nil {
			return err
		}
		m, err := pool.NewManager(map[string]roche.Provider{"qemu": p}, []pool.Spec{spec}, pool.WithConcurrency(2), pool.WithOwner("bench:snapshots"))
		if err != nil {
			return err
		}
		m.Start()
		pl := m.Pools()[0]
		t0 := time.Now()
		err = pl.Warmup(ctx, size)
		fill := time.Since(t0)
		var refill time.Duration
		if err == nil {
			for range size {
				sb, ok := pl.Acquire(ctx)
				if !ok {
					err = errors.New("the pool handed out fewer members than it held")
					break
				}
				err = errors.Join(err, p.Destroy(ctx, sb.ID))
				pl.Forget(sb.ID)
			}
		}
		if err == nil {
			t1 := time.Now()
			err = pl.Warmup(ctx, size)
			refill = time.Since(t1)
		}
		_, cerr := m.Close(context.WithoutCancel(ctx))
		if err = errors.Join(err, cerr); err != nil {
			return err
		}
		how := "booting each"
		if snap {
			how = "from a memory snapshot"
		}
		fmt.Printf("%-44s fill %9s  refill %9s  %.2f sandboxes/s (%d, 2 at once)\n", "pool code=python, "+how, samples.Ms(fill), samples.Ms(refill), float64(size)/refill.Seconds(), size)
	}
	return nil
}

// contextFork measures a code context's fork (the interpreter forking itself) in a VM.
func contextFork(ctx context.Context, p *vm.Provider, cfg roche.Config, n int) error {
	sb, err := p.Create(ctx, cfg)
	if err != nil {
		return err
	}
	defer func() { _ = p.Destroy(context.WithoutCancel(ctx), sb.ID) }()
	cc, err := p.CreateContext(ctx, sb.ID, roche.ContextOptions{Language: roche.LanguagePython})
	if err != nil {
		return err
	}
	if _, err := p.RunCode(ctx, sb.ID, roche.CodeRequest{Context: cc.ID, Code: "import json, os\nx = list(range(100000))"}); err != nil {
		return err
	}
	var forks, firstCell []time.Duration
	for range n {
		t0 := time.Now()
		f, err := p.ForkContext(ctx, sb.ID, cc.ID)
		if err != nil {
			return err
		}
		t1 := time.Now()
		ex, err := p.RunCode(ctx, sb.ID, roche.CodeRequest{Context: f.ID, Code: "len(x)"})
		if err == nil && ex.Text() != "100000" {
			err = fmt.Errorf("the forked context's len(x) is %q", ex.Text())
		}
		if err != nil {
			return err
		}
		forks, firstCell = append(forks, t1.Sub(t0)), append(firstCell, time.Since(t1))
		if err := p.RemoveContext(ctx, sb.ID, f.ID); err != nil {
			return err
		}
	}
	fmt.Printf("%-44s p50 %9s  max %9s  first cell p50 %s (n=%d)\n", "code context fork (in a VM)", samples.Ms(samples.Median(forks)), samples.Ms(samples.Percentile(forks, 100)), samples.Ms(samples.Median(firstCell)), len(forks))
	return nil
}
