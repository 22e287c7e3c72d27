package guest

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"
)

// Client talks to one sandbox's agent over its unix socket. It is safe for concurrent
// use: each operation has a connection of its own.
type Client struct {
	socket string
	dialer net.Dialer
	// dial, when set, replaces dialing socket (transports other than a unix socket path).
	dial func(ctx context.Context) (net.Conn, error)
}

// NewClient returns a client for the agent listening on socket.
func NewClient(socket string) *Client { return &Client{socket: socket} }

// NewClientWithDialer returns a client that reaches the agent through dial, for
// transports other than a unix socket path (a microVM's vsock). name is reported by
// Socket, for messages.
func NewClientWithDialer(name string, dial func(ctx context.Context) (net.Conn, error)) *Client {
	return &Client{socket: name, dial: dial}
}

// Socket is the socket path the client dials.
func (c *Client) Socket() string { return c.socket }

// ReaderSize is the read buffer of a connection, at either end (the client here, the
// agent's server). Frames of output or files larger than it are read past it, straight
// into the frame's buffer; what it saves is a system call per small frame. An exec of
// true reads two frames, and the 64 KiB it had cost more to allocate and collect than
// the rest of the call.
const ReaderSize = 8 << 10

// session is one operation's connection.
type session struct {
	nc  net.Conn
	r   *bufio.Reader
	wmu sync.Mutex
	buf []byte
}

func (c *Client) open(ctx context.Context, req Request) (*session, error) {
	var nc net.Conn
	var err error
	if c.dial != nil {
		nc, err = c.dial(ctx)
	} else {
		nc, err = c.dialer.DialContext(ctx, "unix", c.socket)
	}
	if err != nil {
		return nil, fmt.Errorf("connecting to the sandbox agent: %w", err)
	}
	s := &session{nc: nc, r: bufio.NewReaderSize(nc, ReaderSize)}
	if err := s.sendJSON(FrameRequest, req); err != nil {
		nc.Close()
		return nil, err
	}
	return s, nil
}

// closeOnDone closes the session's connection when ctx ends, which makes the agent kill
// a foreground command; the returned func stops watching.
func (s *session) closeOnDone(ctx context.Context) func() bool {
	return context.AfterFunc(ctx, func() { s.nc.Close() })
}

func (s *session) send(kind byte, p []byte) error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	return WriteFrame(s.nc, kind, p)
}

func (s *session) sendJSON(kind byte, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return s.send(kind, b)
}

func (s *session) read() (byte, []byte, error) {
	kind, p, err := ReadFrame(s.r, s.buf)
	if err == nil && cap(p) > cap(s.buf) {
		s.buf = p[:0]
	}
	return kind, p, err
}

// reply reads a single reply frame into v (nil to ignore it), or the agent's error.
func (s *session) reply(v any) error {
	kind, p, err := s.read()
	if err != nil {
		return fmt.Errorf("reading the agent's reply: %w", err)
	}
	return decode(kind, p, FrameReply, v)
}

func decode(kind byte, p []byte, want byte, v any) error {
	switch kind {
	case want:
		if v == nil {
			return nil
		}
		return json.Unmarshal(p, v)
	case FrameError:
		var e Error
		if err := json.Unmarshal(p, &e); err != nil {
			return fmt.Errorf("malformed agent error: %w", err)
		}
		return &e
	}
	return fmt.Errorf("unexpected agent frame %q", kind)
}

// ExecOptions carries the streams of a command.
type ExecOptions struct {
	Stdin          io.Reader
	Stdout, Stderr io.Writer
	// Started, if set, is called with the command's started frame once it runs (on an
	// attach, with where the replay starts).
	Started func(Started)
	// Signals, if set, are forwarded to the command's process group while it runs.
	Signals <-chan int
	// Resize, if set, resizes the command's terminal (a Request with TTY) while it runs.
	Resize <-chan Winsize
}

