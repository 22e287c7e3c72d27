package remedy_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/internal/remedy"
)

// TestRemedyAdvice: one missing image, worded for each caller: the command line gets
// the command and the flag, an API or SDK caller what to set and where the fix runs,
// a model what to tell its user and the argument, a Go program the Config field; none
// gets a repository script. Wrapped, the advice replaces the remedy's own words and
// errors.Is still sees the sentinel.
func TestRemedyAdvice(t *testing.T) {
	rem := &roche.Remedy{Err: fmt.Errorf("%w: image x is not here", roche.ErrImageNotFound), Run: "roche image build python", AsRoot: true, Image: "roche/python:local"}
	err := fmt.Errorf("creating sandbox: %w", rem)
	for a, want := range map[remedy.Audience]string{
		remedy.ForCLI:    "creating sandbox: image not found: image x is not here: run roche image build python (as root), then pass --image roche/python:local",
		remedy.ForClient: `creating sandbox: image not found: image x is not here: make it on the host that runs the sandboxes (roched's, when you use roched) with roche image build python (as root), then create sandboxes with image "roche/python:local"`,
		remedy.ForModel:  `creating sandbox: image not found: image x is not here: this server's host lacks it; tell the user, who can make it there with roche image build python (as root), and then call create_sandbox with image "roche/python:local"`,
	} {
		if got := remedy.Advise(err, a); got != want {
			t.Errorf("audience %d:\n got %s\nwant %s", a, got, want)
		}
	}
	goWords := `creating sandbox: image not found: image x is not here: make it on this host with roche image build python (as root), then set Config.Image to "roche/python:local"`
	if err.Error() != goWords || !errors.Is(err, roche.ErrImageNotFound) || strings.Contains(err.Error(), "scripts/") {
		t.Errorf("the Go wording or the sentinel: %v", err)
	}
	plain := errors.New("no remedy")
	if remedy.Advise(plain, remedy.ForCLI) != "no remedy" {
		t.Error("an error without a remedy was reworded")
	}
}
