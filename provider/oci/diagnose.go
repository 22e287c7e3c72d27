package oci

import (
	"context"
	"fmt"
	"os"

	"github.com/roche-sandbox/roche/internal/guest/guestbin"
	"github.com/roche-sandbox/roche/provider/internal/imagefs"
	"github.com/roche-sandbox/roche/provider/kit"
)

var _ kit.Diagnoser = (*Provider)(nil)

// Diagnose implements kit.Diagnoser: root, the agent binary, an OCI runtime that runs
// the probe sandbox (Available's checks, one finding each), and the image in the Docker
// engine, which the provider unpacks.
func (p *Provider) Diagnose(ctx context.Context, image string) []kit.Finding {
	if image == "" {
		image = kit.DiagnoseImage
	}
	if os.Geteuid() != 0 {
		return []kit.Finding{kit.Lacks("root", p.canRun(), "roche daemon start", true)}
	}
	out := []kit.Finding{kit.Found("root", nil, "running as root")}
	if p.agentPath == "" {
		return append(out, kit.Lacks("agent", p.canRun(), guestbin.InstallCommand, false))
	}
	out = append(out, kit.Found("agent", nil, p.agentPath))
	r, err := p.resolveRuntime(ctx)
	if err != nil {
		want := p.runtimeName
		if want == "" {
			want = RuntimeRunc
		}
		if _, ferr := findRuntime(want); ferr == nil {
			// Installed, and failing its probe on this host: no command fixes that; the
			// error says why, and another runtime may work.
			return append(out, kit.Found("runtime", err, ""))
		}
		return append(out, kit.Lacks("runtime", err, "apt-get install "+want, true))
	}
	out = append(out, kit.Found("runtime", nil, fmt.Sprintf("%s at %s ran the probe sandbox", r.name, r.path)))
	cli, err := p.dockerClient()
	if err != nil {
		return append(out, kit.Found("image", err, ""))
	}
	return append(out, imagefs.Diagnose(ctx, cli, p.dockerd, image,
		"the oci provider unpacks Docker images, or OCI layouts named "+LayoutPrefix+"/dir", "start it, or name an OCI layout"))
}
