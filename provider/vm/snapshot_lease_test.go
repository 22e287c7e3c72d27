package vm_test

import (
	"context"
	"testing"
	"time"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/internal/guest"
	"github.com/roche-sandbox/roche/provider/kit"
	"github.com/roche-sandbox/roche/provider/vm"
)

// TestForkKeepsTheOriginsLease: a leased VM forked, and one paused to disk, resumed and
// forked, still runs past its lease's grace after the fork. The fork's snapshot moves
// the guest to a new link, and the lease held on the old one must be taken again on it.
func TestForkKeepsTheOriginsLease(t *testing.T) {
	stateDir := t.TempDir()
	ramDir, memDir := shmDir(t), shmDir(t)
	p := newQEMU(t, vm.WithStateDir(stateDir), vm.WithMemoryDir(memDir), vm.WithRAMDir(ramDir))
	ctx := context.Background()
	info, err := p.CreateFor(ctx, testConfig(), kit.CreateOptions{Leased: true})
	if err != nil {
		t.Fatal(err)
	}
	id := info.ID
	var made []string
	t.Cleanup(func() {
		for _, id := range append(made, id) {
			_ = p.Destroy(context.Background(), id)
		}
	})
	alive := func(when string) {
		t.Helper()
		// Past the grace after which a guest with no lease holder stops.
		time.Sleep(guest.DefaultLeaseGrace + 2*time.Second)
		res, err := p.Exec(ctx, id, roche.ExecRequest{Cmd: []string{"true"}})
		if err != nil || res.ExitCode != 0 {
			t.Fatalf("the leased origin %s: %s: exec %+v, %v", id, when, res, err)
		}
	}
	forks, err := p.Fork(ctx, id, 1)
	if err != nil {
		t.Fatalf("Fork: %v", err)
	}
	made = append(made, forks[0].ID)
	alive("after a fork")

	if err := p.PauseToDisk(ctx, id); err != nil {
		t.Fatalf("PauseToDisk: %v", err)
	}
	if _, err := p.Resume(ctx, id); err != nil {
		t.Fatalf("Resume: %v", err)
	}
	forks, err = p.Fork(ctx, id, 1)
	if err != nil {
		t.Fatalf("Fork after the resume: %v", err)
	}
	made = append(made, forks[0].ID)
	alive("paused to disk, resumed, then forked")
}
