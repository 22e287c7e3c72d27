package docker

import (
	"context"
	"fmt"
	"io"
	"io/fs"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/provider/internal/agentconv"
)

// agentFor returns the sandbox's agent, or ErrUnsupported for a sandbox on the exec-API
// fallback.
func (p *Provider) agentFor(ctx context.Context, id string) (sandbox, error) {
	s, err := p.lookup(ctx, id)
	if err != nil {
		return s, err
	}
	if s.agent == nil {
		return s, fmt.Errorf("%w: sandbox %s runs without roche-agent (transport %s), and the files API needs it", roche.ErrUnsupported, id, TransportDockerExec)
	}
	return s, nil
}

// WriteFile implements roche.FileSystem.
func (p *Provider) WriteFile(ctx context.Context, id, path string, r io.Reader, mode fs.FileMode) error {
	s, err := p.agentFor(ctx, id)
	if err != nil {
		return err
	}
	return p.agentErrOrNil(s, s.agent.WriteFile(ctx, path, r, uint32(mode.Perm()), true))
}

// ReadFile implements roche.FileSystem.
func (p *Provider) ReadFile(ctx context.Context, id, path string, w io.Writer) error {
	s, err := p.agentFor(ctx, id)
	if err != nil {
		return err
	}
	return p.agentErrOrNil(s, s.agent.ReadFile(ctx, path, w))
}

// ListDir implements roche.FileSystem.
func (p *Provider) ListDir(ctx context.Context, id, path string) ([]roche.FileInfo, error) {
	s, err := p.agentFor(ctx, id)
	if err != nil {
		return nil, err
	}
	list, err := s.agent.List(ctx, path)
	if err != nil {
		return nil, p.agentErr(s, err)
	}
	return agentconv.FileInfos(list), nil
}

// Stat implements roche.FileSystem.
func (p *Provider) Stat(ctx context.Context, id, path string) (roche.FileInfo, error) {
	s, err := p.agentFor(ctx, id)
	if err != nil {
		return roche.FileInfo{}, err
	}
	fi, err := s.agent.Stat(ctx, path)
	if err != nil {
		return roche.FileInfo{}, p.agentErr(s, err)
	}
	return agentconv.FileInfo(fi), nil
}

// Mkdir implements roche.FileSystem.
func (p *Provider) Mkdir(ctx context.Context, id, path string) error {
	s, err := p.agentFor(ctx, id)
	if err != nil {
		return err
	}
	return p.agentErrOrNil(s, s.agent.Mkdir(ctx, path, true))
}

// Remove implements roche.FileSystem.
func (p *Provider) Remove(ctx context.Context, id, path string) error {
	s, err := p.agentFor(ctx, id)
	if err != nil {
		return err
	}
	return p.agentErrOrNil(s, s.agent.Remove(ctx, path, true))
}

// Rename implements roche.FileSystem.
func (p *Provider) Rename(ctx context.Context, id, from, to string) error {
	s, err := p.agentFor(ctx, id)
	if err != nil {
		return err
	}
	return p.agentErrOrNil(s, s.agent.Rename(ctx, from, to))
}

func (p *Provider) agentErrOrNil(s sandbox, err error) error {
	if err == nil {
		return nil
	}
	return p.agentErr(s, err)
}
