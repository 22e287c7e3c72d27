package guestfwd

import (
	"context"
	"fmt"
	"io"
	"io/fs"
	"path"
	"time"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/internal/guest"
	"github.com/roche-sandbox/roche/provider/kit"
)

// Target is one sandbox's agent, as its provider reaches it.
type Target struct {
	ID      string
	Agent   *guest.Client
	Expires time.Time // a command without a timeout runs at most until then
	Workdir string    // where a command without one runs; "" is the agent's default
	// Gone reports, after the agent could not be reached, whether the sandbox no longer
	// exists (destroyed, expired, its VM stopped); the provider forgets it then. Nil
	// means the provider cannot tell.
	Gone func() bool
	// Ended, when set, says why the sandbox ended once Gone has said it is gone (nil when
	// that cannot be known): the error then carries it (roche.EndedError).
	Ended func() *roche.EndReason
}

// Forwarder implements, through roche-agent, the methods of roche.Provider (Exec),
// roche.BackgroundRunner (command.go), roche.FileSystem and roche.TarCopier. A provider embeds it and
// overrides what it serves otherwise (the Docker provider's exec-API transport).
type Forwarder struct {
	// Reach returns the agent of sandbox id, or the error that says why there is none
	// (not found, paused, running without the agent).
	Reach func(ctx context.Context, id string) (Target, error)
}

// answerSlack is how long past a command's own timeout its agent may take to answer
// before the sandbox is taken to be unable to (frozen in a paused container).
const answerSlack = 10 * time.Second

// Exec implements roche.Provider.
func (f Forwarder) Exec(ctx context.Context, id string, req roche.ExecRequest) (roche.ExecResult, error) {
	if err := req.Validate(); err != nil {
		return roche.ExecResult{}, err
	}
	t, err := f.Reach(ctx, id)
	if err != nil {
		return roche.ExecResult{}, err
	}
	return t.Exec(ctx, req)
}

// Exec runs req.Cmd through the agent, which enforces the timeout and output limit
// inside the sandbox and kills the command's whole tree when ctx ends. req is valid.
func (t Target) Exec(ctx context.Context, req roche.ExecRequest) (roche.ExecResult, error) {
	stdout, stderr := kit.Captures(req)
	// The agent enforces the timeout; this deadline only catches an agent that cannot
	// answer at all.
	timeout := t.timeout(req)
	actx, cancel := context.WithTimeout(ctx, timeout+answerSlack)
	defer cancel()
	r := t.request(req, timeout)
	r.TraceParent = traceParent(ctx)
	res, err := t.Agent.Exec(actx, r, guest.ExecOptions{Stdin: req.Stdin, Stdout: stdout, Stderr: stderr})
	agentSpans(ctx, res.Spans)
	if err != nil {
		if ctx.Err() != nil {
			return roche.ExecResult{}, fmt.Errorf("running command in sandbox %s: %w", t.ID, ctx.Err())
		}
		if actx.Err() != nil {
			return roche.ExecResult{}, fmt.Errorf("%w: sandbox %s did not answer within the command's timeout: is it paused? (roche unpause %s)", roche.ErrTimeout, t.ID, t.ID)
		}
		return roche.ExecResult{}, t.fail(err)
	}
	return roche.ExecResult{
		ExitCode: res.ExitCode, Stdout: stdout.String(), Stderr: stderr.String(),
		TimedOut: res.TimedOut, Truncated: res.Truncated || stdout.Truncated() || stderr.Truncated(),
		OOMKilled: res.OOMKilled, Duration: time.Duration(res.DurationNS), Receipt: receiptOf(res.Receipt),
	}, nil
}

// timeout is the command's: the request's, else the sandbox's remaining life.
func (t Target) timeout(req roche.ExecRequest) time.Duration {
	if req.Timeout > 0 {
		return req.Timeout
	}
	return max(time.Until(t.Expires), time.Second)
}

func (t Target) request(req roche.ExecRequest, timeout time.Duration) guest.Request {
	cwd := req.Workdir
	if cwd == "" {
		cwd = t.Workdir
	}
	return guest.Request{
		Cmd: req.Cmd, Env: req.Env, Cwd: cwd,
		TimeoutMS: timeout.Milliseconds(), OutputLimit: req.OutputLimit, Key: req.IdempotencyKey,
	}
}

// fail maps an agent failure onto the core's sentinels. One that did not come from the
// agent (it could not be reached) is the sandbox having gone, when it has.
func (t Target) fail(err error) error {
	if mapped, ok := Err(t.ID, err); ok {
		return mapped
	}
	if t.Gone != nil && t.Gone() {
		gone := fmt.Errorf("%w: sandbox %s is gone (destroyed, stopped, or its lifetime ended)", roche.ErrNotFound, t.ID)
		if t.Ended != nil {
			if end := t.Ended(); end != nil {
				return &roche.EndedError{ID: t.ID, End: *end, Err: gone}
			}
		}
		return gone
	}
	return fmt.Errorf("sandbox %s: %w", t.ID, err)
}

// streamFail is fail for a stream between the caller and the agent: when the caller's
// side failed (its reader or writer, a cap) or its context ended, as a copy refused over
// its cap does to stop the agent, that is the error, and the sandbox is not suspected of
// having gone: asking (Gone) polls the engine for seconds and drops what the provider
// knew of a sandbox that is well.
func (t Target) streamFail(ctx context.Context, err, callerErr error) error {
	switch {
	case callerErr != nil:
		return callerErr
	case ctx.Err() != nil:
		return ctx.Err()
	}
	return t.fail(err)
}

func (t Target) failOrNil(err error) error {
	if err == nil {
		return nil
	}
	return t.fail(err)
}

