package roche_test

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/roche-sandbox/roche"
)

func TestCopyReportNote(t *testing.T) {
	if n := (roche.CopyReport{Files: 3}).Note(); n != "" {
		t.Fatalf("nothing skipped, yet %q", n)
	}
	r := roche.CopyReport{Skipped: 1, SkippedLinks: 1, Examples: []roche.SkippedEntry{{Path: "/tmp/e", Target: "/etc", Reason: "symlink"}}}
	if n := r.Note(); !strings.HasPrefix(n, "skipped 1 symlink (/tmp/e -> /etc): ") || !strings.Contains(n, "--preserve-links") {
		t.Fatalf("note %q", n)
	}
	r = roche.CopyReport{Skipped: 7, SkippedLinks: 6, Examples: []roche.SkippedEntry{{Path: "/a"}, {Path: "/b"}}}
	if n := r.Note(); !strings.HasPrefix(n, "skipped 7 entries (/a, /b, ...)") || !strings.Contains(n, "fifos") {
		t.Fatalf("note %q", n)
	}
}

// stream is a TarCopier whose sandbox side is scripted: it writes an archive of one
// file of size bytes (0: nothing) and then fails with err.
type stream struct {
	size int64
	err  error
}

func (s stream) CopyTarTo(ctx context.Context, id, dst string, r io.Reader) error {
	_, err := io.Copy(io.Discard, r)
	if s.err != nil {
		return s.err
	}
	return err
}

func (s stream) CopyTarFrom(ctx context.Context, id, src string, w io.Writer) error {
	if s.size > 0 {
		tw := tar.NewWriter(w)
		if err := tw.WriteHeader(&tar.Header{Name: "f", Typeflag: tar.TypeReg, Size: s.size, Mode: 0o644}); err != nil {
			return err
		}
		chunk := make([]byte, 1<<16)
		for left := s.size; left > 0; left -= int64(len(chunk)) {
			if _, err := tw.Write(chunk[:min(int64(len(chunk)), left)]); err != nil {
				return fmt.Errorf("sending: %w", err)
			}
		}
		if err := tw.Close(); err != nil {
			return err
		}
	}
	return s.err
}

// TestCopyOutErrors: whose error a failed copy reports. The sandbox side's, when it
// failed and the host side only saw the stream end; the host side's refusal, when the
// host refused (and stopped the sandbox side, whose complaint about that is not news).
func TestCopyOutErrors(t *testing.T) {
	ctx := context.Background()
	dst := filepath.Join(t.TempDir(), "f")
	gone := fmt.Errorf("%w: no /tmp/f in the sandbox", roche.ErrNotFound)
	if _, err := roche.CopyOut(ctx, stream{err: gone}, "sb", "/tmp/f", dst, roche.CopyOptions{}); !errors.Is(err, roche.ErrNotFound) {
		t.Fatalf("missing source: %v", err)
	}
	if _, err := roche.CopyOut(ctx, stream{size: 100, err: errors.New("tar exited 2")}, "sb", "/tmp/f", dst, roche.CopyOptions{}); err == nil || err.Error() != "tar exited 2" {
		t.Fatalf("a sandbox side failing after its archive: %v", err)
	}
	dst = filepath.Join(t.TempDir(), "f")
	_, err := roche.CopyOut(ctx, stream{size: 10 << 20}, "sb", "/tmp/f", dst, roche.CopyOptions{MaxBytes: 1 << 20})
	if !errors.Is(err, roche.ErrExhausted) || !strings.Contains(err.Error(), "/tmp/f is 10 MiB") {
		t.Fatalf("over the cap: %v", err)
	}
	if _, err := os.Lstat(dst); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the file over the cap was written: %v", err)
	}
	if rep, err := roche.CopyOut(ctx, stream{size: 100}, "sb", "/tmp/f", dst, roche.CopyOptions{}); err != nil || rep.Files != 1 || rep.Bytes != 100 {
		t.Fatalf("a good copy: %+v %v", rep, err)
	}
	src := filepath.Join(t.TempDir(), "big")
	os.WriteFile(src, make([]byte, 2<<20), 0o644)
	_, err = roche.CopyIn(ctx, stream{err: errors.New("the sandbox side saw the stream cut")}, "sb", src, "/tmp/big", roche.CopyOptions{MaxBytes: 1 << 20})
	if !errors.Is(err, roche.ErrExhausted) || !strings.Contains(err.Error(), "limit of 1 MiB") {
		t.Fatalf("copying in over the cap: %v", err)
	}
	for _, bad := range []string{"relative", "/", ""} {
		if _, err := roche.CopyOut(ctx, stream{}, "sb", bad, dst, roche.CopyOptions{}); !errors.Is(err, roche.ErrInvalidConfig) {
			t.Errorf("source %q: %v", bad, err)
		}
	}
}
