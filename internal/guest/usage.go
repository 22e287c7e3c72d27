package guest

import (
	"context"
	"errors"
	"strings"
)

// OpUsage asks the agent what the sandbox uses now (Usage), read inside it: in a
// container, its own cgroup (through its cgroup namespace, the files docker stats
// reads); in a microVM, the whole VM's figures from the guest kernel. It runs nothing.
// An agent from before it answers CodeInvalid "unknown operation" (Client.Usage says
// ErrUsageUnsupported).
const OpUsage = "usage"

// Usage is what the sandbox uses now.
type Usage struct {
	// CPUTimeNS is the CPU time used since it started: its cgroup's usage_usec, or, in a
	// microVM, every CPU's non-idle time (/proc/stat).
	CPUTimeNS int64 `json:"cpu_time_ns"`
	// MemoryBytes is the memory in use (page cache the kernel can drop left out),
	// MemoryLimitBytes its limit (0: none).
	MemoryBytes      int64 `json:"memory_bytes"`
	MemoryLimitBytes int64 `json:"memory_limit_bytes"`
	// Tasks is the processes and their threads, the agent's included.
	Tasks int `json:"tasks"`
	// Source names what was read: "cgroup" or "vm".
	Source string `json:"source"`
}

// ErrUsageUnsupported: the agent is older than OpUsage.
var ErrUsageUnsupported = errors.New("the sandbox's agent is too old to report its usage: recreate the sandbox")

// Usage asks the agent for the sandbox's usage.
func (c *Client) Usage(ctx context.Context) (Usage, error) {
	var u Usage
	err := c.call(ctx, Request{Op: OpUsage}, &u)
	var ae *Error
	if errors.As(err, &ae) && ae.Code == CodeInvalid && strings.HasPrefix(ae.Message, "unknown operation") {
		return Usage{}, ErrUsageUnsupported
	}
	return u, err
}
