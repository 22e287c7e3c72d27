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
			http.Error(w, "missing or wrong bearer token: send Authorization: Bearer TOKEN (roche mcp's --token)", http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// CheckListen refuses to serve code execution to a network without a token: only a
// loopback address may go without one.
func CheckListen(addr, token string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("%w: --http %q: give HOST:PORT, e.g. 127.0.0.1:8765", roche.ErrInvalidConfig, addr)
	}
	if token != "" {
		return nil
	}
	if ip := net.ParseIP(host); host == "localhost" || (ip != nil && ip.IsLoopback()) {
		return nil
	}
	return fmt.Errorf("%w: refusing to serve %s without a token: anyone who can reach it could run code; "+
		"pass --token (or ROCHE_MCP_TOKEN), or listen on 127.0.0.1", roche.ErrInvalidConfig, addr)
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
