package kit

import (
	"context"
	"time"
)

// Usage is what a running sandbox uses now, as its engine measures its cgroup: the
// console's live figures.
type Usage struct {
	// CPUTime is the CPU time its processes have used since it started; two readings
	// apart make a rate.
	CPUTime time.Duration `json:"cpu_time_ns"`
	// MemoryBytes is its memory in use now, MemoryLimitBytes its limit (0: none known).
	MemoryBytes      int64 `json:"memory_bytes"`
	MemoryLimitBytes int64 `json:"memory_limit_bytes"`
	// Processes is how many processes (tasks) it runs now.
	Processes int `json:"processes"`
	// At is when it was read.
	At time.Time `json:"at"`
}

// UsageReader is implemented by providers that can read a sandbox's usage without
// running anything in it.
type UsageReader interface {
	Usage(ctx context.Context, id string) (Usage, error)
}
