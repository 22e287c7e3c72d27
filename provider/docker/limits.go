package docker

import (
	"path/filepath"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/mount"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/internal/guest"
	"github.com/roche-sandbox/roche/provider/internal/agentspec"
)

// A sandbox's process limit is the one number a program in it reads and meets:
// roche-agent holds the sandbox user to exactly Config.PidsLimit processes and threads
// (RLIMIT_NPROC, which /proc/self/limits and ulimit -u show; agent --nproc), and the
// container's pids cgroup is only the host's ceiling on the whole sandbox, the agent's
// threads included (runc: the limit plus agent.ThreadCeiling; gVisor: what its kernel's
// host threads need, gvisorHostPids). That ceiling is hidden inside, where it would read
// as a larger limit than the one that holds.
//
// limitProcesses sets both on a container that runs roche-agent, and the open-file
// limit on every container (limitOpenFiles).
func (p *Provider) limitProcesses(cfg roche.Config, agent *agentspec.Spec, hcfg *container.HostConfig) {
	agent.NProc = cfg.PidsLimit
	pids := int64(cfg.PidsLimit + guest.ThreadCeiling)
	if p.gvisor() {
		// gVisor charges a task to the user that creates it: the agent forks commands
		// as the sandbox user, or their first process would not count. Unlike Linux,
		// gVisor holds root to RLIMIT_NPROC too, unless it has CAP_SYS_RESOURCE: the
		// agent keeps it (commands get no capability at all). gVisor's tasks are not host
		// processes: the host's cgroup counts its kernel's threads (gvisorHostPids).
		agent.ForkAsUser = true
		hcfg.CapAdd = append(hcfg.CapAdd, "SYS_RESOURCE")
		pids = int64(gvisorHostPids(cfg.PidsLimit))
		// gVisor ignores masked paths; its own cgroupfs (unlimited inside) goes under an
		// empty read-only tmpfs.
		hcfg.Mounts = append(hcfg.Mounts, mount.Mount{Type: mount.TypeTmpfs, Target: "/sys/fs/cgroup/pids", ReadOnly: true,
			TmpfsOptions: &mount.TmpfsOptions{SizeBytes: 4096, Mode: 0o555}})
	} else {
		hcfg.MaskedPaths = maskedPaths()
	}
	hcfg.Resources.PidsLimit = &pids
}

// limitOpenFiles gives the container's own processes (roche-agent, or the init and the
// commands of Docker's exec API) the open-file limit, soft and hard; the agent sets the
// same for every command it starts.
func limitOpenFiles(hcfg *container.HostConfig) {
	hcfg.Resources.Ulimits = append(hcfg.Resources.Ulimits,
		&container.Ulimit{Name: "nofile", Soft: roche.DefaultOpenFiles, Hard: roche.DefaultOpenFiles})
}

// pidsCgroupPaths are where a container sees its pids cgroup: the controller's directory
// (cgroup v1) or its files (v2). Masking a path that does not exist is a no-op.
var pidsCgroupPaths = []string{
	"/sys/fs/cgroup/pids",
	"/sys/fs/cgroup/pids.max", "/sys/fs/cgroup/pids.current", "/sys/fs/cgroup/pids.events", "/sys/fs/cgroup/pids.peak",
}

// maskedPaths is the engine's default list of masked paths and the pids cgroup's. A
// container that names its masked paths replaces the engine's list, so it is given in
// full: today's Docker default (oci.DefaultSpec, a superset of older engines'), with the
// thermal-throttle counters of this host's CPUs, which the engine adds for its own host
// (the provider's engine is on this host: it bind-mounts the agent from here).
func maskedPaths() []string {
	paths := []string{
		"/proc/asound", "/proc/acpi", "/proc/interrupts", "/proc/kcore", "/proc/keys",
		"/proc/latency_stats", "/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug",
		"/proc/scsi", "/sys/firmware", "/sys/devices/virtual/powercap",
	}
	cpus, _ := filepath.Glob("/sys/devices/system/cpu/cpu[0-9]*/thermal_throttle")
	paths = append(paths, cpus...)
	return append(paths, pidsCgroupPaths...)
}
