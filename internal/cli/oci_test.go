package cli

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/roche-sandbox/roche/internal/testenv"
)

// TestRunOCIOneShot: roche run --provider oci with no roched, whose sandbox is made for
// its one command (a one-shot sandbox), reports the command as a sandbox made to stay
// does (output, stdin with -i, exit status, a signal's, a timeout's 124 and why), and
// leaves no sandbox behind: roche list shows none, and no directory of one is left.
func TestRunOCIOneShot(t *testing.T) {
	testenv.Needs(t, testenv.Root, testenv.Docker)
	img := testImage()
	before, _ := filepath.Glob("/run/roche/oci/oci-*")
	oci := func(stdin string, args ...string) result {
		t.Helper()
		return rocheIn(t, stdin, append([]string{"run", "--provider", "oci", "--image", img}, args...)...)
	}
	if r := oci("", "--", "sh", "-c", "echo out; echo err >&2; exit 7"); r.code != 7 || r.stdout != "out\n" || r.stderr != "err\n" {
		t.Errorf("exit 7: %+v", r)
	}
	if r := oci("typed\n", "-i", "--", "cat"); r.code != 0 || r.stdout != "typed\n" {
		t.Errorf("stdin: %+v, want typed", r)
	}
	if r := oci("", "--", "sh", "-c", "kill -9 $$"); r.code != 128+9 {
		t.Errorf("killed by SIGKILL: %+v, want exit 137", r)
	}
	if r := oci("", "--exec-timeout", "1", "--", "sleep", "30"); r.code != exitCodeTimeout || !strings.Contains(r.stderr, "timed out: --exec-timeout 1s killed it") {
		t.Errorf("timeout: %+v, want exit 124 naming --exec-timeout 1s", r)
	}
	if r := run(t, "list", "--provider", "oci"); r.code != 0 || strings.Contains(r.stdout, "oci-") {
		t.Errorf("roche list after the runs: %+v, want no sandbox", r)
	}
	// Other processes may make oci sandboxes meanwhile: this test's carry its owner.
	after, _ := filepath.Glob("/run/roche/oci/oci-*")
	for _, d := range after {
		record, _ := os.ReadFile(filepath.Join(d, "record.json"))
		if !slices.Contains(before, d) && strings.Contains(string(record), `"owner":"`+os.Getenv("ROCHE_OWNER")+`"`) {
			t.Errorf("sandbox directory left: %s (%s)", d, record)
		}
	}
}
