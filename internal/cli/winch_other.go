//go:build !unix

package cli

import (
	"os"

	"github.com/roche-sandbox/roche"
)

// watchWindow: no SIGWINCH outside unix; the size stays as it started.
func watchWindow(*os.File) (<-chan roche.TerminalSize, func()) { return nil, func() {} }
