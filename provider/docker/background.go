package docker

import (
	"context"
	"io"
	"time"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/agent"
	"github.com/roche-sandbox/roche/provider/internal/agentconv"
)

var _ roche.BackgroundRunner = (*Provider)(nil)

// Start implements roche.BackgroundRunner.
func (p *Provider) Start(ctx context.Context, id string, req roche.ExecRequest) (int, error) {
	if err := req.Validate(); err != nil {
		return 0, err
	}
	s, err := p.agentFor(ctx, id)
	if err != nil {
		return 0, err
	}
	pid, err := s.agent.Start(ctx, agent.Request{
		Cmd: req.Cmd, Env: req.Env, Cwd: req.Workdir,
		TimeoutMS:   timeoutFor(s, req).Milliseconds(),
		OutputLimit: req.OutputLimit,
	})
	if err != nil {
		return 0, p.agentErr(s, err)
	}
	return pid, nil
}

// Processes implements roche.BackgroundRunner.
func (p *Provider) Processes(ctx context.Context, id string) ([]roche.Process, error) {
	s, err := p.agentFor(ctx, id)
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
	s, err := p.agentFor(ctx, id)
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
	s, err := p.agentFor(ctx, id)
	if err != nil {
		return err
	}
	return p.agentErrOrNil(s, s.agent.Signal(ctx, pid, signal))
}