// WriteFile implements roche.FileSystem.
func (f Forwarder) WriteFile(ctx context.Context, id, name string, r io.Reader, mode fs.FileMode) error {
	t, err := f.Reach(ctx, id)
	if err != nil {
		return err
	}
	cr := &CallerReader{R: r}
	if err := t.Agent.WriteFile(ctx, name, cr, uint32(mode.Perm()), true); err != nil {
		return t.streamFail(ctx, err, cr.Err)
	}
	return nil
}

// ReadFile implements roche.FileSystem.
func (f Forwarder) ReadFile(ctx context.Context, id, name string, w io.Writer) error {
	t, err := f.Reach(ctx, id)
	if err != nil {
		return err
	}
	cw := &CallerWriter{W: w}
	if err := t.Agent.ReadFile(ctx, name, cw); err != nil {
		return t.streamFail(ctx, err, cw.Err)
	}
	return nil
}

// ListDir implements roche.FileSystem.
func (f Forwarder) ListDir(ctx context.Context, id, name string) ([]roche.FileInfo, error) {
	t, err := f.Reach(ctx, id)
	if err != nil {
		return nil, err
	}
	list, err := t.Agent.List(ctx, name)
	if err != nil {
		return nil, t.fail(err)
	}
	return FileInfos(list), nil
}

// Stat implements roche.FileSystem.
func (f Forwarder) Stat(ctx context.Context, id, name string) (roche.FileInfo, error) {
	t, err := f.Reach(ctx, id)
	if err != nil {
		return roche.FileInfo{}, err
	}
	fi, err := t.Agent.Stat(ctx, name)
	if err != nil {
		return roche.FileInfo{}, t.fail(err)
	}
	return FileInfo(fi), nil
}

// Mkdir implements roche.FileSystem.
func (f Forwarder) Mkdir(ctx context.Context, id, name string) error {
	t, err := f.Reach(ctx, id)
	if err != nil {
		return err
	}
	return t.failOrNil(t.Agent.Mkdir(ctx, name, true))
}

// Remove implements roche.FileSystem.
func (f Forwarder) Remove(ctx context.Context, id, name string) error {
	t, err := f.Reach(ctx, id)
	if err != nil {
		return err
	}
	return t.failOrNil(t.Agent.Remove(ctx, name, true))
}

// Rename implements roche.FileSystem.
func (f Forwarder) Rename(ctx context.Context, id, from, to string) error {
	t, err := f.Reach(ctx, id)
	if err != nil {
		return err
	}
	return t.failOrNil(t.Agent.Rename(ctx, from, to))
}

// CopyTarTo implements roche.TarCopier.
func (f Forwarder) CopyTarTo(ctx context.Context, id, dst string, r io.Reader) error {
	t, err := f.Reach(ctx, id)
	if err != nil {
		return err
	}
	return t.CopyTarTo(ctx, dst, r)
}

// CopyTarTo has the agent unpack the archive as the sandbox user, its root entry
// becoming dst (parent directories created).
func (t Target) CopyTarTo(ctx context.Context, dst string, r io.Reader) error {
	dst, err := sandboxPath("destination", dst)
	if err != nil {
		return err
	}
	cr := &CallerReader{R: r}
	if err := t.Agent.Untar(ctx, dst, cr); err != nil {
		return fmt.Errorf("copying into sandbox %s at %s: %w", t.ID, dst, t.streamFail(ctx, err, cr.Err))
	}
	return nil
}

// CopyTarFrom implements roche.TarCopier.
func (f Forwarder) CopyTarFrom(ctx context.Context, id, src string, w io.Writer) error {
	t, err := f.Reach(ctx, id)
	if err != nil {
		return err
	}
	return t.CopyTarFrom(ctx, src, w)
}

// CopyTarFrom has the agent send src as a tar stream whose root entry is its base name.
func (t Target) CopyTarFrom(ctx context.Context, src string, w io.Writer) error {
	src, err := sandboxPath("source", src)
	if err != nil {
		return err
	}
	cw := &CallerWriter{W: w}
	if err := t.Agent.Tar(ctx, src, cw); err != nil {
		return fmt.Errorf("copying %s out of sandbox %s: %w", src, t.ID, t.streamFail(ctx, err, cw.Err))
	}
	return nil
}

// sandboxPath checks that p is an absolute path below / and cleans it.
func sandboxPath(what, p string) (string, error) {
	if !path.IsAbs(p) || path.Clean(p) == "/" {
		return "", fmt.Errorf("%w: %s %q must be an absolute path below /", roche.ErrInvalidConfig, what, p)
	}
	return path.Clean(p), nil
}

// Keep implements kit.Leaser: the agent ends the sandbox's lease (a provider that
// holds the lease itself lets go of it as well).
func (f Forwarder) Keep(ctx context.Context, id string) error {
	t, err := f.Reach(ctx, id)
	if err != nil {
		return err
	}
	if err := t.Agent.Keep(ctx); err != nil {
		return fmt.Errorf("ending the lease of sandbox %s: %w", id, t.fail(err))
	}
	return nil
}

// SetLifetime tells sandbox id's agent to end it d from now (the agent's lifetime timer
// is what ends a sandbox); the provider records the new end where it reports it from.
func (f Forwarder) SetLifetime(ctx context.Context, id string, d time.Duration) error {
	if err := roche.ValidTimeout(d); err != nil {
		return err
	}
	t, err := f.Reach(ctx, id)
	if err != nil {
		return err
	}
	if err := t.Agent.SetLifetime(ctx, d); err != nil {
		return fmt.Errorf("setting the lifetime of sandbox %s: %w", id, t.fail(err))
	}
	return nil
}
