package oci

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/roche-sandbox/roche"
	"github.com/roche-sandbox/roche/internal/guest"
	"github.com/roche-sandbox/roche/provider/internal/agentspec"
)

// A one-shot sandbox (kit.CreateOptions.OneShot: roche run with no roched, a process
// that makes a sandbox, runs one command in it and destroys it) is made for that one
// command. The runtime runs it in the foreground, as this process's child, rather than
// detached, and its roche-agent serves one connection, this process's end of a socket
// pair the runtime passes in (oneShotFD), instead of a socket in the run directory. So
// nothing waits for a socket to appear or dials it, no lease connection is taken (the
// connection is the lease: when this process ends, however it ends, its end closes and
// the agent kills the command and stops), and no exit is watched on a pidfd: the
// runtime's run returns when the sandbox's PID 1 has exited, having deleted the
// container (its state and cgroups) itself, so a destroy needs no second run of the
// runtime. The command runs through the agent as any other (the same limits, timeout,
// output bounds, stdin and result); what this process's teardown has left to do is
// the root's unmount and the sandbox's directory.

// oneShotFD is the descriptor the agent of a one-shot sandbox finds its connection on:
// the first after the standard streams, the one the runtime's --preserve-fds 1 passes.
const oneShotFD = 3

// oneShot is one one-shot sandbox's runtime run and connection.
type oneShot struct {
	conn  net.Conn // this process's end of the agent's connection
	taken atomic.Bool
	// exited is closed once the runtime's run has returned, with err what it returned.
	exited chan struct{}
	err    error
}

// oneShotReady bounds the wait for the agent's ready frame, as start bounds the wait
// for its socket.
const oneShotReady = 15 * time.Second

// oneShotEnd bounds the wait, in a teardown, for the runtime's run to return after the
// connection closed: the agent kills what is left of the command at once, then stops.
const oneShotEnd = 5 * time.Second

