package docker_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/provider/docker"
)

// TestPinnedMountsResistSymlinkSwaps attacks a pinned mount from the host side: while
// sandboxes are created with a host mount, a swapper flips a directory on its path
// between the real directory and a symbolic link to a victim directory, as a sandbox with
// a read-write mount above it could. Each create must either be refused or bind the real
// directory; the victim's file must never be seen inside. A link already on the path is
// refused outright, naming it.
func TestPinnedMountsResistSymlinkSwaps(t *testing.T) {
	state := t.TempDir()
	p := newProvider(t, docker.WithPinnedMounts(), docker.WithStateDir(state))
	// Registered after the TempDir, so it runs before its removal: nothing is ever
	// removed recursively while a staging point might still be mounted.
	t.Cleanup(func() { unix.Unmount(filepath.Join(state, "pinned"), unix.MNT_DETACH) })
	base := t.TempDir()
	victim := filepath.Join(base, "victim")
	allowed := filepath.Join(base, "allowed")
	x := filepath.Join(allowed, "x")
	for _, d := range []string{victim, x} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	os.WriteFile(filepath.Join(victim, "marker"), []byte("victim"), 0o644)
	os.WriteFile(filepath.Join(x, "marker"), []byte("real"), 0o644)
	ctx := context.Background()

	link := filepath.Join(allowed, "link")
	if err := os.Symlink(victim, link); err != nil {
		t.Fatal(err)
	}
	cfg := testConfig()
	cfg.TimeoutSecs = 60
	cfg.Mounts = []roche.Mount{{Source: filepath.Join(link), Target: "/m"}}
	if sb, err := p.Create(ctx, cfg); !errors.Is(err, roche.ErrInvalidConfig) || !strings.Contains(err.Error(), link+" is a symbolic link") {
		if err == nil {
			p.Destroy(ctx, sb.ID)
		}
		t.Fatalf("a mount through a symlink: %v, want it refused naming %s", err, link)
	}

	stop := make(chan struct{})
	var wg sync.WaitGroup
	var flips atomic.Int64
	wg.Add(1)
	// The swap is atomic (RENAME_EXCHANGE): x is always either the directory or the
	// link, never missing, as an attacker would want it.
	swap := filepath.Join(allowed, "x.swap")
	if err := os.Symlink(victim, swap); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			if err := unix.Renameat2(unix.AT_FDCWD, x, unix.AT_FDCWD, swap, unix.RENAME_EXCHANGE); err != nil {
				t.Errorf("swapping: %v", err)
				return
			}
			flips.Add(1)
			time.Sleep(20 * time.Microsecond)
		}
	}()
	cfg.Mounts = []roche.Mount{{Source: x, Target: "/m"}}
	served, refused := 0, 0
	for range 16 {
		sb, err := p.Create(ctx, cfg)
		if err != nil {
			if !errors.Is(err, roche.ErrInvalidConfig) {
				close(stop)
				wg.Wait()
				t.Fatalf("create during the swaps: %v, want success or ErrInvalidConfig", err)
			}
			refused++
			continue
		}
		res, err := p.Exec(ctx, sb.ID, roche.ExecRequest{Cmd: []string{"cat", "/m/marker"}, Timeout: 20 * time.Second})
		p.Destroy(ctx, sb.ID)
		if err != nil {
			close(stop)
			wg.Wait()
			t.Fatal(err)
		}
		if strings.Contains(res.Stdout, "victim") {
			close(stop)
			wg.Wait()
			t.Fatalf("the sandbox got the victim directory through a swapped symlink: %+v", res)
		}
		if res.Stdout != "real" {
			close(stop)
			wg.Wait()
			t.Fatalf("the mount shows %q (%s), want the real directory's marker", res.Stdout, res.Stderr)
		}
		served++
	}
	close(stop)
	wg.Wait()
	t.Logf("%d creates bound the real directory, %d were refused, during %d swaps", served, refused, flips.Load())
	if served == 0 {
		t.Fatal("no create got through: the race was not exercised")
	}
	if flips.Load() < 100 {
		t.Fatalf("only %d swaps happened: the race was not exercised", flips.Load())
	}
	if left, _ := os.ReadDir(filepath.Join(state, "pinned")); len(left) != 0 {
		t.Fatalf("staging points left behind: %v", left)
	}
}
