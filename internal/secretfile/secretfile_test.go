package secretfile

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/roche-sandbox/roche"
)

// TestReadToken: a token file others may read, or a short token, is refused, saying
// what to do; a private one with a long token is read, whitespace trimmed.
func TestReadToken(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	long := strings.Repeat("k", MinTokenLength)
	for _, c := range []struct {
		path, want string
	}{
		{write("open", long, 0o644), "chmod 600"},
		{write("short", "short\n", 0o600), "has 5 characters: use at least 16"},
		{dir, "not a regular file"},
		{filepath.Join(dir, "missing"), "no such file"},
	} {
		if _, err := ReadToken(c.path, "--token-file"); !errors.Is(err, roche.ErrInvalidConfig) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("ReadToken(%s): %v, want %q", c.path, err, c.want)
		}
	}
	tok, err := ReadToken(write("good", "  "+long+"\n", 0o600), "--token-file")
	if err != nil || tok != long {
		t.Fatalf("a private token file: %q %v", tok, err)
	}
}