// Exec runs a command and waits for its result. Cancelling ctx closes the connection,
// and the agent then kills a foreground command with everything it started.
func (c *Client) Exec(ctx context.Context, req Request, opts ExecOptions) (Result, error) {
	req.Op = OpExec
	req.Stdin = opts.Stdin != nil
	s, err := c.open(ctx, req)
	if err != nil {
		return Result{}, err
	}
	defer s.nc.Close()
	stop := s.closeOnDone(ctx)
	defer stop()
	if opts.Stdin != nil {
		go s.pumpStdin(opts.Stdin)
	}
	if opts.Signals != nil {
		done := make(chan struct{})
		defer close(done)
		go func() {
			for {
				select {
				case sig := <-opts.Signals:
					_ = s.sendJSON(FrameSignal, SignalRequest{Signal: sig})
				case <-done:
					return
				}
			}
		}()
	}
	if opts.Resize != nil {
		done := make(chan struct{})
		defer close(done)
		go func() {
			for {
				select {
				case ws := <-opts.Resize:
					_ = s.sendJSON(FrameResize, ws)
				case <-done:
					return
				}
			}
		}()
	}
	return s.output(ctx, opts)
}

func (s *session) pumpStdin(r io.Reader) {
	buf := make([]byte, 32<<10)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			if s.send(FrameStdin, buf[:n]) != nil {
				return
			}
		}
		if err != nil {
			_ = s.send(FrameStdinEOF, nil)
			return
		}
	}
}

// output reads output frames until the result.
func (s *session) output(ctx context.Context, opts ExecOptions) (Result, error) {
	for {
		kind, p, err := s.read()
		if err != nil {
			if ctx.Err() != nil {
				return Result{}, ctx.Err()
			}
			return Result{}, fmt.Errorf("the sandbox agent closed the connection mid-command (did the sandbox stop?): %w", err)
		}
		switch kind {
		case FrameStdout:
			if opts.Stdout != nil {
				_, _ = opts.Stdout.Write(p)
			}
		case FrameStderr:
			if opts.Stderr != nil {
				_, _ = opts.Stderr.Write(p)
			}
		case FrameStarted:
			if opts.Started != nil {
				var st Started
				if err := json.Unmarshal(p, &st); err != nil {
					return Result{}, fmt.Errorf("malformed started frame from the agent: %w", err)
				}
				opts.Started(st)
			}
		case FrameResult, FrameError:
			var res Result
			return res, decode(kind, p, FrameResult, &res)
		default:
			return Result{}, fmt.Errorf("unexpected agent frame %q", kind)
		}
	}
}

// Start runs a durable command in the background and returns its started frame at
// once; the command keeps running, and its output is kept for Connect. With req.Stdin
// its stdin stays open for SendInput. With req.Key, a command the agent still knows
// by that key is returned (Existing) instead of a new one.
func (c *Client) Start(ctx context.Context, req Request) (Started, error) {
	req.Op = OpExec
	req.Background = true
	s, err := c.open(ctx, req)
	if err != nil {
		return Started{}, err
	}
	defer s.nc.Close()
	stop := s.closeOnDone(ctx)
	defer stop()
	kind, p, err := s.read()
	if err != nil {
		if ctx.Err() != nil {
			return Started{}, ctx.Err()
		}
		return Started{}, fmt.Errorf("reading the agent's reply: %w", err)
	}
	if kind == FrameStderr { // the command could not start; its result follows
		msg := string(p)
		kind, p, err = s.read()
		if err == nil && kind == FrameResult {
			return Started{}, &Error{Code: CodeNotFound, Message: msg}
		}
	}
	var st Started
	if err := decode(kind, p, FrameStarted, &st); err != nil {
		return Started{}, err
	}
	return st, nil
}

// Attach reconnects to a durable command: the output still kept first, then the rest
// and the result. Cancelling ctx detaches without stopping the command.
func (c *Client) Attach(ctx context.Context, pid int, opts ExecOptions) (Result, error) {
	return c.Connect(ctx, Request{PID: pid}, opts)
}

// Connect follows the durable command req names (PID, else Tag) from req.From (nil:
// the first byte still kept): opts.Started hears where the replay starts, the output
// follows in the order it was written, then the rest as it comes, and the result. An
// offset the window no longer keeps is an Error with CodeGone. Cancelling ctx detaches
// without stopping the command.
func (c *Client) Connect(ctx context.Context, req Request, opts ExecOptions) (Result, error) {
	req.Op = OpAttach
	s, err := c.open(ctx, req)
	if err != nil {
		return Result{}, err
	}
	defer s.nc.Close()
	stop := s.closeOnDone(ctx)
	defer stop()
	return s.output(ctx, opts)
}

