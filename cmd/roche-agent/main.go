// Command roche-agent runs as PID 1 inside every sandbox and serves exec, signals,
// background processes and files over a unix socket (see package agent). It is built
// static (CGO_ENABLED=0) and bind-mounted read-only into the sandbox by the provider.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"

	"github.com/roche-sandbox/roche/agent/podlink"
	"github.com/roche-sandbox/roche/agent/server"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "roche-agent: %v\n", err)
		os.Exit(1)
	}
}

func run() error {
	if mode := vmMode(); mode != nil {
		return mode()
	}
	// The two modes of a Kubernetes Pod (see package podlink): install the agent from
	// its image into the Pod's agent volume, and relay one host connection to the agent.
	if len(os.Args) > 1 {
		switch os.Args[1] {
		case podlink.InstallArg:
			if len(os.Args) != 3 {
				return fmt.Errorf("usage: roche-agent %s DIR", podlink.InstallArg)
			}
			self, err := os.Executable()
			if err != nil {
				return err
			}
			return podlink.Install(self, os.Args[2])
		case podlink.RelayArg:
			return podlink.Relay(podlink.Socket, os.Stdin, os.Stdout)
		case podlink.MuxArg:
			return podlink.Mux(podlink.Socket, os.Stdin, os.Stdout)
		}
	}
	socket := flag.String("socket", "/.roche/run/agent.sock", "unix socket to serve on")
	owner := flag.Int("owner", 0, "host uid allowed to connect to the socket")
	user := flag.String("user", "65534:65534", "uid[:gid] or name commands run as")
	lifetime := flag.Duration("lifetime", 0, "stop after this long (0: never)")
	leaseGrace := flag.Duration("lease-grace", 0, "make the sandbox leased: stop this long after the last lease holder goes (0: not leased)")
	firstLease := flag.Duration("first-lease", 0, "with --lease-grace: stop when no lease was taken this long after the start (0: 30s)")
	egressListen := flag.String("egress-listen", "", "loopback address to accept HTTP proxy connections on (e.g. 127.0.0.1:3128)")
	egressSocket := flag.String("egress-socket", "", "unix socket of the host's egress proxy, where those connections are relayed")
	own := flag.String("own", "", "directory to hand to the sandbox user at start if root owns it (a workspace)")
	chownFrom := flag.Int("chown-from", 0, "uid whose files on the root filesystem are handed to the sandbox user at start (the uid of the sandbox a snapshot was taken of)")
	nproc := flag.Int("nproc", 0, "cap the sandbox user's processes and threads (RLIMIT_NPROC; 0: no cap)")
	version := flag.Bool("version", false, "print the version and exit")
	flag.Parse()
	if *version {
		fmt.Println(server.Version)
		return nil
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	cfg := server.Config{
		Socket: *socket, SocketOwner: *owner, User: *user, Lifetime: *lifetime, Log: log,
		LeaseGrace: *leaseGrace, FirstLease: *firstLease,
		ChownFrom: *chownFrom, NProc: *nproc,
	}
	if *own != "" {
		cfg.Own = []string{*own}
	}
	if *egressListen != "" {
		sock := *egressSocket
		cfg.EgressListen = *egressListen
		cfg.EgressDial = func() (net.Conn, error) { return net.Dial("unix", sock) }
	}
	s, err := server.New(cfg)
	if err != nil {
		return err
	}
	return s.Run(context.Background())
}
