package cli

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/docker/docker/api/types/image"
	dockerclient "github.com/docker/docker/client"

	"github.com/roche-sandbox/roche/internal/daemon"
	"github.com/roche-sandbox/roche/internal/testenv"
	"github.com/roche-sandbox/roche/provider/vm/supervisor"
)

// TestMain builds roche-agent for the Docker provider, and lets the test binary double as
// the roche binary for tests that need a real process to signal (ROCHE_TEST_AS_CLI=1),
// and as roched for roche daemon start (ROCHED_TEST_AS_DAEMON=1).
func TestMain(m *testing.M) {
	if testLocal == nil {
		fmt.Fprintln(os.Stderr, "no providers to run in-process: full_test.go sets them")
		os.Exit(1)
	}
	// The qemu provider runs each VM's supervisor as this binary, as roched does.
	supervisor.RunIfAsked()
	if os.Getenv("ROCHE_TEST_AS_CLI") == "1" {
		os.Exit(Main(os.Args[1:], os.Stdin, os.Stdout, os.Stderr, testLocal))
	}
	if os.Getenv("ROCHED_TEST_AS_DAEMON") == "1" {
		os.Exit(daemon.Main(os.Args[1:], os.Stdout, os.Stderr))
	}
	cleanup, err := testenv.SetupAgent()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	untag, err := privateImage()
	if err != nil {
		cleanup()
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	// An owner of this test process's own, so that its gc --all and destroy --all take
	// only what these tests made, whatever else runs on the engine.
	os.Setenv("ROCHE_OWNER", "cli:test-"+strings.TrimPrefix(os.Getenv("ROCHE_TEST_IMAGE"), "roche/python:cli-test-"))
	code := m.Run()
	untag()
	cleanup()
	os.Exit(code)
}

// privateImage points ROCHE_TEST_IMAGE at a tag of the test image that only this test
// process uses, so that managed() counts exactly the containers these tests made, not
// those of other packages' tests running on the same engine at the same time.
func privateImage() (untag func(), err error) {
	if testenv.Fast() {
		return func() {}, nil // no engine: the tests that need one skip (testenv.Needs)
	}
	c, err := dockerclient.NewClientWithOpts(dockerclient.FromEnv, dockerclient.WithAPIVersionNegotiation())
	if err != nil {
		return nil, err
	}
	defer c.Close()
	b := make([]byte, 4)
	rand.Read(b)
	tag := "roche/python:cli-test-" + hex.EncodeToString(b)
	if err := c.ImageTag(context.Background(), testenv.Image(), tag); err != nil {
		return nil, fmt.Errorf("tagging %s: %v (the README's test command builds it)", testenv.Image(), err)
	}
	os.Setenv("ROCHE_TEST_IMAGE", tag)
	return func() {
		c, err := dockerclient.NewClientWithOpts(dockerclient.FromEnv, dockerclient.WithAPIVersionNegotiation())
		if err == nil {
			c.ImageRemove(context.Background(), tag, image.RemoveOptions{})
			c.Close()
		}
	}, nil
}
