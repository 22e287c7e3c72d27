package server

import (
	"errors"
	"fmt"
	"os"
	"sort"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/roche-sandbox/roche/internal/guest"
)

// Durable commands: commands that belong to the sandbox rather than to the connection
// that started them (a background start, a terminal session, an exec with an
// idempotency key). Each keeps its output in a window per stream (outlog.go) that any
// number of clients follow by byte offsets, so a client that went away (its process
// killed, roched restarted) reconnects where it left off, and a slow one never holds up
// the command: it falls behind, and hears so, instead.

const (
	// followBatch bounds the output a follower takes from the log at once.
	followBatch = 1 << 20
	// inputWait is how long a write to a command's stdin waits for the command to read
	// (its pipe holds 64 KiB) before giving up.
	inputWait = 30 * time.Second
	// keepKeys bounds the idempotency keys remembered.
	keepKeys = 1024
	// defaultKeptOutput bounds the output all durable commands together keep (see
	// keptBudget): the agent's memory counts against the sandbox's.
	defaultKeptOutput = 256 << 20
)

// keptBudget counts the output every durable command's log holds; past max, the
// server drops the oldest (evict).
type keptBudget struct {
	n    atomic.Int64
	max  int64
	over chan struct{}
}

func newKeptBudget(max int64) *keptBudget {
	if max <= 0 {
		max = defaultKeptOutput
	}
	return &keptBudget{max: max, over: make(chan struct{}, 1)}
}

func (b *keptBudget) add(n int64) {
	if b.n.Add(n) > b.max {
		select {
		case b.over <- struct{}{}:
		default:
		}
	}
}

// evictLoop keeps the budget until done closes.
func (s *Server) evictLoop(done <-chan struct{}) {
	for {
		select {
		case <-done:
			return
		case <-s.kept.over:
			s.evict()
		}
	}
}

// evict brings the output kept under the budget: the finished commands' output goes
// first, oldest first, then the running commands' oldest output, the largest first.
// What goes is gone honestly: a client asking for it hears where the output now starts.
func (s *Server) evict() {
	for s.kept.n.Load() > s.kept.max {
		s.mu.Lock()
		var finished, running []*proc
		for _, p := range s.procs {
			if p.log == nil {
				continue
			}
			if isFinished(p) {
				finished = append(finished, p)
			} else {
				running = append(running, p)
			}
		}
		s.mu.Unlock()
		sort.Slice(finished, func(i, j int) bool { return finished[i].endedAt().Before(finished[j].endedAt()) })
		for _, p := range finished {
			if s.kept.n.Load() <= s.kept.max {
				return
			}
			p.dropOutput()
		}
		sort.Slice(running, func(i, j int) bool { return running[i].keptBytes() > running[j].keptBytes() })
		shrunk := false
		for _, p := range running {
			if s.kept.n.Load() <= s.kept.max {
				return
			}
			shrunk = p.shrinkOutput() || shrunk
		}
		if !shrunk {
			return
		}
	}
}

// dropOutput forgets everything a durable command's log keeps.
func (p *proc) dropOutput() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.log != nil {
		p.budget.add(-(p.log.trim(0, 0) + p.log.trim(1, 0)))
	}
}

// shrinkOutput halves what a running command's log keeps of each stream; false when it
// kept next to nothing.
func (p *proc) shrinkOutput() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	var dropped int64
	for i := range p.log.s {
		st := &p.log.s[i]
		dropped += p.log.trim(i, (st.end-st.first)/2)
	}
	p.budget.add(-dropped)
	return dropped > 0
}

func (p *proc) keptBytes() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.log.kept()
}

func (p *proc) endedAt() time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.ended
}

// register lists a started command and remembers its idempotency key.
func (s *Server) register(p *proc) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.procs[p.pid] = p
	if p.key == "" {
		return
	}
	if _, ok := s.keys[p.key]; !ok {
		s.keyOrder = append(s.keyOrder, p.key)
	}
	s.keys[p.key] = p.pid
	if len(s.keyOrder) > keepKeys {
		for _, k := range s.keyOrder[:len(s.keyOrder)-keepKeys] {
			delete(s.keys, k)
		}
		s.keyOrder = append([]string(nil), s.keyOrder[len(s.keyOrder)-keepKeys:]...)
	}
}

// keyed finds the command started with key: nil when the key is new, an error when its
// command is no longer kept (it would be wrong to start it again).
func (s *Server) keyed(key string) (*proc, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	pid, ok := s.keys[key]
	if !ok {
		return nil, nil
	}
	if p := s.procs[pid]; p != nil && p.key == key {
		return p, nil
	}
	return nil, notFound("the command started with idempotency key %q (pid %d) has ended and is no longer kept: it was not started again", key, pid)
}

