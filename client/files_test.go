package client_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/roche-sandbox/roche"
)

// TestFiles: WriteFile and ReadFile through the daemon, binary-safe, with parents made
// and the mode kept, and the core's errors for what cannot be read.
func TestFiles(t *testing.T) {
	c, _ := serve(t)
	p := c.Provider("docker")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cfg := roche.DefaultConfig()
	cfg.Image = testImage()
	sb, err := p.Create(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Destroy(context.WithoutCancel(ctx), sb.ID)

	blob := make([]byte, 3<<20)
	rand.Read(blob)
	if err := p.WriteFile(ctx, sb.ID, "/tmp/a/b/blob.bin", bytes.NewReader(blob), 0o640); err != nil {
		t.Fatal(err)
	}
	var got bytes.Buffer
	if err := p.ReadFile(ctx, sb.ID, "/tmp/a/b/blob.bin", &got); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got.Bytes(), blob) {
		t.Fatalf("read %d bytes back, not the %d written", got.Len(), len(blob))
	}
	res, err := p.Exec(ctx, sb.ID, roche.ExecRequest{Cmd: []string{"stat", "-c", "%a", "/tmp/a/b/blob.bin"}})
	if err != nil || strings.TrimSpace(res.Stdout) != "640" {
		t.Fatalf("mode: %q, %v", res.Stdout, err)
	}

	if err := p.ReadFile(ctx, sb.ID, "/tmp/nothing-here", &got); !errors.Is(err, roche.ErrNotFound) {
		t.Errorf("reading a missing file: %v, want ErrNotFound", err)
	}
	if err := p.ReadFile(ctx, sb.ID, "/tmp/a", &got); !errors.Is(err, roche.ErrInvalidConfig) || !strings.Contains(err.Error(), "directory") {
		t.Errorf("reading a directory: %v, want ErrInvalidConfig naming it a directory", err)
	}
	if err := p.WriteFile(ctx, sb.ID, "relative.txt", strings.NewReader("x"), 0o644); !errors.Is(err, roche.ErrInvalidConfig) {
		t.Errorf("writing a relative path: %v, want ErrInvalidConfig", err)
	}
	if err := p.WriteFile(ctx, "no-such-sandbox", "/tmp/x", strings.NewReader("x"), 0o644); !errors.Is(err, roche.ErrNotFound) {
		t.Errorf("writing into an unknown sandbox: %v, want ErrNotFound", err)
	}
}
