package providertest

import (
	"errors"
	"testing"
	"time"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/provider/kit"
)

// UsageGrows checks the console's live figures (kit.UsageReader) of running sandbox id
// of p: a command that keeps 32 MiB in the sandbox's memory (a file in /dev/shm, a
// tmpfs, which no reclaim drops) and burns half a second of CPU makes its memory grow
// by most of that and its CPU time by most of the half second; it counts its tasks.
// An unknown sandbox has none (not found).
func UsageGrows(t *testing.T, p roche.Provider, id string) {
	t.Helper()
	ur, ok := p.(kit.UsageReader)
	if !ok {
		t.Fatalf("provider %s does not read a sandbox's usage (kit.UsageReader)", p.Name())
	}
	ctx := ctxFor(t, 2*time.Minute)
	before, err := ur.Usage(ctx, id)
	if err != nil {
		t.Fatalf("usage: %v", err)
	}
	if before.MemoryBytes <= 0 || before.Processes < 1 || before.CPUTime <= 0 || before.At.IsZero() {
		t.Errorf("usage of a running sandbox: %+v; want memory in use, CPU time and at least one task", before)
	}
	res, err := p.Exec(ctx, id, roche.ExecRequest{Timeout: time.Minute, Cmd: []string{"python3", "-c", `
import time
with open('/dev/shm/roche-usage', 'wb') as f:
    for _ in range(32):
        f.write(b'x' * (1 << 20))
t = time.process_time()
while time.process_time() - t < 0.5:
    pass
`}})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("exec: %+v %v", res, err)
	}
	after, err := ur.Usage(ctx, id)
	if err != nil {
		t.Fatalf("usage: %v", err)
	}
	t.Logf("before: %+v; after 32 MiB kept and 0.5 s burnt: %+v", before, after)
	if burnt := after.CPUTime - before.CPUTime; burnt < 300*time.Millisecond {
		t.Errorf("CPU time grew by %v over a command that burnt 0.5 s", burnt)
	}
	if grew := after.MemoryBytes - before.MemoryBytes; grew < 24<<20 {
		t.Errorf("memory grew by %d bytes over 32 MiB kept in /dev/shm", grew)
	}
	if after.MemoryLimitBytes != 0 && after.MemoryLimitBytes < after.MemoryBytes {
		t.Errorf("memory %d over its limit %d", after.MemoryBytes, after.MemoryLimitBytes)
	}
	if res, err := p.Exec(ctx, id, roche.ExecRequest{Cmd: []string{"rm", "/dev/shm/roche-usage"}}); err != nil || res.ExitCode != 0 {
		t.Errorf("rm: %+v %v", res, err)
	}
	if _, err := ur.Usage(ctx, "roche-nonesuch-0123456789"); !errors.Is(err, roche.ErrNotFound) {
		t.Errorf("usage of an unknown sandbox: %v, want not found", err)
	}
}
