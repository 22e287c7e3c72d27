package defaults

import (
	"os"
	"os/user"
	"testing"
)

// TestDirectOwner: the CLI's owner in direct mode, which roched's --direct-owner
// defaults to in the same environment: ROCHE_OWNER when set, else cli:USER@HOST.
func TestDirectOwner(t *testing.T) {
	t.Setenv("ROCHE_OWNER", "ci-job-7")
	if got := DirectOwner(); got != "ci-job-7" {
		t.Errorf("with ROCHE_OWNER: %q", got)
	}
	t.Setenv("ROCHE_OWNER", "")
	u, err := user.Current()
	if err != nil {
		t.Fatal(err)
	}
	host, _ := os.Hostname()
	if got, want := DirectOwner(), "cli:"+u.Username+"@"+host; got != want {
		t.Errorf("without ROCHE_OWNER: %q, want %q", got, want)
	}
}
