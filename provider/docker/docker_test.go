package docker_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/internal/testenv"
	"github.com/roche-sandbox/roche/provider/docker"
	"github.com/roche-sandbox/roche/provider/providertest"
)

func TestMain(m *testing.M) {
	// The test binary doubles as the listener that network tests run inside a network
	// namespace of their own.
	if addrs := os.Getenv(bannerListenEnv); addrs != "" {
		os.Exit(serveBanners(strings.Split(addrs, ","), os.Getenv(bannerTextEnv)))
	}
	// Or the second local user's probe of sandboxes' control channels (control_test.go).
	if arg := os.Getenv(controlProbeEnv); arg != "" {
		os.Exit(controlProbe(arg))
	}
	// Or the creator a lease test kills (lease_test.go), with the parent's roche-agent.
	if mode := os.Getenv(leaseChildEnv); mode != "" {
		os.Exit(leaseChild(mode))
	}
	// Every exec, copy and attach must have let go of its goroutines.
	os.Exit(testenv.RunWithAgent(m))
}

// Environment of the banner listener mode of the test binary.
const (
	bannerListenEnv = "ROCHE_TEST_BANNER_LISTEN"
	bannerTextEnv   = "ROCHE_TEST_BANNER_TEXT"
)

// serveBanners listens on every address, prints "ready", and writes the banner to every
// connection, until killed.
func serveBanners(addrs []string, banner string) int {
	for _, a := range addrs {
		ln, err := net.Listen("tcp", a)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				fmt.Fprintln(c, banner)
				c.Close()
			}
		}()
	}
	fmt.Println("ready")
	select {}
}

func newProvider(t *testing.T, opts ...docker.Option) *docker.Provider {
	t.Helper()
	testenv.Needs(t, testenv.Docker)
	p, err := docker.New(opts...)
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

func testConfig() roche.Config {
	cfg := roche.DefaultConfig()
	cfg.Image = testenv.Image()
	return cfg
}

// TestConformance runs the suite over roche-agent, the normal path.
func TestConformance(t *testing.T) {
	p := newProvider(t)
	info, err := p.Create(context.Background(), testConfig())
	if err != nil {
		t.Fatal(err)
	}
	p.Destroy(context.Background(), info.ID)
	if info.Transport != docker.TransportAgent {
		t.Fatalf("transport %q, want %q: the suite would not test the agent", info.Transport, docker.TransportAgent)
	}
	providertest.Run(t, p, providertest.Options{Config: testConfig(), PidsExact: true})
}

// TestConformanceExecFallback runs the suite over Docker's exec API, the transport asked
// for with --transport docker-exec (or WithExecFallback where the agent cannot start).
func TestConformanceExecFallback(t *testing.T) {
	p := newProvider(t, docker.WithTransport(docker.TransportDockerExec))
	providertest.Run(t, p, providertest.Options{Config: testConfig()})
}

// TestConformanceRunsc runs the suite on gVisor (WithRuntime(RuntimeGVisor)), registered
// with the engine by scripts/runsc.sh, as make test does.
func TestConformanceRunsc(t *testing.T) {
	p := newProvider(t, docker.WithRuntime(docker.RuntimeGVisor), docker.WithEgressProxy())
	providertest.Run(t, p, providertest.Options{Config: testConfig(), GVisor: true, PidsExact: true})
}
