package docker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/docker/docker/api/types"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/events"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/pkg/stdcopy"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/internal/proctree"
	"github.com/roche-sandbox/roche/provider/internal/engine"
	"github.com/roche-sandbox/roche/provider/kit"
)

// sigkillExit is the exit status of a process killed by SIGKILL (128+9).
const sigkillExit = 137

// Exec implements roche.Provider, through roche-agent (guestfwd) or, for a sandbox on
// the exec-API transport, the Engine API's exec endpoints. Either way the command's
// lifetime is tied to the call: when ctx ends or the timeout fires, the command and
// every process it started are killed.
func (p *Provider) Exec(ctx context.Context, id string, req roche.ExecRequest) (roche.ExecResult, error) {
	if err := req.Validate(); err != nil {
		return roche.ExecResult{}, err
	}
	s, err := p.lookup(ctx, id)
	if err != nil {
		return roche.ExecResult{}, err
	}
	if s.agent != nil {
		return p.target(s).Exec(ctx, req)
	}
	if req.IdempotencyKey != "" {
		return roche.ExecResult{}, fmt.Errorf("%w: sandbox %s runs without roche-agent (transport %s), which keeps durable commands: no idempotency keys", roche.ErrUnsupported, id, TransportDockerExec)
	}
	stdout, stderr := kit.Captures(req)
	res, err := p.run(ctx, s, req, stdout, stderr)
	res.Stdout, res.Stderr = stdout.String(), stderr.String()
	res.Truncated = res.Truncated || stdout.Truncated() || stderr.Truncated()
	return res, err
}

// timeoutFor is the command's timeout: the request's, else the sandbox's remaining life.
func timeoutFor(s sandbox, req roche.ExecRequest) time.Duration {
	if req.Timeout > 0 {
		return req.Timeout
	}
	return max(time.Until(s.expires), time.Second)
}

// run runs req.Cmd in the sandbox, writing its output to stdout and stderr unbuffered,
// and reports everything but the output.
func (p *Provider) run(ctx context.Context, s sandbox, req roche.ExecRequest, stdout, stderr io.Writer) (roche.ExecResult, error) {
	timeout := timeoutFor(s, req)
	env := make([]string, 0, len(req.Env))
	for k, v := range req.Env {
		env = append(env, k+"="+v)
	}
	start := time.Now()
	created, hij, err := p.startExec(ctx, s, req, env)
	if err != nil {
		return roche.ExecResult{}, err
	}
	defer hij.Close()

	if req.Stdin != nil {
		go func() {
			_, _ = io.Copy(hij.Conn, req.Stdin)
			_ = hij.CloseWrite()
		}()
	}
	copied := make(chan error, 1)
	go func() {
		_, err := stdcopy.StdCopy(stdout, stderr, hij.Reader)
		copied <- err
	}()

	timer := time.NewTimer(timeout)
	defer timer.Stop()
	var timedOut bool
	var ctxErr error
	select {
	case <-copied:
	case <-timer.C:
		timedOut = true
		p.killExec(created.ID)
	case <-ctx.Done():
		ctxErr = ctx.Err()
		p.killExec(created.ID)
	}
	if timedOut || ctxErr != nil {
		// Killed processes close their pipes; a descendant that escaped the kill may hold
		// them open, so stop reading after a grace period rather than hang.
		select {
		case <-copied:
		case <-time.After(3 * time.Second):
			hij.Close()
			<-copied
		}
	}
	if ctxErr != nil {
		return roche.ExecResult{}, fmt.Errorf("running command in sandbox %s: %w", s.id, ctxErr)
	}

	res := roche.ExecResult{TimedOut: timedOut, Duration: time.Since(start)}
	res.ExitCode, err = p.exitCode(ctx, created.ID)
	if err != nil {
		return res, err
	}
	if res.ExitCode == sigkillExit && !timedOut {
		res.OOMKilled = p.oomDuring(ctx, s.id, created.ID, start)
	}
	return res, nil
}

