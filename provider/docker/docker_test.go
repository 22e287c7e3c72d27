package docker_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/provider/docker"
	"github.com/roche-sandbox/roche/provider/providertest"
)

// testImage is built by scripts/build-test-image.sh (the README's test command runs it).
func testImage() string {
	if img := os.Getenv("ROCHE_TEST_IMAGE"); img != "" {
		return img
	}
	return "roche/python:local"
}

func newProvider(t *testing.T) *docker.Provider {
	t.Helper()
	p, err := docker.New()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := p.Ping(ctx); err != nil {
		t.Fatalf("%v (the README's test command starts dockerd and builds the image)", err)
	}
	return p
}

func TestConformance(t *testing.T) {
	p := newProvider(t)
	cfg := roche.DefaultConfig()
	cfg.Image = testImage()
	providertest.Run(t, p, providertest.Options{Config: cfg})
}
