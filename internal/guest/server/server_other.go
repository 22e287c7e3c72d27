//go:build !linux

package server

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"time"
)

// Version is reported by health.
const Version = "1"

// Config is what the agent is started with.
type Config struct {
	Socket      string
	SocketOwner int
	User        string
	Lifetime    time.Duration
	LeaseGrace  time.Duration
	FirstLease  time.Duration
	Log         *slog.Logger
	Listener    net.Listener
	ConnFD      int
	// EgressListen and EgressDial relay the sandbox's HTTP proxy port to the host.
	EgressListen string
	EgressDial   func() (net.Conn, error)
	Own          []string
	ChownFrom    int
	NProc        int
}

// Server is the in-sandbox agent; it exists only on Linux.
type Server struct{}

// New fails: the agent runs inside Linux sandboxes only.
func New(Config) (*Server, error) { return nil, errors.New("roche-agent runs on Linux only") }

// Run is never reached off Linux.
func (*Server) Run(context.Context) error { return errors.New("roche-agent runs on Linux only") }