// runningDurable counts the durable commands still running.
func (s *Server) runningDurable() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, p := range s.procs {
		if p.durable && !isFinished(p) {
			n++
		}
	}
	return n
}

// command finds the command a request names: by pid, or the newest durable command
// with the tag. durable refuses a command that is not; running one that has ended.
func (s *Server) command(pid int, tag string, durable, running bool) (*proc, error) {
	s.mu.Lock()
	var p *proc
	switch {
	case pid > 0:
		p = s.procs[pid]
	case tag != "":
		for _, q := range s.procs {
			if q.durable && q.tag == tag && (p == nil || q.started.After(p.started)) {
				p = q
			}
		}
	default:
		s.mu.Unlock()
		return nil, invalid("name the command by its pid or its tag")
	}
	s.mu.Unlock()
	name := fmt.Sprintf("process %d", pid)
	if pid <= 0 {
		name = fmt.Sprintf("command tagged %q", tag)
	}
	switch {
	case p == nil:
		return nil, notFound("no %s in this sandbox (finished commands are kept: the last %d)", name, keepFinished)
	case durable && !p.durable:
		return nil, invalid("%s runs in the foreground of another call: only commands started in the background can be followed", name)
	case running && isFinished(p):
		return nil, notFound("no running %s in this sandbox: it has ended", name)
	}
	return p, nil
}

// attach follows a durable command from the offsets the request names.
func (s *Server) attach(c *conn, req guest.Request) error {
	p, err := s.command(req.PID, req.Tag, true, false)
	if err != nil {
		return err
	}
	return s.follow(c, p, req.From, false)
}

// follow sends a durable command's started frame, its output from from on in the order
// it was written, what follows as it comes, and its result; it returns when the
// command has ended or the client has gone. Meanwhile the client may send stdin,
// signals and resizes. A client that falls behind the window hears so (CodeGone).
func (s *Server) follow(c *conn, p *proc, from *guest.Offsets, existing bool) error {
	s.following.Add(1)
	defer s.following.Done()
	p.mu.Lock()
	pos, err := p.log.resolve(from)
	p.mu.Unlock()
	if err != nil {
		return err
	}
	st := guest.Started{PID: p.pid, Tag: p.tag, From: &guest.Offsets{Stdout: pos[0], Stderr: pos[1]}, Existing: existing}
	if err := c.sendJSON(guest.FrameStarted, st); err != nil {
		return nil
	}
	gone := make(chan struct{})
	go func() {
		defer close(gone)
		p.readFollower(c)
	}()
	for {
		p.mu.Lock()
		pieces, err := p.log.read(&pos, followBatch)
		finished := p.finished.Load()
		var changed chan struct{}
		if err == nil && len(pieces) == 0 && !finished {
			p.watched = true
			changed = p.changed
		}
		res, stopping := p.result, p.stopping
		p.mu.Unlock()
		if err != nil {
			var ge *guest.Error
			if errors.As(err, &ge) && ge.Code == guest.CodeGone {
				ge.Message = "this client fell behind the command's output: " + ge.Message
			}
			return err
		}
		for _, pc := range pieces {
			kind := byte(guest.FrameStdout)
			if pc.stream == 1 {
				kind = guest.FrameStderr
			}
			for d := pc.data; len(d) > 0; d = d[min(len(d), guest.MaxChunk):] {
				if c.send(kind, d[:min(len(d), guest.MaxChunk)]) != nil {
					return nil
				}
			}
		}
		if len(pieces) > 0 {
			continue
		}
		if finished {
			if stopping != "" {
				return stoppedWith(stopping, res)
			}
			return c.sendJSON(guest.FrameResult, res)
		}
		select {
		case <-changed:
		case <-gone:
			return nil
		}
	}
}

// followersDone waits, at most d, for every follower to have sent what it has: when
// the sandbox stops, each hears why before the agent exits.
func (s *Server) followersDone(d time.Duration) {
	done := make(chan struct{})
	go func() {
		s.following.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(d):
	}
}

// readFollower handles what a follower sends: stdin for the command (a keyed exec's
// input), signals and resizes, until the connection closes. Its going away leaves the
// command running.
func (p *proc) readFollower(c *conn) {
	for {
		kind, payload, err := c.read()
		if err != nil {
			return
		}
		switch kind {
		case guest.FrameStdin:
			if p.isTTY() {
				_ = p.typeInto(payload)
			} else {
				_ = p.writeStdin(payload)
			}
		case guest.FrameStdinEOF:
			if p.isTTY() {
				p.endInput()
			} else {
				p.closeStdin()
			}
		default:
			p.control(kind, payload)
		}
	}
}

