package cli_test

import (
	"github.com/roche-sandbox/roche/internal/cli"
	"github.com/roche-sandbox/roche/internal/cli/full"
)

// The tests run the full CLI, as roched does when started as roche: package
// initialisation, before TestMain.
func init() { cli.SetTestLocal(full.Local{}) }
