package client_test

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/internal/daemon"
	"github.com/roche-sandbox/roche/internal/daemon/daemontest"
)

// TestCopyCapThroughDaemon: roched caps every copy at its --copy-max-bytes, which a
// request may lower and not raise, and refuses the file that would pass it before
// sending any of it; the Go client refuses a file over its own cap before reading it.
func TestCopyCapThroughDaemon(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c := daemontest.Serve(t, daemon.Config{CopyMaxBytes: 1 << 20}).Client
	p := c.Provider("docker")
	cfg := roche.DefaultConfig()
	cfg.Image = testImage()
	sb, err := p.Create(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Destroy(context.WithoutCancel(ctx), sb.ID)
	res, err := p.Exec(ctx, sb.ID, roche.ExecRequest{Cmd: []string{"sh", "-c", "head -c 2097152 /dev/urandom > /tmp/two && truncate -s 10T /tmp/huge"}})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("%+v %v", res, err)
	}
	out := filepath.Join(t.TempDir(), "two")
	if _, err := p.CopyOut(ctx, sb.ID, "/tmp/two", out, roche.CopyOptions{}); !errors.Is(err, roche.ErrExhausted) || !strings.Contains(err.Error(), "limit of 1 MiB") {
		t.Fatalf("copying 2 MiB out past roched's 1 MiB cap: %v", err)
	}
	if _, err := os.Lstat(out); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the file over the cap was written: %v", err)
	}
	if _, err := p.CopyOut(ctx, sb.ID, "/tmp/two", out, roche.CopyOptions{MaxBytes: 4 << 20}); !errors.Is(err, roche.ErrInvalidConfig) || !strings.Contains(err.Error(), "over this roched's cap") {
		t.Fatalf("asking for more than roched's cap: %v", err)
	}
	src := filepath.Join(t.TempDir(), "up")
	os.WriteFile(src, make([]byte, 2<<20), 0o644)
	if _, err := p.CopyIn(ctx, sb.ID, src, "/tmp/up", roche.CopyOptions{MaxBytes: 4 << 30}); !errors.Is(err, roche.ErrInvalidConfig) {
		t.Fatalf("uploading with a cap over roched's: %v", err)
	}
	if err := p.ReadFile(ctx, sb.ID, "/tmp/two", io.Discard); !errors.Is(err, roche.ErrExhausted) {
		t.Fatalf("ReadFile of 2 MiB past roched's cap: %v", err)
	}
	// The client's own cap, below the daemon's: refused before the content is read.
	if _, err := p.ReadFileLimit(ctx, sb.ID, "/tmp/two", io.Discard, 1000); !errors.Is(err, roche.ErrExhausted) || !strings.Contains(err.Error(), "1000 bytes") {
		t.Fatalf("ReadFileLimit 1000 of 2 MiB: %v", err)
	}
	if err := p.ReadFile(ctx, sb.ID, "/tmp/huge", io.Discard); !errors.Is(err, roche.ErrExhausted) || !strings.Contains(err.Error(), "10 TiB") {
		t.Fatalf("ReadFile of a 10 TiB sparse file: %v", err)
	}
}
