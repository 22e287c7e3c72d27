package statedir

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/internal/testenv"
)

// TestMakeRefusesWhatAnotherUserCouldSwap: the directories a provider keeps sockets in
// are made, or accepted, only when no other user owns or may write them or a directory
// above them. Another user's is made by chowning (the test runs as root); nobody 65534
// stands for the other user.
func TestMakeRefusesWhatAnotherUserCouldSwap(t *testing.T) {
	testenv.Needs(t, testenv.Root) // to give a directory to another user
	base := t.TempDir()            // 0700, root's, under the sticky /tmp
	ok := filepath.Join(base, "mine", "docker")
	if err := Make(ok); err != nil {
		t.Fatalf("a directory of our own: %v", err)
	}
	if fi, _ := os.Stat(ok); fi.Mode().Perm() != 0o700 {
		t.Fatalf("made %v, want 0700", fi.Mode().Perm())
	}

	// Taken first by another user, as /tmp/roche-UID may be.
	taken := filepath.Join(base, "taken")
	if err := os.Mkdir(taken, 0o777); err != nil {
		t.Fatal(err)
	}
	os.Chmod(taken, 0o777)
	os.Chown(taken, 65534, 65534)
	err := Make(filepath.Join(taken, "docker"))
	if !errors.Is(err, roche.ErrUnavailable) || !strings.Contains(err.Error(), "belongs to uid 65534") {
		t.Fatalf("under another user's directory: %v, want a refusal naming its owner", err)
	}

	// Ours, but open to everyone.
	open := filepath.Join(base, "open")
	if err := os.Mkdir(open, 0o700); err != nil {
		t.Fatal(err)
	}
	os.Chmod(open, 0o777)
	if err := Make(filepath.Join(open, "docker")); err == nil || !strings.Contains(err.Error(), "may be written by others") {
		t.Fatalf("under a directory anyone may write: %v, want a refusal", err)
	}

	// A link to another user's directory is judged by where it leads.
	link := filepath.Join(base, "link")
	if err := os.Symlink(taken, link); err != nil {
		t.Fatal(err)
	}
	if err := Check(link); err == nil || !strings.Contains(err.Error(), "belongs to uid 65534") {
		t.Fatalf("a link to another user's directory: %v, want a refusal", err)
	}
}