// Processes lists durable commands.
func (c *Client) Processes(ctx context.Context) ([]Process, error) {
	var out []Process
	return out, c.call(ctx, Request{Op: OpPs}, &out)
}

// Selector names a command: by PID, else the newest durable command tagged Tag.
type Selector struct {
	PID int
	Tag string
}

// Signal signals a command's process group.
func (c *Client) Signal(ctx context.Context, pid, sig int) error {
	return c.SignalCommand(ctx, Selector{PID: pid}, sig)
}

// SignalCommand signals the process group of the command sel names.
func (c *Client) SignalCommand(ctx context.Context, sel Selector, sig int) error {
	return c.call(ctx, Request{Op: OpSignal, PID: sel.PID, Tag: sel.Tag, Signal: sig}, nil)
}

// Input types data into a durable command's terminal, or writes it to its open stdin.
func (c *Client) Input(ctx context.Context, pid int, data []byte) error {
	return c.SendInput(ctx, Selector{PID: pid}, data, false)
}

// EndInput ends a durable command's input: its terminal's (Request.EndInput), or its
// stdin, which is closed.
func (c *Client) EndInput(ctx context.Context, pid int) error {
	return c.SendInput(ctx, Selector{PID: pid}, nil, true)
}

// SendInput writes data to the input of the command sel names (its stdin, or its
// terminal) and, with end, ends that input.
func (c *Client) SendInput(ctx context.Context, sel Selector, data []byte, end bool) error {
	return c.call(ctx, Request{Op: OpInput, PID: sel.PID, Tag: sel.Tag, Data: data, EndInput: end}, nil)
}

// Resize sets a background command's terminal size.
func (c *Client) Resize(ctx context.Context, pid int, ws Winsize) error {
	return c.call(ctx, Request{Op: OpResize, PID: pid, Cols: ws.Cols, Rows: ws.Rows}, nil)
}

// Health asks the agent how it is.
func (c *Client) Health(ctx context.Context) (Health, error) {
	var h Health
	return h, c.call(ctx, Request{Op: OpHealth}, &h)
}

// WaitReady polls Health until the agent answers or ctx ends.
func (c *Client) WaitReady(ctx context.Context) error {
	delay := time.Millisecond
	for {
		hctx, cancel := context.WithTimeout(ctx, time.Second)
		_, err := c.Health(hctx)
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the sandbox agent did not answer: %w", err)
		case <-time.After(delay):
		}
		delay = min(delay*2, 5*time.Millisecond)
	}
}

// Lease takes the sandbox's lease and holds it until the returned Closer is closed (or
// this process ends: the kernel closes the connection, and the sandbox stops after its
// grace). ctx bounds taking it, not holding it.
func (c *Client) Lease(ctx context.Context) (io.Closer, error) {
	s, err := c.open(ctx, Request{Op: OpLease})
	if err != nil {
		return nil, err
	}
	stop := s.closeOnDone(ctx)
	err = s.reply(nil)
	if !stop() && err == nil {
		err = ctx.Err()
	}
	if err != nil {
		s.nc.Close()
		return nil, err
	}
	return s.nc, nil
}

// Keep ends the sandbox's lease: it no longer stops when its lease holders go, and lives
// out its lifetime.
func (c *Client) Keep(ctx context.Context) error {
	return c.call(ctx, Request{Op: OpLease, Keep: true}, nil)
}

// SetLifetime makes the agent end the sandbox d from now, sooner or later than it was to.
func (c *Client) SetLifetime(ctx context.Context, d time.Duration) error {
	return c.call(ctx, Request{Op: OpLifetime, LifetimeMS: max(d.Milliseconds(), 1)}, nil)
}

// PrepareSnapshot tells a microVM's agent that a memory snapshot comes: once it has
// answered, it waits for the host's vmlink.RelinkLine(nonce) on a new link.
func (c *Client) PrepareSnapshot(ctx context.Context, nonce string) error {
	return c.call(ctx, Request{Op: OpSnapshotPrepare, Nonce: nonce}, nil)
}

