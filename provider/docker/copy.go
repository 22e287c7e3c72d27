package docker

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"path"
	"strings"

	"github.com/docker/docker/api/types/container"

	"github.com/roche-sandbox/roche"
)

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

// CopyTarTo implements roche.TarCopier: the archive's root entry becomes dst in the
// sandbox, parent directories created. With roche-agent the archive streams over its
// socket and is unpacked as the sandbox user.
//
// Without the agent: the Engine's archive API writes through the container's root filesystem on the host, so
// it refuses a read-only root and cannot see the /tmp tmpfs, which lives only in the
// container's mount namespace. With the secure defaults both apply, so those copies run
// tar inside the sandbox instead, as the sandbox user: a copy can then write nowhere the
// sandboxed program could not.
func (p *Provider) CopyTarTo(ctx context.Context, id, dst string, r io.Reader) error {
	s, err := p.lookup(ctx, id)
	if err != nil {
		return err
	}
	if !path.IsAbs(dst) || path.Clean(dst) == "/" {
		return fmt.Errorf("%w: destination %q must be an absolute path below /", roche.ErrInvalidConfig, dst)
	}
	dst = path.Clean(dst)
	if s.agent != nil {
		return p.target(s).CopyTarTo(ctx, dst, r)
	}
	if useArchiveAPI(s.cfg.Config, dst) {
		err := p.cli.CopyToContainer(ctx, s.id, path.Dir(dst), r, container.CopyToContainerOptions{})
		return p.engineErr("copying into sandbox "+id+" at "+dst, err)
	}
	var stderr bytes.Buffer
	res, err := p.run(ctx, s, roche.ExecRequest{
		Cmd:   []string{"sh", "-c", `mkdir -p "$1" && exec tar -x -o -C "$1" -f -`, "sh", path.Dir(dst)},
		Stdin: r,
	}, io.Discard, &stderr)
	if err != nil {
		return err
	}
	if res.ExitCode != 0 {
		return fmt.Errorf("copying into sandbox %s at %s: %w", id, dst, copyFailure(&stderr, res.ExitCode))
	}
	return nil
}

// CopyTarFrom implements roche.TarCopier: src is written to w as a tar stream whose
// root entry is its base name, by the agent, the Engine's archive API or tar in the
// sandbox (see CopyTarTo).
func (p *Provider) CopyTarFrom(ctx context.Context, id, src string, w io.Writer) error {
	s, err := p.lookup(ctx, id)
	if err != nil {
		return err
	}
	if !path.IsAbs(src) || path.Clean(src) == "/" {
		return fmt.Errorf("%w: source %q must be an absolute path below /", roche.ErrInvalidConfig, src)
	}
	src = path.Clean(src)
	if s.agent != nil {
		return p.target(s).CopyTarFrom(ctx, src, w)
	}
	if useArchiveAPI(s.cfg.Config, src) {
		rc, _, err := p.cli.CopyFromContainer(ctx, s.id, src)
		if err != nil {
			return p.engineErr("copying "+src+" out of sandbox "+id, err)
		}
		defer rc.Close()
		if _, err := io.Copy(w, rc); err != nil {
			return fmt.Errorf("copying %s out of sandbox %s: %w", src, id, err)
		}
		return nil
	}
	var stderr bytes.Buffer
	res, err := p.run(ctx, s, roche.ExecRequest{
		Cmd: []string{"tar", "-c", "-C", path.Dir(src), "-f", "-", path.Base(src)},
	}, w, &stderr)
	if err != nil {
		return err
	}
	if res.ExitCode != 0 {
		return fmt.Errorf("copying %s out of sandbox %s: %w", src, id, copyFailure(&stderr, res.ExitCode))
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
	case strings.Contains(msg, "No space left"), strings.Contains(msg, "Disk quota exceeded"):
		return fmt.Errorf("%w: no space left: the sandbox's disk or /tmp is full: %s", roche.ErrExhausted, firstLine(msg))
	case strings.Contains(msg, "No such file"):
		return fmt.Errorf("%w: %s", roche.ErrNotFound, firstLine(msg))
	case strings.Contains(msg, "not found"), code == 126, code == 127:
		return fmt.Errorf("%w: the image has no tar, which copying needs: %s", roche.ErrUnsupported, firstLine(msg))
	}
	return errors.New(firstLine(msg))
}
