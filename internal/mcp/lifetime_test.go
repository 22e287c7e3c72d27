package mcp_test

import (
	"strings"
	"testing"
	"time"

	"github.com/roche-sandbox/roche/internal/mcp"
)

// TestSetSandboxTimeout: a model gives its sandbox more time, and the expiry it is told is
// the new one; a bad lifetime is an error that says to change the call; another session
// cannot touch the sandbox.
func TestSetSandboxTimeout(t *testing.T) {
	s, _ := newServer(t, mcp.Config{})
	cs := connect(t, s)
	var sb mcp.Sandbox
	call(t, cs, "create_sandbox", map[string]any{"timeout_secs": 60}, &sb)
	var got mcp.Sandbox
	if text, isErr := call(t, cs, "set_sandbox_timeout", map[string]any{"sandbox_id": sb.ID, "timeout_secs": 600}, &got); isErr {
		t.Fatalf("set_sandbox_timeout: %s", text)
	}
	end, err := time.Parse(time.RFC3339, got.ExpiresAt)
	if err != nil || time.Until(end) < 590*time.Second || time.Until(end) > 610*time.Second {
		t.Errorf("set_sandbox_timeout 600: expires_at %q (%v), want about 600 s from now", got.ExpiresAt, err)
	}
	if text, isErr := call(t, cs, "set_sandbox_timeout", map[string]any{"sandbox_id": sb.ID, "timeout_secs": 0}, nil); !isErr || !strings.Contains(text, "change the arguments") {
		t.Errorf("set_sandbox_timeout 0: %q (error %v), want an error asking for other arguments", text, isErr)
	}
	other := connect(t, s)
	if text, isErr := call(t, other, "set_sandbox_timeout", map[string]any{"sandbox_id": sb.ID, "timeout_secs": 5}, nil); !isErr || !strings.Contains(text, "no sandbox") {
		t.Errorf("another session's set_sandbox_timeout: %q (error %v), want not found", text, isErr)
	}
	call(t, cs, "destroy_sandbox", map[string]any{"sandbox_id": sb.ID}, nil)
}
