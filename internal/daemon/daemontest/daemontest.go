// Package daemontest runs roched in a test's own process, for the tests of what talks to
// it (client, internal/cli): the real Docker provider, a socket in a short temporary
// directory, a client of it, and all of it shut down when the test ends.
// internal/daemon's own tests have their own set-up (helpers_test.go), which sees the
// daemon's insides and checks that nothing made through it survives.
package daemontest

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/client"
	"github.com/roche-sandbox/roche/internal/daemon"
	"github.com/roche-sandbox/roche/internal/testenv"
	"github.com/roche-sandbox/roche/provider/docker"
)

// Served is a daemon running in the test's process.
type Served struct {
	Daemon *daemon.Daemon
	// Client talks to it over its socket.
	Client *client.Client
	// Docker is the provider it serves, for looking at the engine behind its back.
	Docker *docker.Provider
	Socket string
}

// Serve starts a daemon with cfg (on a fresh socket unless cfg names one) serving the
// Docker provider, failing the test, not skipping it, when the engine does not answer
// (the fast tier skips it: testenv.Needs).
// When the test ends the client is closed, the daemon shut down (a failed shutdown
// fails the test) and the provider closed.
func Serve(t testing.TB, cfg daemon.Config) *Served {
	t.Helper()
	testenv.Needs(t, testenv.Docker)
	dp, err := docker.New(docker.WithEgressProxy()) // as roched runs it
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := dp.Ping(ctx); err != nil {
		dp.Close()
		t.Fatalf("%v (the README's test command starts dockerd and builds the image)", err)
	}
	if cfg.Socket == "" {
		cfg.Socket = filepath.Join(testenv.ShortDir(t), "roched.sock")
	}
	d, err := daemon.New(cfg, map[string]roche.Provider{"docker": dp})
	if err != nil {
		dp.Close()
		t.Fatal(err)
	}
	if err := d.Start(ctx); err != nil {
		dp.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := d.Shutdown(context.Background()); err != nil {
			t.Error(err)
		}
		dp.Close()
	})
	c, err := client.New(client.WithSocket(cfg.Socket))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() }) // before the shutdown: cleanups run last first
	return &Served{Daemon: d, Client: c, Docker: dp, Socket: cfg.Socket}
}
