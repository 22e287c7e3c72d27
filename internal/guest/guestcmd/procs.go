package guestcmd

import (
	"os"
	"runtime"
	"strconv"
	"strings"
)

// fitProcs runs the agent on one P when its sandbox may use at most one CPU (the default
// sandbox). The agent shares the sandbox's CPU limit with the commands it runs, and Go
// rounds a limit under 2 up to GOMAXPROCS 2: the second P only makes idle threads wake
// to look for work, scheduler churn that the sandbox's commands pay for under the limit.
// Measured in a docker sandbox of 1 CPU, an exec of true cost the agent 740 us of CPU
// with 2 Ps and 510 us with 1, while the sandbox was being throttled for most periods.
func fitProcs() {
	if limit, ok := cpuLimit(); ok && limit <= 1 {
		runtime.GOMAXPROCS(1)
	}
}

// cpuLimit reads the CPU bandwidth limit of the agent's cgroup (cgroup v2 or v1, as a
// container sees its own), in CPUs; false when there is none or it cannot be read.
func cpuLimit() (float64, bool) {
	if b, err := os.ReadFile("/sys/fs/cgroup/cpu.max"); err == nil {
		f := strings.Fields(string(b)) // "max 100000" or "QUOTA PERIOD"
		if len(f) == 2 {
			return ratio(f[0], f[1])
		}
		return 0, false
	}
	q, err1 := os.ReadFile("/sys/fs/cgroup/cpu/cpu.cfs_quota_us") // -1 without a limit
	p, err2 := os.ReadFile("/sys/fs/cgroup/cpu/cpu.cfs_period_us")
	if err1 != nil || err2 != nil {
		return 0, false
	}
	return ratio(strings.TrimSpace(string(q)), strings.TrimSpace(string(p)))
}

func ratio(quota, period string) (float64, bool) {
	q, err1 := strconv.ParseInt(quota, 10, 64)
	p, err2 := strconv.ParseInt(period, 10, 64)
	if err1 != nil || err2 != nil || q <= 0 || p <= 0 {
		return 0, false
	}
	return float64(q) / float64(p), true
}