// writeStdin writes data to a durable command's open stdin.
func (p *proc) writeStdin(data []byte) error {
	p.stdinMu.Lock()
	defer p.stdinMu.Unlock()
	if p.stdin == nil {
		if isFinished(p) {
			return notFound("process %d has ended", p.pid)
		}
		return invalid("process %d's stdin is not open: start it with stdin kept open to send it input (and it is closed for good once closed)", p.pid)
	}
	_ = p.stdin.SetWriteDeadline(time.Now().Add(inputWait))
	n, err := p.stdin.Write(data)
	if err == nil {
		return nil
	}
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return invalid("process %d read none of its input for %s: %d of the %d bytes were written (its pipe is full)", p.pid, inputWait, n, len(data))
	}
	if errors.Is(err, syscall.EPIPE) {
		return invalid("process %d closed its stdin: %d of the %d bytes were written", p.pid, n, len(data))
	}
	return fmt.Errorf("writing to process %d's stdin: %w", p.pid, err)
}

// closeStdin closes a durable command's stdin, once.
func (p *proc) closeStdin() {
	p.stdinMu.Lock()
	defer p.stdinMu.Unlock()
	if p.stdin != nil {
		p.stdin.Close()
		p.stdin = nil
	}
}

func (p *proc) stdinOpen() bool {
	p.stdinMu.Lock()
	defer p.stdinMu.Unlock()
	return p.stdin != nil
}

// input serves OpInput: data for a command's stdin, or typed into its terminal, and
// the end of its input.
func (s *Server) input(req guest.Request) error {
	p, err := s.command(req.PID, req.Tag, false, true)
	if err != nil {
		return err
	}
	if p.isTTY() {
		if err := p.typeInto(req.Data); err != nil {
			return err
		}
		if req.EndInput {
			p.endInput()
		}
		return nil
	}
	if len(req.Data) > 0 {
		if err := p.writeStdin(req.Data); err != nil {
			return err
		}
	}
	if req.EndInput {
		if !p.stdinOpen() {
			return invalid("process %d's stdin is not open (it was started without it, or already closed)", p.pid)
		}
		p.closeStdin()
	}
	return nil
}

// terminal finds a running command's terminal for OpResize.
func (s *Server) terminal(req guest.Request) (*proc, error) {
	p, err := s.command(req.PID, req.Tag, false, true)
	if err != nil {
		return nil, err
	}
	if !p.isTTY() {
		return nil, invalid("process %d has no terminal (start it with a terminal to type into or resize it)", p.pid)
	}
	return p, nil
}

// signal signals a command's process group.
func (s *Server) signal(req guest.Request) error {
	p, err := s.command(req.PID, req.Tag, false, true)
	if err != nil {
		return err
	}
	if req.Signal <= 0 || req.Signal > 64 {
		return invalid("signal %d is not a signal number", req.Signal)
	}
	if err := syscall.Kill(-p.pid, syscall.Signal(req.Signal)); err != nil && !errors.Is(err, syscall.ESRCH) {
		return err
	}
	return nil
}

// ps lists the durable commands, oldest first.
func (s *Server) ps() []guest.Process {
	s.mu.Lock()
	procs := make([]*proc, 0, len(s.procs))
	for _, p := range s.procs {
		if p.durable {
			procs = append(procs, p)
		}
	}
	s.mu.Unlock()
	sort.Slice(procs, func(i, j int) bool { return procs[i].started.Before(procs[j].started) })
	out := make([]guest.Process, 0, len(procs))
	for _, p := range procs {
		out = append(out, p.describe())
	}
	return out
}

func (p *proc) describe() guest.Process {
	stdin := p.stdinOpen()
	p.mu.Lock()
	defer p.mu.Unlock()
	d := guest.Process{
		PID: p.pid, Cmd: p.cmd, Tag: p.tag, Env: p.env, Cwd: p.cwd, TTY: p.ttyOn, Stdin: stdin,
		Running: !p.finished.Load(), StartedNS: p.started.UnixNano(), Window: p.log.window,
		First: p.log.first(), End: p.log.end(),
	}
	if !d.Running {
		res := p.result
		d.Result, d.ExitCode, d.Stopping = &res, res.ExitCode, p.stopping
	}
	return d
}
