package agentbin

import (
	"os"
	"path/filepath"
	"testing"
)

// TestStaticRefusesWhatNeedsALoader: a dynamically linked program (the host's sh) and a
// file that is no executable are not offered as the agent. (A static one is: see
// cmd/roche's TestOneBinary.)
func TestStaticRefusesWhatNeedsALoader(t *testing.T) {
	if Static("/bin/sh") {
		t.Error("/bin/sh, which needs the dynamic loader, was taken for static")
	}
	script := filepath.Join(t.TempDir(), "roche-agent")
	if err := os.WriteFile(script, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if Static(script) || Static(filepath.Join(t.TempDir(), "missing")) {
		t.Error("a script or a missing file was taken for a static executable")
	}
}
