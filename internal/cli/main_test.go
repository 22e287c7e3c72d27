package cli

import (
	"fmt"
	"os"
	"testing"

	"github.com/roche-sandbox/roche/internal/daemon"
	"github.com/roche-sandbox/roche/internal/testenv"
)

// TestMain builds roche-agent for the Docker provider, and lets the test binary double as
// the roche binary for tests that need a real process to signal (ROCHE_TEST_AS_CLI=1),
// and as roched for roche daemon start (ROCHED_TEST_AS_DAEMON=1).
func TestMain(m *testing.M) {
	if os.Getenv("ROCHE_TEST_AS_CLI") == "1" {
		os.Exit(Main(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
	}
	if os.Getenv("ROCHED_TEST_AS_DAEMON") == "1" {
		os.Exit(daemon.Main(os.Args[1:], os.Stdout, os.Stderr))
	}
	cleanup, err := testenv.SetupAgent()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	cleanup()
	os.Exit(code)
}
