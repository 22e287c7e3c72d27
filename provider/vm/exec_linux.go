package vm

import (
	"context"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"time"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/agent"
	"github.com/roche-sandbox/roche/provider/internal/agentconv"
)

// running returns the sandbox, refusing one that is paused (its agent cannot answer).
func (p *Provider) running(id string) (*sandbox, error) {
	s, err := p.lookup(id)
	if err != nil {
		return nil, err
	}
	if _, err := os.Stat(filepath.Join(s.Dir, "paused")); err == nil {
		return nil, fmt.Errorf("sandbox %s is paused: unpause it first", id)
	}
	return s, nil
}

// timeoutFor is the command's timeout: the request's, else the sandbox's remaining life.
func timeoutFor(s *sandbox, req roche.ExecRequest) time.Duration {
	if req.Timeout > 0 {
		return req.Timeout
	}
	return max(time.Until(s.ExpiresAt), time.Second)
}

func (s *sandbox) request(req roche.ExecRequest) agent.Request {
	cwd := req.Workdir
	if cwd == "" {
		cwd = s.Workdir
	}
	return agent.Request{
		Cmd: req.Cmd, Env: req.Env, Cwd: cwd,
		TimeoutMS: timeoutFor(s, req).Milliseconds(), OutputLimit: req.OutputLimit,
	}
}

// Exec implements roche.Provider: the agent inside the VM runs the command, enforces its
// timeout and output limit, and kills its whole tree when ctx ends.
func (p *Provider) Exec(ctx context.Context, id string, req roche.ExecRequest) (roche.ExecResult, error) {
	if err := req.Validate(); err != nil {
		return roche.ExecResult{}, err
	}
	s, err := p.running(id)
	if err != nil {
		return roche.ExecResult{}, err
	}
	stdout, stderr := req.Captures()
	res, err := s.agent.Exec(ctx, s.request(req), agent.ExecOptions{Stdin: req.Stdin, Stdout: stdout, Stderr: stderr})
	if err != nil {
		if ctx.Err() != nil {
			return roche.ExecResult{}, fmt.Errorf("running command in sandbox %s: %w", id, ctx.Err())
		}
		return roche.ExecResult{}, p.agentErr(s, err)
	}
	return roche.ExecResult{
		ExitCode: res.ExitCode, Stdout: stdout.String(), Stderr: stderr.String(),
		TimedOut: res.TimedOut, Truncated: res.Truncated || stdout.Truncated() || stderr.Truncated(),
		OOMKilled: res.OOMKilled, Duration: time.Duration(res.DurationNS),
	}, nil
}

// agentErr maps an agent failure onto the core's sentinels; an agent that cannot be
// reached means the VM has stopped.
func (p *Provider) agentErr(s *sandbox, err error) error {
	if mapped, ok := agentconv.Err(s.ID, err); ok {
		return mapped
	}
	if _, alive, rerr := p.readVM(s.Dir); rerr != nil || !alive {
		p.forget(s.ID)
		return fmt.Errorf("%w: sandbox %s is gone (destroyed, or its lifetime ended)", roche.ErrNotFound, s.ID)
	}
	return fmt.Errorf("sandbox %s: %w", s.ID, err)
}

func (p *Provider) agentErrOrNil(s *sandbox, err error) error {
	if err == nil {
		return nil
	}
	return p.agentErr(s, err)
}

// Start implements roche.BackgroundRunner.
func (p *Provider) Start(ctx context.Context, id string, req roche.ExecRequest) (int, error) {
	if err := req.Validate(); err != nil {
		return 0, err
	}
	s, err := p.running(id)
	if err != nil {
		return 0, err
	}
	pid, err := s.agent.Start(ctx, s.request(req))
	if err != nil {
		return 0, p.agentErr(s, err)
	}
	return pid, nil
}

// Processes implements roche.BackgroundRunner.
func (p *Provider) Processes(ctx context.Context, id string) ([]roche.Process, error) {
	s, err := p.running(id)
	if err != nil {
		return nil, err
	}
	list, err := s.agent.Processes(ctx)
	if err != nil {
		return nil, p.agentErr(s, err)
	}
	return agentconv.Processes(list), nil
}

// Attach implements roche.BackgroundRunner.
func (p *Provider) Attach(ctx context.Context, id string, pid int, stdout, stderr io.Writer) (roche.ExecResult, error) {
	s, err := p.running(id)
	if err != nil {
		return roche.ExecResult{}, err
	}
	res, err := s.agent.Attach(ctx, pid, agent.ExecOptions{Stdout: stdout, Stderr: stderr})
	if err != nil {
		return roche.ExecResult{}, p.agentErr(s, err)
	}
	return roche.ExecResult{
		ExitCode: res.ExitCode, TimedOut: res.TimedOut, Truncated: res.Truncated,
		OOMKilled: res.OOMKilled, Duration: time.Duration(res.DurationNS),
	}, nil
}

