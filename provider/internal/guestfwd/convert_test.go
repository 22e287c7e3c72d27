package guestfwd

import (
	"errors"
	"fmt"
	"io/fs"
	"strings"
	"testing"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/internal/guest"
)

func TestErr(t *testing.T) {
	for code, want := range map[string]error{
		guest.CodeNotFound:    roche.ErrNotFound,
		guest.CodePermission:  roche.ErrPermission,
		guest.CodeUnsupported: roche.ErrUnsupported,
		guest.CodeInvalid:     roche.ErrInvalidConfig,
		guest.CodeNoSpace:     roche.ErrExhausted,
		guest.CodeTooLarge:    roche.ErrExhausted,
		guest.CodeExhausted:   roche.ErrExhausted,
		guest.CodeGone:        roche.ErrOutputGone,
	} {
		err, ok := Err("sb1", fmt.Errorf("wrapped: %w", &guest.Error{Code: code, Message: "what happened"}))
		if !ok || !errors.Is(err, want) || !strings.Contains(err.Error(), "what happened") {
			t.Errorf("code %s: %v %v, want %v", code, err, ok, want)
		}
	}
	err, ok := Err("sb1", &guest.Error{Code: guest.CodeInternal, Message: "boom"})
	if !ok || err.Error() != "sandbox sb1: boom" {
		t.Errorf("internal: %v %v", err, ok)
	}
	err, ok = Err("sb1", &guest.Error{Code: guest.CodeStopping, Message: "the sandbox is stopping: its lifetime of 5m0s ended"})
	if !ok || !errors.Is(err, roche.ErrNotFound) || !strings.Contains(err.Error(), "sandbox sb1 stopped while the command ran: the sandbox is stopping: its lifetime") {
		t.Errorf("stopping: %v %v", err, ok)
	}
	plain := errors.New("connection refused")
	if err, ok := Err("sb1", plain); ok || err != plain {
		t.Errorf("a connection error is the provider's to judge: %v %v", err, ok)
	}
}

func TestFileInfo(t *testing.T) {
	for _, c := range []struct {
		in   guest.FileInfo
		want fs.FileMode
		typ  string
	}{
		{guest.FileInfo{Mode: 0o644, Type: guest.TypeFile}, 0o644, "file"},
		{guest.FileInfo{Mode: 0o755, Type: guest.TypeDir, IsDir: true}, fs.ModeDir | 0o755, "dir"},
		{guest.FileInfo{Mode: 0o777, Type: guest.TypeSymlink, Symlink: "/etc"}, fs.ModeSymlink | 0o777, "symlink"},
		{guest.FileInfo{Mode: 0o600, Type: guest.TypeFIFO}, fs.ModeNamedPipe | 0o600, "fifo"},
		{guest.FileInfo{Mode: 0o666, Type: guest.TypeDevice}, fs.ModeDevice | 0o666, "device"},
		{guest.FileInfo{Mode: 0o755, IsDir: true}, fs.ModeDir | 0o755, "dir"}, // an older agent
	} {
		got := FileInfo(c.in)
		if got.Mode != c.want || got.FileType() != c.typ || got.IsDir != (c.typ == "dir") {
			t.Errorf("%+v: mode %v type %s, want %v %s", c.in, got.Mode, got.FileType(), c.want, c.typ)
		}
	}
	got := FileInfo(guest.FileInfo{ModTime: 5, ModTimeNS: 5_000_000_123, UID: 7, GID: 8, Owner: "u", Group: "g"})
	if got.ModTime.UnixNano() != 5_000_000_123 || got.UID != 7 || got.GID != 8 || got.Owner != "u" || got.Group != "g" {
		t.Errorf("times and owners: %+v", got)
	}
}
