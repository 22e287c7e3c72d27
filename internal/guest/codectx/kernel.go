package codectx

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/roche-sandbox/roche/internal/guest"
	"github.com/roche-sandbox/roche/internal/guest/kernel"
)

// Proc is a kernel as its platform runs it: a process (roche-agent) or an instance of
// python.wasm (the wasm provider). It is all a platform writes; the Set and the Kernel
// do the rest.
type Proc interface {
	// Send writes a cell's line (kernel.Cell.Line) to the kernel. It may block until the
	// kernel reads it; an error means the kernel is gone.
	Send(line []byte) error
	// Interrupt raises a KeyboardInterrupt in the running cell, or says why it cannot
	// (python.wasm has no signals): the Set then stops the kernel at once.
	Interrupt() error
	// Kill stops the kernel and everything it started; its event stream then ends. It is
	// called once.
	Kill()
	// Exit says how the kernel ended. It is called once its event stream has ended, at
	// most once, and may wait briefly for the platform to know.
	Exit() Exit
}

// Exit is how a kernel ended.
type Exit struct {
	// How completes "the interpreter ...": "exited with status 3", "was killed by signal
	// 9 (killed)", "stopped answering".
	How string
	// OOM: it ended because the sandbox's memory ran out.
	OOM bool
}

// Stream is one of a cell's two output streams.
type Stream int

// The streams.
const (
	Stdout Stream = iota
	Stderr
)

// Event is one event of a kernel and the line it came in, so that a result can be
// passed on as it came.
type Event struct {
	kernel.Event
	Raw []byte
}

// Output receives a running cell's output, as it is produced. Its calls never overlap.
type Output interface {
	// Write is what the cell wrote to one stream, already cut at the output limit.
	Write(s Stream, p []byte)
	// Result is one rich result of the cell.
	Result(ev Event)
}

// maxEventLine caps one kernel event, its newline included (a result with a large
// image), so that it fits in one agent frame and no reader holds more.
const maxEventLine = 7 << 20

// Kernel is a started kernel: its Proc and the plumbing every platform shares, its
// events, its raw output and the running cell they go to. The platform makes it with
// NewKernel and feeds it the kernel's streams: PumpEvents and PumpRaw for pipes of
// their own (kernel.Argv), or StdioWriter and StderrWriter for a kernel whose events
// share stdout with raw writes (kernel.StdioArgv), then EndEvents.
type Kernel struct {
	proc   Proc
	events chan Event    // closed when the event stream ends
	ended  chan struct{} // closed with events
	stop   chan struct{} // closed by Stop: an event nobody will read is dropped
	marks  chan int      // cells whose sync marks came through a raw pipe
	pumps  int           // raw pipes read for sync marks (PumpRaw)
	end    sync.Once

	// sendMu keeps the lines written to the kernel whole: a cell's, and a reseed
	// (Set.Reseed) that may come while another is written.
	sendMu sync.Mutex

	mu        sync.Mutex
	cell      *cellRun // where output goes; nil between cells (then it is dropped)
	stopped   bool
	stoppedBy string // why the Set stopped it ("restarted", "removed", ...)
}

// NewKernel returns the Kernel of p, which has just started.
func NewKernel(p Proc) *Kernel {
	return &Kernel{
		proc:   p,
		events: make(chan Event, 64),
		ended:  make(chan struct{}),
		stop:   make(chan struct{}),
		marks:  make(chan int, 64),
	}
}

// send writes one line to the kernel.
func (k *Kernel) send(line []byte) error {
	k.sendMu.Lock()
	defer k.sendMu.Unlock()
	return k.proc.Send(line)
}

// Ended is closed once the kernel's event stream has ended: it died or was stopped.
func (k *Kernel) Ended() <-chan struct{} { return k.ended }

// Gone is what a Proc may also implement: whether its kernel has ended, known at once
// (a process reaped), which can be a moment before its event stream is seen to end.
type Gone interface{ Gone() bool }

// gone reports whether the kernel has ended: its event stream did, or its Proc says so.
func (k *Kernel) gone() bool {
	select {
	case <-k.ended:
		return true
	default:
	}
	g, ok := k.proc.(Gone)
	return ok && g.Gone()
}