// Restored tells a microVM's agent, just restored from a snapshot, its fresh entropy,
// the time, its hostname and its lifetime.
func (c *Client) Restored(ctx context.Context, req Request) error {
	req.Op = OpRestored
	return c.call(ctx, req, nil)
}

// call performs a request with a single JSON reply.
func (c *Client) call(ctx context.Context, req Request, v any) error {
	s, err := c.open(ctx, req)
	if err != nil {
		return err
	}
	defer s.nc.Close()
	stop := s.closeOnDone(ctx)
	defer stop()
	return s.reply(v)
}

// WriteFile writes r to path in the sandbox (creating parents when asked).
func (c *Client) WriteFile(ctx context.Context, path string, r io.Reader, mode uint32, parents bool) error {
	s, err := c.open(ctx, Request{Op: OpWrite, Path: path, Mode: mode, Parents: parents})
	if err != nil {
		return err
	}
	defer s.nc.Close()
	stop := s.closeOnDone(ctx)
	defer stop()
	return s.upload(r)
}

// Untar extracts a tar stream at path: the archive's root entry becomes path.
func (c *Client) Untar(ctx context.Context, path string, r io.Reader) error {
	s, err := c.open(ctx, Request{Op: OpUntar, Path: path})
	if err != nil {
		return err
	}
	defer s.nc.Close()
	stop := s.closeOnDone(ctx)
	defer stop()
	return s.upload(r)
}

// upload sends r as data frames while watching for an early error from the agent.
func (s *session) upload(r io.Reader) error {
	replied := make(chan error, 1)
	go func() { replied <- s.reply(nil) }()
	buf := make([]byte, MaxChunk)
	var sendErr error
	for {
		n, err := r.Read(buf)
		if n > 0 {
			if sendErr = s.send(FrameData, buf[:n]); sendErr != nil {
				break
			}
		}
		if errors.Is(err, io.EOF) {
			sendErr = s.send(FrameDataEOF, nil)
			break
		}
		if err != nil {
			// Ending the upload without its end-of-data frame fails it in the agent, which
			// removes what it wrote; waiting for its answer (where the connection can be
			// half-closed) means that is done when this returns.
			if cw, ok := s.nc.(interface{ CloseWrite() error }); ok && cw.CloseWrite() == nil {
				select {
				case <-replied:
				case <-time.After(5 * time.Second):
				}
			}
			s.nc.Close()
			return fmt.Errorf("reading the data to send: %w", err)
		}
		select {
		case err := <-replied: // the agent gave up early (e.g. read-only path)
			return err
		default:
		}
	}
	err := <-replied
	if err == nil && sendErr != nil {
		err = sendErr
	}
	return err
}

// ReadFile streams path from the sandbox to w.
func (c *Client) ReadFile(ctx context.Context, path string, w io.Writer) error {
	return c.download(ctx, Request{Op: OpRead, Path: path}, w)
}

// Tar streams path from the sandbox as a tar archive whose root entry is its base name.
func (c *Client) Tar(ctx context.Context, path string, w io.Writer) error {
	return c.download(ctx, Request{Op: OpTar, Path: path}, w)
}

func (c *Client) download(ctx context.Context, req Request, w io.Writer) error {
	s, err := c.open(ctx, req)
	if err != nil {
		return err
	}
	defer s.nc.Close()
	stop := s.closeOnDone(ctx)
	defer stop()
	for {
		kind, p, err := s.read()
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("reading from the sandbox agent: %w", err)
		}
		switch kind {
		case FrameData:
			if _, err := w.Write(p); err != nil {
				return err
			}
		case FrameDataEOF:
			return nil
		default:
			return decode(kind, p, FrameDataEOF, nil)
		}
	}
}

// List lists a directory.
func (c *Client) List(ctx context.Context, path string) ([]FileInfo, error) {
	var out []FileInfo
	return out, c.call(ctx, Request{Op: OpList, Path: path}, &out)
}

// Stat describes a path without following a final symlink.
func (c *Client) Stat(ctx context.Context, path string) (FileInfo, error) {
	var fi FileInfo
	return fi, c.call(ctx, Request{Op: OpStat, Path: path}, &fi)
}

