package guestfwd

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/roche-sandbox/roche/internal/guest"
	"github.com/roche-sandbox/roche/provider/kit"
)

// Usage implements kit.UsageReader through the sandbox's agent (guest.OpUsage), for the
// providers whose host cannot read the sandbox's cgroup itself: kubernetes (the
// kubelet's figures need a right roched's Role does not have) and the microVMs (whose
// processes the host does not see). The agent reads its own cgroup, or the VM's
// kernel's figures, and runs nothing.
func (f Forwarder) Usage(ctx context.Context, id string) (kit.Usage, error) {
	t, err := f.Reach(ctx, id)
	if err != nil {
		return kit.Usage{}, err
	}
	u, err := t.Agent.Usage(ctx)
	if errors.Is(err, guest.ErrUsageUnsupported) {
		// Said, not hidden: the console shows it in place of the figures.
		return kit.Usage{}, fmt.Errorf("sandbox %s: %w", id, err)
	}
	if err != nil {
		return kit.Usage{}, t.fail(err)
	}
	return kit.Usage{
		CPUTime:     time.Duration(u.CPUTimeNS),
		MemoryBytes: u.MemoryBytes, MemoryLimitBytes: u.MemoryLimitBytes,
		Processes: u.Tasks, At: time.Now(),
	}, nil
}