// PumpEvents reads the kernel's event pipe in the background, until it ends; a line
// that is no event is dropped. It closes r.
func (k *Kernel) PumpEvents(r io.ReadCloser) {
	go func() {
		defer k.EndEvents()
		defer r.Close()
		w := &eventWriter{k: k, max: maxEventLine}
		_, _ = io.Copy(w, r)
		w.flush()
	}()
}

// PumpRaw passes what is written to the kernel's raw fd 1 or fd 2 (by subprocesses and
// C code) to the running cell, in the background, finding the sync marks that end each
// cell's output there. It closes r.
func (k *Kernel) PumpRaw(r io.ReadCloser, s Stream) {
	k.pumps++
	go func() {
		defer r.Close()
		var m kernel.Marks
		buf := make([]byte, 32<<10)
		for {
			n, err := r.Read(buf)
			if n > 0 {
				out, cells := m.Feed(buf[:n])
				k.raw(s, out)
				for _, id := range cells {
					select {
					case k.marks <- id:
					default:
					}
				}
			}
			if err != nil {
				k.raw(s, m.Flush())
				return
			}
		}
	}()
}

// StdioWriter is the stdout of a kernel started with --stdio: each line that is an event
// is queued as one, every other byte is the running cell's stdout. EndEvents when the
// kernel has ended.
func (k *Kernel) StdioWriter() io.Writer { return &eventWriter{k: k, mixed: true, max: maxEventLine} }

// StderrWriter is a kernel's raw stderr, passed to the running cell.
func (k *Kernel) StderrWriter() io.Writer { return rawWriter{k: k, s: Stderr} }

// EndEvents ends the kernel's event stream: it has ended.
func (k *Kernel) EndEvents() {
	k.end.Do(func() {
		close(k.events)
		close(k.ended)
	})
}

// Stop kills the kernel and everything it started, noting why (the first reason given
// stays).
func (k *Kernel) Stop(why string) {
	k.mu.Lock()
	if k.stoppedBy == "" {
		k.stoppedBy = why
	}
	first := !k.stopped
	k.stopped = true
	k.mu.Unlock()
	if first {
		close(k.stop)
		k.proc.Kill()
	}
}

func (k *Kernel) stopReason() string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.stoppedBy
}

func (k *Kernel) setCell(r *cellRun) {
	k.mu.Lock()
	k.cell = r
	k.mu.Unlock()
}

// raw passes raw output to the running cell.
func (k *Kernel) raw(s Stream, p []byte) {
	if len(p) == 0 {
		return
	}
	k.mu.Lock()
	r := k.cell
	k.mu.Unlock()
	if r != nil {
		r.write(s, p)
	}
}

func (k *Kernel) queue(ev Event) {
	select {
	case k.events <- ev:
	case <-k.stop:
	}
}

// ErrStartTimeout is the error of a kernel that did not say it was ready in time.
var ErrStartTimeout = errors.New("the python kernel did not start in time")

// kernelReady bounds a kernel's start: python3 importing the standard library, or
// instantiating python.wasm.
const kernelReady = 60 * time.Second

// earlyOutput bounds what a kernel that fails at start shows of its output (a Python
// too old to run it says so on stderr).
const earlyOutput = 4096

// waitReady waits for the kernel's ready event; on failure the kernel is stopped.
func (k *Kernel) waitReady(ctx context.Context) error {
	var early collected
	run := &cellRun{out: &early, limit: earlyOutput}
	k.setCell(run)
	defer k.setCell(nil)
	timer := time.NewTimer(kernelReady)
	defer timer.Stop()
	for {
		select {
		case ev, ok := <-k.events:
			if !ok {
				k.Stop("")
				exit := k.proc.Exit()
				run.mu.Lock()
				msg := early.String()
				run.mu.Unlock()
				if msg == "" {
					msg = "(no output)"
				}
				return fmt.Errorf("the python kernel %s at start: %s", exit.How, msg)
			}
			if ev.T == kernel.EventReady {
				return nil
			}
		case <-timer.C:
			k.Stop("did not start")
			return fmt.Errorf("%w: it did not say it was ready within %s", ErrStartTimeout, kernelReady)
		case <-ctx.Done():
			k.Stop("")
			return ctx.Err()
		}
	}
}

// forkWait bounds the wait for a kernel to end a fork request.
const forkWait = 30 * time.Second