// Signal implements roche.BackgroundRunner.
func (p *Provider) Signal(ctx context.Context, id string, pid, signal int) error {
	s, err := p.running(id)
	if err != nil {
		return err
	}
	return p.agentErrOrNil(s, s.agent.Signal(ctx, pid, signal))
}

// WriteFile implements roche.FileSystem.
func (p *Provider) WriteFile(ctx context.Context, id, name string, r io.Reader, mode fs.FileMode) error {
	s, err := p.running(id)
	if err != nil {
		return err
	}
	return p.agentErrOrNil(s, s.agent.WriteFile(ctx, name, r, uint32(mode.Perm()), true))
}

// ReadFile implements roche.FileSystem.
func (p *Provider) ReadFile(ctx context.Context, id, name string, w io.Writer) error {
	s, err := p.running(id)
	if err != nil {
		return err
	}
	return p.agentErrOrNil(s, s.agent.ReadFile(ctx, name, w))
}

// ListDir implements roche.FileSystem.
func (p *Provider) ListDir(ctx context.Context, id, name string) ([]roche.FileInfo, error) {
	s, err := p.running(id)
	if err != nil {
		return nil, err
	}
	list, err := s.agent.List(ctx, name)
	if err != nil {
		return nil, p.agentErr(s, err)
	}
	return agentconv.FileInfos(list), nil
}

// Stat implements roche.FileSystem.
func (p *Provider) Stat(ctx context.Context, id, name string) (roche.FileInfo, error) {
	s, err := p.running(id)
	if err != nil {
		return roche.FileInfo{}, err
	}
	fi, err := s.agent.Stat(ctx, name)
	if err != nil {
		return roche.FileInfo{}, p.agentErr(s, err)
	}
	return agentconv.FileInfo(fi), nil
}

// Mkdir implements roche.FileSystem.
func (p *Provider) Mkdir(ctx context.Context, id, name string) error {
	s, err := p.running(id)
	if err != nil {
		return err
	}
	return p.agentErrOrNil(s, s.agent.Mkdir(ctx, name, true))
}

// Remove implements roche.FileSystem.
func (p *Provider) Remove(ctx context.Context, id, name string) error {
	s, err := p.running(id)
	if err != nil {
		return err
	}
	return p.agentErrOrNil(s, s.agent.Remove(ctx, name, true))
}

// Rename implements roche.FileSystem.
func (p *Provider) Rename(ctx context.Context, id, from, to string) error {
	s, err := p.running(id)
	if err != nil {
		return err
	}
	return p.agentErrOrNil(s, s.agent.Rename(ctx, from, to))
}

// CopyTo implements roche.FileCopier with the default options (see roche.CopyIn).
func (p *Provider) CopyTo(ctx context.Context, id, src, dst string) error {
	_, err := roche.CopyIn(ctx, p, id, src, dst, roche.CopyOptions{})
	return err
}

// CopyFrom implements roche.FileCopier with the default options (see roche.CopyOut).
func (p *Provider) CopyFrom(ctx context.Context, id, src, dst string) error {
	_, err := roche.CopyOut(ctx, p, id, src, dst, roche.CopyOptions{})
	return err
}

// CopyTarTo implements roche.TarCopier: the agent unpacks the archive as the sandbox
// user, its root entry becoming dst.
func (p *Provider) CopyTarTo(ctx context.Context, id, dst string, r io.Reader) error {
	s, err := p.running(id)
	if err != nil {
		return err
	}
	if !path.IsAbs(dst) || path.Clean(dst) == "/" {
		return fmt.Errorf("%w: destination %q must be an absolute path below /", roche.ErrInvalidConfig, dst)
	}
	dst = path.Clean(dst)
	cr := &agentconv.CallerReader{R: r}
	if err := s.agent.Untar(ctx, dst, cr); err != nil {
		if cr.Err != nil {
			err = cr.Err
		} else {
			err = p.agentErr(s, err)
		}
		return fmt.Errorf("copying into sandbox %s at %s: %w", id, dst, err)
	}
	return nil
}

// CopyTarFrom implements roche.TarCopier: the agent sends src as a tar stream.
func (p *Provider) CopyTarFrom(ctx context.Context, id, src string, w io.Writer) error {
	s, err := p.running(id)
	if err != nil {
		return err
	}
	if !path.IsAbs(src) || path.Clean(src) == "/" {
		return fmt.Errorf("%w: source %q must be an absolute path below /", roche.ErrInvalidConfig, src)
	}
	src = path.Clean(src)
	cw := &agentconv.CallerWriter{W: w}
	if err := s.agent.Tar(ctx, src, cw); err != nil {
		if cw.Err != nil {
			err = cw.Err
		} else {
			err = p.agentErr(s, err)
		}
		return fmt.Errorf("copying %s out of sandbox %s: %w", src, id, err)
	}
	return nil
}