// startOneShot runs the container of one-shot sandbox s in the foreground and waits for
// its agent's ready frame. warmed is called once the agent is ready (the runtime's
// cgroup moves are done by then; see cgroupwarm.Start).
func (p *Provider) startOneShot(ctx context.Context, rt *ociRuntime, s *sandbox, warmed func()) (err error) {
	defer func() {
		warmed()
		// As in start: a compiled filter the sandbox failed with is not handed on.
		if err != nil {
			rt.forgetSeccomp()
		}
	}()
	logf, err := os.OpenFile(filepath.Join(s.dir, "agent.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close()
	host, agentEnd, err := socketPair()
	if err != nil {
		return fmt.Errorf("%w: the one-shot sandbox's connection: %v", roche.ErrUnavailable, err)
	}
	defer agentEnd.Close()
	// Not the create's context: the run lasts as long as the sandbox, and ends with it.
	cmd := rt.command(context.Background(), "run", "--preserve-fds", "1", "--bundle", s.dir, "--pid-file", filepath.Join(s.dir, "pid"), s.ID)
	// The agent's stdio is the log file, as in start; its connection is descriptor 3.
	cmd.Stdin, cmd.Stdout, cmd.Stderr = nil, logf, logf
	cmd.ExtraFiles = []*os.File{agentEnd}
	// A process group of its own: a terminal's Ctrl-C reaches this process, which ends
	// the command through the connection, and not the runtime, which would pass it on
	// to the agent as a stop.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		host.Close()
		return fmt.Errorf("%w: %s run: %v", roche.ErrUnavailable, rt.name, err)
	}
	one := &oneShot{conn: host, exited: make(chan struct{})}
	go func() {
		one.err = cmd.Wait()
		close(one.exited)
	}()
	p.mu.Lock()
	if p.oneShots == nil {
		p.oneShots = map[string]*oneShot{}
	}
	p.oneShots[s.ID] = one
	p.mu.Unlock()
	agentEnd.Close() // the runtime has it; the connection ends when the agent's copy does

	rctx, cancel := context.WithTimeout(ctx, oneShotReady)
	defer cancel()
	if err := awaitReady(rctx, host); err != nil {
		if ctx.Err() != nil {
			return context.Cause(ctx)
		}
		// The runtime failed, or the agent did: what they said is in the log.
		select {
		case <-one.exited:
			if one.err != nil {
				return fmt.Errorf("%w: %s run: %v: %s", roche.ErrUnavailable, rt.name, one.err, p.logTail(s))
			}
		case <-time.After(time.Second):
		}
		return fmt.Errorf("%w: roche-agent did not start in the sandbox: %v: %s", roche.ErrUnavailable, err, p.logTail(s))
	}
	rt.learnSeccomp(s.ID)
	s.agent = guest.NewClientWithDialer(filepath.Join(s.runDir(), agentspec.SocketName), func(context.Context) (net.Conn, error) {
		if one.taken.Swap(true) {
			return nil, errOneShotUsed(s.ID)
		}
		return host, nil
	})
	return nil
}

func errOneShotUsed(id string) error {
	return fmt.Errorf("%w: sandbox %s was made for one command (roche run), which it has run", roche.ErrUnsupported, id)
}

// oneShotUsed says why a one-shot sandbox this process made serves no more requests,
// or nil.
func (p *Provider) oneShotUsed(id string) error {
	p.mu.Lock()
	one := p.oneShots[id]
	p.mu.Unlock()
	if one != nil && one.taken.Load() {
		return errOneShotUsed(id)
	}
	return nil
}

// awaitReady reads the agent's ready frame (server.Config.ConnFD) from c.
func awaitReady(ctx context.Context, c net.Conn) error {
	stop := context.AfterFunc(ctx, func() { _ = c.SetReadDeadline(time.Unix(1, 0)) })
	defer stop()
	kind, payload, err := guest.ReadFrame(c, nil)
	if err != nil {
		return fmt.Errorf("waiting for its ready frame: %w", err)
	}
	if kind != guest.FrameReply {
		return fmt.Errorf("the agent's first frame is %q, not its ready frame", kind)
	}
	var h guest.Health
	if err := json.Unmarshal(payload, &h); err != nil {
		return fmt.Errorf("the agent's ready frame: %w", err)
	}
	return nil
}

// takeOneShot returns the one-shot run of sandbox id, if this process made it, and
// forgets it.
func (p *Provider) takeOneShot(id string) *oneShot {
	p.mu.Lock()
	defer p.mu.Unlock()
	one := p.oneShots[id]
	delete(p.oneShots, id)
	return one
}

// endOneShot begins the teardown of sandbox s when this process made it one-shot (one
// is then its run, else nil): it closes the connection, which ends the command (if it
// still runs) and the agent, unmounts the root's mounts here meanwhile (the sandbox has
// its own copies of them, in its mount namespace, which go with it; rootGone tells
// how that went), and waits, at most oneShotEnd, for the runtime's run to return.
// ranOut reports that it did and that the runtime forgot the container, as its
// foreground run deletes it: the teardown then has no runtime run of its own to make.
func (p *Provider) endOneShot(ctx context.Context, rt *ociRuntime, s *sandbox) (one *oneShot, ranOut bool, rootGone <-chan []error) {
	one = p.takeOneShot(s.ID)
	if one == nil {
		return nil, false, nil
	}
	one.conn.Close()
	unmounted := make(chan []error, 1)
	go func() {
		var errs []error
		for _, mp := range mountsBelow(s.dir) {
			errs = append(errs, unmountAll(mp))
		}
		unmounted <- errs
	}()
	ranOut = one.wait(ctx, oneShotEnd) && rt != nil && runtimeForgot(rt, s.ID)
	return one, ranOut, unmounted
}

// wait waits, at most d or until ctx ends, for the runtime's run to return.
func (one *oneShot) wait(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-one.exited:
		return true
	case <-t.C:
	case <-ctx.Done():
	}
	return false
}

// runtimeForgot reports whether the runtime holds no state of container id (its
// foreground run deleted the container).
func runtimeForgot(rt *ociRuntime, id string) bool {
	_, err := os.Stat(filepath.Join(rt.root, id))
	return errors.Is(err, os.ErrNotExist)
}

// closeOneShots closes the connections of the one-shot sandboxes this process made and
// did not destroy: each ends its command and stops (Close).
func (p *Provider) closeOneShots() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, one := range p.oneShots {
		one.conn.Close()
	}
}