// awaitDone reads the kernel's events up to the done of request id (a fork), returning
// the error it reported, if any. A kernel that ends or does not answer is stopped.
func (k *Kernel) awaitDone(ctx context.Context, id int) *guest.CodeError {
	timer := time.NewTimer(forkWait)
	defer timer.Stop()
	var failed *guest.CodeError
	for {
		select {
		case ev, ok := <-k.events:
			if !ok {
				return &guest.CodeError{Name: "ContextDied", Value: "the interpreter ended while it forked"}
			}
			switch {
			case ev.T == kernel.EventError:
				failed = &guest.CodeError{Name: ev.Name, Value: ev.Value}
			case ev.T == kernel.EventDone && ev.ID == id:
				return failed
			}
		case <-timer.C:
			k.Stop("")
			return &guest.CodeError{Name: "TimeoutError", Value: "the interpreter did not end its fork in time: it was stopped"}
		case <-ctx.Done():
			k.Stop("")
			return &guest.CodeError{Name: "ContextDied", Value: "the fork was given up: the interpreter was stopped"}
		}
	}
}

// awaitMarks waits (briefly) for cell id's sync marks on the raw pipes, so that what the
// cell's subprocesses wrote there before it ended reaches it.
func (k *Kernel) awaitMarks(id int) {
	if k.pumps == 0 {
		return
	}
	timer := time.NewTimer(syncGrace)
	defer timer.Stop()
	for seen := 0; seen < k.pumps; {
		select {
		case got := <-k.marks:
			if got == id {
				seen++
			}
		case <-timer.C:
			return
		}
	}
}

// eventWriter splits a kernel's event stream into lines, each at most max bytes
// (maxEventLine). Without mixed (a pipe of events only) a line that is no event is dropped, and
// a longer one too, with a note on the cell's stderr. With mixed (python.wasm's stdout,
// where raw writes to fd 1 land too) a line that is no event is the cell's stdout, and a
// longer one is passed on as it comes rather than held whole (a cell writing to fd 1
// without a newline must not make its reader hold all of it).
type eventWriter struct {
	k        *Kernel
	mixed    bool
	max      int
	line     []byte // a partial line
	overlong bool   // the line being written passed maxEventLine
}

func (w *eventWriter) Write(p []byte) (int, error) {
	// What is held has no newline: only the new bytes are searched.
	from := len(w.line)
	w.line = append(w.line, p...)
	for {
		i := bytes.IndexByte(w.line[from:], '\n')
		if i < 0 {
			if w.overlong || len(w.line) > w.max {
				if w.mixed {
					w.k.raw(Stdout, w.line)
				}
				w.line, w.overlong = w.line[:0], true
			}
			return len(p), nil
		}
		line := w.line[:from+i+1]
		var ev kernel.Event
		switch {
		case !w.overlong && len(line) <= w.max && json.Unmarshal(line, &ev) == nil && ev.T != "":
			w.k.queue(Event{Event: ev, Raw: bytes.Clone(line)})
		case w.mixed:
			w.k.raw(Stdout, line)
		case w.overlong || len(line) > w.max:
			w.k.raw(Stderr, []byte(fmt.Sprintf("roche: a result of more than %d MiB was dropped\n", w.max>>20)))
		}
		w.line, w.overlong, from = w.line[from+i+1:], false, 0
	}
}

// flush passes on an unfinished last line, which is no event.
func (w *eventWriter) flush() {
	if w.mixed {
		w.k.raw(Stdout, w.line)
	}
	w.line = nil
}

type rawWriter struct {
	k *Kernel
	s Stream
}

func (w rawWriter) Write(p []byte) (int, error) {
	w.k.raw(w.s, p)
	return len(p), nil
}

// cellRun is a running cell's output to its Output, each stream cut at the limit.
type cellRun struct {
	out   Output
	limit int64

	mu        sync.Mutex
	written   [2]int64
	truncated bool
}

func (r *cellRun) write(s Stream, p []byte) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if room := r.limit - r.written[s]; int64(len(p)) > room {
		p = p[:max(room, 0)]
		r.truncated = true
	}
	if len(p) == 0 {
		return
	}
	r.written[s] += int64(len(p))
	r.out.Write(s, p)
}

func (r *cellRun) result(ev Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.out.Result(ev)
}

func (r *cellRun) wasTruncated() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.truncated
}

// collected keeps both streams' output together (a failed start's).
type collected struct{ bytes.Buffer }

func (c *collected) Write(_ Stream, p []byte) { c.Buffer.Write(p) }
func (c *collected) Result(Event)             {}
