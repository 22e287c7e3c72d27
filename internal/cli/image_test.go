package cli

import (
	"strings"
	"testing"

	"github.com/roche-sandbox/roche/internal/testenv"
)

// TestImageBuild: roche image build python leaves an image its recipe made alone (its
// label says so), in one line and at once; an image it has no recipe for is refused.
// (The build itself is scripts/build-test-image.sh's, which runs this command for the
// suite: on a machine without the image, the suite's own image is its test.)
func TestImageBuild(t *testing.T) {
	testenv.Needs(t, testenv.Root, testenv.Docker)
	r := run(t, "image", "build", "python", "--tag", testImage())
	if r.code != 0 || !strings.Contains(r.stderr, "already exists (version ") || strings.Count(r.stderr, "\n") != 1 {
		t.Fatalf("roche image build python on the test image: %+v", r)
	}
	r = run(t, "image", "build", "node")
	if r.code == 0 || !strings.Contains(r.stderr, `makes one image, python, not "node"`) {
		t.Fatalf("roche image build node: %+v", r)
	}
	r = run(t, "image", "build", "python", "--provider", "vmware")
	if r.code == 0 || !strings.Contains(r.stderr, "choose one of") {
		t.Fatalf("roche image build python --provider vmware: %+v", r)
	}
}
