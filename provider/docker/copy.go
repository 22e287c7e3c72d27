package docker

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strings"

	"github.com/docker/docker/api/types/container"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/agent"
	"github.com/roche-sandbox/roche/internal/tarfs"
)

// CopyTo implements roche.FileCopier: the host file or directory src becomes dst in the
// sandbox, parent directories created. With roche-agent the archive streams over its
// socket and is unpacked as the sandbox user.
//
// Without the agent: the Engine's archive API writes through the container's root filesystem on the host, so
// it refuses a read-only root and cannot see the /tmp tmpfs, which lives only in the
// container's mount namespace. With the secure defaults both apply, so those copies run
// tar inside the sandbox instead, as the sandbox user: a copy can then write nowhere the
// sandboxed program could not.
func (p *Provider) CopyTo(ctx context.Context, id, src, dst string) error {
	s, err := p.lookup(ctx, id)
	if err != nil {
		return err
	}
	if !path.IsAbs(dst) || path.Clean(dst) == "/" {
		return fmt.Errorf("%w: destination %q must be an absolute path below /", roche.ErrInvalidConfig, dst)
	}
	dst = path.Clean(dst)
	if _, err := os.Lstat(src); err != nil {
		return fmt.Errorf("%w: host path %s: %v", roche.ErrNotFound, src, err)
	}
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(tarfs.Write(pw, src, path.Base(dst))) }()
	defer pr.Close()

	if s.agent != nil {
		if err := s.agent.Untar(ctx, dst, pr); err != nil {
			return fmt.Errorf("copying %s into sandbox %s: %w", src, id, p.agentErr(s, err))
		}
		return nil
	}
	if useArchiveAPI(s.cfg, dst) {
		err := p.cli.CopyToContainer(ctx, s.id, path.Dir(dst), pr, container.CopyToContainerOptions{})
		return p.engineErr("copying "+src+" into sandbox "+id, err)
	}
	var stderr bytes.Buffer
	res, err := p.run(ctx, s, roche.ExecRequest{
		Cmd:   []string{"sh", "-c", `mkdir -p "$1" && exec tar -x -o -C "$1" -f -`, "sh", path.Dir(dst)},
		Stdin: pr,
	}, io.Discard, &stderr)
	if err != nil {
		return err
	}
	if res.ExitCode != 0 {
		return fmt.Errorf("copying %s into sandbox %s at %s: %w", src, id, dst, copyFailure(&stderr, res.ExitCode))
	}
	return nil
}

// CopyFrom implements roche.FileCopier: the sandbox path src becomes the host path dst.
func (p *Provider) CopyFrom(ctx context.Context, id, src, dst string) error {
	s, err := p.lookup(ctx, id)
	if err != nil {
		return err
	}
	if !path.IsAbs(src) || path.Clean(src) == "/" {
		return fmt.Errorf("%w: source %q must be an absolute path below /", roche.ErrInvalidConfig, src)
	}
	src = path.Clean(src)
	if s.agent != nil {
		pr, pw := io.Pipe()
		go func() { pw.CloseWithError(s.agent.Tar(ctx, src, pw)) }()
		err := tarfs.Extract(pr, dst)
		pr.CloseWithError(err)
		if err != nil {
			var ae *agent.Error
			if errors.As(err, &ae) {
				err = p.agentErr(s, err)
			}
			return fmt.Errorf("copying %s out of sandbox %s: %w", src, id, err)
		}
		return nil
	}
	if useArchiveAPI(s.cfg, src) {
		rc, _, err := p.cli.CopyFromContainer(ctx, s.id, src)
		if err != nil {
			return p.engineErr("copying "+src+" out of sandbox "+id, err)
		}
		defer rc.Close()
		return tarfs.Extract(rc, dst)
	}

	pr, pw := io.Pipe()
	extracted := make(chan error, 1)
	go func() {
		err := tarfs.Extract(pr, dst)
		// Keep draining so tar's complaint on stderr, which may come later, is still read.
		_, _ = io.Copy(io.Discard, pr)
		extracted <- err
	}()
	var stderr bytes.Buffer
	res, err := p.run(ctx, s, roche.ExecRequest{
		Cmd: []string{"tar", "-c", "-C", path.Dir(src), "-f", "-", path.Base(src)},
	}, pw, &stderr)
	pw.Close()
	exErr := <-extracted
	if err != nil {
		return err
	}
	if res.ExitCode != 0 {
		return fmt.Errorf("copying %s out of sandbox %s: %w", src, id, copyFailure(&stderr, res.ExitCode))
	}
	if exErr != nil {
		return fmt.Errorf("copying %s out of sandbox %s: %w", src, id, exErr)
	}
	return nil
}

// useArchiveAPI reports whether the Engine's archive API can reach p in a sandbox made
// from cfg (see CopyTo).
func useArchiveAPI(cfg roche.Config, p string) bool {
	return cfg.Writable && p != "/tmp" && !strings.HasPrefix(p, "/tmp/")
}

// copyFailure turns tar's complaint into an error, recognising a missing path.
func copyFailure(stderr *bytes.Buffer, code int) error {
	msg := strings.TrimSpace(stderr.String())
	if msg == "" {
		msg = fmt.Sprintf("tar exited %d", code)
	}
	switch {
	case strings.Contains(msg, "No such file"):
		return fmt.Errorf("%w: %s", roche.ErrNotFound, firstLine(msg))
	case strings.Contains(msg, "not found"), code == 126, code == 127:
		return fmt.Errorf("%w: the image has no tar, which copying needs: %s", roche.ErrUnsupported, firstLine(msg))
	}
	return errors.New(firstLine(msg))
}
