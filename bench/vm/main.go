// Command vm benchmarks the qemu microVM provider on this machine: how long a VM takes
// from Create to an agent that answers (boot-to-agent-ready), a full create+exec+destroy
// cycle, the same cycle when the VM was booted ahead (as a warm pool in roched does),
// and exec latency inside a running VM. It reports which accelerator the VMs used and,
// if it is emulation (TCG), why KVM was not used.
//
// Run it with `make bench` (or go run ./bench/vm); it needs QEMU, a Debian kernel and
// the image roche/python:local (make test installs and builds them), and builds
// roche-agent itself.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/bench/internal/samples"
	"github.com/roche-sandbox/roche/internal/testenv"
	"github.com/roche-sandbox/roche/provider/vm"
	"github.com/roche-sandbox/roche/provider/vm/supervisor"
)

func main() {
	// The providers run each VM's supervisor as this program.
	supervisor.RunIfAsked()
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "bench/vm: %v\n", err)
		os.Exit(1)
	}
}

func run() error {
	n := flag.Int("n", 5, "VMs booted for each boot measurement")
	execs := flag.Int("execs", 50, "execs for the latency measurement")
	accel := flag.String("accel", vm.AccelAuto, "QEMU acceleration: auto, kvm or tcg")
	flag.Parse()
	ctx, stopSignals := samples.Interruptible()
	defer stopSignals()

	dir, err := os.MkdirTemp("", "roche-bench-vm-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	agentPath, err := testenv.BuildAgent(dir)
	if err != nil {
		return err
	}
	p, err := vm.NewQEMU(vm.WithAgentPath(agentPath), vm.WithAccel(*accel))
	if err != nil {
		return err
	}
	defer p.Close()
	cfg := roche.DefaultConfig()
	cfg.Image = testenv.Image()

	mode, why, err := p.Acceleration(ctx)
	if err != nil {
		return err
	}
	fmt.Printf("qemu microVMs (image %s, %s, 1 vCPU, %s)\n", cfg.Image, mode, cfg.Memory)
	if why != "" {
		fmt.Printf("KVM not used: %s\n", why)
	}
	fmt.Println()

	// First VM: may build the root filesystem from the image and the initramfs (cached
	// afterwards); reported apart, since only the first VM of an image pays for it.
	start := time.Now()
	first, err := p.Create(ctx, cfg)
	if err != nil {
		return err
	}
	cold := time.Since(start)
	if err := p.Destroy(context.WithoutCancel(ctx), first.ID); err != nil {
		return err
	}

	// destroyAfter destroys the VMs ids after err, a failure between their creates and
	// their destroys, and returns every error. The destroys' context is not ctx's
	// cancellation: Ctrl-C cancels ctx (and so the step that failed), and the VMs must go.
	destroyAfter := func(err error, ids ...string) error {
		for _, id := range ids {
			err = errors.Join(err, p.Destroy(context.WithoutCancel(ctx), id))
		}
		return err
	}

	var boot, guestUp, firstExec, destroy, cycle []time.Duration
	for i := 0; i < *n; i++ {
		t0 := time.Now()
		sb, err := p.Create(ctx, cfg)
		if err != nil {
			return err
		}
		t1 := time.Now()
		res, err := p.Exec(ctx, sb.ID, roche.ExecRequest{Cmd: []string{"cat", "/proc/uptime"}})
		if err != nil || res.ExitCode != 0 {
			return destroyAfter(fmt.Errorf("exec in %s: %+v %v", sb.ID, res, err), sb.ID)
		}
		t2 := time.Now()
		if err := p.Destroy(context.WithoutCancel(ctx), sb.ID); err != nil {
			return err
		}
		t3 := time.Now()
		boot, firstExec, destroy, cycle = append(boot, t1.Sub(t0)), append(firstExec, t2.Sub(t1)), append(destroy, t3.Sub(t2)), append(cycle, t3.Sub(t0))
		if f := strings.Fields(res.Stdout); len(f) > 0 {
			if s, err := strconv.ParseFloat(f[0], 64); err == nil {
				guestUp = append(guestUp, time.Duration(s*float64(time.Second)))
			}
		}
	}

	// Pooled: the VMs are booted ahead; the cycle a caller sees is then exec + destroy
	// (handing out an idle VM is a map lookup).
	ahead := make([]string, 0, *n)
	for i := 0; i < *n; i++ {
		sb, err := p.Create(ctx, cfg)
		if err != nil {
			return destroyAfter(err, ahead...)
		}
		ahead = append(ahead, sb.ID)
	}
	var pooled []time.Duration
	for i, id := range ahead {
		t0 := time.Now()
		res, err := p.Exec(ctx, id, roche.ExecRequest{Cmd: []string{"python3", "-c", "print('hello')"}})
		if err != nil || res.ExitCode != 0 {
			return destroyAfter(fmt.Errorf("exec in %s: %+v %v", id, res, err), ahead[i:]...)
		}
		if err := p.Destroy(context.WithoutCancel(ctx), id); err != nil {
			return destroyAfter(err, ahead[i+1:]...)
		}
		pooled = append(pooled, time.Since(t0))
	}

	// Exec latency in one running VM.
	sb, err := p.Create(ctx, cfg)
	if err != nil {
		return err
	}
	defer p.Destroy(context.WithoutCancel(ctx), sb.ID)
	var trueLat, pyLat []time.Duration
	for i := 0; i < *execs; i++ {
		t0 := time.Now()
		if _, err := p.Exec(ctx, sb.ID, roche.ExecRequest{Cmd: []string{"true"}}); err != nil {
			return err
		}
		trueLat = append(trueLat, time.Since(t0))
	}
	for i := 0; i < max(*execs/5, 3); i++ {
		t0 := time.Now()
		if _, err := p.Exec(ctx, sb.ID, roche.ExecRequest{Cmd: []string{"python3", "-c", "print(1)"}}); err != nil {
			return err
		}
		pyLat = append(pyLat, time.Since(t0))
	}

	row := func(what string, d []time.Duration, note string) {
		fmt.Printf("%-46s p50 %9s  max %9s  %s\n", what, round(samples.Percentile(d, 50)), round(samples.Percentile(d, 100)), note)
	}
	fmt.Printf("%-46s %s\n", "first create (caches cold or warm)", round(cold))
	row("boot-to-agent-ready (Create)", boot, fmt.Sprintf("n=%d", len(boot)))
	row("  of which guest kernel+init (guest uptime)", guestUp, "")
	row("first exec after boot", firstExec, "")
	row("Destroy", destroy, "")
	row("create+exec+destroy", cycle, "")
	row("pooled create+exec+destroy (booted ahead)", pooled, "python3 print; the exec is most of it")
	row("exec `true` in a running VM", trueLat, fmt.Sprintf("n=%d", len(trueLat)))
	row("exec python3 -c 'print(1)' in a running VM", pyLat, fmt.Sprintf("n=%d", len(pyLat)))
	return nil
}

func round(d time.Duration) string {
	switch {
	case d >= time.Second:
		return d.Round(10 * time.Millisecond).String()
	case d >= time.Millisecond:
		return d.Round(10 * time.Microsecond).String()
	}
	return d.String()
}
