package guestfwd

import (
	"errors"
	"fmt"
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