// Mkdir makes a directory (and its parents when asked).
func (c *Client) Mkdir(ctx context.Context, path string, parents bool) error {
	return c.call(ctx, Request{Op: OpMkdir, Path: path, Parents: parents}, nil)
}

// Remove removes a path (recursively when asked).
func (c *Client) Remove(ctx context.Context, path string, recursive bool) error {
	return c.call(ctx, Request{Op: OpRemove, Path: path, Recursive: recursive}, nil)
}

// Rename renames a path.
func (c *Client) Rename(ctx context.Context, from, to string) error {
	return c.call(ctx, Request{Op: OpRename, Path: from, NewPath: to}, nil)
}

// CodeOptions carries a cell's streams.
type CodeOptions struct {
	Stdout, Stderr io.Writer
	// Result, if set, is called with each rich result as it arrives.
	Result func(CodeResult)
}

// RunCode runs req.Code (with req.Context or req.Language, TimeoutMS, OutputLimit, and
// Cwd and Env for a default context made now) in a code context and waits for its end. Cancelling
// ctx closes the connection, which interrupts the cell.
func (c *Client) RunCode(ctx context.Context, req Request, opts CodeOptions) (CodeEnd, error) {
	req.Op = OpCodeRun
	s, err := c.open(ctx, req)
	if err != nil {
		return CodeEnd{}, err
	}
	defer s.nc.Close()
	stop := s.closeOnDone(ctx)
	defer stop()
	for {
		kind, p, err := s.read()
		if err != nil {
			if ctx.Err() != nil {
				return CodeEnd{}, ctx.Err()
			}
			return CodeEnd{}, fmt.Errorf("the sandbox agent closed the connection mid-cell (did the sandbox stop?): %w", err)
		}
		switch kind {
		case FrameStdout:
			if opts.Stdout != nil {
				_, _ = opts.Stdout.Write(p)
			}
		case FrameStderr:
			if opts.Stderr != nil {
				_, _ = opts.Stderr.Write(p)
			}
		case FrameCodeResult:
			var r CodeResult
			if err := json.Unmarshal(p, &r); err != nil {
				return CodeEnd{}, fmt.Errorf("malformed code result from the agent: %w", err)
			}
			if opts.Result != nil {
				opts.Result(r)
			}
		case FrameCodeEnd, FrameError:
			var end CodeEnd
			return end, decode(kind, p, FrameCodeEnd, &end)
		default:
			return CodeEnd{}, fmt.Errorf("unexpected agent frame %q", kind)
		}
	}
}

// CreateContext starts a code context.
func (c *Client) CreateContext(ctx context.Context, language, cwd string, env map[string]string) (CodeContext, error) {
	var cc CodeContext
	return cc, c.call(ctx, Request{Op: OpCodeCreate, Language: language, Cwd: cwd, Env: env}, &cc)
}

// WarmCode starts language's interpreter ahead of its first context: the next context
// started with the same cwd and env (a default context's first cell, or CreateContext)
// takes it instead of starting one. It returns once the interpreter is ready.
func (c *Client) WarmCode(ctx context.Context, language, cwd string, env map[string]string) error {
	return c.call(ctx, Request{Op: OpCodeWarm, Language: language, Cwd: cwd, Env: env}, nil)
}

// Contexts lists the code contexts.
func (c *Client) Contexts(ctx context.Context) ([]CodeContext, error) {
	var out []CodeContext
	return out, c.call(ctx, Request{Op: OpCodeList}, &out)
}

// RestartContext gives a code context a fresh interpreter.
func (c *Client) RestartContext(ctx context.Context, id string) error {
	return c.call(ctx, Request{Op: OpCodeRestart, Context: id}, nil)
}

// ForkContext makes a new code context holding a copy of context id's interpreter.
func (c *Client) ForkContext(ctx context.Context, id string) (CodeContext, error) {
	var cc CodeContext
	return cc, c.call(ctx, Request{Op: OpCodeFork, Context: id}, &cc)
}

// RemoveContext stops a code context and forgets it.
func (c *Client) RemoveContext(ctx context.Context, id string) error {
	return c.call(ctx, Request{Op: OpCodeRemove, Context: id}, nil)
}
