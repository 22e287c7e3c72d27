package vm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/internal/guest/guestbin"
	"github.com/roche-sandbox/roche/provider/internal/imagefs"
	"github.com/roche-sandbox/roche/provider/kit"
)

var _ kit.Diagnoser = (*Provider)(nil)

// Diagnose implements kit.Diagnoser: the hypervisor's binary, KVM (or, for QEMU, TCG
// only, which works, slower), the agent binary (every VM's init), a guest kernel, and
// the image in the Docker engine that each VM's root filesystem is built from. It boots
// nothing: for QEMU, whether a guest boots under KVM is the verdict of the last probe
// this boot, when there is one.
func (p *Provider) Diagnose(ctx context.Context, image string) []kit.Finding {
	if image == "" {
		image = kit.DiagnoseImage
	}
	var out []kit.Finding
	q, isQEMU := p.hv.(*qemu)
	if isQEMU {
		bin, err := q.binary(p)
		if err != nil {
			return append(out, kit.Lacks("hypervisor", err, "apt-get install qemu-system-x86", true))
		}
		out = append(out, kit.Found("hypervisor", nil, bin))
	} else {
		bin, err := p.hv.(*firecrackerVMM).binary(p)
		if err != nil {
			return append(out, kit.Found("hypervisor", err, "")) // no package: the error says where to get it
		}
		out = append(out, kit.Found("hypervisor", nil, bin))
	}
	kvm := p.diagnoseKVM(isQEMU)
	out = append(out, kvm)
	if !kvm.OK {
		return out
	}
	if p.agentPath == "" {
		return append(out, kit.Lacks("agent", fmt.Errorf("%w: roche-agent was not found: it is every VM's init", roche.ErrUnavailable),
			guestbin.InstallCommand, false))
	}
	if err := checkStatic(p.agentPath); err != nil {
		return append(out, kit.Lacks("agent", err, "make build", false))
	}
	out = append(out, kit.Found("agent", nil, p.agentPath))
	kernel, err := findKernel(p.kernel)
	if err != nil {
		return append(out, kit.Lacks("kernel", err, "apt-get install linux-image-amd64", true))
	}
	out = append(out, kit.Found("kernel", nil, kernel))
	cli, err := p.dockerClient()
	if err != nil {
		return append(out, kit.Found("image", err, ""))
	}
	return append(out, imagefs.Diagnose(ctx, cli, p.dockerEngine(cli), image,
		"the "+p.Name()+" provider builds each VM's root filesystem from a Docker image", "start it (sudo dockerd &)"))
}

// diagnoseKVM is the "kvm" finding: /dev/kvm opening, and for QEMU the last probe's
// verdict this boot. QEMU without KVM runs under TCG (emulation), which is a finding
// that holds, unless KVM was asked for (ROCHE_VM_ACCEL=kvm).
func (p *Provider) diagnoseKVM(isQEMU bool) kit.Finding {
	opens := kvmOpens()
	if isQEMU && p.accel == AccelTCG {
		return kit.Found("kvm", nil, "TCG only (emulation, slower): acceleration tcg was asked for")
	}
	if opens != nil {
		err := fmt.Errorf("%w: KVM is not usable here: %v", roche.ErrUnavailable, opens)
		if isQEMU && p.accel != AccelKVM {
			return kit.Found("kvm", nil, "TCG only (emulation: VMs boot in seconds, not milliseconds): "+opens.Error())
		}
		return kit.Lacks("kvm", err, kvmFix(opens), true)
	}
	if !isQEMU {
		return kit.Found("kvm", nil, "/dev/kvm opens and speaks KVM API 12")
	}
	var r kvmProbe
	bootID, _ := os.ReadFile("/proc/sys/kernel/random/boot_id")
	b, err := os.ReadFile(filepath.Join(p.cacheDir, "kvm-probe.json"))
	if err != nil || json.Unmarshal(b, &r) != nil || r.BootID != strings.TrimSpace(string(bootID)) {
		return kit.Found("kvm", nil, "/dev/kvm opens; whether a guest boots under it is probed at the first create (else TCG)")
	}
	if r.Usable {
		return kit.Found("kvm", nil, "KVM: the probe booted a guest under it this boot")
	}
	if p.accel == AccelKVM {
		return kit.Found("kvm", fmt.Errorf("%w: KVM is not usable here: %s; use acceleration auto or tcg (ROCHE_VM_ACCEL)", roche.ErrUnavailable, r.Reason), "")
	}
	return kit.Found("kvm", nil, "TCG only (emulation, slower): the KVM probe failed this boot: "+r.Reason)
}

// kvmFix is the command that makes /dev/kvm usable, from why it is not: the user added
// to the kvm group, or the module for this CPU loaded; none where the CPU offers no
// virtualisation (a VM without nested virtualisation).
func kvmFix(why error) string {
	if errors.Is(why, os.ErrPermission) {
		return "usermod -aG kvm $USER"
	}
	cpu, _ := os.ReadFile("/proc/cpuinfo")
	switch {
	case strings.Contains(string(cpu), " vmx"):
		return "modprobe kvm_intel"
	case strings.Contains(string(cpu), " svm"):
		return "modprobe kvm_amd"
	}
	return ""
}
