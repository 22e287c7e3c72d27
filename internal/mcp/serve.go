package mcp

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/internal/secretfile"
)

// ServeStdio serves one client over r and w (a process's stdin and stdout) until it
// disconnects or ctx ends.
func (s *Server) ServeStdio(ctx context.Context, r io.Reader, w io.Writer) error {
	err := s.server.Run(ctx, &mcp.IOTransport{Reader: io.NopCloser(r), Writer: nopWriteCloser{w}})
	if errors.Is(err, io.EOF) || errors.Is(err, context.Canceled) {
		return nil // the client hung up, or we were told to stop
	}
	return err
}

type nopWriteCloser struct{ io.Writer }

func (nopWriteCloser) Close() error { return nil }

// Handler serves the streamable HTTP transport. With a token, every request must carry
// "Authorization: Bearer TOKEN". Requests from browsers of other origins are refused, and
// so are requests to a loopback address that name another host (DNS rebinding).
func (s *Server) Handler(token string) http.Handler {
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s.server },
		&mcp.StreamableHTTPOptions{Logger: s.log, SessionTimeout: 30 * time.Minute})
	var next http.Handler = http.NewCrossOriginProtection().Handler(h)
	if token == "" {
		return next
	}
	want := []byte("Bearer " + token)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if subtle.ConstantTimeCompare([]byte(r.Header.Get("Authorization")), want) != 1 {
			w.Header().Set("WWW-Authenticate", "Bearer")
			http.Error(w, "missing or wrong bearer token: send Authorization: Bearer TOKEN (roche mcp's --token-file or ROCHE_MCP_TOKEN)", http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// MinTokenLength is the shortest bearer token the server takes, as roched's: a token
// is all that stands between a caller and running code.
const MinTokenLength = secretfile.MinTokenLength

// CheckListen refuses to serve code execution beyond this host: the server speaks plain
// HTTP, so a bearer token and the code sent would cross the network readable by anyone
// on the way. A loopback address serves this host's clients; others reach it through
// what encrypts the way (an SSH tunnel, a TLS proxy on this host). A token, when given,
// must be at least MinTokenLength characters.
func CheckListen(addr, token string) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("%w: --http %q: give HOST:PORT, e.g. 127.0.0.1:8765", roche.ErrInvalidConfig, addr)
	}
	if token != "" {
		if err := secretfile.CheckToken(token, "the MCP token"); err != nil {
			return err
		}
	}
	if ip := net.ParseIP(host); host == "localhost" || (ip != nil && ip.IsLoopback()) {
		return nil
	}
	if port == "" || port == "0" {
		port = "8765"
	}
	return fmt.Errorf("%w: refusing to serve %s: roche mcp speaks plain HTTP, so its token and the code sent would cross the network unencrypted; "+
		"serve on 127.0.0.1 (--http 127.0.0.1:%s) and reach it from elsewhere through an SSH tunnel (ssh -L %s:127.0.0.1:%s THIS-HOST) "+
		"or a TLS-terminating proxy on this host, with --token-file; or run roche mcp over stdio on the client's own host, reaching roched there over TLS (roche --address https://HOST:PORT mcp)",
		roche.ErrInvalidConfig, addr, port, port, port)
}

// ServeHTTP serves the streamable HTTP transport on l until ctx ends, then stops
// accepting and gives calls in progress up to grace to finish.
func (s *Server) ServeHTTP(ctx context.Context, l net.Listener, token string, grace time.Duration) error {
	srv := &http.Server{Handler: s.Handler(token), ReadHeaderTimeout: 10 * time.Second}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(l) }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), grace)
	defer cancel()
	err := srv.Shutdown(sctx)
	if errors.Is(err, context.DeadlineExceeded) {
		err = srv.Close()
	}
	if serr := <-done; !errors.Is(serr, http.ErrServerClosed) && serr != nil {
		return serr
	}
	return err
}