// startExec creates the exec and attaches to it, within the deadline of a call that needs
// one quick answer. The attach hijacks the connection, and Docker's client stops
// watching ctx once it has dialled, so the wait is bounded here (engine.Call).
func (p *Provider) startExec(ctx context.Context, s sandbox, req roche.ExecRequest, env []string) (_ container.ExecCreateResponse, _ types.HijackedResponse, err error) {
	ctx, done := p.bound(ctx, "starting a command in sandbox "+s.id)
	defer done(&err)
	created, err := p.cli.ContainerExecCreate(ctx, s.id, container.ExecOptions{
		Cmd:          req.Cmd,
		Env:          env,
		WorkingDir:   req.Workdir,
		AttachStdin:  req.Stdin != nil,
		AttachStdout: true,
		AttachStderr: true,
	})
	if err != nil {
		p.forget(s.id)
		return created, types.HijackedResponse{}, p.engineErr("starting command in sandbox "+s.id, err)
	}
	hij, err := engine.Call(ctx, func() (types.HijackedResponse, error) {
		return p.cli.ContainerExecAttach(ctx, created.ID, container.ExecAttachOptions{})
	}, func(h types.HijackedResponse) { h.Close() })
	if err != nil {
		return created, hij, p.engineErr("attaching to command in sandbox "+s.id, err)
	}
	return created, hij, nil
}

// exitCode waits (briefly) for the engine to record the exec's exit and returns it.
func (p *Provider) exitCode(ctx context.Context, execID string) (_ int, err error) {
	ctx, done := p.bound(ctx, "reading a command's exit status")
	defer done(&err)
	for i := 0; ; i++ {
		ins, err := p.cli.ContainerExecInspect(ctx, execID)
		if err != nil {
			return -1, p.engineErr("reading the command's exit status", err)
		}
		if !ins.Running {
			return ins.ExitCode, nil
		}
		if i == 100 {
			return -1, fmt.Errorf("the engine still reports the command running after its output closed: %w", roche.ErrTimeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// killExec kills an exec's whole process tree.
func (p *Provider) killExec(execID string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ins, err := p.cli.ContainerExecInspect(ctx, execID)
	if err != nil || ins.Pid == 0 {
		p.log.Warn("cannot find the timed-out command's process", "exec", execID, "err", err)
		return
	}
	if err := proctree.KillTree(ins.Pid); err != nil {
		p.log.Warn("killing the timed-out command's process tree", "exec", execID, "pid", ins.Pid, "err", err)
	}
}

// oomDuring reports whether the engine saw an OOM kill in the container since the exec
// started: an "oom" event no earlier than the exec's own "exec_start" event. Both times
// are the engine's, so neither a clock difference with this host nor an earlier
// command's OOM kill a moment before counts. The OOM event can trail the killed
// process's exit by a moment, so it looks a few times.
func (p *Provider) oomDuring(ctx context.Context, containerID, execID string, start time.Time) bool {
	for try := 0; try < 10; try++ {
		if try > 0 {
			time.Sleep(50 * time.Millisecond)
		}
		msgs, err := p.events(ctx, containerID, start.Add(-time.Minute), time.Now(), "oom", "exec_start")
		if err != nil {
			p.log.Warn("reading oom events", "container", containerID, "err", err)
			return false
		}
		started := int64(-1)
		for _, m := range msgs {
			if strings.HasPrefix(string(m.Action), "exec_start") && m.Actor.Attributes["execID"] == execID {
				started = m.TimeNano
			}
		}
		for _, m := range msgs {
			if started >= 0 && m.Action == "oom" && m.TimeNano >= started {
				return true
			}
		}
	}
	return false
}

// events returns the container's events of the given actions between since and until.
func (p *Provider) events(ctx context.Context, containerID string, since, until time.Time, actions ...string) ([]events.Message, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	args := filters.NewArgs(
		filters.Arg("type", string(events.ContainerEventType)),
		filters.Arg("container", containerID),
	)
	for _, a := range actions {
		args.Add("event", a)
	}
	msgs, errs := p.cli.Events(ctx, events.ListOptions{Since: unixNano(since), Until: unixNano(until), Filters: args})
	var out []events.Message
	for {
		select {
		case m := <-msgs:
			out = append(out, m)
		case err := <-errs:
			if err == nil || errors.Is(err, io.EOF) {
				return out, nil
			}
			return out, err
		}
	}
}

func unixNano(t time.Time) string {
	return strconv.FormatInt(t.Unix(), 10) + "." + fmt.Sprintf("%09d", t.Nanosecond())
}
