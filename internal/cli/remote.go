package cli

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/client"
	"github.com/roche-sandbox/roche/internal/localca"
	"github.com/roche-sandbox/roche/provider/kit"
)

// remoteDaemon is roched reached over TCP instead of its unix socket: --address, the
// CA that verifies it, and the client certificate it may require.
type remoteDaemon struct {
	address, ca, clientCert, clientKey string
	// err is why the client could not be made (a bad address, an unreadable CA).
	err error
}

func (e *env) addRemoteFlags(pf *pflag.FlagSet) {
	r := &e.daemon.remote
	pf.StringVar(&r.address, "address", e.getenv("ROCHE_ADDRESS"),
		"roched over TCP instead of the socket: https://HOST:PORT (TLS), or http://HOST:PORT on loopback (env ROCHE_ADDRESS);\nthe token comes from ROCHE_TOKEN_FILE or ROCHE_TOKEN")
	pf.StringVar(&r.ca, "ca", e.getenv("ROCHE_CA_FILE"), "PEM CA that verifies roched's certificate at an https:// --address (env ROCHE_CA_FILE; default: the system's)")
	pf.StringVar(&r.clientCert, "client-cert", e.getenv("ROCHE_CLIENT_CERT"), "PEM client certificate for a roched with --client-ca (env ROCHE_CLIENT_CERT)")
	pf.StringVar(&r.clientKey, "client-key", e.getenv("ROCHE_CLIENT_KEY"), "PEM key of --client-cert (env ROCHE_CLIENT_KEY)")
}

// connectRemote makes the client of --address once. It does not probe: the first call
// says in one line what is wrong (no daemon, an untrusted or expired certificate, a
// refused client certificate), and nothing falls back to running in this process.
func (d *daemonLink) connectRemote(e *env) *client.Client {
	d.once.Do(func() {
		r := &d.remote
		opts := []client.Option{client.WithAddress(r.address)}
		tok, err := remoteToken(e.getenv)
		if err != nil {
			r.err = err
			return
		}
		if tok != "" {
			opts = append(opts, client.WithToken(tok))
		}
		if r.ca != "" {
			opts = append(opts, client.WithCAFile(r.ca))
		}
		if r.clientCert != "" || r.clientKey != "" {
			opts = append(opts, client.WithClientCert(r.clientCert, r.clientKey))
		}
		if strings.HasPrefix(r.address, "tcp://") {
			r.err = fmt.Errorf("%w: --address %s: use https://%s (roched with TLS) or http://%s (plaintext, loopback)",
				roche.ErrInvalidConfig, r.address, strings.TrimPrefix(r.address, "tcp://"), strings.TrimPrefix(r.address, "tcp://"))
			return
		}
		c, err := client.New(opts...)
		if err != nil {
			r.err = fmt.Errorf("--address: %w", err)
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), remoteProbeTimeout)
		defer cancel()
		h, err := c.Health(ctx)
		if err != nil {
			c.Close()
			r.err = err
			return
		}
		e.log.Debug("using roched", "address", r.address, "pid", h.PID, "providers", h.Providers)
		d.c, d.providers = c, h.Providers
	})
	return d.c
}

// remoteProbeTimeout bounds the first call to a roched named by --address.
const remoteProbeTimeout = 10 * time.Second

// remoteErr says why the named provider cannot be had from the roched --address names,
// or nil when it can, or when no address was given (the socket's roched is used when it
// answers, and otherwise the provider runs in this process).
func (d *daemonLink) remoteErr(name string) error {
	r := &d.remote
	switch {
	case r.address == "" || d.direct:
		return nil
	case r.err != nil:
		return r.err
	case !slices.Contains(d.providers, name):
		// Not set up there: a list across providers passes it over.
		return kit.NotConfigured(fmt.Errorf("%w: roched at %s does not serve the %s provider (it serves %s)",
			roche.ErrUnavailable, r.address, name, strings.Join(d.providers, ", ")))
	}
	return nil
}

// remoteToken is the bearer token for --address: the file ROCHE_TOKEN_FILE names (only
// its owner may read it), else ROCHE_TOKEN. A token never comes from the command line.
func remoteToken(getenv func(string) string) (string, error) {
	if f := getenv("ROCHE_TOKEN_FILE"); f != "" {
		fi, err := os.Stat(f)
		if err != nil {
			return "", fmt.Errorf("%w: ROCHE_TOKEN_FILE: %v", roche.ErrInvalidConfig, err)
		}
		if fi.Mode().Perm()&0o077 != 0 {
			return "", fmt.Errorf("%w: ROCHE_TOKEN_FILE %s is open to group or others (mode %04o): chmod 600 %s", roche.ErrInvalidConfig, f, fi.Mode().Perm(), f)
		}
		b, err := os.ReadFile(f)
		if err != nil {
			return "", fmt.Errorf("%w: ROCHE_TOKEN_FILE: %v", roche.ErrInvalidConfig, err)
		}
		return strings.TrimSpace(string(b)), nil
	}
	return getenv("ROCHE_TOKEN"), nil
}

