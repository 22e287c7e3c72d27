package kubernetes

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/httpstream"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/remotecommand"

	"github.com/hashicorp/yamux"

	"github.com/roche-sandbox/roche/internal/guest/podlink"
	"github.com/roche-sandbox/roche/internal/guest/vmlink"
)

// dialAgent opens one connection to the agent of Pod id: a stream of the sandbox's
// multiplexed relay session (one pods/exec of "roche-agent mux", opened on first use and
// again when it has ended).
func (p *Provider) dialAgent(ctx context.Context, id string) (net.Conn, error) {
	for attempt := 0; ; attempt++ {
		sess, err := p.session(ctx, id)
		if err != nil {
			return nil, err
		}
		st, err := sess.OpenStream()
		if err == nil {
			return st, nil
		}
		p.dropSession(id, sess)
		if attempt == 1 {
			return nil, fmt.Errorf("reaching the agent of sandbox %s: %w", id, err)
		}
	}
}

// session returns the open relay session of sandbox id, opening one if there is none.
func (p *Provider) session(ctx context.Context, id string) (*yamux.Session, error) {
	p.sessMu.Lock()
	defer p.sessMu.Unlock()
	if s := p.sessions[id]; s != nil && !s.IsClosed() {
		return s, nil
	}
	px, err := p.egressProxy(ctx, id)
	if err != nil {
		return nil, err
	}
	mode := []string{podlink.MuxArg}
	if px != nil {
		mode = append(mode, podlink.EgressArg)
	}
	c, err := p.execRelay(ctx, id, mode...)
	if err != nil {
		return nil, err
	}
	s, err := yamux.Client(c, vmlink.MuxConfig())
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("reaching the agent of sandbox %s: %w", id, err)
	}
	if px != nil {
		// The relay opens a stream for each connection the agent makes to the egress
		// socket: the session is the proxy's listener, until it ends.
		go func() { _ = px.Serve(s) }()
	}
	p.sessions[id] = s
	return s, nil
}

// dropSession closes the relay session of sandbox id (only s, when given, so that a
// newer one stays).
func (p *Provider) dropSession(id string, s *yamux.Session) {
	p.sessMu.Lock()
	cur := p.sessions[id]
	if s == nil || cur == s {
		delete(p.sessions, id)
	}
	p.sessMu.Unlock()
	if s == nil {
		s = cur
	}
	if s != nil {
		s.Close()
	}
}

// dropSessions closes every relay session (Close).
func (p *Provider) dropSessions() {
	p.sessMu.Lock()
	all := p.sessions
	p.sessions = map[string]*yamux.Session{}
	p.sessMu.Unlock()
	for _, s := range all {
		s.Close()
	}
}

// execRelay runs the agent's relay in mode (podlink.RelayArg; MuxArg, maybe EgressArg) in Pod id through
// the API server, over WebSocket, or SPDY where the API server or a proxy on the way does
// not upgrade to it, and returns its stdin and stdout as a connection. The connection
// lives until it is closed or the stream ends, whatever becomes of ctx.
func (p *Provider) execRelay(ctx context.Context, id string, mode ...string) (*execConn, error) {
	req := p.cs.CoreV1().RESTClient().Post().
		Namespace(p.namespace).Resource("pods").Name(id).SubResource("exec").
		VersionedParams(&corev1.PodExecOptions{
			Container: containerSandbox,
			Command:   append([]string{podlink.Agent}, mode...),
			Stdin:     true, Stdout: true, Stderr: true,
		}, scheme.ParameterCodec)
	ws, err := remotecommand.NewWebSocketExecutor(p.rest, "GET", req.URL().String())
	if err != nil {
		return nil, fmt.Errorf("reaching the agent of sandbox %s: %w", id, err)
	}
	spdy, err := remotecommand.NewSPDYExecutor(p.rest, "POST", req.URL())
	if err != nil {
		return nil, fmt.Errorf("reaching the agent of sandbox %s: %w", id, err)
	}
	exe, err := remotecommand.NewFallbackExecutor(ws, spdy, func(err error) bool {
		return httpstream.IsUpgradeFailure(err) || httpstream.IsHTTPSProxyError(err)
	})
	if err != nil {
		return nil, fmt.Errorf("reaching the agent of sandbox %s: %w", id, err)
	}
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	c := &execConn{id: id, in: inW, out: outR, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(c.done)
		stderr := &limitedBuffer{max: 4 << 10}
		err := exe.StreamWithContext(sctx, remotecommand.StreamOptions{Stdin: inR, Stdout: outW, Stderr: stderr})
		if err != nil && sctx.Err() == nil {
			msg := strings.TrimSpace(stderr.String())
			if msg != "" {
				err = fmt.Errorf("%w (%s)", err, firstLine(msg))
			}
			outW.CloseWithError(fmt.Errorf("the exec stream to the agent of sandbox %s ended: %w", id, err))
		} else {
			outW.Close()
		}
		// A write still waiting for the stream fails rather than hangs; the executor's
		// copy of stdin, which may outlive the stream, reads a clean end.
		inW.Close()
	}()
	return c, nil
}

// execConn is one exec stream seen as a net.Conn: writes go to the relay's stdin, reads
// come from its stdout.
type execConn struct {
	id     string
	in     *io.PipeWriter
	out    *io.PipeReader
	cancel context.CancelFunc
	done   chan struct{}
	once   sync.Once
}

func (c *execConn) Read(b []byte) (int, error)  { return c.out.Read(b) }
func (c *execConn) Write(b []byte) (int, error) { return c.in.Write(b) }

// Close ends the relay's stdin, which ends its connection to the agent and so the relay:
// the stream then ends on its own. What the relay still sends is drained meanwhile; a
// stream that does not end within closeGrace is torn down.
func (c *execConn) Close() error {
	c.once.Do(func() {
		c.in.Close()
		go func() {
			_, _ = io.Copy(io.Discard, c.out)
		}()
		go func() {
			select {
			case <-c.done:
			case <-time.After(closeGrace):
			}
			c.cancel()
			c.out.Close()
		}()
	})
	return nil
}

// closeGrace is how long a closed connection's stream may take to end on its own.
const closeGrace = 10 * time.Second

type execAddr string

func (a execAddr) Network() string { return "pods/exec" }
func (a execAddr) String() string  { return string(a) }

func (c *execConn) LocalAddr() net.Addr  { return execAddr("roche") }
func (c *execConn) RemoteAddr() net.Addr { return execAddr(c.id) }

var errNoDeadlines = errors.New("an exec stream to the agent has no deadlines: cancel the context instead")

func (c *execConn) SetDeadline(time.Time) error      { return errNoDeadlines }
func (c *execConn) SetReadDeadline(time.Time) error  { return errNoDeadlines }
func (c *execConn) SetWriteDeadline(time.Time) error { return errNoDeadlines }

// limitedBuffer keeps the first max bytes written to it (the relay's error message).
type limitedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
	max int
}

func (b *limitedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if room := b.max - b.buf.Len(); room > 0 {
		b.buf.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

func (b *limitedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
