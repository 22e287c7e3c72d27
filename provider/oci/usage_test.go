package oci_test

import (
	"context"
	"errors"
	"testing"

	"github.com/roche-sandbox/roche"
)

// TestUsage: the console's live figures of an oci sandbox come from its own cgroup: its
// memory limit is the sandbox's, its CPU time grows by what a command in it burns, it
// counts its tasks; an unknown or destroyed sandbox has none.
func TestUsage(t *testing.T) {
	p, _ := newProvider(t)
	ctx := context.Background()
	cfg := testConfig()
	cfg.Memory = "320m"
	info, err := p.Create(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Destroy(ctx, info.ID)
	before, err := p.Usage(ctx, info.ID)
	if err != nil {
		t.Fatal(err)
	}
	if before.MemoryLimitBytes != 320<<20 || before.MemoryBytes <= 0 || before.Processes < 1 || before.At.IsZero() {
		t.Errorf("usage of a fresh sandbox: %+v; want its 320 MiB limit, memory in use and at least one task", before)
	}
	// A command that burns half a second of CPU.
	res, err := p.Exec(ctx, info.ID, roche.ExecRequest{Cmd: []string{"python3", "-c",
		"import time\nt=time.process_time()\nwhile time.process_time()-t<0.5: pass"}})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("exec: %+v %v", res, err)
	}
	after, err := p.Usage(ctx, info.ID)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("before: %+v; after burning 0.5 s: %+v", before, after)
	if burnt := after.CPUTime - before.CPUTime; burnt < 300e6 {
		t.Errorf("CPU time grew by %v over a command that burnt 0.5 s: not the sandbox's cgroup (%+v, then %+v)", burnt, before, after)
	}
	if _, err := p.Usage(ctx, "0000000000000000000000000000000000000000000000000000000000000000"); !errors.Is(err, roche.ErrNotFound) {
		t.Errorf("usage of an unknown sandbox: %v, want not found", err)
	}
	if err := p.Destroy(ctx, info.ID); err != nil {
		t.Fatal(err)
	}
	if u, err := p.Usage(ctx, info.ID); !errors.Is(err, roche.ErrNotFound) {
		t.Errorf("usage of a destroyed sandbox: %+v %v, want not found", u, err)
	}
}
