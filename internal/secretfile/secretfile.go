// Package secretfile reads secrets from files the way roched and roche mcp both require:
// the file private to its owner, the token long enough. One guard for both: a token is
// all that stands between a caller and running code.
package secretfile

import (
	"fmt"
	"os"
	"strings"

	"github.com/roche-sandbox/roche"
)

// MinTokenLength is the shortest token accepted from a token file or the environment.
const MinTokenLength = 16

// CheckPrivate refuses a secret file that anyone but its owner can read or write, or that
// someone other than this process's user (or root) owns. what names it for messages
// ("--token-file").
func CheckPrivate(path, what string) error {
	fi, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("%w: %s: %v", roche.ErrInvalidConfig, what, err)
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("%w: %s %s is not a regular file", roche.ErrInvalidConfig, what, path)
	}
	if perm := fi.Mode().Perm(); perm&0o077 != 0 {
		return fmt.Errorf("%w: %s %s is open to group or others (mode %04o): anyone who can read it can run code; chmod 600 %s",
			roche.ErrInvalidConfig, what, path, perm, path)
	}
	return checkOwner(fi, path, what)
}

// CheckToken refuses a token shorter than MinTokenLength; from says where it came from.
func CheckToken(tok, from string) error {
	if len(tok) < MinTokenLength {
		return fmt.Errorf("%w: the token in %s has %d characters: use at least %d random ones, e.g. openssl rand -hex 16",
			roche.ErrInvalidConfig, from, len(tok), MinTokenLength)
	}
	return nil
}

// ReadToken reads the single token of a token file (flag names it for messages): the
// whole file, surrounding whitespace trimmed. The file must be private to its owner and
// the token long enough.
func ReadToken(path, flag string) (string, error) {
	if err := CheckPrivate(path, flag); err != nil {
		return "", err
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("%w: %s: %v", roche.ErrInvalidConfig, flag, err)
	}
	tok := strings.TrimSpace(string(b))
	if err := CheckToken(tok, flag+" "+path); err != nil {
		return "", err
	}
	return tok, nil
}