// localTLS keeps a local CA and a server certificate for the --listen host in dir/tls
// (localca.Ensure) and returns them with what to tell the user clients set.
func localTLS(listen, stateDir string) (localca.Paths, string, error) {
	u, err := url.Parse(listen)
	if listen == "" || err != nil || u.Scheme != "tcp" || u.Host == "" {
		return localca.Paths{}, "", fmt.Errorf("--tls serves TCP: give --listen tcp://HOST:PORT too")
	}
	host, port, err := net.SplitHostPort(u.Host)
	if err != nil {
		return localca.Paths{}, "", fmt.Errorf("--listen %s: %w", listen, err)
	}
	hosts := []string{"127.0.0.1", "::1", "localhost"}
	clientHost := host
	if ip := net.ParseIP(host); host == "" || ip != nil && ip.IsUnspecified() {
		// Every address: name this host's names and addresses, which clients may use.
		if name, err := os.Hostname(); err == nil {
			hosts = append(hosts, name)
		}
		if addrs, err := net.InterfaceAddrs(); err == nil {
			for _, a := range addrs {
				if n, ok := a.(*net.IPNet); ok {
					hosts = append(hosts, n.IP.String())
				}
			}
		}
		clientHost = "127.0.0.1"
	} else {
		hosts = append(hosts, host)
	}
	slices.Sort(hosts)
	hosts = slices.Compact(hosts)
	p, _, err := localca.Ensure(filepath.Join(stateDir, "tls"), hosts)
	if err != nil {
		return p, "", err
	}
	note := fmt.Sprintf("TLS with a local CA: clients set ROCHE_ADDRESS=https://%s ROCHE_CA_FILE=%s (roche --ca, Roche(ca=...))\n",
		net.JoinHostPort(clientHost, port), p.CA)
	return p, note, nil
}

// daemonClientCertCommand signs a client certificate with the local CA of daemon start
// --tls, for a roched started with --client-ca on that CA.
func (e *env) daemonClientCertCommand() *cobra.Command {
	var out string
	var validFor time.Duration
	c := &cobra.Command{
		Use:   "client-cert TENANT",
		Short: "Sign a client certificate for a tenant with roched's local CA (daemon start --tls)",
		Long: `Sign a client certificate whose Common Name is TENANT with the local CA that
roche daemon start --tls keeps beside --socket (made now if missing), and write it and its
key (mode 0600) to --out. A roched given that CA with --client-ca serves the holder as
TENANT: roche daemon start --tls --client-ca DIR/tls/ca.pem. It prints what the client
sets: ROCHE_CLIENT_CERT and ROCHE_CLIENT_KEY (roche --client-cert/--client-key,
Roche(client_cert=..., client_key=...)).`,
		Example: `  roche daemon client-cert acme --out ~/acme-tls`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			name := args[0]
			if name == "" || strings.ContainsAny(name, "/\\ \t\n") {
				return fmt.Errorf("%w: tenant %q: give the tenant's name, as roched's tokens file lists it", roche.ErrInvalidConfig, name)
			}
			dir := filepath.Join(filepath.Dir(client.StateFile(e.daemon.socket)), "tls")
			p, err := localca.EnsureCA(dir)
			if err != nil {
				return err
			}
			ca, err := localca.Load(p.CA, p.CAKey)
			if err != nil {
				return err
			}
			if out == "" {
				out = dir
			}
			if err := os.MkdirAll(out, 0o700); err != nil {
				return err
			}
			now := time.Now()
			leaf, err := ca.Client(name, now.Add(-time.Minute), now.Add(validFor))
			if err != nil {
				return err
			}
			certFile, keyFile := filepath.Join(out, name+"-client.pem"), filepath.Join(out, name+"-client-key.pem")
			if err := leaf.Write(certFile, keyFile); err != nil {
				return err
			}
			fmt.Fprintf(e.stdout, "client certificate for %s: ROCHE_CLIENT_CERT=%s ROCHE_CLIENT_KEY=%s (roched needs --client-ca %s)\n", name, certFile, keyFile, p.CA)
			return nil
		},
	}
	c.Flags().StringVar(&out, "out", "", "directory to write TENANT-client.pem and TENANT-client-key.pem to (default: the local CA's)")
	c.Flags().DurationVar(&validFor, "valid-for", localca.ServerValidity, "how long the certificate is valid")
	return c
}
