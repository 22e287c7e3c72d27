// Package guestfwd forwards the calls roche-agent serves (commands, background
// processes, the files API, tar streams) to a sandbox's agent, once for every provider
// whose sandboxes run it (docker, the microVMs, and the providers to come): a provider
// says only how to reach the agent of a sandbox (Forwarder.Reach) and whether a sandbox
// whose agent cannot be reached is gone. It also turns what the agent answers (its
// errors, file and process descriptions) into the core's types.
package guestfwd

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"time"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/internal/guest"
)

// Err returns the core error for an error the agent of sandbox id reported, and false
// when err did not come from the agent (the connection failed: the provider decides
// whether the sandbox is gone).
func Err(id string, err error) (error, bool) {
	var ae *guest.Error
	if !errors.As(err, &ae) {
		return err, false
	}
	sentinel := roche.ErrInvalidConfig
	switch ae.Code {
	case guest.CodeNotFound:
		sentinel = roche.ErrNotFound
	case guest.CodePermission:
		sentinel = roche.ErrPermission
	case guest.CodeUnsupported:
		sentinel = roche.ErrUnsupported
	case guest.CodeNoSpace, guest.CodeTooLarge, guest.CodeExhausted:
		sentinel = roche.ErrExhausted
	case guest.CodeGone:
		sentinel = roche.ErrOutputGone
	case guest.CodeInternal:
		return fmt.Errorf("sandbox %s: %s", id, ae.Message), true
	case guest.CodeStopping:
		// The sandbox is ending under the command: by the time the caller hears it, it is
		// gone, as when its agent can no longer be reached (Target.fail).
		return fmt.Errorf("%w: sandbox %s stopped while the command ran: %s", roche.ErrNotFound, id, ae.Message), true
	}
	return fmt.Errorf("%w: %s", sentinel, ae.Message), true
}

// FileInfo is the core's description of a file the agent described.
func FileInfo(fi guest.FileInfo) roche.FileInfo {
	mode := fs.FileMode(fi.Mode)
	switch fi.Type {
	case guest.TypeDir:
		mode |= fs.ModeDir
	case guest.TypeSymlink:
		mode |= fs.ModeSymlink
	case guest.TypeFIFO:
		mode |= fs.ModeNamedPipe
	case guest.TypeSocket:
		mode |= fs.ModeSocket
	case guest.TypeDevice:
		mode |= fs.ModeDevice
	case "": // an agent from before types were reported
		if fi.IsDir {
			mode |= fs.ModeDir
		}
		if fi.Symlink != "" {
			mode |= fs.ModeSymlink
		}
	}
	mtime := time.Unix(fi.ModTime, 0)
	if fi.ModTimeNS != 0 {
		mtime = time.Unix(0, fi.ModTimeNS)
	}
	return roche.FileInfo{
		Name: fi.Name, Path: fi.Path, Size: fi.Size, Mode: mode, IsDir: mode.IsDir(),
		Symlink: fi.Symlink, ModTime: mtime,
		UID: fi.UID, GID: fi.GID, Owner: fi.Owner, Group: fi.Group,
	}
}

// FileInfos converts a directory listing.
func FileInfos(list []guest.FileInfo) []roche.FileInfo {
	out := make([]roche.FileInfo, len(list))
	for i, fi := range list {
		out[i] = FileInfo(fi)
	}
	return out
}

// Command converts the agent's description of a durable command.
func Command(pr guest.Process) roche.Command {
	c := roche.Command{
		PID: pr.PID, Tag: pr.Tag, Cmd: pr.Cmd, Env: pr.Env, Workdir: pr.Cwd, TTY: pr.TTY, Stdin: pr.Stdin,
		Running: pr.Running, StartedAt: time.Unix(0, pr.StartedNS), Window: pr.Window,
		First: Offsets(pr.First), Written: Offsets(pr.End),
	}
	if pr.Result != nil {
		end := CommandEnd(*pr.Result)
		if pr.Stopping != "" {
			end = roche.CommandEnd{ExitCode: -1, Duration: end.Duration, Unknown: "the sandbox was stopping: " + pr.Stopping}
		}
		c.End = &end
	}
	return c
}

// CommandEnd converts a durable command's result.
func CommandEnd(r guest.Result) roche.CommandEnd {
	return roche.CommandEnd{
		ExitCode: r.ExitCode, Signal: r.Signal, TimedOut: r.TimedOut, OOMKilled: r.OOMKilled,
		Duration: time.Duration(r.DurationNS),
	}
}

// Offsets converts stream offsets.
func Offsets(o guest.Offsets) roche.CommandOffsets {
	return roche.CommandOffsets{Stdout: o.Stdout, Stderr: o.Stderr}
}

// CallerReader is the caller's side of an upload to the agent. It remembers the error
// that side reported (a cap reached, a source file gone), so that a provider does not
// take it for the sandbox having gone away.
type CallerReader struct {
	R   io.Reader
	Err error
}

func (c *CallerReader) Read(p []byte) (int, error) {
	n, err := c.R.Read(p)
	if err != nil && !errors.Is(err, io.EOF) {
		c.Err = err
	}
	return n, err
}

// CallerWriter is the caller's side of a download from the agent; see CallerReader.
type CallerWriter struct {
	W   io.Writer
	Err error
}

func (c *CallerWriter) Write(p []byte) (int, error) {
	n, err := c.W.Write(p)
	if err != nil {
		c.Err = err
	}
	return n, err
}

// receiptOf is what the agent measured of a command; nil from an agent that measures none.
func receiptOf(r *guest.Receipt) *roche.Receipt {
	if r == nil {
		return nil
	}
	return &roche.Receipt{PeakMemoryBytes: r.PeakMemoryBytes, CPUTime: time.Duration(r.CPUTimeNS), Leftover: r.Leftover,
		End: roche.EndKind(r.End), Evidence: r.Evidence}
}
