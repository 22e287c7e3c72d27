package docker

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/internal/guest/guestbin"
	"github.com/roche-sandbox/roche/provider/internal/engine"
	"github.com/roche-sandbox/roche/provider/internal/sizedfs"
	"github.com/roche-sandbox/roche/provider/kit"
)

var _ kit.Diagnoser = (*Provider)(nil)

// Diagnose implements kit.Diagnoser: the agent binary, the engine answering, the
// runtime registered with it, the image present, and (optional) sized disks, each with
// the check its Create makes. It stops at an engine that does not answer, as what
// follows asks the engine.
func (p *Provider) Diagnose(ctx context.Context, image string) []kit.Finding {
	if image == "" {
		image = kit.DiagnoseImage
	}
	var out []kit.Finding
	if p.transport == TransportAgent {
		if p.agentPath == "" {
			out = append(out, kit.Lacks("agent", fmt.Errorf("%w: roche-agent was not found: Docker sandboxes run it as PID 1", roche.ErrUnavailable),
				guestbin.InstallCommand, false))
		} else {
			out = append(out, kit.Found("agent", nil, p.agentPath))
		}
	}
	version, err := p.diagnosePing(ctx)
	if err != nil {
		fix := "systemctl start docker"
		if errors.Is(err, roche.ErrTimeout) {
			fix = "systemctl restart docker" // it is there, and hangs
		}
		return append(out, kit.Lacks("engine", err, fix, true))
	}
	out = append(out, kit.Found("engine", nil, fmt.Sprintf("Docker %s at %s", version, p.cli.DaemonHost())))
	out = append(out, p.diagnoseRuntime(ctx))
	present, err := p.imagePresent(ctx, image)
	switch {
	case err != nil:
		out = append(out, kit.Found("image", err, ""))
	case !present:
		out = append(out, kit.Found("image", NoImage(fmt.Errorf("%w: image %s is not in the Docker engine at %s", roche.ErrImageNotFound, image, p.cli.DaemonHost())), ""))
	default:
		out = append(out, kit.Found("image", nil, image))
	}
	disks := kit.Found("sized disks", errors.Join(p.canSizeDisks(), sizedfs.Available()), "loop devices, mkfs.ext4 and mount: --writable roots and workspaces are bounded")
	disks.Optional = true
	return append(out, disks)
}

// diagnosePing asks the engine its version within what is left of ctx, naming the engine
// in the error when it does not answer.
func (p *Provider) diagnosePing(ctx context.Context) (version string, err error) {
	d := engine.ControlTimeout
	if dl, ok := ctx.Deadline(); ok {
		d = min(d, time.Until(dl))
	}
	ctx, done := p.engine.Bound(ctx, "a version request", d)
	defer done(&err)
	v, err := p.cli.ServerVersion(ctx)
	if err != nil {
		return "", p.engineErr("reaching the Docker engine", err)
	}
	return v.Version, nil
}

// diagnoseRuntime checks that the engine has the runtime sandboxes run on registered.
func (p *Provider) diagnoseRuntime(ctx context.Context) kit.Finding {
	info, err := p.cli.Info(ctx)
	if err != nil {
		return kit.Found("runtime", p.engineErr("asking the Docker engine its runtimes", err), "")
	}
	if _, ok := info.Runtimes[p.runtime]; ok {
		detail := fmt.Sprintf("%s registered (cgroup v%s, %s)", p.runtime, info.CgroupVersion, info.CgroupDriver)
		return kit.Found("runtime", nil, detail)
	}
	err = fmt.Errorf("%w: the Docker engine at %s has no runtime %q registered", roche.ErrUnavailable, p.cli.DaemonHost(), p.runtime)
	if p.gvisor() {
		return kit.Lacks("runtime", err, "bash scripts/runsc.sh", true)
	}
	return kit.Lacks("runtime", err, "register it with dockerd (/etc/docker/daemon.json \"runtimes\"), then: kill -HUP $(pidof dockerd)", true)
}
