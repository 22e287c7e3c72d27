package docker

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/docker/docker/api/types/container"

	"github.com/roche-sandbox/roche/provider/kit"
)

var _ kit.UsageReader = (*Provider)(nil)

// Usage reads sandbox id's CPU time, memory and processes from the engine's one-shot
// stats of its container (its cgroup), running nothing inside it.
func (p *Provider) Usage(ctx context.Context, id string) (kit.Usage, error) {
	if _, _, err := p.inspect(ctx, id); err != nil {
		return kit.Usage{}, err
	}
	sctx, done := p.bound(ctx, "reading the usage of sandbox "+id)
	resp, err := p.cli.ContainerStatsOneShot(sctx, id)
	if err != nil {
		done(&err)
		return kit.Usage{}, p.engineErr("reading the usage of sandbox "+id, err)
	}
	defer resp.Body.Close()
	var st container.StatsResponse
	err = json.NewDecoder(resp.Body).Decode(&st)
	done(&err)
	if err != nil {
		return kit.Usage{}, fmt.Errorf("reading the usage of sandbox %s: %w", id, err)
	}
	u := kit.Usage{
		CPUTime:          time.Duration(st.CPUStats.CPUUsage.TotalUsage),
		MemoryBytes:      int64(st.MemoryStats.Usage),
		MemoryLimitBytes: int64(st.MemoryStats.Limit),
		Processes:        int(st.PidsStats.Current),
		At:               st.Read,
	}
	// As docker stats shows it: the page cache the kernel can drop is not counted.
	if inactive, ok := st.MemoryStats.Stats["inactive_file"]; ok && inactive < st.MemoryStats.Usage {
		u.MemoryBytes -= int64(inactive)
	}
	if u.At.IsZero() {
		u.At = time.Now()
	}
	return u, nil
}
