// Package testenv prepares what integration tests need: a freshly built roche-agent and
// the local test image's name.
package testenv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"

	"github.com/docker/docker/api/types/image"
	"github.com/docker/docker/client"
)

// Image is the sandbox image tests use (built by scripts/build-test-image.sh);
// ROCHE_TEST_IMAGE overrides it.
func Image() string {
	if img := os.Getenv("ROCHE_TEST_IMAGE"); img != "" {
		return img
	}
	return "roche/python:local"
}

// BuildAgent builds a static roche-agent from this checkout into dir and returns its path.
func BuildAgent(dir string) (string, error) {
	_, file, _, _ := runtime.Caller(0)
	root := filepath.Join(filepath.Dir(file), "..", "..")
	out := filepath.Join(dir, "roche-agent")
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", out, "./cmd/roche-agent")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("building roche-agent: %v\n%s", err, b)
	}
	return out, nil
}

// SetupAgent builds roche-agent into a fresh temporary directory and points ROCHE_AGENT
// at it, for TestMain; the returned func removes it.
func SetupAgent() (cleanup func(), err error) {
	dir, err := os.MkdirTemp("", "roche-agent-test-")
	if err != nil {
		return nil, err
	}
	path, err := BuildAgent(dir)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	os.Setenv("ROCHE_AGENT", path)
	return func() { os.RemoveAll(dir) }, nil
}

// BuildCLI builds roche, roched and roche-run from this checkout into dir, as `make
// build` does, and returns the paths of the first two: tests that must run the real
// binaries get ones that match the code, and a one-shot roche run among them goes
// through roche-run, as an installed one does.
func BuildCLI(dir string) (roche, roched string, err error) {
	_, file, _, _ := runtime.Caller(0)
	root := filepath.Join(filepath.Dir(file), "..", "..")
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", dir+string(filepath.Separator), "./cmd/roche", "./cmd/roched", "./cmd/roche-run")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0") // static, as make build makes them
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", "", fmt.Errorf("building roche, roched and roche-run: %v\n%s", err, b)
	}
	return filepath.Join(dir, "roche"), filepath.Join(dir, "roched"), nil
}

// PrivateImage tags the test image with a tag no other test process uses, so a test can
// count exactly the sandboxes made from it while other tests share the engine. The
// returned func removes the tag.
func PrivateImage(ctx context.Context, prefix string) (tag string, untag func(), err error) {
	c, err := client.NewClientWithOpts(client.FromEnv, client.WithAPIVersionNegotiation())
	if err != nil {
		return "", nil, err
	}
	b := make([]byte, 4)
	rand.Read(b)
	tag = "roche/python:" + prefix + "-" + hex.EncodeToString(b)
	if err := c.ImageTag(ctx, Image(), tag); err != nil {
		c.Close()
		return "", nil, fmt.Errorf("tagging %s: %v (the README's test command builds it)", Image(), err)
	}
	return tag, func() {
		// Force: a container of the tag that a reaper has not removed yet (a roched
		// killed by the test, its sandboxes going at the lease's grace) would otherwise
		// keep the tag; the image itself stays under Image()'s name.
		c.ImageRemove(context.Background(), tag, image.RemoveOptions{Force: true})
		c.Close()
	}, nil
}
