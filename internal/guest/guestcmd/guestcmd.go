// Package guestcmd is roche-agent's command line: the program that runs as PID 1 inside
// every sandbox. It lives in a package, not only in cmd/roche-agent, so that roche and
// roched can carry the agent too (one static binary has everything): a program calls
// RunIfAsked first thing in main, and when it was started as the agent (by the name
// roche-agent, as providers mount it, or as a microVM's /init) it runs as the agent and
// exits; otherwise RunIfAsked returns and marks the program as one that carries it.
package guestcmd

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"

	"github.com/roche-sandbox/roche/internal/guest"
	"github.com/roche-sandbox/roche/internal/guest/guestbin"
	"github.com/roche-sandbox/roche/internal/guest/podlink"
	"github.com/roche-sandbox/roche/internal/guest/server"
)

// RunIfAsked runs the agent and exits when this process was started as one: its name is
// roche-agent (providers mount it under that name), or it is a microVM's init.
// Otherwise it returns at once, and guestbin.Path offers this executable as the agent
// when no roche-agent is found beside it.
func RunIfAsked() {
	if filepath.Base(os.Args[0]) == guestbin.Name || server.IsVMInit() {
		os.Exit(Main(os.Args[1:], os.Stdout, os.Stderr))
	}
	guestbin.MarkCarried()
}

// Main runs roche-agent with args (without the program name) and returns its exit status.
func Main(args []string, stdout, stderr io.Writer) int {
	if err := run(args, stdout, stderr); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintf(stderr, "roche-agent: %v\n", err)
		return 1
	}
	return 0
}

func run(args []string, stdout, stderr io.Writer) error {
	// The kernel starts a microVM's agent as /init from the initramfs.
	if server.IsVMInit() {
		return server.RunVM()
	}
	// The modes of a Kubernetes Pod (see package podlink): install the agent from its
	// image into the Pod's agent volume, and relay host connections to the agent.
	if len(args) > 0 {
		switch args[0] {
		case podlink.InstallArg:
			if len(args) != 2 {
				return fmt.Errorf("usage: roche-agent %s DIR", podlink.InstallArg)
			}
			self, err := os.Executable()
			if err != nil {
				return err
			}
			return podlink.Install(self, args[1])
		case podlink.RelayArg:
			return podlink.Relay(podlink.Socket, os.Stdin, os.Stdout)
		case podlink.MuxArg:
			egress := ""
			switch {
			case len(args) == 2 && args[1] == podlink.EgressArg:
				egress = podlink.EgressSocket
			case len(args) != 1:
				return fmt.Errorf("usage: roche-agent %s [%s]", podlink.MuxArg, podlink.EgressArg)
			}
			return podlink.Mux(podlink.Socket, os.Stdin, os.Stdout, egress)
		}
	}
	cfg, version, err := Parse(args, stderr)
	if err != nil {
		return err
	}
	if version {
		fmt.Fprintln(stdout, server.Version)
		return nil
	}
	cfg.Log = slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	fitProcs()
	s, err := server.New(cfg)
	if err != nil {
		return err
	}
	return s.Run(context.Background())
}

// Parse reads roche-agent's flags (args without the program name, as providers write
// them: provider/internal/agentspec) into the server's config; version reports
// --version. Usage and errors go to stderr.
func Parse(args []string, stderr io.Writer) (cfg server.Config, version bool, err error) {
	fs := flag.NewFlagSet(guestbin.Name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	socket := fs.String("socket", "/.roche/run/agent.sock", "unix socket to serve on")
	connFD := fs.Int("conn-fd", 0, "serve the one connection on this inherited descriptor (a socket) instead of --socket, and stop when it ends: a one-shot sandbox's (0: none)")
	owner := fs.Int("owner", 0, "host uid allowed to connect to the socket")
	user := fs.String("user", "65534:65534", "uid[:gid] or name commands run as")
	lifetime := fs.Duration("lifetime", 0, "stop after this long (0: never)")
	leaseGrace := fs.Duration("lease-grace", 0, "make the sandbox leased: stop this long after the last lease holder goes (0: not leased)")
	firstLease := fs.Duration("first-lease", 0, "with --lease-grace: stop when no lease was taken this long after the start (0: 30s)")
	egressListen := fs.String("egress-listen", "", "loopback address to accept HTTP proxy connections on (e.g. 127.0.0.1:3128)")
	egressSocket := fs.String("egress-socket", "", "unix socket of the host's egress proxy, where those connections are relayed")
	own := fs.String("own", "", "directory to hand to the sandbox user at start if root owns it (a workspace)")
	chownFrom := fs.Int("chown-from", 0, "uid whose files on the root filesystem are handed to the sandbox user at start (the uid of the sandbox a snapshot was taken of)")
	nproc := fs.Int("nproc", 0, "cap the sandbox user's processes and threads at exactly this many (RLIMIT_NPROC; 0: no cap)")
	forkAsUser := fs.Bool("fork-as-user", false, "start commands from a thread running as the sandbox user, so that a kernel counting tasks by their creator's user (gVisor) counts them against --nproc")
	scratchMax := fs.Int64("scratch-max", 0, "refuse to start unless /tmp and /dev/shm are tmpfs of at most this many bytes (0: no check)")
	nofile := fs.Int("nofile", 0, fmt.Sprintf("open files per process, for the agent and every command (RLIMIT_NOFILE, soft and hard; 0: %d; -1: as started)", guest.OpenFiles))
	versionFlag := fs.Bool("version", false, "print the version and exit")
	if err := fs.Parse(args); err != nil {
		return server.Config{}, false, err
	}
	cfg = server.Config{
		Socket: *socket, ConnFD: *connFD, SocketOwner: *owner, User: *user, Lifetime: *lifetime,
		LeaseGrace: *leaseGrace, FirstLease: *firstLease,
		ChownFrom: *chownFrom, NProc: *nproc, ForkAsUser: *forkAsUser, NoFile: *nofile,
		ScratchMax: *scratchMax,
	}
	if *own != "" {
		cfg.Own = []string{*own}
	}
	if *egressListen != "" {
		sock := *egressSocket
		cfg.EgressListen = *egressListen
		cfg.EgressDial = func() (net.Conn, error) { return net.Dial("unix", sock) }
	}
	return cfg, *versionFlag, nil
}
